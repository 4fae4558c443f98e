/* SPDX-License-Identifier: GPL-2.0 */
/*
 * dm-ckpt update: the chunk buffers (queue_depth of them, allocated in the
 * constructor) and the chunk update that runs in each: read the committed
 * slot's record, the core's update of the chunk (ckpt_step_update: the
 * check, the fused AdamW update in bounded kernel_fpu_begin/end sections,
 * the seal), write the record and the chunk's p_lo to the other slot, then
 * tell the step state machine (ckpt_step_update_done).
 *
 * Locks: the target's command lock serialises dispatch; job_lock protects
 * the free list and the busy count; the update work items take the core's
 * sm lock (a spinlock the target gives) only around the core's job calls.
 * The update knows its target only through struct dm_ckpt_upd_target.
 */
#ifndef DM_CKPT_UPDATE_H
#define DM_CKPT_UPDATE_H

#include <linux/bio.h>
#include <linux/err.h>
#include <linux/spinlock.h>

#include "ckpt_codec.h"
#include "ckpt_step.h"
#include "dm-ckpt-metadata.h"

struct dm_ckpt_update;		/* the chunk buffers and their workqueue: opaque */

/*
 * What the update needs of its target, given to dm_ckpt_upd_create and
 * constant for the update's life: the backing device, the image's layout,
 * the core's step and its sm lock (taken around the core's job calls), and
 * where a chunk update that failed on the backing device reports it:
 * failed(ctx, -errno), in process context with no lock held, once per
 * failed update.
 */
struct dm_ckpt_upd_target {
	struct dm_ckpt_metadata *md;
	const struct ckpt_regions *regions;
	struct ckpt_step *step;
	spinlock_t *sm_lock;		/* the core's sm lock: step->sm */
	void (*failed)(void *ctx, int err);
	void *ctx;
};

/*
 * Pick this CPU's row of the core's update builds (ckpt_update_pick: SSE2,
 * AVX2/F16C or AVX-512) for the module's life. Module init only.
 */
void dm_ckpt_upd_init(void);

/* The row in use ("sse2", "avx2", "avx512"), for log lines and stats. */
const char *dm_ckpt_upd_fpu_name(void);

/* Bytes of memory queue_depth chunk buffers need for chunks of layout l. */
u64 dm_ckpt_upd_bytes(const struct ckpt_regions *l, unsigned int queue_depth);

/*
 * Allocate queue_depth chunk buffers and the update workqueue for target t
 * (copied). Constructor only: process context, GFP_KERNEL. Returns the
 * update or an ERR_PTR with *error set to a static message for ti->error.
 */
struct dm_ckpt_update *dm_ckpt_upd_create(const struct dm_ckpt_upd_target *t,
					  unsigned int queue_depth, char **error);

/* Free what dm_ckpt_upd_create allocated; no update may be in flight. NULL is ignored. */
void dm_ckpt_upd_destroy(struct dm_ckpt_update *u);

/*
 * Hand one whole chunk of gradients, which the core has claimed, to an
 * update (group: the chunk's group) and take a reference on bio (dropped when the
 * update completes). The gradient comes from bio at *it (advanced) or, when
 * it is NULL, from stage_grad. The update reads the record the current
 * superblock commits and writes the one the open step makes
 * (ckpt_rec_committed/_next). Called with the command lock held, in process
 * context (the core's dispatch op); blocks while all buffers are busy.
 */
void dm_ckpt_upd_dispatch(struct dm_ckpt_update *u, struct bio *bio, u32 chunk, u8 group,
			  struct bvec_iter *it, const u8 *stage_grad);

/*
 * Wait until no chunk update is in flight. Process context; blocks. With
 * the command lock held no new update can start meanwhile.
 */
void dm_ckpt_upd_drain(struct dm_ckpt_update *u);

/* The core's fpu_begin and fpu_end ops: kernel_fpu_begin/end, then cond_resched. */
void dm_ckpt_fpu_begin(void *host);
void dm_ckpt_fpu_end(void *host);

/* Chunk buffers in use now (a snapshot). Any context but hard IRQ. */
unsigned int dm_ckpt_upd_busy(struct dm_ckpt_update *u);

#endif /* DM_CKPT_UPDATE_H */
