// SPDX-License-Identifier: GPL-2.0 OR MIT
/*
 * The step state machine (BEGIN, claims, COMMIT, ABORT, failure, refusals)
 * and the counters the status page reports, shared by the kernel target and
 * the userspace engine. See ckpt_step.h. Every entry point that can refuse
 * checks all its preconditions before it changes anything, so a refused
 * command leaves the machine exactly as it was; the host then calls
 * ckpt_sm_rejected().
 *
 * No I/O, no allocation, no float (fp32 values are checked as bit patterns).
 */
#include "ckpt_step_impl.h"

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

int ckpt_sm_begin_check(const struct ckpt_step_sm *sm, const struct ckpt_cmd *cmd)
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
	return 0;
}

void ckpt_sm_clear_bitmaps(struct ckpt_step_sm *sm, u64 *claimed, u64 *applied)
{
	ckpt_bits_clear(claimed, sm->n_chunks);
	ckpt_bits_clear(applied, sm->n_chunks);
}

void ckpt_sm_begin_open(struct ckpt_step_sm *sm, const struct ckpt_cmd *cmd)
{
	u32 i;

	sm->chunks_claimed = 0;
	sm->chunks_applied = 0;
	sm->overflow = 0;
	sm->count_fault = 0;
	sm->grad_scale = cmd->grad_scale;
	memset(sm->groups, 0, sizeof(sm->groups));
	for (i = 0; i < cmd->n_groups; i++)
		sm->groups[i] = cmd->groups[i];
	sm->open_step = cmd->step;
	sm->state = CKPT_STATE_OPEN;
	sm->last_result = CKPT_RESULT_NONE;
	sm->last_error = CKPT_OK;
}

int ckpt_sm_begin(struct ckpt_step_sm *sm, const struct ckpt_cmd *cmd)
{
	int ret = ckpt_sm_begin_check(sm, cmd);

	if (ret)
		return ret;
	ckpt_sm_clear_bitmaps(sm, sm->claimed, sm->applied);
	ckpt_sm_begin_open(sm, cmd);
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

void ckpt_sm_count_fault(struct ckpt_step_sm *sm, u32 chunk)
{
	if (sm->state != CKPT_STATE_OPEN || chunk >= sm->n_chunks ||
	    !ckpt_bit_test(sm->claimed, chunk) || ckpt_bit_test(sm->applied, chunk) ||
	    sm->chunks_applied >= sm->chunks_claimed)
		return;
	sm->count_fault = 1;
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
	if (sm->count_fault)
		return -CKPT_E_STEP;

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

void ckpt_sm_counters(const struct ckpt_step_sm *sm, u64 grad_bytes, u64 param_bytes,
		      struct ckpt_counters *k)
{
	bool open = sm->state == CKPT_STATE_OPEN;

	memset(k, 0, sizeof(*k));
	k->state = sm->state;
	k->committed_step = sm->committed_step;
	k->open_step = open ? sm->open_step : 0;
	k->chunks_done = open ? sm->chunks_applied : 0;
	k->overflow = open ? sm->overflow : 0;
	k->last_result = sm->last_result;
	k->last_error = sm->last_error;
	k->first_io_error = sm->first_io_error;
	k->steps_committed = sm->steps_committed;
	k->steps_skipped = sm->steps_skipped;
	k->steps_aborted = sm->steps_aborted;
	k->commands_rejected = sm->commands_rejected;
	k->grad_bytes = grad_bytes;
	k->param_bytes = param_bytes;
	k->io_errors = sm->io_errors;
	k->committed_slot = sm->committed_slot;
}

/* The status page's counters are k's, field by field of the list. */
static void ckpt_counters_to_status(const struct ckpt_counters *src, struct ckpt_status *dst)
{
	CKPT_STATUS_FIELDS(CKPT_ABI_COPY)
	dst->committed_slot = src->committed_slot;
}

void ckpt_sm_status(const struct ckpt_step_sm *sm, const struct ckpt_sb *sb,
		    struct ckpt_status *st)
{
	struct ckpt_counters k;

	ckpt_sm_counters(sm, 0, 0, &k);
	memset(st, 0, sizeof(*st));
	/* grad_bytes and param_bytes are the host's counters (0 here): it fills them. */
	ckpt_counters_to_status(&k, st);
	st->grad_sumsq = sm->grad_sumsq;
	st->grad_sumsq_step = sm->grad_sumsq_step;
	if (sb) {
		st->geo = sb->geo;
		st->blob_len = sb->blob_len <= CKPT_BLOB_MAX ? sb->blob_len : 0;
		memcpy(st->blob, sb->blob, st->blob_len);
	}
}
