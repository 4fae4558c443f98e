/* SPDX-License-Identifier: GPL-2.0 */
/*
 * dm-ckpt metadata: the backing device, its superblock and group table, and
 * the commit of a step (flush, then the next superblock copy with FUA).
 *
 * The on-disk format itself (encoding, checks, which copy is current) is the
 * portable core's (ckpt_codec.h); this layer does the I/O around it. All
 * I/O goes through dm-io on the backing device.
 */
#ifndef DM_CKPT_METADATA_H
#define DM_CKPT_METADATA_H

#include <linux/device-mapper.h>
#include <linux/dm-io.h>

#include "ckpt_codec.h"

struct dm_ckpt_metadata {
	struct dm_target *ti;		/* for the device name in log lines */
	struct dm_dev *dev;		/* the backing device */
	struct dm_io_client *io;

	/* the image this table uses, while claimed (dm_ckpt_md_claim) */
	struct list_head claim;
	struct mapped_device *owner;
	u8 uuid[16];
	bool claimed;
};

/*
 * Open the backing device at path with the table's mode and create the dm-io
 * client. Constructor only: process context, may sleep (GFP_KERNEL). Returns
 * 0 or -errno with *error set to a static message for ti->error.
 */
int dm_ckpt_md_open(struct dm_ckpt_metadata *md, struct dm_target *ti,
		    const char *path, char **error);

/*
 * Claim the image with this uuid for the table's mapped device: one image,
 * one ckpt device. A table of another mapped device that claims it is
 * refused (-EBUSY), whichever path leads to the image (the same block
 * device, a dm-linear over it, ...); a new table of the same mapped device
 * (a reload, whose constructor runs while the old table lives) is not.
 * Constructor only: process context, takes a module-wide mutex. Returns 0 or
 * -EBUSY with *error set. dm_ckpt_md_close releases the claim.
 */
int dm_ckpt_md_claim(struct dm_ckpt_metadata *md, const u8 *uuid, char **error);

/* The mapped device's name, for log lines. Any context. */
const char *dm_ckpt_md_name(struct dm_ckpt_metadata *md);

/*
 * Undo dm_ckpt_md_open; also on a partly opened md. No I/O may be in flight.
 * Process context, may sleep.
 */
void dm_ckpt_md_close(struct dm_ckpt_metadata *md);

/*
 * Fill a dm-io request for len bytes at byte offset off of the backing device
 * (both 512 B aligned) from or to buf (kmalloc or vmalloc memory), with no
 * completion callback. Any context; does no I/O.
 */
void dm_ckpt_md_io_prep(struct dm_ckpt_metadata *md, struct dm_io_request *req,
			struct dm_io_region *where, blk_opf_t opf, void *buf,
			u64 off, u64 len);

/*
 * Submit a prepared request: synchronous when req->notify.fn is NULL (blocks
 * until the I/O is done), else asynchronous (may block for memory only).
 * Process context. Returns 0 or -errno.
 */
int dm_ckpt_md_submit(struct dm_io_request *req, struct dm_io_region *where,
		      unsigned long *error_bits);

/*
 * Synchronous I/O on the backing device: off and len in bytes, 512 B aligned.
 * Process context, no spinlock held; blocks until the I/O is done. Returns 0
 * or -errno; every I/O failure is -EIO (dm-io's synchronous path reports
 * -EIO whatever the bio's status was).
 */
int dm_ckpt_md_io(struct dm_ckpt_metadata *md, blk_opf_t opf, void *buf, u64 off,
		  u64 len);

/*
 * Read both superblock copies and pick the current one into sb (scratch is a
 * second superblock for the checks). When groups is not NULL, also read the
 * group table (n_chunks bytes, kvmalloc'ed into *groups, the caller frees it)
 * from the first copy that checks out. Damaged copies that were skipped are
 * logged. Process context, no spinlock held; blocks on I/O and allocates with
 * GFP_KERNEL. Returns 0 or -errno with *error set to a static message.
 */
int dm_ckpt_md_read_sb(struct dm_ckpt_metadata *md, struct ckpt_sb *sb,
		       struct ckpt_sb *scratch, u8 **groups, char **error);

/*
 * The two I/Os of a commit, which the core orders (ckpt_step_write_sb):
 * dm_ckpt_md_flush makes every write so far durable; dm_ckpt_md_write_sb
 * writes one encoded CKPT_BLOCK superblock block at byte offset off with
 * FUA. Called with the target's command lock held (it owns block); process
 * context; block on the I/O. Return 0 or -errno: the flush's own errno, -EIO
 * for any write failure (dm-io's synchronous path knows no other errno).
 */
int dm_ckpt_md_flush(struct dm_ckpt_metadata *md);
int dm_ckpt_md_write_sb(struct dm_ckpt_metadata *md, const void *block, u64 off);

#endif /* DM_CKPT_METADATA_H */
