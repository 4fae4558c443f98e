/* SPDX-License-Identifier: GPL-2.0 */
/*
 * dm-ckpt update: the chunk buffers (queue_depth of them, allocated in the
 * constructor) and the chunk update that runs in each: read the committed
 * slot's record, the core's update of the chunk (ckpt_step_update: the
 * check, the fused AdamW update in bounded kernel_fpu_begin/end sections,
 * the seal), write the record and the chunk's p_lo to the other slot, then
 * tell the step state machine (ckpt_step_update_done).
 *
 * Locks: the target's cmd_lock serialises dispatch; job_lock protects the
 * free list and the busy count; the update work items take the target's
 * sm_lock (a spinlock) only around state machine calls.
 */
#ifndef DM_CKPT_UPDATE_H
#define DM_CKPT_UPDATE_H

#include <linux/bio.h>
#include <linux/list.h>
#include <linux/spinlock.h>
#include <linux/wait.h>
#include <linux/workqueue.h>

struct dm_ckpt;
struct dm_ckpt_job;
struct ckpt_layout;

struct dm_ckpt_update {
	struct workqueue_struct *wq;	/* unbound, queue_depth items at once */
	struct dm_ckpt_job *jobs;
	unsigned int queue_depth;
	spinlock_t job_lock;		/* free_jobs, jobs_busy */
	struct list_head free_jobs;
	unsigned int jobs_busy;
	wait_queue_head_t job_wait;
};

/*
 * Pick this CPU's row of the core's update builds (ckpt_update_pick: SSE2,
 * AVX2/F16C or AVX-512) for the module's life. Module init only.
 */
void dm_ckpt_upd_init(void);

/* The row in use ("sse2", "avx2", "avx512"), for log lines and stats. */
const char *dm_ckpt_upd_fpu_name(void);

/* Bytes of memory queue_depth chunk buffers need for chunks of layout l. */
u64 dm_ckpt_upd_bytes(const struct ckpt_layout *l, unsigned int queue_depth);

/*
 * Allocate queue_depth chunk buffers and the update workqueue for c, whose
 * layout is known. Constructor only: process context, GFP_KERNEL. Returns 0
 * or -errno with *error set to a static message for ti->error; on error the
 * caller still calls dm_ckpt_upd_destroy.
 */
int dm_ckpt_upd_create(struct dm_ckpt *c, unsigned int queue_depth, char **error);

/* Free what dm_ckpt_upd_create allocated; no update may be in flight. */
void dm_ckpt_upd_destroy(struct dm_ckpt *c);

/*
 * Hand one whole chunk of gradients, which the core has claimed, to an
 * update and take a reference on bio (dropped when the update completes).
 * The gradient comes from bio at *it (advanced) or, when it is NULL, from
 * stage_grad. The update reads the record the current superblock commits
 * and writes the one the open step makes (ckpt_rec_committed/_next).
 * Called with cmd_lock held, in process context (the core's dispatch op);
 * blocks while all queue_depth buffers are busy.
 */
void dm_ckpt_upd_dispatch(struct dm_ckpt *c, struct bio *bio, u32 chunk,
			  struct bvec_iter *it, const u8 *stage_grad);

/*
 * Wait until no chunk update is in flight. Process context; blocks. With
 * cmd_lock held no new update can start meanwhile.
 */
void dm_ckpt_upd_drain(struct dm_ckpt *c);

/* The core's fpu_begin and fpu_end ops: kernel_fpu_begin/end, then cond_resched. */
void dm_ckpt_fpu_begin(void *host);
void dm_ckpt_fpu_end(void *host);

/* Chunk buffers in use now (a snapshot). Any context but hard IRQ. */
unsigned int dm_ckpt_upd_busy(struct dm_ckpt *c);

#endif /* DM_CKPT_UPDATE_H */
