/* SPDX-License-Identifier: GPL-2.0 */
/*
 * dm-ckpt I/O: the per-bio data of the target's deferred bios, which the
 * target completes and a chunk update holds a reference on, and the flags
 * of the module's large allocations.
 */
#ifndef DM_CKPT_IO_H
#define DM_CKPT_IO_H

#include <linux/atomic.h>
#include <linux/bio.h>
#include <linux/device-mapper.h>

#include "ckpt_step.h"

/*
 * Flags for the large allocations (staging, chunk buffers, per-chunk arrays,
 * a rollback's record): their size comes from the table line and the image,
 * so failing is an answer (the table or the command is refused), not a
 * kernel warning.
 */
#define DM_CKPT_GFP_BIG		(GFP_KERNEL | __GFP_NOWARN | __GFP_RETRY_MAYFAIL)

/* Per-bio data: a gradient write completes when all its chunk updates have. */
struct dm_ckpt_io {
	atomic_t pending;
	blk_status_t status;
	int slot;		/* a PARAM read: the p_lo slot it reads; else -1 */
	struct ckpt_route route;	/* where map routed it (ckpt_step_route) */
};

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

#endif /* DM_CKPT_IO_H */
