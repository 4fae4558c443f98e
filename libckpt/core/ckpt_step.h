/* SPDX-License-Identifier: GPL-2.0 OR MIT */
/*
 * The step state machine of section 3 of the design, shared by the kernel
 * target and the userspace engine so both accept and refuse exactly the same
 * command streams. It does no I/O: the host applies chunks, writes the
 * superblock, and reports back.
 *
 *   IDLE --BEGIN(t = committed + 1)--> OPEN --claim/applied per chunk-->
 *   OPEN --COMMIT--> [all chunks applied]  overflow ? IDLE (skipped)
 *                                          : host writes superblock -> IDLE, committed = t
 *   OPEN --ABORT--> IDLE
 *   any  --I/O error--> FAILED (refuses new steps; committed state untouched)
 */
#ifndef CKPT_STEP_H
#define CKPT_STEP_H

#include "ckpt_format.h"

#ifdef __cplusplus
extern "C" {
#endif

/*
 * The largest step a load of state (import) may commit: each committed step
 * must leave room for the next one, BEGIN(committed + 1), and steps up to
 * 2^63 - 1 stay representable as signed 64-bit integers (Python, torch).
 */
#define CKPT_STEP_MAX 0x7fffffffffffffffULL

static inline u64 ckpt_bitmap_words(u64 bits)
{
	return (bits + 63) / 64;
}

struct ckpt_step_sm {
	u32 state;		/* enum ckpt_state */
	u32 n_chunks;
	u32 n_groups;
	u32 committed_slot;
	u64 committed_step;
	u64 open_step;
	u64 *claimed;		/* n_chunks bits: update dispatched this step */
	u64 *applied;		/* n_chunks bits: update written this step */
	u64 chunks_claimed;
	u64 chunks_applied;
	u32 overflow;
	u32 grad_scale;		/* fp32 bits */
	struct ckpt_hparams groups[CKPT_MAX_GROUPS];
	/* what the status page reports */
	u32 last_result;
	u32 last_error;
	u32 first_io_error;
	u64 steps_committed;
	u64 steps_skipped;
	u64 steps_aborted;
	u64 commands_rejected;
	u64 io_errors;
};

/*
 * claimed and applied are caller storage of ckpt_bitmap_words(n_chunks) words
 * each, so the core never allocates.
 */
void ckpt_sm_init(struct ckpt_step_sm *sm, const struct ckpt_sb *sb,
		  u64 *claimed, u64 *applied);

/*
 * The range check of one group's hyperparameters, on their fp32 bit patterns:
 * what torch.optim.AdamW refuses (lr, eps, weight_decay < 0; a beta outside
 * [0, 1)) and derived fields no valid input gives (1 - beta outside (0, 1],
 * bc2_sqrt outside (0, 1], step_size < 0), every field finite, known flags.
 * A beta may be 1.0f: the fp32 of a double just below 1, which torch takes;
 * 1 - beta, computed in double, is what must be positive. -0.0 counts as 0.
 * Returns 0, or -CKPT_E_HPARAM with *field naming the first bad field (as in
 * struct ckpt_hparams) when field is not NULL.
 */
int ckpt_hparams_check(const struct ckpt_hparams *h, const char **field);

/* BEGIN: state IDLE, step == committed + 1, n_groups matches, hparams valid. */
int ckpt_sm_begin(struct ckpt_step_sm *sm, const struct ckpt_cmd *cmd);
/* Before a chunk's update is dispatched: OPEN, in range, not yet claimed. */
int ckpt_sm_claim(struct ckpt_step_sm *sm, u32 chunk);
/* After the chunk's new state is on the backing device (or skipped on overflow). */
void ckpt_sm_applied(struct ckpt_step_sm *sm, u32 chunk, bool nonfinite, bool written);
/*
 * COMMIT: returns CKPT_RESULT_COMMITTED when the host must now flush and write
 * the superblock (then call ckpt_sm_committed), CKPT_RESULT_OVERFLOW when the
 * step was discarded (the machine is IDLE again), or -err with nothing changed.
 */
int ckpt_sm_commit(struct ckpt_step_sm *sm, const struct ckpt_cmd *cmd);
void ckpt_sm_committed(struct ckpt_step_sm *sm);
/* The superblock write failed: the machine fails, the old commit stands. */
void ckpt_sm_commit_failed(struct ckpt_step_sm *sm, int io_errno);
int ckpt_sm_abort(struct ckpt_step_sm *sm, const struct ckpt_cmd *cmd);
/* Any backing I/O error. */
void ckpt_sm_fail(struct ckpt_step_sm *sm, int io_errno);
/* Record that a command was refused with err (a positive enum ckpt_err). */
void ckpt_sm_rejected(struct ckpt_step_sm *sm, int err);

/* Slot whose p_lo a PARAM read of this chunk returns: latest applied values. */
u32 ckpt_sm_read_slot(const struct ckpt_step_sm *sm, u32 chunk);
/* Slot a step's update reads (committed) and writes (the other one). */
static inline u32 ckpt_sm_src_slot(const struct ckpt_step_sm *sm)
{
	return sm->committed_slot;
}

static inline u32 ckpt_sm_dst_slot(const struct ckpt_step_sm *sm)
{
	return sm->committed_slot ^ 1;
}

void ckpt_sm_status(const struct ckpt_step_sm *sm, const struct ckpt_sb *sb,
		    struct ckpt_status *st);

/*
 * Sector coverage of a partially written chunk (staging). bits holds
 * ckpt_bitmap_words(sectors) words. Adding an already covered sector fails
 * with -CKPT_E_TWICE and changes nothing.
 */
int ckpt_cover_add(u64 *bits, u32 n_sectors, u32 first, u32 count);
bool ckpt_cover_full(const u64 *bits, u32 n_sectors);

#ifdef __cplusplus
}
#endif

#endif /* CKPT_STEP_H */
