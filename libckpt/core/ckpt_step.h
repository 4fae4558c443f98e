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
 *   IDLE --ROLLBACK--> core re-stamps, writes superblock -> IDLE, committed - 1
 *
 * A superblock write that failed once it was issued (any commit: COMMIT, a
 * load, a ROLLBACK) leaves the device naming either copy as committed, so
 * the machine fails there too: it never steps on from a superblock the
 * device may no longer hold.
 */
#ifndef CKPT_STEP_H
#define CKPT_STEP_H

#include "ckpt_codec.h"
#include "ckpt_update.h"

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
	u32 count_fault;	/* COUNTS: a block's count did not match its update */
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
	u64 grad_sumsq;		/* ckpt_status.grad_sumsq */
	u64 grad_sumsq_step;
};

/*
 * claimed and applied are caller storage of ckpt_bitmap_words(n_chunks) words
 * each, so the core never allocates.
 */
void ckpt_sm_init(struct ckpt_step_sm *sm, const struct ckpt_sb *sb,
		  u64 *claimed, u64 *applied);

/* BEGIN: state IDLE, step == committed + 1, n_groups matches, hparams valid. */
int ckpt_sm_begin(struct ckpt_step_sm *sm, const struct ckpt_cmd *cmd);
/*
 * BEGIN in two parts, so that a host need not clear the bitmaps (2 MiB each
 * with 2^24 chunks) under its sm lock: ckpt_sm_begin_check refuses what
 * ckpt_sm_begin refuses and changes nothing; ckpt_sm_begin_open opens the
 * checked step and expects claimed and applied clear (outside an open step
 * nothing reads them, so the host clears them unlocked in between and checks
 * again under the lock: an update may have failed the machine meanwhile).
 */
int ckpt_sm_begin_check(const struct ckpt_step_sm *sm, const struct ckpt_cmd *cmd);
void ckpt_sm_begin_open(struct ckpt_step_sm *sm, const struct ckpt_cmd *cmd);
/* Clear claimed and applied: not under the sm lock, never in an open step. */
void ckpt_sm_clear_bitmaps(struct ckpt_step_sm *sm, u64 *claimed, u64 *applied);
/* Before a chunk's update is dispatched: OPEN, in range, not yet claimed. */
int ckpt_sm_claim(struct ckpt_step_sm *sm, u32 chunk);
/* After the chunk's new state is on the backing device (or skipped on overflow). */
void ckpt_sm_applied(struct ckpt_step_sm *sm, u32 chunk, bool nonfinite, bool written);
/*
 * Instead of ckpt_sm_applied: the chunk was not written because a block's
 * step count is not the one its update's bias correction is for
 * (ckpt_step_counts); COMMIT refuses the step (E_STEP), ABORT ends it.
 */
void ckpt_sm_count_fault(struct ckpt_step_sm *sm, u32 chunk);
/*
 * COMMIT: returns CKPT_RESULT_COMMITTED when the host must now flush and write
 * the superblock (then call ckpt_sm_committed), CKPT_RESULT_OVERFLOW when the
 * step was discarded (the machine is IDLE again), or -err with nothing changed.
 */
int ckpt_sm_commit(struct ckpt_step_sm *sm, const struct ckpt_cmd *cmd);
void ckpt_sm_committed(struct ckpt_step_sm *sm);
/*
 * The commit's superblock write failed: the machine fails; which commit
 * stands is the device's (the newest valid copy a table reload reads).
 */
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
 * The status counters: the fields of CKPT_STATUS_FIELDS, in its order, each
 * of its kind's type (CKPT_ABI_MEMBER), plus the committed slot the stats
 * message reports. Generated from the list, as the status line's field table
 * and struct ckpt_device_status are, so a field cannot be missing here.
 */
struct ckpt_counters {
	CKPT_STATUS_FIELDS(CKPT_ABI_MEMBER)
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
 * The same, and on -CKPT_E_INVAL *field (if not NULL) says where the line
 * went wrong: the index in CKPT_STATUS_FIELDS of the field that is missing
 * or invalid, or CKPT_STATUS_N when text follows the last field.
 */
int ckpt_status_line_parse_at(const char *s, u32 len, struct ckpt_counters *k, u32 *n_chunks,
			      u32 *field);

/*
 * Sector coverage of a partially written chunk (staging). bits holds
 * ckpt_bitmap_words(sectors) words. Adding an already covered sector fails
 * with -CKPT_E_TWICE and changes nothing.
 */
int ckpt_cover_add(u64 *bits, u32 n_sectors, u32 first, u32 count);
bool ckpt_cover_full(const u64 *bits, u32 n_sectors);

/* ---------------- the step protocol: what a target does, minus its I/O ---------------- */

/*
 * A target (the kernel's, the engine) runs the protocol through struct
 * ckpt_step: the core decides (which write is refused, which chunk is staged
 * or dispatched, when stages are released, what a command does, what the
 * next superblock is) and calls the host's ops for I/O only.
 *
 * Locking contract. The host has two locks:
 *   - its command lock (kernel: a mutex, engine: its call mutex), held by the
 *     caller of ckpt_step_grad_write, ckpt_step_command, ckpt_step_exec and
 *     ckpt_step_write_sb; it serializes them and guards the staging state;
 *   - the sm lock (kernel: a spinlock), taken by the core through ops->lock
 *     around every change or read of cs->sm and cs->grad_bytes, for work
 *     bounded by the write's pieces; the core never sleeps or calls another
 *     op while it holds it. Every ckpt_sm_* function above expects it held:
 *     the host takes it around its own calls (an update's ckpt_sm_applied or
 *     ckpt_sm_fail, a status read's ckpt_sm_counters).
 * The other ops are called with only the command lock held and may sleep.
 */
struct ckpt_step_ops {
	void (*lock)(void *host);
	void (*unlock)(void *host);
	/* Optional: wait until every dispatched update has called ckpt_sm_applied. */
	void (*drain)(void *host);
	/* Make every write so far durable: 0 or -errno. */
	int (*flush)(void *host);
	/* Write one CKPT_BLOCK superblock block at off, durable (FUA): 0 or -errno. */
	int (*write_sb)(void *host, const void *block, u64 off);
	/* Gradient write walk, src is the caller's: consume the next n bytes into dst. */
	void (*copy)(void *host, void *src, void *dst, u64 n);
	/*
	 * Hand chunk's gradients to an update (the chunk is claimed): grad NULL,
	 * the next chunk-size bytes of src; else a complete stage, valid until
	 * the walk ends (after ops->dispatched). 0 or a negative error the write
	 * then returns.
	 */
	int (*dispatch)(void *host, void *src, u32 chunk, const void *grad);
	/* Optional: every chunk of the write is dispatched; 0 or a negative error. */
	int (*dispatched)(void *host, void *src);
	/*
	 * Optional: a step is now open that writes slot; return once no read
	 * of that slot's p_lo that started before BEGIN is still in flight
	 * (the step's updates will overwrite it).
	 */
	void (*quiesce)(void *host, u32 slot);
	/*
	 * Optional: a superblock write failed with io_errno (a COMMIT's, or
	 * any commit's once its write was issued: ckpt_step_write_sb) and
	 * the step machine has just entered FAILED (the host's failed mode:
	 * its sticky error, an event for userspace).
	 */
	void (*failed)(void *host, int io_errno);
	/*
	 * Both targets: read len bytes at byte offset off of the device into
	 * buf (0 or -errno). The commit reads its superblock back: a device
	 * that acknowledged the write but lost it (dm-flakey drop_writes, a
	 * lying cache) fails the commit, instead of the next step overwriting
	 * the slot the device still names as committed. A rollback reads the
	 * older superblock copy and the other slot's records.
	 */
	int (*read)(void *host, void *buf, u64 off, u64 len);
	/*
	 * Optional (without write and alloc ROLLBACK is an unknown command,
	 * E_OPCODE): write len bytes from buf at off (0 or -errno; durable
	 * only after ops->flush), and the rollback's memory (a superblock, a
	 * record with its p_lo): alloc returns NULL when there is none, free
	 * takes what alloc gave. Called with only the command lock held.
	 */
	int (*write)(void *host, const void *buf, u64 off, u64 len);
	void *(*alloc)(void *host, u64 bytes);
	void (*free)(void *host, void *p);
	/*
	 * Optional: around the core's own float arithmetic (COMMIT's sum of the
	 * chunks' gradient sums, ckpt_sum_f64): the kernel's kernel_fpu_begin
	 * and kernel_fpu_end. Called with only the command lock held.
	 */
	void (*fpu_begin)(void *host);
	void (*fpu_end)(void *host);
};

#define CKPT_STAGE_FREE		0xffffffffu

/* A RANGE's bias correction: step_size and bc2_sqrt for blocks reaching count. */
struct ckpt_bias {
	u64 count;
	u32 step_size;
	u32 bc2_sqrt;
};

#define CKPT_BIAS_MAX		254u
#define CKPT_MODE_SKIP		0xffu

/*
 * One run of a chunk's update (ckpt_step_run): n params from first (in the
 * chunk) that the update skips (their p, m, v stay; p_lo is rounded from
 * p) or updates with hp.
 */
struct ckpt_run {
	u64 first;
	u64 n;
	bool skip;
	struct ckpt_hparams hp;
};
/* Default staging memory for partial chunks (the target's staging_kb). */
#define CKPT_STAGING_DEFAULT	(64ULL << 20)

/*
 * The number of stages for staging_bytes of partial-chunk gradients: one per
 * chunk_bytes (a power of two), at least 2 (two tensors sharing a chunk), at most
 * max(2, n_chunks) (more could never be used).
 */
u32 ckpt_stage_count(u64 staging_bytes, u64 chunk_bytes, u32 n_chunks);

/* A partial chunk's gradients. cover and grad are host storage. */
struct ckpt_stage_buf {
	u32 chunk;		/* CKPT_STAGE_FREE: free */
	u32 done_next;		/* complete in this write: next index, or CKPT_STAGE_FREE */
	u64 *cover;		/* ckpt_bitmap_words(chunk sectors) words */
	u8 *grad;		/* chunk_bytes */
};

/* Which part of a rollback refused or failed (struct ckpt_rollback_fault). */
enum ckpt_rollback_part {
	CKPT_ROLLBACK_OK = 0,
	CKPT_ROLLBACK_MACHINE,	/* refused by the machine: FAILED, a step open, another step, step 0 */
	CKPT_ROLLBACK_OLDER,	/* the older superblock copy: unreadable, invalid, not the previous commit */
	CKPT_ROLLBACK_RECORD,	/* a record of the other slot: unreadable, overwritten or damaged */
	CKPT_ROLLBACK_RESTAMP,	/* writing a re-stamped record header */
	CKPT_ROLLBACK_COMMIT,	/* the commit (ckpt_step_rollback_commit) */
	CKPT_ROLLBACK_NOMEM,	/* ops->alloc */
};

/*
 * What the last ROLLBACK found, for the host's words (cs->rollback, under
 * the command lock): the part, and for OLDER the copy's index and what its
 * decode answered (older: 0 when it decoded, then older_sb is it), for
 * RECORD the chunk, the slot, the check's fault and what the record holds
 * (got, when its header decodes), for an I/O error io_errno.
 */
struct ckpt_rollback_fault {
	enum ckpt_rollback_part part;
	u32 older_index;
	int older;
	u64 older_step, older_sequence;
	u32 chunk, slot;
	enum ckpt_rec_fault rec;
	bool got_valid;
	struct ckpt_rec got;
	int io_errno;
};

/*
 * What the host allocates for ckpt_step_init (the core never allocates):
 * claimed, applied: ckpt_bitmap_words(n_chunks) words each; stages:
 * ckpt_stage_count() entries, each with its cover and grad; stage_of: n_chunks
 * entries; spare: a superblock; block: CKPT_BLOCK bytes the host can write
 * (the superblock is encoded there); cmd: a decoded command.
 */
struct ckpt_step_mem {
	u64 *claimed;
	u64 *applied;
	u8 *modes;		/* COUNTS: ckpt_step_blocks() entries, else NULL */
	struct ckpt_stage_buf *stages;
	u32 n_stages;
	u32 *stage_of;
	struct ckpt_sb *spare;
	void *block;
	struct ckpt_cmd *cmd;
	u64 *sumsq;		/* n_chunks entries (ckpt_step_sumsq), or NULL: none reported */
};

struct ckpt_step {
	const struct ckpt_step_ops *ops;
	void *host;
	struct ckpt_sb *sb;	/* the current superblock (host's), updated on commit */
	struct ckpt_step_mem mem;
	struct ckpt_step_sm sm;	/* under the sm lock */
	u64 grad_bytes;		/* under the sm lock */
	u64 chunk_bytes;	/* of gradients: 2 B per param, a power of two */
	u32 cb_shift;		/* log2(chunk_bytes) */
	u32 sectors;		/* per chunk */
	u32 free_stages;	/* under the command lock, as the stages */
	u32 done_first;		/* stages completed by the current write */
	/* the image's layout: constant (a restart keeps the geometry), read unlocked */
	struct ckpt_regions regions;
	/*
	 * COUNTS: what the open step does with each block (mem.modes: 0 an
	 * update with its group's hyperparameters, CKPT_MODE_SKIP, or 1 + an
	 * index into bias), set by RANGE commands before the block's chunk is
	 * claimed and cleared by BEGIN; under the command lock. An update
	 * reads them unlocked: they do not change while its chunk is claimed.
	 */
	u32 n_bias;
	struct ckpt_bias bias[CKPT_BIAS_MAX];
	/*
	 * What the last command found if it was a ROLLBACK (ckpt_step_rollback;
	 * part CKPT_ROLLBACK_OK after any other), under the command lock.
	 */
	struct ckpt_rollback_fault rollback;
};

/* Blocks (CKPT_TENSOR_ALIGN params) of an image: the size of mem.modes. */
static inline u64 ckpt_step_blocks(const struct ckpt_regions *l)
{
	return l->n_params >> CKPT_BLOCK_SHIFT;
}

/* Start from superblock sb (the host's, kept up to date by commits). */
void ckpt_step_init(struct ckpt_step *cs, const struct ckpt_step_ops *ops, void *host,
		    struct ckpt_sb *sb, const struct ckpt_step_mem *mem);

/*
 * A gradient write of len bytes at off in the GRAD window. Every piece is
 * checked before anything changes (state FAILED/not OPEN: E_FAILED/E_STATE;
 * a claimed chunk, a whole chunk over a staged one or a staged sector again:
 * E_TWICE; no free stage for a new partial chunk: E_NOSPC): a refused write is
 * recorded (ckpt_sm_rejected) and returns -CKPT_E_* with nothing else changed.
 * Then each piece is either a whole chunk, dispatched from src, or copied into
 * its chunk's stage, dispatched from there once complete; completed stages are
 * released after ops->dispatched. Returns 0, or the first error of a claim
 * (-CKPT_E_*: the device failed meanwhile) or an op (not recorded as a
 * refusal). Caller holds the command lock.
 */
int ckpt_step_grad_write(struct ckpt_step *cs, u64 off, u64 len, void *src);

/*
 * A command as written to the control block: decoded (a malformed one is
 * refused), then ckpt_step_exec. Caller holds the command lock.
 */
int ckpt_step_command(struct ckpt_step *cs, const void *buf, u32 len);

/*
 * Run a decoded command: drain the updates, then BEGIN, ABORT, COMMIT or
 * ROLLBACK (ckpt_step_rollback, its fault in cs->rollback; its refusals are recorded, an I/O error is not:
 * before the superblock write the device does not fail and the old commit
 * stands, after it the device fails as for COMMIT).
 * BEGIN clears the step's bitmaps with the sm lock released (see
 * ckpt_sm_begin_check), then calls ops->quiesce for the slot the step
 * writes. ABORT and a discarded (overflowed) COMMIT release the stages; a
 * COMMIT of a
 * complete step writes the next superblock (ckpt_step_write_sb), then the
 * step is committed and the stages released. Returns >= 0 (CKPT_RESULT_* for
 * COMMIT), -CKPT_E_IO when the superblock write failed (the device fails,
 * the old commit stands, ops->failed is called; *io_errno, if not NULL,
 * gets the host's errno), or
 * another -CKPT_E_* for a refused command, recorded. cmd may be cs->mem.cmd.
 * Caller holds the command lock.
 */
int ckpt_step_exec(struct ckpt_step *cs, const struct ckpt_cmd *cmd, int *io_errno);

/*
 * The update of a claimed chunk of the open step, whose group is group, in
 * runs: *pos starts at 0; each call fills run with the next run and returns
 * true, false after the last. Without COUNTS, or with no RANGE over the
 * chunk, one run: the whole chunk with the group's hyperparameters. The
 * host's update calls it after ckpt_step_counts.
 */
bool ckpt_step_run(const struct ckpt_step *cs, u32 chunk, u32 group, u64 *pos,
		   struct ckpt_run *run);

/*
 * COUNTS: check and advance the block counts of a claimed chunk's record
 * header (read from the committed slot and checked): every updated block's
 * count must be one less than the count its bias correction is for (the
 * open step, or its RANGE's count), and goes up by one; a skipped block's
 * stays. Returns 0, or -CKPT_E_STEP with the header untouched (the host
 * then calls ckpt_sm_count_fault). Without COUNTS: 0, nothing done.
 */
int ckpt_step_counts(const struct ckpt_step *cs, u32 chunk, void *header);

/*
 * The sum of the squares of a claimed chunk's gradients that its update
 * applied (ckpt_grad_sumsq chained over its runs that update, in order; fp64
 * bits), given before ckpt_sm_applied (ckpt_step_update_done). COMMIT adds the chunks' sums in chunk
 * order (ckpt_sum_f64) into the status page's grad_sumsq: the global gradient
 * norm without a pass of the trainer's. Without mem.sumsq, nothing.
 */
static inline void ckpt_step_sumsq(struct ckpt_step *cs, u32 chunk, u64 sumsq)
{
	if (cs->mem.sumsq && chunk < cs->sm.n_chunks)
		cs->mem.sumsq[chunk] = sumsq;
}

/*
 * The update of one chunk (ckpt_chunk.c), the whole sequence both targets
 * run between reading the committed record and writing the new one.
 *
 * ckpt_step_job, under the sm lock when the host takes a claimed chunk
 * (the kernel at dispatch, the engine's worker when it picks the chunk up):
 * what the update is for, group the chunk's param group and step the open
 * step's (or a load's). ckpt_step_update, unlocked: rec holds the record
 * read from job->src's place (record_bytes), grad the chunk's gradients;
 * checks the record (data checksum included), the block counts, updates the
 * runs with the host's update builds (ops), sums the gradients' squares, and
 * seals rec for job->dst, plo the new low-precision params. Then the host
 * writes rec and plo to job->dst's place (CKPT_UPDATE_WRITE) or nothing,
 * and calls ckpt_step_update_done under the sm lock; CKPT_UPDATE_DAMAGED
 * (job->fault, job->got: what the record holds) fails the device instead.
 */
struct ckpt_update_job {
	u32 chunk;
	u32 group;
	u32 grad_scale;		/* fp32 bits, the open step's */
	struct ckpt_rec src;	/* the record the update reads: the committed one */
	struct ckpt_rec dst;	/* the record it writes: the open step's */
	u64 sumsq;		/* the gradients' sum of squares (ckpt_grad_sumsq) */
	enum ckpt_rec_fault fault;	/* CKPT_UPDATE_DAMAGED: what is wrong */
	struct ckpt_rec got;		/* CKPT_UPDATE_DAMAGED: what the record holds */
};

/*
 * The update builds a host picked for its CPU, and the brackets of float
 * code: ops->fpu_begin and ops->fpu_end (optional) around each slice of at
 * most ops->slice params (0: a run at once; else a multiple of
 * CKPT_TENSOR_ALIGN), where the kernel saves the FPU and reschedules.
 */
struct ckpt_update_ops {
	ckpt_update_t *update;
	ckpt_update_q8_t *update_q8;
	ckpt_update_q8bf_t *update_q8bf;
	void (*fpu_begin)(void *host);
	void (*fpu_end)(void *host);
	u64 slice;
};

enum ckpt_update_result {
	CKPT_UPDATE_WRITE,		/* write rec and plo to job->dst's place */
	CKPT_UPDATE_NONFINITE,		/* write nothing: the step will be skipped */
	CKPT_UPDATE_COUNT_FAULT,	/* write nothing: COMMIT refuses the step (E_STEP) */
	CKPT_UPDATE_DAMAGED,		/* the committed record is damaged: fail */
};

void ckpt_step_job(const struct ckpt_step *cs, u32 chunk, u32 group, u64 step,
		   struct ckpt_update_job *job);
enum ckpt_update_result ckpt_step_update(const struct ckpt_step *cs,
					 const struct ckpt_update_ops *ops, void *host,
					 struct ckpt_update_job *job, void *rec, const u16 *grad,
					 u16 *plo, u32 *tmp);
void ckpt_step_update_done(struct ckpt_step *cs, const struct ckpt_update_job *job,
			   enum ckpt_update_result result);

/* Round n fp32 params (bits) to dtype with integer arithmetic only (any context). */
void ckpt_round_params_int(u32 dtype, const u32 *p, u16 *plo, u64 n);

/*
 * Commit: flush, then the superblock after cs->sb committing step in slot
 * with blob, with FUA at its copy; on success *cs->sb is it. Returns 0 or
 * -errno (of ops->flush, ops->write_sb or ops->read; -EIO if it cannot be
 * encoded or does not read back). An error before the superblock write
 * leaves the step machine untouched. One after it is issued leaves the
 * device naming either copy as committed, so the machine fails
 * (ckpt_sm_commit_failed, then ops->failed): the next BEGIN would write
 * the slot the device may name as committed. Caller holds the command lock.
 */
int ckpt_step_write_sb(struct ckpt_step *cs, u64 step, u32 slot, const void *blob,
		       u32 blob_len);

/*
 * Start again from *cs->sb, which the host has replaced (a reloaded table
 * found a newer image): the stages are released and the step machine is
 * re-initialized (counters too), its bitmaps cleared outside the sm lock.
 * No update may be in flight. Caller holds the command lock.
 */
void ckpt_step_restart(struct ckpt_step *cs);

/*
 * The commit of a superblock, the one path every commit takes (a step's
 * COMMIT and a load of state through ckpt_step_write_sb, verify's rollback):
 * the successor of *sb committing step in slot with blob (ckpt_sb_next) is
 * built in spare, ops->flush makes the writes before it durable, then it is
 * encoded into block (CKPT_BLOCK bytes) and written with ops->write_sb at
 * its copy, then read back (ops->read, if any); on success *sb is it.
 * Uses only ops->flush, ops->write_sb and ops->read. Returns 0, the
 * -errno of an op, or -EIO when it cannot be built or encoded (nothing
 * written) or does not read back. *issued (if not NULL) says whether the
 * superblock write was issued: after that a failure leaves the device
 * naming either copy as committed.
 */
int ckpt_sb_commit(const struct ckpt_step_ops *ops, void *host, struct ckpt_sb *sb,
		   struct ckpt_sb *spare, void *block, u64 step, u32 slot, const void *blob,
		   u32 blob_len, bool *issued);

/* Release every stage (ABORT, a new commit). Caller holds the command lock. */
void ckpt_step_release_stages(struct ckpt_step *cs);

/* Stages in use (stats). Caller holds the command lock. */
static inline u32 ckpt_step_stages_used(const struct ckpt_step *cs)
{
	return cs->mem.n_stages - cs->free_stages;
}

/* ---------------- the virtual device: which window an access hits ---------------- */

/* The windows of the virtual device (design section 3), in offset order. */
enum ckpt_window {
	CKPT_WIN_NONE,		/* an empty access, or one beyond the device */
	CKPT_WIN_CTRL,		/* [0, grad_off): one command; reads give the status page */
	CKPT_WIN_GRAD,		/* [grad_off, param_off): gradients; reads give zeros */
	CKPT_WIN_PARAM,		/* [param_off, image_off): the latest applied p_lo, read-only */
	CKPT_WIN_IMAGE,		/* [image_off, virt_bytes): the backing image, read-only */
};

/* ckpt_route flags */
#define CKPT_ROUTE_WRITE	(1u << 0)	/* a write (else a read) */
#define CKPT_ROUTE_READ_ONLY	(1u << 1)	/* a read-only device (table): no write */

/* Where an access goes, as ckpt_route decides. */
struct ckpt_route {
	u32 window;		/* enum ckpt_window of off (also on a refusal) */
	u32 chunk;		/* PARAM: the chunk at off */
	u64 off;		/* offset of the access in its window */
	u64 in;			/* PARAM: offset in the chunk's p_lo */
	u64 len;		/* bytes of the access that go to this window (the cut) */
};

/*
 * Route len bytes at virtual device offset off, the one rule of what each
 * window accepts. A write is accepted whole or refused: it must be sector
 * aligned (-CKPT_E_ALIGN), within the device (-CKPT_E_RANGE), on a
 * writable device (-CKPT_E_READONLY); a command is one write at offset 0 of
 * at most CKPT_BLOCK bytes, a gradient write must not run into the PARAM
 * window (-CKPT_E_RANGE), the PARAM and IMAGE windows are read-only
 * (-CKPT_E_READONLY). The IMAGE window reads the backing device's bytes
 * [0, dev_bytes) (superblocks, group table, manifest, records): what a
 * client needs of the image, through the target, when the backing device
 * is not its to open (a device served over NVMe-oF).
 * A read may start anywhere in the device (else -CKPT_E_RANGE) and is cut
 * at the end of its window, a PARAM read at the end of its chunk: r->len
 * bytes go to r->window, the host routes the rest again from off + r->len.
 * An empty access is accepted as CKPT_WIN_NONE with r->len 0. r is always
 * filled (window of off, or NONE beyond the device). l must be a computed
 * layout (ckpt_regions_compute). off and len may be any u64: an off + len
 * that wraps is beyond the device. Pure: no lock, any context.
 */
int ckpt_route(const struct ckpt_regions *l, u64 off, u64 len, u32 flags, struct ckpt_route *r);

/*
 * ckpt_route on cs's image, and the refusal counted as the protocol counts
 * it: a refused write is a refused request (ckpt_sm_rejected under the sm
 * lock, so the status page says why), a refused read changes nothing.
 * Needs no command lock (the kernel routes in map); takes the sm lock only
 * to record a refusal.
 */
int ckpt_step_route(struct ckpt_step *cs, u64 off, u64 len, u32 flags, struct ckpt_route *r);

/* ---------------- loading state from outside (initial masters, an import) ---------------- */

/*
 * May state be loaded now, committing step with a blob_len-byte trainer
 * blob? Only on an IDLE machine that has committed no step: -CKPT_E_FAILED
 * (failed device), -CKPT_E_STATE (a step is open, or committed_step is not
 * 0), -CKPT_E_STEP (step > CKPT_STEP_MAX: no next step would be left),
 * -CKPT_E_BLOB (blob_len > CKPT_BLOB_MAX), else 0. Changes nothing, records
 * nothing (a load is not a request of the virtual device). Takes the sm
 * lock; caller holds the command lock.
 */
int ckpt_step_load_check(struct ckpt_step *cs, u64 step, u64 blob_len);

/* A loaded span of n params at param offset offset: 0, or -CKPT_E_RANGE outside the image. */
int ckpt_step_load_span(const struct ckpt_step *cs, u64 offset, u64 n);

/*
 * Commit a checked load whose chunks the host has written, every one, to
 * ckpt_sm_dst_slot(): the superblock committing step in that slot with the
 * blob (ckpt_step_write_sb), then the machine starts over from it
 * (ckpt_step_restart: counters too). Returns 0 or the -errno of the commit
 * (*cs->sb unchanged; the machine too, unless the error came after the
 * superblock write was issued: then it has failed). No update in flight;
 * caller holds the command lock, not the sm lock.
 */
int ckpt_step_load_commit(struct ckpt_step *cs, u64 step, const void *blob, u32 blob_len);

/* ---------------- rollback: the previous step committed again ---------------- */

/*
 * A commit leaves the previous step whole in the other slot until the next
 * BEGIN writes there, and the older superblock copy commits it. A rollback
 * makes it the committed step again, in three parts (like a load):
 *
 * ckpt_step_rollback_check: may the device go back from step (the
 * committed step, or 0: whichever) to prev, the older superblock copy as
 * the host read and decoded it (NULL: that copy is not valid)?
 * -CKPT_E_FAILED (failed device), -CKPT_E_STATE (a step is open),
 * -CKPT_E_STEP (step is neither 0 nor the committed step),
 * -CKPT_E_ROLLBACK (committed step 0, or prev is not the commit of step
 * committed - 1 in the other slot at sequence - 1 of the same image: there
 * is nothing to go back to, or the device went back once already: a
 * rollback never goes two steps). Changes nothing, records nothing. Takes
 * the sm lock; caller holds the command lock.
 *
 * ckpt_step_rollback_rec: the record of chunk in the other slot as the host
 * read it (header block, the 12 B * chunk params of data, the chunk's p_lo):
 * it must be prev's record of that chunk, intact (ckpt_rec_check), or one
 * an interrupted rollback already re-stamped. Returns 1 when header was
 * re-stamped (the host writes it back), 0 when it is already right, or
 * -CKPT_E_ROLLBACK when a later step overwrote it (a BEGIN wrote there, an
 * aborted or crashed step) or it is damaged: nothing to go back to.
 *
 * ckpt_step_rollback_commit: after every chunk passed and the re-stamped
 * headers are written, the commit of prev's step in its slot with its blob
 * (ckpt_step_write_sb: flush, then the superblock), then the machine goes
 * on from it: IDLE at prev's step and slot, its counters kept (a rollback
 * is a command of the live device, like a commit). Returns 0 or the -errno
 * of the commit. An error before the superblock write leaves the machine
 * and *cs->sb unchanged, and so does a crash there: the current commit
 * stands and the rollback is repeatable. An error after the superblock
 * write was issued (the write itself, its read-back) fails the machine
 * (ckpt_step_write_sb): the device may already commit prev's step in the
 * slot the machine would write next.
 */
/*
 * The ROLLBACK command (ckpt_step_exec runs it; the hosts' other entry
 * points, the kernel's rollback message and Engine::rollback, go through
 * exec too): the previous step committed again, over the host's read,
 * write, flush and superblock ops, in the three parts above: read the older
 * superblock copy and check it, read every record of the other slot with
 * its p_lo and write back each re-stamped header, commit. Returns 0, a
 * refusal -CKPT_E_* with nothing changed, -CKPT_E_NOMEM, -CKPT_E_OPCODE
 * (the host has no write or alloc op), or -CKPT_E_IO with *io_errno the
 * host's -errno (the machine has failed when the superblock write had been
 * issued). *f says where and why (its part is CKPT_ROLLBACK_OK on success).
 * Caller holds the command lock; no step open (the check refuses one).
 */
int ckpt_step_rollback(struct ckpt_step *cs, u64 step, struct ckpt_rollback_fault *f,
		       int *io_errno);
int ckpt_step_rollback_check(struct ckpt_step *cs, const struct ckpt_sb *prev, u64 step);
int ckpt_step_rollback_rec(const struct ckpt_step *cs, const struct ckpt_sb *prev, u32 chunk,
			   void *header, const void *data, const void *plo);
int ckpt_step_rollback_commit(struct ckpt_step *cs, const struct ckpt_sb *prev);

#ifdef __cplusplus
}
#endif

#endif /* CKPT_STEP_H */
