// SPDX-License-Identifier: GPL-2.0 OR MIT
/*
 * Rollback: when the previous step may be committed again, the re-stamp of
 * each record of the other slot, and its commit.
 *
 * No I/O, no allocation, no float (fp32 values are checked as bit patterns).
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
