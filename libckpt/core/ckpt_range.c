// SPDX-License-Identifier: GPL-2.0 OR MIT
/*
 * Block counts: the RANGE command (skip, per-block bias correction), the
 * runs of a chunk's update, the check and advance of a record's counts.
 *
 * No I/O, no allocation, no float (fp32 values are checked as bit patterns).
 */
#include "ckpt_step_impl.h"
#define CKPT_UPDATE_INT_ONLY
#include "ckpt_update_impl.h"

/* ---------------- block counts: RANGE and the update's runs ---------------- */

static bool ckpt_counts(const struct ckpt_step *cs)
{
	return cs->sb->feature_incompat & CKPT_FEATURE_INCOMPAT_COUNTS;
}

/* Blocks per chunk, as a shift. */
static u32 ckpt_bpc_shift(const struct ckpt_step *cs)
{
	return cs->sb->geo.chunk_shift - CKPT_BLOCK_SHIFT;
}

/* Every range of a RANGE command, before anything changes. */
static int ckpt_range_check(const struct ckpt_step *cs, const struct ckpt_cmd *cmd)
{
	const u64 window = cs->regions.window_bytes;
	const u32 bpc = ckpt_bpc_shift(cs);
	u32 i, k, n_bias = cs->n_bias;

	for (i = 0; i < cmd->n_ranges; i++) {
		const struct ckpt_range *r = &cmd->ranges[i];
		u64 b, first = r->off >> (CKPT_BLOCK_SHIFT + 1), end;

		if (r->flags & ~CKPT_RANGE_SKIP)
			return -CKPT_E_INVAL;
		if ((r->off | r->len) & (CKPT_BLOCK - 1))
			return -CKPT_E_ALIGN;
		if (!r->len || r->off >= window || r->len > window - r->off)
			return -CKPT_E_RANGE;
		end = first + (r->len >> (CKPT_BLOCK_SHIFT + 1));
		for (k = 0; k < i; k++) {	/* no block twice in one command */
			const struct ckpt_range *o = &cmd->ranges[k];

			if (r->off < o->off + o->len && o->off < r->off + r->len)
				return -CKPT_E_TWICE;
		}
		if (!(r->flags & CKPT_RANGE_SKIP)) {
			struct ckpt_hparams h = cs->sm.groups[0];

			/* a block's count reaches at most the open step */
			if (!r->count || r->count > cs->sm.open_step)
				return -CKPT_E_STEP;
			h.step_size = r->step_size;
			h.bc2_sqrt = r->bc2_sqrt;
			if (ckpt_hparams_check(&h, NULL))
				return -CKPT_E_HPARAM;
			if (n_bias++ >= CKPT_BIAS_MAX)
				return -CKPT_E_NOSPC;
		}
		for (b = first; b < end; b++)
			if (cs->mem.modes[b] || ckpt_bit_test(cs->sm.claimed, (u32)(b >> bpc)))
				return -CKPT_E_TWICE;
	}
	return 0;
}

/*
 * RANGE: no drain (it changes no update in flight: a block it names must
 * not be claimed yet). The claimed bitmap changes only under the command
 * lock, which the caller holds, so the blocks are checked unlocked.
 */
int ckpt_step_range(struct ckpt_step *cs, const struct ckpt_cmd *cmd)
{
	u32 i;
	int ret = 0;

	cs->ops->lock(cs->host);
	if (cs->sm.state == CKPT_STATE_FAILED)
		ret = -CKPT_E_FAILED;
	else if (cs->sm.state != CKPT_STATE_OPEN)
		ret = -CKPT_E_STATE;
	else if (cmd->step != cs->sm.open_step)
		ret = -CKPT_E_STEP;
	else if (!ckpt_counts(cs) || !cs->mem.modes)
		ret = -CKPT_E_FEATURE;
	cs->ops->unlock(cs->host);
	if (!ret)
		ret = ckpt_range_check(cs, cmd);
	if (ret) {
		cs->ops->lock(cs->host);
		ckpt_sm_rejected(&cs->sm, ret);
		cs->ops->unlock(cs->host);
		return ret;
	}
	for (i = 0; i < cmd->n_ranges; i++) {
		const struct ckpt_range *r = &cmd->ranges[i];
		u8 mode = CKPT_MODE_SKIP;

		if (!(r->flags & CKPT_RANGE_SKIP)) {
			cs->bias[cs->n_bias].count = r->count;
			cs->bias[cs->n_bias].step_size = r->step_size;
			cs->bias[cs->n_bias].bc2_sqrt = r->bc2_sqrt;
			mode = (u8)(++cs->n_bias);
		}
		memset(cs->mem.modes + (r->off >> (CKPT_BLOCK_SHIFT + 1)), mode,
		       r->len >> (CKPT_BLOCK_SHIFT + 1));
	}
	return 0;
}

static u8 ckpt_block_mode(const struct ckpt_step *cs, u32 chunk, u32 block)
{
	if (!cs->mem.modes || !ckpt_counts(cs))
		return 0;
	return cs->mem.modes[((u64)chunk << ckpt_bpc_shift(cs)) + block];
}

bool ckpt_step_run(const struct ckpt_step *cs, u32 chunk, u32 group, u64 *pos,
		   struct ckpt_run *run)
{
	const u32 blocks = 1u << ckpt_bpc_shift(cs);
	u32 b = (u32)*pos, e;
	u8 mode;

	if (b >= blocks)
		return false;
	mode = ckpt_block_mode(cs, chunk, b);
	for (e = b + 1; e < blocks && ckpt_block_mode(cs, chunk, e) == mode; e++)
		;
	*pos = e;
	run->first = (u64)b << CKPT_BLOCK_SHIFT;
	run->n = (u64)(e - b) << CKPT_BLOCK_SHIFT;
	run->skip = mode == CKPT_MODE_SKIP;
	run->hp = cs->sm.groups[group];
	if (mode && !run->skip) {
		run->hp.step_size = cs->bias[mode - 1].step_size;
		run->hp.bc2_sqrt = cs->bias[mode - 1].bc2_sqrt;
	}
	return true;
}

int ckpt_step_counts(const struct ckpt_step *cs, u32 chunk, void *header)
{
	const u32 blocks = 1u << ckpt_bpc_shift(cs);
	u32 b;

	if (!ckpt_counts(cs))
		return 0;
	for (b = 0; b < blocks; b++) {
		u8 mode = ckpt_block_mode(cs, chunk, b);

		/* a skipped block has no count to reach (and no bias entry) */
		if (mode == CKPT_MODE_SKIP)
			continue;
		if (ckpt_rec_count(header, b) + 1 != (mode ? cs->bias[mode - 1].count : cs->sm.open_step))
			return -CKPT_E_STEP;
	}
	for (b = 0; b < blocks; b++)
		if (ckpt_block_mode(cs, chunk, b) != CKPT_MODE_SKIP)
			ckpt_rec_set_count(header, b, ckpt_rec_count(header, b) + 1);
	return 0;
}

void ckpt_round_params_int(u32 dtype, const u32 *p, u16 *plo, u64 n)
{
	u64 i;

	for (i = 0; i < n; i++)
		plo[i] = dtype == CKPT_DTYPE_BF16 ? ckpt_f32_to_bf16_int(p[i])
						  : ckpt_f32_to_f16_int(p[i]);
}
