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

/*
 * The status counters: the fields of CKPT_STATUS_FIELDS (kind STATE and
 * RESULT: the enum value; FRACTION: chunks_done, over n_chunks), plus the
 * committed slot the stats message reports. The status line's field table is
 * generated from the list with offsetof(), so a field missing here does not
 * compile.
 */
struct ckpt_counters {
	u32 state;
	u64 committed_step;
	u64 open_step;
	u64 chunks_done;
	u32 overflow;
	u32 last_result;
	u32 last_error;
	u32 first_io_error;
	u64 steps_committed;
	u64 steps_skipped;
	u64 steps_aborted;
	u64 commands_rejected;
	u64 grad_bytes;
	u64 param_bytes;
	u64 io_errors;
	u32 committed_slot;
};

/*
 * Fill k from the step machine, the one derivation of what the status page,
 * the dm status line and the stats message report (open_step, overflow and
 * chunks_done are 0 outside an open step). grad_bytes and param_bytes are
 * the host's byte counters. Caller holds the sm lock (no sleeping, no ops).
 */
void ckpt_sm_counters(const struct ckpt_step_sm *sm, u64 grad_bytes, u64 param_bytes,
		      struct ckpt_counters *k);

/*
 * The status page: ckpt_sm_counters and sb's geometry and blob; the host
 * then sets grad_bytes and param_bytes. Caller holds the sm lock.
 */
void ckpt_sm_status(const struct ckpt_step_sm *sm, const struct ckpt_sb *sb,
		    struct ckpt_status *st);

/*
 * The dm status INFO line: the CKPT_STATUS_FIELDS of k separated by single
 * spaces, STATE and RESULT by name, FRACTION as "chunks_done/n_chunks",
 * numbers in decimal, no newline. Writes at most len bytes including the
 * NUL; returns the length, or -CKPT_E_INVAL (buf holds "") when it does not
 * fit. CKPT_STATUS_LINE_MAX always fits.
 */
#define CKPT_STATUS_LINE_MAX	512
int ckpt_status_line(const struct ckpt_counters *k, u32 n_chunks, char *buf, u32 len);

/*
 * Parse the first len bytes of s (a NUL before len ends it), as printed by
 * ckpt_status_line, optionally followed by one newline. Strict: exactly the
 * fields in order, single spaces, known names, decimal without sign or
 * leading zeros that fits its field, chunks_done <= n_chunks. Returns 0, or
 * -CKPT_E_INVAL with k and n_chunks untouched.
 */
int ckpt_status_line_parse(const char *s, u32 len, struct ckpt_counters *k, u32 *n_chunks);

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
