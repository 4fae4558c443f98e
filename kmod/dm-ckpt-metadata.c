// SPDX-License-Identifier: GPL-2.0
/*
 * dm-ckpt metadata: superblock and group table reads, the commit of a step,
 * and the dm-io helper every backing I/O of the target goes through.
 */
#include <linux/blkdev.h>
#include <linux/device-mapper.h>
#include <linux/dm-io.h>
#include <linux/ioprio.h>
#include <linux/mm.h>
#include <linux/mutex.h>
#include <linux/list.h>
#include <linux/slab.h>
#include <linux/string.h>

#include "ckpt_config.h"
#include "dm-ckpt-metadata.h"

#define DM_MSG_PREFIX "ckpt"

const char *dm_ckpt_md_name(struct dm_ckpt_metadata *md)
{
	return dm_device_name(dm_table_get_md(md->ti->table));
}

int dm_ckpt_md_open(struct dm_ckpt_metadata *md, struct dm_target *ti,
		    const char *path, char **error)
{
	int ret;

	md->ti = ti;
	ret = dm_get_device(ti, path, dm_table_get_mode(ti->table), &md->dev);
	if (ret) {
		*error = "Backing device lookup failed";
		return ret;
	}
	if (bdev_logical_block_size(md->dev->bdev) > CKPT_BLOCK) {
		*error = "Backing device logical block size above 4096 is not supported";
		return -EINVAL;
	}
	md->io = dm_io_client_create();
	if (IS_ERR(md->io)) {
		ret = PTR_ERR(md->io);
		md->io = NULL;
		*error = "Cannot create dm-io client";
		return ret;
	}
	return 0;
}

/* Every claimed image, under dm_ckpt_claims_lock. */
static LIST_HEAD(dm_ckpt_claims);
static DEFINE_MUTEX(dm_ckpt_claims_lock);

int dm_ckpt_md_claim(struct dm_ckpt_metadata *md, const u8 *uuid, char **error)
{
	struct mapped_device *owner = dm_table_get_md(md->ti->table);
	struct dm_ckpt_metadata *o;
	int ret = 0;

	mutex_lock(&dm_ckpt_claims_lock);
	list_for_each_entry(o, &dm_ckpt_claims, claim) {
		if (o->owner != owner && !memcmp(o->uuid, uuid, sizeof(o->uuid))) {
			DMERR("%s: the image on %s (uuid %pU) is in use by ckpt device %s",
			      dm_ckpt_md_name(md), md->dev->name, uuid, dm_device_name(o->owner));
			*error = "Backing device in use by another ckpt device";
			ret = -EBUSY;
			goto out;
		}
	}
	memcpy(md->uuid, uuid, sizeof(md->uuid));
	md->owner = owner;
	list_add(&md->claim, &dm_ckpt_claims);
	md->claimed = true;
out:
	mutex_unlock(&dm_ckpt_claims_lock);
	return ret;
}

void dm_ckpt_md_close(struct dm_ckpt_metadata *md)
{
	if (md->claimed) {
		mutex_lock(&dm_ckpt_claims_lock);
		list_del(&md->claim);
		mutex_unlock(&dm_ckpt_claims_lock);
		md->claimed = false;
	}
	if (md->io)
		dm_io_client_destroy(md->io);
	md->io = NULL;
	if (md->dev)
		dm_put_device(md->ti, md->dev);
	md->dev = NULL;
}

int dm_ckpt_md_submit(struct dm_io_request *req, struct dm_io_region *where,
		      unsigned long *error_bits)
{
#ifdef CKPT_HAVE_DM_IO_IOPRIO
	return dm_io(req, 1, where, error_bits, IOPRIO_DEFAULT);
#else
	return dm_io(req, 1, where, error_bits);
#endif
}

void dm_ckpt_md_io_prep(struct dm_ckpt_metadata *md, struct dm_io_request *req,
			struct dm_io_region *where, blk_opf_t opf, void *buf,
			u64 off, u64 len)
{
	where->bdev = md->dev->bdev;
	where->sector = off >> SECTOR_SHIFT;
	where->count = len >> SECTOR_SHIFT;
	req->bi_opf = opf;
	req->mem.type = is_vmalloc_addr(buf) ? DM_IO_VMA : DM_IO_KMEM;
	req->mem.offset = 0;
	req->mem.ptr.addr = buf;
	req->notify.fn = NULL;
	req->notify.context = NULL;
	req->client = md->io;
}

int dm_ckpt_md_io(struct dm_ckpt_metadata *md, blk_opf_t opf, void *buf, u64 off,
		  u64 len)
{
	struct dm_io_request req;
	struct dm_io_region where;
	unsigned long bits = 0;

	dm_ckpt_md_io_prep(md, &req, &where, opf, buf, off, len);
	return dm_ckpt_md_submit(&req, &where, &bits);
}

/*
 * ti->error for the core's verdict on the superblock (a -CKPT_E_*); the log
 * line printed before it has the details of both copies.
 */
static const char *sb_error(int err)
{
	switch (err < 0 ? -err : err) {
	case CKPT_E_MAGIC:
		return "Superblock: bad magic number";
	case CKPT_E_CRC:
		return "Superblock: checksum mismatch";
	case CKPT_E_VERSION:
		return "Superblock: unsupported format version";
	case CKPT_E_FEATURE:
		return "Superblock: unsupported feature bits";
	case CKPT_E_GEOMETRY:
		return "Superblock: geometry out of range";
	case CKPT_E_LAYOUT:
		return "Superblock: offsets or sizes disagree with the geometry";
	case CKPT_E_TOO_SMALL:
		return "Superblock: backing device smaller than the layout";
	case CKPT_E_NO_SB:
		return "Superblock: no valid copy";
	case CKPT_E_BLOB:
		return "Superblock: trainer blob too large";
	case CKPT_E_MANIFEST:
		return "Superblock: manifest length out of range";
	default:
		return "Superblock: invalid";
	}
}

/*
 * Read one copy of the group table into table and check it against sb.
 * Returns 0, the read's -errno, or -EINVAL when the copy does not check out
 * (the core's -CKPT_E_* stays here); on error *why says what failed, for the
 * log, and *error the same for ti->error.
 */
static int read_groups(struct dm_ckpt_metadata *md, const struct ckpt_sb *sb, u32 copy,
		       u8 *table, const char **why, char **error)
{
	int ret;

	ret = dm_ckpt_md_io(md, REQ_OP_READ | REQ_SYNC, table,
			    ckpt_group_offset(&sb->regions, copy), sb->regions.group_bytes);
	if (ret) {
		*why = "read error";
		*error = "Cannot read the group table";
		return ret;
	}
	ret = ckpt_group_table_check(sb, table);
	if (ret == -CKPT_E_CRC) {
		*why = "checksum mismatch";
		*error = "Group table: checksum mismatch";
		return -EINVAL;
	}
	if (ret) {
		*why = "a chunk's group is out of range";
		*error = "Group table: a chunk's group is out of range";
		return -EINVAL;
	}
	return 0;
}

int dm_ckpt_md_read_sb(struct dm_ckpt_metadata *md, struct ckpt_sb *sb,
		       struct ckpt_sb *scratch, u8 **groups, char **error)
{
	u64 dev_bytes = bdev_nr_bytes(md->dev->bdev);
	const char *why[2] = { NULL, NULL };
	u8 *buf, *table = NULL;
	int ret, r0, r1;
	u32 copy, copies, other;

	if (dev_bytes < 2 * CKPT_BLOCK) {
		*error = "Backing device too small for a superblock";
		return -EINVAL;
	}
	buf = kvmalloc(2 * CKPT_BLOCK, GFP_KERNEL);
	if (!buf) {
		*error = "Cannot allocate superblock buffer";
		return -ENOMEM;
	}
	ret = dm_ckpt_md_io(md, REQ_OP_READ | REQ_SYNC, buf, 0, 2 * CKPT_BLOCK);
	if (ret) {
		*error = "Cannot read the superblock";
		goto out;
	}
	ret = ckpt_sb_pick(buf, buf + CKPT_BLOCK, dev_bytes, sb);
	if (ret < 0) {
		r0 = ckpt_sb_decode(buf, dev_bytes, scratch);
		r1 = ckpt_sb_decode(buf + CKPT_BLOCK, dev_bytes, scratch);
		DMERR("%s: no usable superblock on %s (%llu bytes): copy 0: %s, copy 1: %s",
		      dm_ckpt_md_name(md), md->dev->name, dev_bytes,
		      r0 ? ckpt_strerror(r0) : "wrong parity",
		      r1 ? ckpt_strerror(r1) : "wrong parity");
		*error = (char *)sb_error(ret);
		ret = -EINVAL;
		goto out;
	}
	copy = ret;
	ret = 0;
	if (!groups)
		goto out;

	other = copy ^ 1;
	/* It may have been a newer commit: the device would resume one step back. */
	r1 = ckpt_sb_check_other(buf + other * CKPT_BLOCK, other, dev_bytes, sb, scratch);
	if (r1)
		DMWARN("%s: superblock copy %u on %s is damaged (%s): using copy %u (sequence %llu, step %llu), a newer commit may be lost",
		       dm_ckpt_md_name(md), other, md->dev->name,
		       r1 == -CKPT_E_NO_SB ? "its sequence belongs to the other copy" :
		       ckpt_strerror(r1), copy, sb->sequence, sb->committed_step);

	table = kvmalloc(sb->regions.group_bytes, GFP_KERNEL);
	if (!table) {
		*error = "Cannot allocate the group table";
		ret = -ENOMEM;
		goto out;
	}
	copies = ckpt_meta_copies(&sb->regions);
	for (copy = 0; copy < copies; copy++) {
		ret = read_groups(md, sb, copy, table, &why[copy], error);
		if (!ret)
			break;
	}
	if (ret) {
		DMERR("%s: group table on %s: copy 0: %s%s%s", dm_ckpt_md_name(md), md->dev->name,
		      why[0], copies > 1 ? ", copy 1: " : "", copies > 1 ? why[1] : "");
		if (copies > 1)
			*error = "Group table: no intact copy";
		goto out;
	}
	if (copy)
		DMWARN("%s: group table copy 0 on %s is damaged (%s): using copy 1",
		       dm_ckpt_md_name(md), md->dev->name, why[0]);
	*groups = table;
	table = NULL;
out:
	kvfree(table);
	kvfree(buf);
	return ret;
}

int dm_ckpt_md_flush(struct dm_ckpt_metadata *md)
{
	return blkdev_issue_flush(md->dev->bdev);
}

int dm_ckpt_md_write_sb(struct dm_ckpt_metadata *md, const void *block, u64 off)
{
	/* dm-io takes a non-const buffer for both directions; a write only reads it. */
	return dm_ckpt_md_io(md, REQ_OP_WRITE | REQ_SYNC | REQ_FUA, (void *)block, off,
			     CKPT_BLOCK);
}
