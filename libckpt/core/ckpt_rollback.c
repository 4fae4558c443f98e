// SPDX-License-Identifier: GPL-2.0 OR MIT
/*
 * Rollback: when the previous step may be committed again, the re-stamp of
 * each record of the other slot, its commit, and the whole sequence over the
 * host's I/O ops (ckpt_step_rollback).
 *
 * No float (fp32 values are checked as bit patterns); memory and I/O are
 * the host's ops.
 */
#include "ckpt_step_impl.h"

/* ---------------- rollback ---------------- */

int ckpt_step_rollback_check(struct ckpt_step *cs, const struct ckpt_sb *prev, u64 step)
{
	const struct ckpt_sb *sb = cs->sb;
	int ret = 0;

	cs->ops->lock(cs->host);
	if (cs->sm.state == CKPT_STATE_FAILED)
		ret = -CKPT_E_FAILED;
	else if (cs->sm.state != CKPT_STATE_IDLE)
		ret = -CKPT_E_STATE;
	else if (step && step != cs->sm.committed_step)
		ret = -CKPT_E_STEP;
	cs->ops->unlock(cs->host);
	if (ret)
		return ret;
	if (!sb->committed_step || !prev || prev->sequence + 1 != sb->sequence ||
	    prev->committed_step + 1 != sb->committed_step ||
	    prev->committed_slot != (sb->committed_slot ^ 1) ||
	    memcmp(prev->uuid, sb->uuid, sizeof(sb->uuid)) ||
	    memcmp(&prev->geo, &sb->geo, sizeof(sb->geo)) ||
	    prev->manifest_crc != sb->manifest_crc ||
	    prev->feature_incompat != sb->feature_incompat)
		return -CKPT_E_ROLLBACK;
	return 0;
}

int ckpt_step_rollback_rec(const struct ckpt_step *cs, const struct ckpt_sb *prev, u32 chunk,
			   void *header, const void *data, const void *plo)
{
	const u32 incompat = cs->sb->feature_incompat;
	struct ckpt_rec want, id, got;
	enum ckpt_rec_fault f;

	if (chunk >= cs->sb->geo.n_chunks)
		return -CKPT_E_RANGE;
	ckpt_rec_committed(prev, chunk, &want);
	ckpt_rec_next(cs->sb, chunk, prev->committed_step, &id);
	f = ckpt_rec_check(header, data, plo, &want, incompat, &got);
	if (f == CKPT_REC_STEP && got.step == id.step && got.sequence == id.sequence)
		/* re-stamped by an interrupted rollback: check the rest of it */
		return ckpt_rec_check(header, data, plo, &id, incompat, &got) ? -CKPT_E_ROLLBACK : 0;
	if (f != CKPT_REC_OK)
		return -CKPT_E_ROLLBACK;
	id.data_crc = got.data_crc;
	id.plo_crc = got.plo_crc;
	ckpt_rec_seal(header, NULL, NULL, &id, incompat);
	return 1;
}

int ckpt_step_rollback_commit(struct ckpt_step *cs, const struct ckpt_sb *prev)
{
	int ret = ckpt_step_write_sb(cs, prev->committed_step, prev->committed_slot, prev->blob,
				     prev->blob_len);

	if (ret)
		return ret;
	/* IDLE before and after: no stage, no bitmap in use */
	cs->ops->lock(cs->host);
	cs->sm.committed_step = cs->sb->committed_step;
	cs->sm.committed_slot = cs->sb->committed_slot & 1;
	cs->sm.last_result = CKPT_RESULT_NONE;
	cs->sm.last_error = CKPT_OK;
	cs->ops->unlock(cs->host);
	return 0;
}

/* The older copy: read, decoded, and the check of going back to it. */
static int rollback_older(struct ckpt_step *cs, u64 step, struct ckpt_sb *prev,
			  struct ckpt_rollback_fault *f, int *io)
{
	const u64 off = ckpt_sb_next_offset(cs->sb);
	int ret;

	f->part = CKPT_ROLLBACK_OLDER;
	f->older_index = (cs->sb->sequence + 1) & 1;
	*io = cs->ops->read(cs->host, cs->mem.block, off, CKPT_BLOCK);
	if (*io)
		return -CKPT_E_IO;
	/* the same geometry as the current copy, which was checked against the device */
	f->older = ckpt_sb_decode(cs->mem.block, cs->sb->regions.dev_bytes, prev);
	if (!f->older) {
		f->older_step = prev->committed_step;
		f->older_sequence = prev->sequence;
	}
	ret = ckpt_step_rollback_check(cs, f->older ? NULL : prev, step);
	if (ret && (ret != -CKPT_E_ROLLBACK || !cs->sb->committed_step))
		f->part = CKPT_ROLLBACK_MACHINE;
	return ret;
}

/* Every record of prev's slot checked, and re-stamped where it is not yet. */
static int rollback_records(struct ckpt_step *cs, const struct ckpt_sb *prev, u8 *rec,
			    struct ckpt_rollback_fault *f, int *io)
{
	const struct ckpt_step_ops *ops = cs->ops;
	const struct ckpt_regions *l = &cs->regions;
	struct ckpt_rec want;
	u64 off;
	u32 ch;
	int ret;

	f->part = CKPT_ROLLBACK_RECORD;
	f->slot = prev->committed_slot;
	for (ch = 0; ch < cs->sm.n_chunks; ch++) {
		f->chunk = ch;
		off = ckpt_record_offset(l, prev->committed_slot, ch);
		*io = ops->read(cs->host, rec, off, l->record_bytes);
		if (!*io)
			*io = ops->read(cs->host, rec + l->record_bytes,
					ckpt_plo_offset(l, prev->committed_slot, ch),
					l->plo_chunk_bytes);
		if (*io)
			return -CKPT_E_IO;
		ret = ckpt_step_rollback_rec(cs, prev, ch, rec, rec + CKPT_BLOCK,
					     rec + l->record_bytes);
		if (ret < 0) {
			ckpt_rec_committed(prev, ch, &want);
			f->rec = ckpt_rec_check(rec, rec + CKPT_BLOCK, rec + l->record_bytes, &want,
						cs->sb->feature_incompat, &f->got);
			f->got_valid = !ckpt_rec_decode(rec, &f->got);
			return ret;
		}
		if (ret) {
			f->part = CKPT_ROLLBACK_RESTAMP;
			*io = ops->write(cs->host, rec, off, CKPT_BLOCK);
			if (*io)
				return -CKPT_E_IO;
			f->part = CKPT_ROLLBACK_RECORD;
		}
	}
	return 0;
}

int ckpt_step_rollback(struct ckpt_step *cs, u64 step, struct ckpt_rollback_fault *f,
		       int *io_errno)
{
	const struct ckpt_step_ops *ops = cs->ops;
	struct ckpt_sb *prev;
	u8 *rec;
	int ret, io = 0;

	memset(f, 0, sizeof(*f));
	if (!ops->write || !ops->alloc)
		return -CKPT_E_OPCODE;
	prev = ops->alloc(cs->host, sizeof(*prev));
	rec = ops->alloc(cs->host, cs->regions.record_bytes + cs->regions.plo_chunk_bytes);
	if (!prev || !rec) {
		f->part = CKPT_ROLLBACK_NOMEM;
		ret = -CKPT_E_NOMEM;
		goto out;
	}
	ret = rollback_older(cs, step, prev, f, &io);
	if (!ret)
		ret = rollback_records(cs, prev, rec, f, &io);
	if (!ret) {
		f->part = CKPT_ROLLBACK_COMMIT;
		io = ckpt_step_rollback_commit(cs, prev);
		ret = io ? -CKPT_E_IO : 0;
	}
	if (!ret)
		f->part = CKPT_ROLLBACK_OK;
out:
	f->io_errno = io;
	if (io_errno)
		*io_errno = io;
	if (rec)
		ops->free(cs->host, rec);
	if (prev)
		ops->free(cs->host, prev);
	return ret;
}
