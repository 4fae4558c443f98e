// SPDX-License-Identifier: GPL-2.0 OR MIT
/*
 * The step state machine shared by the kernel target and the userspace
 * engine. See ckpt_step.h. Every entry point that can refuse checks all its
 * preconditions before it changes anything, so a refused command leaves the
 * machine exactly as it was; the host then calls ckpt_sm_rejected().
 *
 * No I/O, no allocation, no float (fp32 values are checked as bit patterns).
 */
#include "ckpt_step.h"

#define CKPT_EIO_ERRNO	5	/* EIO, for a failure reported without an errno */

#define CKPT_F32_EXP	0x7f800000u
#define CKPT_F32_SIGN	0x80000000u

/* Finite fp32 bit pattern: exponent not all ones (neither inf nor NaN). */
static bool ckpt_f32_finite(u32 bits)
{
	return (bits & CKPT_F32_EXP) != CKPT_F32_EXP;
}

static bool ckpt_bit_test(const u64 *bits, u32 i)
{
	return (bits[i >> 6] >> (i & 63)) & 1;
}

static void ckpt_bit_set(u64 *bits, u32 i)
{
	bits[i >> 6] |= (u64)1 << (i & 63);
}

static void ckpt_bits_clear(u64 *bits, u32 n_bits)
{
	if (bits)
		memset(bits, 0, ckpt_bitmap_words(n_bits) * sizeof(u64));
}

void ckpt_sm_init(struct ckpt_step_sm *sm, const struct ckpt_sb *sb,
		  u64 *claimed, u64 *applied)
{
	memset(sm, 0, sizeof(*sm));
	sm->state = CKPT_STATE_IDLE;
	sm->n_chunks = sb->geo.n_chunks;
	sm->n_groups = sb->geo.n_groups;
	sm->committed_slot = sb->committed_slot & 1;
	sm->committed_step = sb->committed_step;
	sm->claimed = claimed;
	sm->applied = applied;
	ckpt_bits_clear(claimed, sm->n_chunks);
	ckpt_bits_clear(applied, sm->n_chunks);
	sm->last_result = CKPT_RESULT_NONE;
}

/* >= 0 (+0 or -0 included), finite */
static bool ckpt_f32_nonneg(u32 bits)
{
	return ckpt_f32_finite(bits) && (!(bits & CKPT_F32_SIGN) || bits == CKPT_F32_SIGN);
}

/*
 * Non-negative finite floats order like their bit patterns, so the ranges are
 * integer comparisons.
 */
#define CKPT_F32_ONE	0x3f800000u

/* in [0, 1] */
static bool ckpt_f32_unit(u32 bits)
{
	return ckpt_f32_nonneg(bits) && (bits & ~CKPT_F32_SIGN) <= CKPT_F32_ONE;
}

/* in (0, 1] */
static bool ckpt_f32_unit_pos(u32 bits)
{
	return !(bits & CKPT_F32_SIGN) && bits != 0 && bits <= CKPT_F32_ONE;
}

int ckpt_hparams_check(const struct ckpt_hparams *h, const char **field)
{
	const char *bad = NULL;

	if (!ckpt_f32_nonneg(h->lr))
		bad = "lr";
	else if (!ckpt_f32_unit(h->beta1))
		bad = "beta1";
	else if (!ckpt_f32_unit(h->beta2))
		bad = "beta2";
	else if (!ckpt_f32_nonneg(h->eps))
		bad = "eps";
	else if (!ckpt_f32_nonneg(h->weight_decay))
		bad = "weight_decay";
	else if (!ckpt_f32_unit_pos(h->one_minus_beta1))
		bad = "one_minus_beta1";
	else if (!ckpt_f32_unit_pos(h->one_minus_beta2))
		bad = "one_minus_beta2";
	else if (!ckpt_f32_nonneg(h->step_size))
		bad = "step_size";
	else if (!ckpt_f32_unit_pos(h->bc2_sqrt))
		bad = "bc2_sqrt";
	else if (!ckpt_f32_finite(h->decay))
		bad = "decay";
	else if (h->flags & ~CKPT_GROUP_ADAM_L2)
		bad = "flags";
	if (!bad)
		return 0;
	if (field)
		*field = bad;
	return -CKPT_E_HPARAM;
}

int ckpt_sm_begin(struct ckpt_step_sm *sm, const struct ckpt_cmd *cmd)
{
	u32 i, gs = cmd->grad_scale;
	int ret;

	if (cmd->opcode != CKPT_OP_BEGIN)
		return -CKPT_E_OPCODE;
	if (sm->state == CKPT_STATE_FAILED)
		return -CKPT_E_FAILED;
	if (sm->state != CKPT_STATE_IDLE)
		return -CKPT_E_STATE;
	if (cmd->step != sm->committed_step + 1 || cmd->step == 0)
		return -CKPT_E_STEP;
	if (cmd->n_groups != sm->n_groups || cmd->n_groups > CKPT_MAX_GROUPS)
		return -CKPT_E_GROUPS;
	/* grad_scale: finite and > 0 (no sign bit, not +0). */
	if (!ckpt_f32_finite(gs) || (gs & CKPT_F32_SIGN) || gs == 0)
		return -CKPT_E_HPARAM;
	for (i = 0; i < cmd->n_groups; i++) {
		ret = ckpt_hparams_check(&cmd->groups[i], NULL);
		if (ret)
			return ret;
	}

	ckpt_bits_clear(sm->claimed, sm->n_chunks);
	ckpt_bits_clear(sm->applied, sm->n_chunks);
	sm->chunks_claimed = 0;
	sm->chunks_applied = 0;
	sm->overflow = 0;
	sm->grad_scale = gs;
	memset(sm->groups, 0, sizeof(sm->groups));
	for (i = 0; i < cmd->n_groups; i++)
		sm->groups[i] = cmd->groups[i];
	sm->open_step = cmd->step;
	sm->state = CKPT_STATE_OPEN;
	sm->last_result = CKPT_RESULT_NONE;
	sm->last_error = CKPT_OK;
	return 0;
}

int ckpt_sm_claim(struct ckpt_step_sm *sm, u32 chunk)
{
	if (sm->state == CKPT_STATE_FAILED)
		return -CKPT_E_FAILED;
	if (sm->state != CKPT_STATE_OPEN)
		return -CKPT_E_STATE;
	if (chunk >= sm->n_chunks)
		return -CKPT_E_RANGE;
	if (ckpt_bit_test(sm->claimed, chunk))
		return -CKPT_E_TWICE;
	ckpt_bit_set(sm->claimed, chunk);
	sm->chunks_claimed++;
	return 0;
}

/*
 * A chunk's update finished. written: its new state (p_lo and record) is on
 * the backing device in the destination slot; the host may skip writing once
 * the step has overflowed. Calls that do not match a claim of the open step
 * (a late completion after ABORT, a host bug) are ignored.
 */
void ckpt_sm_applied(struct ckpt_step_sm *sm, u32 chunk, bool nonfinite, bool written)
{
	if (sm->state != CKPT_STATE_OPEN || chunk >= sm->n_chunks)
		return;
	if (!ckpt_bit_test(sm->claimed, chunk) ||
	    ckpt_bit_test(sm->applied, chunk) ||
	    sm->chunks_applied >= sm->chunks_claimed)
		return;
	if (nonfinite)
		sm->overflow = 1;
	if (written)
		ckpt_bit_set(sm->applied, chunk);
	sm->chunks_applied++;
}

int ckpt_sm_commit(struct ckpt_step_sm *sm, const struct ckpt_cmd *cmd)
{
	if (cmd->opcode != CKPT_OP_COMMIT)
		return -CKPT_E_OPCODE;
	if (sm->state == CKPT_STATE_FAILED)
		return -CKPT_E_FAILED;
	if (sm->state != CKPT_STATE_OPEN)
		return -CKPT_E_STATE;
	if (cmd->step != sm->open_step)
		return -CKPT_E_STEP;
	if (sm->chunks_applied < sm->n_chunks)
		return -CKPT_E_INCOMPLETE;
	if (cmd->blob_len > CKPT_BLOB_MAX)
		return -CKPT_E_BLOB;

	if (sm->overflow) {
		sm->steps_skipped++;
		sm->state = CKPT_STATE_IDLE;
		sm->last_result = CKPT_RESULT_OVERFLOW;
		sm->last_error = CKPT_OK;
		return CKPT_RESULT_OVERFLOW;
	}
	/* The host now flushes, writes the superblock, then ckpt_sm_committed(). */
	return CKPT_RESULT_COMMITTED;
}

void ckpt_sm_committed(struct ckpt_step_sm *sm)
{
	if (sm->state != CKPT_STATE_OPEN)
		return;
	sm->committed_step = sm->open_step;
	sm->committed_slot ^= 1;
	sm->steps_committed++;
	sm->state = CKPT_STATE_IDLE;
	sm->last_result = CKPT_RESULT_COMMITTED;
	sm->last_error = CKPT_OK;
}

void ckpt_sm_commit_failed(struct ckpt_step_sm *sm, int io_errno)
{
	ckpt_sm_fail(sm, io_errno);
}

int ckpt_sm_abort(struct ckpt_step_sm *sm, const struct ckpt_cmd *cmd)
{
	if (cmd->opcode != CKPT_OP_ABORT)
		return -CKPT_E_OPCODE;
	if (sm->state == CKPT_STATE_FAILED)
		return -CKPT_E_FAILED;
	if (sm->state != CKPT_STATE_OPEN)
		return -CKPT_E_STATE;
	/* Step 0 means "whatever step is open". */
	if (cmd->step != 0 && cmd->step != sm->open_step)
		return -CKPT_E_STEP;
	sm->steps_aborted++;
	sm->state = CKPT_STATE_IDLE;
	sm->last_result = CKPT_RESULT_ABORTED;
	sm->last_error = CKPT_OK;
	return 0;
}

void ckpt_sm_fail(struct ckpt_step_sm *sm, int io_errno)
{
	u32 e;

	if (io_errno < 0)
		e = -(u32)io_errno;
	else
		e = (u32)io_errno;
	if (!e)
		e = CKPT_EIO_ERRNO;
	if (!sm->first_io_error)
		sm->first_io_error = e;
	sm->io_errors++;
	sm->state = CKPT_STATE_FAILED;
}

void ckpt_sm_rejected(struct ckpt_step_sm *sm, int err)
{
	if (err < 0)
		err = -err;
	sm->last_error = (u32)err;
	sm->last_result = CKPT_RESULT_REJECTED;
	sm->commands_rejected++;
}

u32 ckpt_sm_read_slot(const struct ckpt_step_sm *sm, u32 chunk)
{
	if (sm->state == CKPT_STATE_OPEN && chunk < sm->n_chunks &&
	    ckpt_bit_test(sm->applied, chunk))
		return ckpt_sm_dst_slot(sm);
	return ckpt_sm_src_slot(sm);
}

void ckpt_sm_status(const struct ckpt_step_sm *sm, const struct ckpt_sb *sb,
		    struct ckpt_status *st)
{
	bool open = sm->state == CKPT_STATE_OPEN;

	memset(st, 0, sizeof(*st));
	st->state = sm->state;
	st->last_result = sm->last_result;
	st->last_error = sm->last_error;
	st->first_io_error = sm->first_io_error;
	st->committed_step = sm->committed_step;
	st->open_step = open ? sm->open_step : 0;
	st->committed_slot = sm->committed_slot;
	st->overflow = open ? sm->overflow : 0;
	st->chunks_done = open ? sm->chunks_applied : 0;
	st->steps_committed = sm->steps_committed;
	st->steps_skipped = sm->steps_skipped;
	st->steps_aborted = sm->steps_aborted;
	st->commands_rejected = sm->commands_rejected;
	st->io_errors = sm->io_errors;
	/* grad_bytes and param_bytes are the host's counters: it fills them. */
	if (sb) {
		st->geo = sb->geo;
		st->blob_len = sb->blob_len <= CKPT_BLOB_MAX ? sb->blob_len : 0;
		memcpy(st->blob, sb->blob, st->blob_len);
	}
}

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
