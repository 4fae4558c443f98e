/* SPDX-License-Identifier: GPL-2.0 */
/*
 * dm-ckpt: the target instance, shared by the target (dm-ckpt-target.c) and
 * the update (dm-ckpt-update.c); the metadata layer sees only its own part.
 */
#ifndef DM_CKPT_H
#define DM_CKPT_H

#include <linux/atomic.h>
#include <linux/bio.h>
#include <linux/device-mapper.h>
#include <linux/mutex.h>
#include <linux/spinlock.h>
#include <linux/workqueue.h>

#include "ckpt_format.h"
#include "ckpt_step.h"
#include "ckpt_table.h"
#include "dm-ckpt-metadata.h"
#include "dm-ckpt-update.h"

#define DM_MSG_PREFIX "ckpt"

/*
 * Flags for the constructor's large allocations (staging, chunk buffers,
 * per-chunk arrays): their size comes from the table line and the image, so
 * failing is an answer (the table is refused), not a kernel warning.
 */
#define DM_CKPT_GFP_BIG		(GFP_KERNEL | __GFP_NOWARN | __GFP_RETRY_MAYFAIL)

/* Per-bio data: a gradient write completes when all its chunk updates have. */
struct dm_ckpt_io {
	atomic_t pending;
	blk_status_t status;
	int slot;		/* a PARAM read: the p_lo slot it reads; else -1 */
	struct ckpt_route route;	/* where map routed it (ckpt_step_route) */
};

struct dm_ckpt {
	struct dm_target *ti;
	struct dm_ckpt_metadata md;
	struct dm_ckpt_update upd;
	struct workqueue_struct *ctl_wq;
	struct ckpt_layout layout;	/* constant for the target's life */
	u32 dtype;

	/* deferred bios, in arrival order */
	spinlock_t bio_lock;
	struct bio_list bios;
	struct work_struct bio_work;

	/*
	 * cmd_lock: the core's command lock (ckpt_step.h): commands, gradient
	 * writes, the superblock, staging and the scratch page. Held by the
	 * bio work item, messages and preresume.
	 */
	struct mutex cmd_lock;
	struct ckpt_sb *sb;		/* the committed superblock (the core updates it) */
	u8 *groups;			/* chunk -> group */
	struct ckpt_status *st;
	u8 *page;			/* 4 KiB scratch: commands, status, superblock */
	bool started;

	/*
	 * The step protocol, run by the core with this target as its host:
	 * step.sm and step.grad_bytes are under sm_lock (the core's sm lock),
	 * the rest under cmd_lock. mem is what the constructor allocated for
	 * it (kept here to be freed).
	 */
	struct ckpt_step step;
	struct ckpt_step_mem mem;
	u64 *cover_mem;
	spinlock_t sm_lock;		/* the core's sm lock: step.sm, step.grad_bytes */

	/*
	 * The first backing device error (-errno), sticky: set once with
	 * cmpxchg, as dm-writecache and dm-integrity keep theirs. Non-zero
	 * means failed mode (no new steps until the table is reloaded).
	 */
	int error;
	u8 uuid[16];			/* the image's, constant */

	/*
	 * PARAM reads in flight per p_lo slot, counted in map (under sm_lock,
	 * with the slot choice) and end_io: BEGIN waits for the slot it is
	 * about to rewrite (the core's quiesce op), so that no read returns a
	 * mix of two steps.
	 */
	atomic_t readers[2];
	wait_queue_head_t readers_wait;

	bool read_only;			/* the table was loaded read-only */

	atomic64_t param_bytes;

	/* the table line's optional arguments (the core parses them) */
	struct ckpt_table_args args;
};

static inline const char *dm_ckpt_name(struct dm_ckpt *c)
{
	return dm_device_name(dm_table_get_md(c->ti->table));
}

static inline struct dm_ckpt_io *dm_ckpt_io_of(struct bio *bio)
{
	return dm_per_bio_data(bio, sizeof(struct dm_ckpt_io));
}

/* Drop one reference of a deferred bio; the last one completes it. Any context. */
static inline void dm_ckpt_bio_put(struct bio *bio, blk_status_t status)
{
	struct dm_ckpt_io *io = dm_ckpt_io_of(bio);

	if (status)
		WRITE_ONCE(io->status, status);
	if (atomic_dec_and_test(&io->pending)) {
		bio->bi_status = READ_ONCE(io->status);
		bio_endio(bio);
	}
}

/* Copy len bytes of the bio at *it to dst, advancing *it. */
static inline void dm_ckpt_bio_copy_from(struct bio *bio, struct bvec_iter *it, void *dst,
					 unsigned int len)
{
	u8 *d = dst;

	while (len) {
		struct bio_vec bv = bio_iter_iovec(bio, *it);
		unsigned int n = min(bv.bv_len, len);

		bv.bv_len = n;
		memcpy_from_bvec(d, &bv);
		bio_advance_iter_single(bio, it, n);
		d += n;
		len -= n;
	}
}

/*
 * A chunk update failed on the backing device with err (a -errno, never a
 * -CKPT_E_*): the first such error is kept (c->error, reported as
 * first_io_error), the state machine enters FAILED (ckpt_sm_fail), and on
 * entering failed mode a table event tells userspace (dmsetup wait,
 * dmeventd). A failed commit takes the same way through the core's failed
 * op. Process context, no spinlock held: takes sm_lock, and
 * dm_table_event() a mutex.
 */
void dm_ckpt_error(struct dm_ckpt *c, int err);

#endif /* DM_CKPT_H */
