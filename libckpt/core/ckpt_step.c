// SPDX-License-Identifier: GPL-2.0 OR MIT
/*
 * The step protocol over a host's ops: gradient writes (their pre-check,
 * sector coverage, staging, dispatch), the commit order (flush, then the
 * superblock with FUA), and the execution of commands. See ckpt_step.h.
 *
 * No I/O, no allocation, no float (fp32 values are checked as bit patterns).
 */
#include "ckpt_step_impl.h"
#include "ckpt_update.h"

/* ---------------- sector coverage ---------------- */

/* The bits of word w that lie in the sector range [first, end), or 0. */
static u64 ckpt_range_mask(u32 w, u32 first, u32 end)
{
	u64 wlo = (u64)w << 6, whi = wlo + 64;
	u64 lo = first > wlo ? first : wlo;
	u64 hi = end < whi ? end : whi;
	u64 m;

	if (lo >= hi)
		return 0;
	m = ~(u64)0 << (lo - wlo);
	if (hi - wlo < 64)
		m &= ((u64)1 << (hi - wlo)) - 1;
	return m;
}

int ckpt_cover_add(u64 *bits, u32 n_sectors, u32 first, u32 count)
{
	u32 end, w, w0, w1;

	if ((u64)first + count > n_sectors)
		return -CKPT_E_RANGE;
	if (!count)
		return 0;
	end = first + count;
	w0 = first >> 6;
	w1 = (end - 1) >> 6;
	for (w = w0; w <= w1; w++)
		if (bits[w] & ckpt_range_mask(w, first, end))
			return -CKPT_E_TWICE;
	for (w = w0; w <= w1; w++)
		bits[w] |= ckpt_range_mask(w, first, end);
	return 0;
}

bool ckpt_cover_full(const u64 *bits, u32 n_sectors)
{
	u32 w, words = n_sectors >> 6;
	u32 rest = n_sectors & 63;

	for (w = 0; w < words; w++)
		if (bits[w] != ~(u64)0)
			return false;
	if (rest) {
		u64 m = ((u64)1 << rest) - 1;

		if ((bits[words] & m) != m)
			return false;
	}
	return true;
}

/* ---------------- the step protocol ---------------- */

u32 ckpt_stage_count(u64 staging_bytes, u64 chunk_bytes, u32 n_chunks)
{
	/* chunk_bytes is a power of two: a shift, no 64-bit division */
	u64 n = chunk_bytes ? staging_bytes >> __builtin_ctzll(chunk_bytes) : 0;
	u64 hi = n_chunks > 2 ? n_chunks : 2;

	if (n < 2)
		n = 2;
	return (u32)(n > hi ? hi : n);
}

void ckpt_step_release_stages(struct ckpt_step *cs)
{
	u32 i, words = ckpt_bitmap_words(cs->sectors);

	for (i = 0; i < cs->mem.n_stages; i++) {
		struct ckpt_stage_buf *s = &cs->mem.stages[i];

		if (s->chunk != CKPT_STAGE_FREE)
			cs->mem.stage_of[s->chunk] = CKPT_STAGE_FREE;
		s->chunk = CKPT_STAGE_FREE;
		s->done_next = CKPT_STAGE_FREE;
		memset(s->cover, 0, words * sizeof(u64));
	}
	cs->free_stages = cs->mem.n_stages;
	cs->done_first = CKPT_STAGE_FREE;
}

void ckpt_step_init(struct ckpt_step *cs, const struct ckpt_step_ops *ops, void *host,
		    struct ckpt_sb *sb, const struct ckpt_step_mem *mem)
{
	u32 i;

	memset(cs, 0, sizeof(*cs));
	cs->ops = ops;
	cs->host = host;
	cs->sb = sb;
	cs->mem = *mem;
	cs->chunk_bytes = sb->regions.plo_chunk_bytes;
	cs->cb_shift = sb->geo.chunk_shift + 1;	/* 2 bytes per param */
	cs->sectors = (u32)(cs->chunk_bytes >> 9);
	cs->regions = sb->regions;
	ckpt_sm_init(&cs->sm, sb, mem->claimed, mem->applied);
	for (i = 0; i < sb->geo.n_chunks; i++)
		mem->stage_of[i] = CKPT_STAGE_FREE;
	for (i = 0; i < mem->n_stages; i++)
		mem->stages[i].chunk = CKPT_STAGE_FREE;
	ckpt_step_release_stages(cs);
}

void ckpt_step_restart(struct ckpt_step *cs)
{
	ckpt_step_release_stages(cs);
	ckpt_sm_clear_bitmaps(&cs->sm, cs->mem.claimed, cs->mem.applied);
	cs->ops->lock(cs->host);
	ckpt_sm_init(&cs->sm, cs->sb, NULL, NULL);
	cs->sm.claimed = cs->mem.claimed;
	cs->sm.applied = cs->mem.applied;
	cs->ops->unlock(cs->host);
}

static bool ckpt_cover_any(const u64 *bits, u32 first, u32 count)
{
	u32 s;

	for (s = first; s < first + count; s++)
		if (ckpt_bit_test(bits, s))
			return true;
	return false;
}

/* Every piece of a gradient write, before anything changes. Under the sm lock. */
static int __ckpt_grad_check(const struct ckpt_step *cs, u64 off, u64 len)
{
	const struct ckpt_step_sm *sm = &cs->sm;
	const u64 cb = cs->chunk_bytes;
	u32 free = cs->free_stages;

	if (sm->state == CKPT_STATE_FAILED)
		return -CKPT_E_FAILED;
	if (sm->state != CKPT_STATE_OPEN)
		return -CKPT_E_STATE;
	if ((off | len) & (CKPT_SECTOR - 1) ||
	    off > ((u64)sm->n_chunks << cs->cb_shift) ||
	    len > ((u64)sm->n_chunks << cs->cb_shift) - off)
		return -CKPT_E_RANGE;
	while (len) {
		u32 chunk = (u32)(off >> cs->cb_shift);
		u64 in = off & (cb - 1);
		u64 n = len < cb - in ? len : cb - in;
		u32 si = cs->mem.stage_of[chunk];

		if (ckpt_bit_test(sm->claimed, chunk))
			return -CKPT_E_TWICE;
		if (n == cb) {
			/* A whole chunk over sectors already staged: written twice. */
			if (si != CKPT_STAGE_FREE)
				return -CKPT_E_TWICE;
		} else if (si == CKPT_STAGE_FREE) {
			if (!free)
				return -CKPT_E_NOSPC;
			free--;
		} else if (ckpt_cover_any(cs->mem.stages[si].cover, (u32)(in >> 9),
					  (u32)(n >> 9))) {
			return -CKPT_E_TWICE;
		}
		off += n;
		len -= n;
	}
	return 0;
}

static struct ckpt_stage_buf *ckpt_stage_take(struct ckpt_step *cs, u32 chunk)
{
	u32 i, si = cs->mem.stage_of[chunk];

	if (si != CKPT_STAGE_FREE)
		return &cs->mem.stages[si];
	for (i = 0; i < cs->mem.n_stages; i++) {
		if (cs->mem.stages[i].chunk == CKPT_STAGE_FREE) {
			cs->mem.stages[i].chunk = chunk;
			cs->mem.stage_of[chunk] = i;
			cs->free_stages--;
			return &cs->mem.stages[i];
		}
	}
	return NULL;	/* cannot happen: checked */
}

static int ckpt_step_claim(struct ckpt_step *cs, u32 chunk)
{
	int ret;

	cs->ops->lock(cs->host);
	ret = ckpt_sm_claim(&cs->sm, chunk);
	cs->ops->unlock(cs->host);
	return ret;
}

int ckpt_step_grad_write(struct ckpt_step *cs, u64 off, u64 len, void *src)
{
	const u64 cb = cs->chunk_bytes;
	u32 words = ckpt_bitmap_words(cs->sectors);
	int ret, err = 0;

	cs->ops->lock(cs->host);
	ret = __ckpt_grad_check(cs, off, len);
	if (ret)
		ckpt_sm_rejected(&cs->sm, ret);
	else
		cs->grad_bytes += len;
	cs->ops->unlock(cs->host);
	if (ret)
		return ret;

	cs->done_first = CKPT_STAGE_FREE;
	while (len && !err) {
		u32 chunk = (u32)(off >> cs->cb_shift);
		u64 in = off & (cb - 1);
		u64 n = len < cb - in ? len : cb - in;
		struct ckpt_stage_buf *s;

		if (n == cb) {
			err = ckpt_step_claim(cs, chunk);
			if (!err)
				err = cs->ops->dispatch(cs->host, src, chunk, NULL);
		} else {
			s = ckpt_stage_take(cs, chunk);
			if (!s) {	/* cannot happen: the check counted the stages */
				err = -CKPT_E_NOSPC;
				break;
			}
			cs->ops->copy(cs->host, src, s->grad + in, n);
			ckpt_cover_add(s->cover, cs->sectors, (u32)(in >> 9), (u32)(n >> 9));
			if (ckpt_cover_full(s->cover, cs->sectors)) {
				s->done_next = cs->done_first;
				cs->done_first = (u32)(s - cs->mem.stages);
				err = ckpt_step_claim(cs, chunk);
				if (!err)
					err = cs->ops->dispatch(cs->host, src, chunk, s->grad);
			}
		}
		off += n;
		len -= n;
	}
	if (cs->ops->dispatched) {
		ret = cs->ops->dispatched(cs->host, src);
		if (!err)
			err = ret;
	}
	/* The completed stages are free again. */
	while (cs->done_first != CKPT_STAGE_FREE) {
		struct ckpt_stage_buf *s = &cs->mem.stages[cs->done_first];

		cs->done_first = s->done_next;
		cs->mem.stage_of[s->chunk] = CKPT_STAGE_FREE;
		s->chunk = CKPT_STAGE_FREE;
		s->done_next = CKPT_STAGE_FREE;
		memset(s->cover, 0, words * sizeof(u64));
		cs->free_stages++;
	}
	return err;
}

int ckpt_sb_commit(const struct ckpt_step_ops *ops, void *host, struct ckpt_sb *sb,
		   struct ckpt_sb *spare, void *block, u64 step, u32 slot, const void *blob,
		   u32 blob_len, bool *issued)
{
	int ret;

	if (issued)
		*issued = false;
	if (ckpt_sb_next(sb, step, slot, blob, blob_len, spare))
		return -CKPT_EIO_ERRNO;
	/* Every write the superblock commits is complete; make them durable first. */
	ret = ops->flush(host);
	if (ret)
		return ret;
	memset(block, 0, CKPT_BLOCK);
	if (ckpt_sb_encode(spare, block))
		return -CKPT_EIO_ERRNO;
	if (issued)
		*issued = true;
	ret = ops->write_sb(host, block, ckpt_sb_next_offset(sb));
	if (ret)
		return ret;
	if (ops->read) {
		const u32 crc = ckpt_crc32c(block, CKPT_BLOCK);

		ret = ops->read(host, block, ckpt_sb_next_offset(sb), CKPT_BLOCK);
		if (ret)
			return ret;
		if (ckpt_crc32c(block, CKPT_BLOCK) != crc)
			return -CKPT_EIO_ERRNO;
	}
	*sb = *spare;
	return 0;
}

/*
 * A superblock write failed with io: the machine enters FAILED, and the host
 * hears of it once (ops->failed), however many commits fail.
 */
void ckpt_step_sb_failed(struct ckpt_step *cs, int io)
{
	bool entered;

	cs->ops->lock(cs->host);
	entered = cs->sm.state != CKPT_STATE_FAILED;
	if (entered)
		ckpt_sm_commit_failed(&cs->sm, io);
	cs->ops->unlock(cs->host);
	if (entered && cs->ops->failed)
		cs->ops->failed(cs->host, io);
}

int ckpt_step_write_sb(struct ckpt_step *cs, u64 step, u32 slot, const void *blob,
		       u32 blob_len)
{
	bool issued;
	int ret = ckpt_sb_commit(cs->ops, cs->host, cs->sb, cs->mem.spare, cs->mem.block, step,
				 slot, blob, blob_len, &issued);

	/*
	 * Once the write is issued, a failure says nothing of what the device
	 * holds (a write it kept, a read-back that failed): it may name the
	 * new commit, whose slot the machine takes for free. Going on from
	 * *cs->sb could overwrite the committed state; only a reload that
	 * reads the device again knows which commit stands.
	 */
	if (ret && issued)
		ckpt_step_sb_failed(cs, ret);
	return ret;
}

/*
 * BEGIN: check under the sm lock, clear the bitmaps without it (nothing reads
 * them outside an open step, and the command lock keeps other commands and
 * claims out), then check again and open the step under it.
 */
static int ckpt_step_begin(struct ckpt_step *cs, const struct ckpt_cmd *cmd)
{
	const struct ckpt_step_ops *ops = cs->ops;
	u32 dst;
	int ret;

	ops->lock(cs->host);
	ret = ckpt_sm_begin_check(&cs->sm, cmd);
	if (ret)
		ckpt_sm_rejected(&cs->sm, ret);
	ops->unlock(cs->host);
	if (ret)
		return ret;

	ckpt_sm_clear_bitmaps(&cs->sm, cs->mem.claimed, cs->mem.applied);
	if (cs->mem.modes)
		memset(cs->mem.modes, 0, ckpt_step_blocks(&cs->regions));
	cs->n_bias = 0;

	ops->lock(cs->host);
	ret = ckpt_sm_begin_check(&cs->sm, cmd);
	if (ret)
		ckpt_sm_rejected(&cs->sm, ret);
	else
		ckpt_sm_begin_open(&cs->sm, cmd);
	dst = ckpt_sm_dst_slot(&cs->sm);
	ops->unlock(cs->host);
	if (ret)
		return ret;
	if (ops->quiesce)
		ops->quiesce(cs->host, dst);
	return 0;
}

/* ROLLBACK (ckpt_step_rollback); a refusal is recorded here, as every command's. */
static int ckpt_step_exec_rollback(struct ckpt_step *cs, const struct ckpt_cmd *cmd, int *io_errno)
{
	int ret = ckpt_step_rollback(cs, cmd->step, &cs->rollback, io_errno);

	if (ret < 0 && ret != -CKPT_E_IO) {
		cs->ops->lock(cs->host);
		ckpt_sm_rejected(&cs->sm, ret);
		cs->ops->unlock(cs->host);
	}
	return ret;
}

int ckpt_step_exec(struct ckpt_step *cs, const struct ckpt_cmd *cmd, int *io_errno)
{
	const struct ckpt_step_ops *ops = cs->ops;
	u64 step = 0, sumsq = 0;
	u32 slot = 0;
	int ret, io;

	cs->rollback.part = CKPT_ROLLBACK_OK;
	if (cmd->opcode == CKPT_OP_RANGE)
		return ckpt_step_range(cs, cmd);
	/* Everything dispatched before the command is on the device first. */
	if (ops->drain)
		ops->drain(cs->host);
	if (cmd->opcode == CKPT_OP_BEGIN)
		return ckpt_step_begin(cs, cmd);
	if (cmd->opcode == CKPT_OP_ROLLBACK)
		return ckpt_step_exec_rollback(cs, cmd, io_errno);
	/*
	 * The step's gradient sum, in chunk order, before the lock (the updates
	 * are drained: the chunks' sums stand); used only if COMMIT ends the step.
	 */
	if (cmd->opcode == CKPT_OP_COMMIT && cs->mem.sumsq) {
		if (ops->fpu_begin)
			ops->fpu_begin(cs->host);
		sumsq = ckpt_sum_f64(cs->mem.sumsq, cs->sm.n_chunks);
		if (ops->fpu_end)
			ops->fpu_end(cs->host);
	}
	ops->lock(cs->host);
	switch (cmd->opcode) {
	case CKPT_OP_ABORT:
		ret = ckpt_sm_abort(&cs->sm, cmd);
		break;
	case CKPT_OP_COMMIT:
		ret = ckpt_sm_commit(&cs->sm, cmd);
		step = cs->sm.open_step;
		slot = ckpt_sm_dst_slot(&cs->sm);
		if (ret >= 0 && cs->mem.sumsq) {
			cs->sm.grad_sumsq = sumsq;
			cs->sm.grad_sumsq_step = step;
		}
		break;
	default:
		ret = -CKPT_E_OPCODE;
		break;
	}
	if (ret < 0)
		ckpt_sm_rejected(&cs->sm, ret);
	ops->unlock(cs->host);
	if (ret < 0)
		return ret;

	if (cmd->opcode == CKPT_OP_ABORT || ret == CKPT_RESULT_OVERFLOW) {
		ckpt_step_release_stages(cs);
	} else if (ret == CKPT_RESULT_COMMITTED) {
		io = ckpt_step_write_sb(cs, step, slot, cmd->blob, cmd->blob_len);
		if (io) {
			/* even before the superblock write: the step cannot commit */
			ckpt_step_sb_failed(cs, io);
			if (io_errno)
				*io_errno = io;
			return -CKPT_E_IO;
		}
		ops->lock(cs->host);
		ckpt_sm_committed(&cs->sm);
		ops->unlock(cs->host);
		ckpt_step_release_stages(cs);
	}
	return ret;
}

int ckpt_step_command(struct ckpt_step *cs, const void *buf, u32 len)
{
	int ret;

	cs->rollback.part = CKPT_ROLLBACK_OK;
	ret = ckpt_cmd_decode(buf, len, cs->mem.cmd);
	if (ret < 0) {
		cs->ops->lock(cs->host);
		ckpt_sm_rejected(&cs->sm, ret);
		cs->ops->unlock(cs->host);
		return ret;
	}
	return ckpt_step_exec(cs, cs->mem.cmd, NULL);
}
