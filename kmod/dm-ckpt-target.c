// SPDX-License-Identifier: GPL-2.0
/*
 * dm-ckpt: a device-mapper target that runs the AdamW optimizer step in the
 * storage path.
 *
 * The trainer writes fp16/bf16 gradients to the GRAD window of the virtual
 * device; each whole chunk of gradients triggers the fused update of that
 * chunk's fp32 state (p, exp_avg, exp_avg_sq) on the backing device; the
 * trainer reads the rounded parameters back from the PARAM window. Commands
 * (BEGIN, COMMIT, ABORT) are writes to the control block; reading it returns
 * the status page. Every committed step is durable: the superblock pointing
 * at the new slot is written with FUA after a flush.
 *
 * The on-disk format, the command/status ABI, the step state machine and the
 * update loop are the portable core (libckpt/core, compiled in place by
 * Kbuild): the userspace engine runs the same code, and both must leave
 * byte-identical backing images for the same command stream.
 *
 * Files: this one is the target (table line, map, deferred bios, commands,
 * staging, status, messages, module init); dm-ckpt-metadata.c reads the
 * superblock and group table and commits; dm-ckpt-update.c owns the chunk
 * buffers and runs the chunk updates, knowing the target only through what
 * dm_ckpt_upd_create is given; dm-ckpt-io.h is the per-bio data they share.
 *
 * Names tell the layer, as in dm-clone: dmckpt_* are the target's ops and
 * helpers, __dmckpt_* run with cmd_lock held (the core's ops among them),
 * dm_ckpt_md_* and dm_ckpt_upd_* are the metadata and update APIs, ckpt_*
 * the core.
 *
 * Threads:
 *  - map() does what the core's routing (ckpt_step_route) says: remaps PARAM
 *    reads (no copy), zero-fills GRAD reads, kills refused writes and defers
 *    control-block I/O and GRAD writes;
 *  - one ordered work item per target processes deferred bios in order under
 *    cmd_lock: commands, status reads, and gradient writes (check, stage,
 *    claim, dispatch);
 *  - chunk updates run as work items on an unbound workqueue, one per busy
 *    chunk buffer (queue_depth of them, allocated in the constructor): read
 *    the committed slot's record, update in kernel_fpu_begin/end slices,
 *    write record and p_lo to the other slot.
 */
#include <linux/module.h>
#include <linux/init.h>
#include <linux/bio.h>
#include <linux/blk-cgroup.h>
#include <linux/blkdev.h>
#include <linux/device-mapper.h>
#include <linux/mm.h>
#include <linux/slab.h>
#include <linux/vmalloc.h>
#include <linux/workqueue.h>
#include <linux/wait.h>
#include <linux/completion.h>
#include <linux/mutex.h>
#include <linux/spinlock.h>
#include <linux/string.h>
#include <linux/kernel.h>
#include <linux/kthread.h>
#include <linux/sched.h>
#include <linux/sched/mm.h>

#include "ckpt_config.h"
#include "ckpt_codec.h"
#include "ckpt_step.h"
#include "ckpt_table.h"
#include "dm-ckpt-io.h"
#include "dm-ckpt-metadata.h"
#include "dm-ckpt-update.h"

#define DM_MSG_PREFIX "ckpt"

/*
 * The target instance: this file's alone (the metadata layer and the update
 * see only what their create calls are given).
 */
struct dm_ckpt {
	struct dm_target *ti;
	struct dm_ckpt_metadata md;
	struct dm_ckpt_update *upd;
	struct workqueue_struct *ctl_wq;
	struct ckpt_regions regions;	/* constant for the target's life */
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

/* ---------------------------------------------------------------- helpers */

static void dmckpt_bio_copy_to(struct bio *bio, const void *src)
{
	struct bvec_iter it;
	struct bio_vec bv;
	const u8 *s = src;

	bio_for_each_segment(bv, bio, it) {
		memcpy_to_bvec(&bv, s);
		s += bv.bv_len;
	}
}

/*
 * The backing device failed with err: log the first error (first: it became
 * the sticky c->error), and on entering failed mode (entered) tell
 * userspace with a table event (never under a spinlock).
 */
static void dmckpt_failed_mode(struct dm_ckpt *c, int err, bool first, bool entered)
{
	u64 committed;

	if (first) {
		spin_lock(&c->sm_lock);
		committed = c->step.sm.committed_step;
		spin_unlock(&c->sm_lock);
		DMERR("%s: backing device error %d: failed mode, step %llu stays committed; reload the table to go on",
		      dm_ckpt_name(c), err, committed);
	}
	if (entered)
		dm_table_event(c->ti->table);
}

/*
 * A chunk update failed on the backing device with err (a -errno, never a
 * -CKPT_E_*; the update's failed op): the first such error is kept
 * (c->error, reported as first_io_error), the state machine enters FAILED
 * (ckpt_sm_fail), and on entering failed mode a table event tells userspace
 * (dmsetup wait, dmeventd). A failed commit takes the same way through the
 * core's failed op. Process context, no spinlock held: takes sm_lock, and
 * dm_table_event() a mutex.
 */
static void dmckpt_update_failed(void *ctx, int err)
{
	struct dm_ckpt *c = ctx;
	bool first, entered;

	/* A caller bug must neither clear the sticky error nor pass for success. */
	if (err >= 0)
		err = -EIO;
	first = !cmpxchg(&c->error, 0, err);

	spin_lock(&c->sm_lock);
	entered = c->step.sm.state != CKPT_STATE_FAILED;
	ckpt_sm_fail(&c->step.sm, READ_ONCE(c->error));
	spin_unlock(&c->sm_lock);
	dmckpt_failed_mode(c, err, first, entered);
}

/* ---------------------------------------------------------------- core host */

/*
 * The ops of the core's step protocol (ckpt_step.h): the kernel does the
 * I/O, the locking and the memory, the core every protocol decision. The
 * command lock is cmd_lock, the sm lock sm_lock.
 */

/* A gradient write's source: the bio and how far the walk has read it. */
struct dmckpt_src {
	struct bio *bio;
	struct bvec_iter it;
};

static void dmckpt_lock(void *host)
{
	struct dm_ckpt *c = host;

	spin_lock(&c->sm_lock);
}

static void dmckpt_unlock(void *host)
{
	struct dm_ckpt *c = host;

	spin_unlock(&c->sm_lock);
}

/* Core op: cmd_lock held. */
static void __dmckpt_drain(void *host)
{
	struct dm_ckpt *c = host;

	dm_ckpt_upd_drain(c->upd);
}

/* Core op: cmd_lock held. */
static int __dmckpt_flush(void *host)
{
	struct dm_ckpt *c = host;

	return dm_ckpt_md_flush(&c->md);
}

/* Core op: cmd_lock held. */
static int __dmckpt_write_sb(void *host, const void *block, u64 off)
{
	struct dm_ckpt *c = host;

	return dm_ckpt_md_write_sb(&c->md, block, off);
}

/* Core op: cmd_lock held. */
static int __dmckpt_read(void *host, void *buf, u64 off, u64 len)
{
	struct dm_ckpt *c = host;

	return dm_ckpt_md_io(&c->md, REQ_OP_READ | REQ_SYNC, buf, off, len);
}

/* Core op (a rollback's re-stamped headers): cmd_lock held. */
static int __dmckpt_write(void *host, const void *buf, u64 off, u64 len)
{
	struct dm_ckpt *c = host;

	return dm_ckpt_md_io(&c->md, REQ_OP_WRITE | REQ_SYNC, (void *)buf, off, len);
}

/*
 * Core op (a rollback's superblock and record): cmd_lock held. A control
 * write runs it from the bio work, so the memory is allocated without I/O.
 */
static void *__dmckpt_alloc(void *host, u64 bytes)
{
	unsigned int noio = memalloc_noio_save();
	void *p = kvmalloc(bytes, DM_CKPT_GFP_BIG);

	memalloc_noio_restore(noio);
	return p;
}

static void __dmckpt_free(void *host, void *p)
{
	kvfree(p);
}

/* Core op: cmd_lock held. */
static void __dmckpt_copy(void *host, void *src, void *dst, u64 n)
{
	struct dmckpt_src *s = src;

	dm_ckpt_bio_copy_from(s->bio, &s->it, dst, n);
}

/* Core op: cmd_lock held (dm_ckpt_upd_dispatch needs it). */
static int __dmckpt_dispatch(void *host, void *src, u32 chunk, const void *grad)
{
	struct dmckpt_src *s = src;

	struct dm_ckpt *c = host;

	dm_ckpt_upd_dispatch(c->upd, s->bio, chunk, c->groups[chunk], grad ? NULL : &s->it, grad);
	return 0;
}

/*
 * Once the step is open, the slot it writes must have no PARAM read in
 * flight: a read mapped before BEGIN reads the previous state there, and
 * the step's first update would overwrite it under the read. New reads of
 * that slot start only for chunks already updated. Core op: cmd_lock held.
 */
static void __dmckpt_quiesce(void *host, u32 slot)
{
	struct dm_ckpt *c = host;

	wait_event(c->readers_wait, !atomic_read(&c->readers[slot]));
}

/*
 * Core op, cmd_lock held: a superblock write failed (a commit's, or a
 * rollback's once issued), the machine has failed.
 */
static void __dmckpt_sb_failed(void *host, int err)
{
	struct dm_ckpt *c = host;

	DMERR("%s: writing the superblock failed: %d; a table reload reads which commit stands",
	      dm_ckpt_name(c), err);
	dmckpt_failed_mode(c, err, !cmpxchg(&c->error, 0, err), true);
}

/*
 * What the core's rollback did (the ROLLBACK command and the rollback
 * message both run it through ckpt_step_exec), in the log: where and why it
 * refused or failed, or the step now committed; nothing after any other
 * command (ret < 0: the command may not have decoded). Caller holds cmd_lock.
 */
static void __dmckpt_rollback_said(struct dm_ckpt *c, int ret)
{
	const struct ckpt_rollback_fault *f = &c->step.rollback;
	const char *name = dm_ckpt_name(c);
	const u64 prev = c->sb->committed_step - 1;

	switch (f->part) {
	case CKPT_ROLLBACK_OK:
		if (!ret && c->step.mem.cmd->opcode == CKPT_OP_ROLLBACK)
			DMINFO("%s: rolled back to step %llu", name, c->sb->committed_step);
		break;
	case CKPT_ROLLBACK_MACHINE:
		DMWARN_LIMIT("%s: rollback refused: %s (committed step %llu)", name,
			     ckpt_strerror(ret), c->sb->committed_step);
		break;
	case CKPT_ROLLBACK_OLDER:
		if (ret == -CKPT_E_IO)
			DMWARN_LIMIT("%s: rollback failed: reading superblock copy %u: %d", name,
				     f->older_index, f->io_errno);
		else if (f->older)
			DMWARN_LIMIT("%s: rollback refused: superblock copy %u is not valid (%s)",
				     name, f->older_index, ckpt_strerror(f->older));
		else
			DMWARN_LIMIT("%s: rollback refused: superblock copy %u commits step %llu sequence %llu, not step %llu: a rollback goes back one step, once",
				     name, f->older_index, f->older_step, f->older_sequence, prev);
		break;
	case CKPT_ROLLBACK_RECORD:
		if (ret == -CKPT_E_IO)
			DMWARN_LIMIT("%s: rollback failed: reading chunk %u of slot %u: %d", name,
				     f->chunk, f->slot, f->io_errno);
		else
			DMWARN_LIMIT("%s: rollback refused: chunk %u of slot %u no longer holds step %llu: %s",
				     name, f->chunk, f->slot, prev, ckpt_rec_fault_str(f->rec));
		break;
	case CKPT_ROLLBACK_RESTAMP:
		DMWARN_LIMIT("%s: rollback failed: writing chunk %u of slot %u: %d", name, f->chunk,
			     f->slot, f->io_errno);
		break;
	case CKPT_ROLLBACK_COMMIT:
		DMWARN_LIMIT("%s: rollback failed: the commit: %d", name, f->io_errno);
		break;
	case CKPT_ROLLBACK_NOMEM:
		DMWARN_LIMIT("%s: rollback refused: out of memory", name);
		break;
	}
}

static const struct ckpt_step_ops dmckpt_step_ops = {
	.lock = dmckpt_lock,
	.unlock = dmckpt_unlock,
	.drain = __dmckpt_drain,
	.flush = __dmckpt_flush,
	.write_sb = __dmckpt_write_sb,
	.copy = __dmckpt_copy,
	.dispatch = __dmckpt_dispatch,
	.quiesce = __dmckpt_quiesce,
	.failed = __dmckpt_sb_failed,
	.read = __dmckpt_read,
	.write = __dmckpt_write,
	.alloc = __dmckpt_alloc,
	.free = __dmckpt_free,
	.fpu_begin = dm_ckpt_fpu_begin,
	.fpu_end = dm_ckpt_fpu_end,
};

/* ---------------------------------------------------------------- deferred bios */

/* Caller holds cmd_lock. */
static void __dmckpt_grad_write(struct dm_ckpt *c, struct bio *bio, const struct ckpt_route *r)
{
	struct dmckpt_src src = { .bio = bio, .it = bio->bi_iter };
	u64 off = r->off;
	u64 len = r->len;
	int ret;

	ret = ckpt_step_grad_write(&c->step, off, len, &src);
	if (ret)
		DMDEBUG_LIMIT("%s: gradient write of %llu bytes at %llu refused: %s",
			      dm_ckpt_name(c), len, off, ckpt_strerror(ret));
	dm_ckpt_bio_put(bio, ret ? BLK_STS_IOERR : BLK_STS_OK);
}

/* Caller holds cmd_lock. */
static void __dmckpt_control_write(struct dm_ckpt *c, struct bio *bio)
{
	struct bvec_iter it = bio->bi_iter;
	u32 len = bio->bi_iter.bi_size;
	int ret;

	memset(c->page, 0, CKPT_BLOCK);
	dm_ckpt_bio_copy_from(bio, &it, c->page, len);
	ret = ckpt_step_command(&c->step, c->page, len);
	__dmckpt_rollback_said(c, ret);
	if (ret < 0)
		DMDEBUG_LIMIT("%s: command refused: %s", dm_ckpt_name(c), ckpt_strerror(ret));
	dm_ckpt_bio_put(bio, ret < 0 ? BLK_STS_IOERR : BLK_STS_OK);
}

/* Caller holds cmd_lock. */
static void __dmckpt_control_read(struct dm_ckpt *c, struct bio *bio, const struct ckpt_route *r)
{
	spin_lock(&c->sm_lock);
	ckpt_sm_status(&c->step.sm, c->sb, c->st);
	c->st->grad_bytes = c->step.grad_bytes;
	spin_unlock(&c->sm_lock);
	c->st->param_bytes = atomic64_read(&c->param_bytes);
	ckpt_status_encode(c->st, c->page);
	dmckpt_bio_copy_to(bio, c->page + r->off);
	dm_ckpt_bio_put(bio, BLK_STS_OK);
}

static void dmckpt_bio_work(struct work_struct *work)
{
	struct dm_ckpt *c = container_of(work, struct dm_ckpt, bio_work);
	struct bio_list bios;
	struct bio *bio;
	unsigned long flags;

	spin_lock_irqsave(&c->bio_lock, flags);
	bios = c->bios;
	bio_list_init(&c->bios);
	spin_unlock_irqrestore(&c->bio_lock, flags);

	while ((bio = bio_list_pop(&bios))) {
		const struct ckpt_route *r = &dm_ckpt_io_of(bio)->route;

		/* staging and commit I/O are the writer's, as the update's (job_work) */
		kthread_associate_blkcg(bio_blkcg_css(bio));
		mutex_lock(&c->cmd_lock);
		if (r->window == CKPT_WIN_GRAD)
			__dmckpt_grad_write(c, bio, r);
		else if (bio_data_dir(bio) == WRITE)
			__dmckpt_control_write(c, bio);
		else
			__dmckpt_control_read(c, bio, r);
		mutex_unlock(&c->cmd_lock);
		kthread_associate_blkcg(NULL);
		cond_resched();
	}
}

/* ---------------------------------------------------------------- map */

static void dmckpt_defer(struct dm_ckpt *c, struct bio *bio)
{
	struct dm_ckpt_io *io = dm_ckpt_io_of(bio);
	unsigned long flags;

	atomic_set(&io->pending, 1);
	io->status = BLK_STS_OK;
	/*
	 * dm hands the target a clone with no blk-cgroup of its own. Map runs
	 * in the submitter's context: associate the clone with the submitter's
	 * cgroup now, so that the workers can charge the I/O it causes to it
	 * (dmckpt_bio_work, and the update's job_work).
	 */
	bio_associate_blkg(bio);
	spin_lock_irqsave(&c->bio_lock, flags);
	bio_list_add(&c->bios, bio);
	spin_unlock_irqrestore(&c->bio_lock, flags);
	queue_work(c->ctl_wq, &c->bio_work);
}

/*
 * The core routes every bio (ckpt_step_route: which window, allowed or not,
 * where it is cut, and a refused write counted on the status page); map
 * only does what the route says: kill, accept part of the bio, zero-fill,
 * remap or defer.
 */
static int dmckpt_map(struct dm_target *ti, struct bio *bio)
{
	struct dm_ckpt *c = ti->private;
	struct dm_ckpt_io *io = dm_ckpt_io_of(bio);
	struct ckpt_route *r = &io->route;
	u32 flags = 0;
	u64 off, len;
	u32 slot;

	io->slot = -1;
	if (bio->bi_opf & REQ_PREFLUSH) {
		/* Empty flush (dm core splits flush+data): pass to the backing device. */
		bio_set_dev(bio, c->md.dev->bdev);
		return DM_MAPIO_REMAPPED;
	}
	if (bio_op(bio) != REQ_OP_READ && bio_op(bio) != REQ_OP_WRITE)
		return DM_MAPIO_KILL;

	off = dm_target_offset(ti, bio->bi_iter.bi_sector) << SECTOR_SHIFT;
	len = bio->bi_iter.bi_size;
	if (bio_data_dir(bio) == WRITE)
		flags |= CKPT_ROUTE_WRITE;
	/* A read-only table never writes the backing device. */
	if (c->read_only)
		flags |= CKPT_ROUTE_READ_ONLY;
	if (ckpt_step_route(&c->step, off, len, flags, r))
		return DM_MAPIO_KILL;
	if (r->len < len)
		dm_accept_partial_bio(bio, r->len >> SECTOR_SHIFT);

	switch (r->window) {
	case CKPT_WIN_CTRL:
		dmckpt_defer(c, bio);
		return DM_MAPIO_SUBMITTED;
	case CKPT_WIN_GRAD:
		if (flags & CKPT_ROUTE_WRITE) {
			dmckpt_defer(c, bio);
			return DM_MAPIO_SUBMITTED;
		}
		zero_fill_bio(bio);
		break;
	case CKPT_WIN_PARAM:
		/* One chunk per bio, remapped to the slot with its latest values. */
		spin_lock(&c->sm_lock);
		slot = ckpt_sm_read_slot(&c->step.sm, r->chunk);
		atomic_inc(&c->readers[slot]);
		spin_unlock(&c->sm_lock);
		io->slot = slot;
		atomic64_add(r->len, &c->param_bytes);
		bio_set_dev(bio, c->md.dev->bdev);
		bio->bi_iter.bi_sector = (ckpt_plo_offset(&c->regions, slot, r->chunk) + r->in) >>
					 SECTOR_SHIFT;
		return DM_MAPIO_REMAPPED;
	case CKPT_WIN_IMAGE:
		/* A read of the backing image: its bytes, where they lie. */
		bio_set_dev(bio, c->md.dev->bdev);
		bio->bi_iter.bi_sector = r->off >> SECTOR_SHIFT;
		return DM_MAPIO_REMAPPED;
	}
	/* Nothing to do (an empty bio), or the zero-filled GRAD read. */
	bio_endio(bio);
	return DM_MAPIO_SUBMITTED;
}

static int dmckpt_end_io(struct dm_target *ti, struct bio *bio, blk_status_t *error)
{
	struct dm_ckpt *c = ti->private;
	int slot = dm_ckpt_io_of(bio)->slot;

	if (slot >= 0 && atomic_dec_and_test(&c->readers[slot]))
		wake_up_all(&c->readers_wait);
	return DM_ENDIO_DONE;
}

/* ---------------------------------------------------------------- ctr/dtr */

static void dmckpt_free(struct dm_ckpt *c)
{
	dm_ckpt_upd_destroy(c->upd);
	if (c->ctl_wq)
		destroy_workqueue(c->ctl_wq);
	if (c->mem.stages) {
		u32 i;

		for (i = 0; i < c->mem.n_stages; i++)
			kvfree(c->mem.stages[i].grad);
	}
	kvfree(c->cover_mem);
	kvfree(c->mem.stages);
	kvfree(c->mem.stage_of);
	kvfree(c->mem.claimed);
	kvfree(c->mem.applied);
	kvfree(c->mem.sumsq);
	kvfree(c->mem.modes);
	kfree(c->mem.spare);
	kfree(c->mem.cmd);
	kvfree(c->groups);
	kfree(c->page);
	kfree(c->st);
	kfree(c->sb);
	dm_ckpt_md_close(&c->md);
	kfree(c);
}

/*
 * What the table line asks for must fit: staging_kb and queue_depth reach
 * gigabytes with the largest chunks (8 MiB of gradients, 48 MiB records), and
 * 2^18 or more chunks make even the per-stage arrays large. Everything is
 * added up before anything is allocated, and a table that would take more
 * than half the memory is refused with the option to reduce.
 */
static int dmckpt_check_memory(struct dm_ckpt *c, u64 n_stages, char **error)
{
	const u64 cb = c->regions.plo_chunk_bytes;
	const u64 stage_bytes = cb + sizeof(struct ckpt_stage_buf) +
		ckpt_bitmap_words(cb >> SECTOR_SHIFT) * sizeof(u64);
	const u64 staging = n_stages * stage_bytes;
	const u64 jobs = dm_ckpt_upd_bytes(&c->regions, c->args.queue_depth);
	const u64 budget = ((u64)totalram_pages() << PAGE_SHIFT) / 2;

	if (staging > budget) {
		DMERR("%s: staging_kb %u with %llu KiB chunks needs %llu MiB for %llu stages, more than half the RAM (%llu MiB)",
		      dm_ckpt_name(c), c->args.staging_kb, cb >> 10, staging >> 20, n_stages,
		      budget >> 20);
		*error = "staging_kb needs more than half the RAM: reduce staging_kb";
		return -ENOMEM;
	}
	if (jobs > budget) {
		DMERR("%s: queue_depth %u with %llu KiB records needs %llu MiB of chunk buffers, more than half the RAM (%llu MiB)",
		      dm_ckpt_name(c), c->args.queue_depth, c->regions.record_bytes >> 10,
		      jobs >> 20, budget >> 20);
		*error = "queue_depth needs more than half the RAM: reduce queue_depth";
		return -ENOMEM;
	}
	if (staging + jobs > budget) {
		DMERR("%s: staging_kb %u and queue_depth %u need %llu + %llu MiB, more than half the RAM (%llu MiB)",
		      dm_ckpt_name(c), c->args.staging_kb, c->args.queue_depth, staging >> 20,
		      jobs >> 20, budget >> 20);
		*error = "staging_kb plus queue_depth exceed half the RAM: reduce either";
		return -ENOMEM;
	}
	return 0;
}

/* The memory the core's step protocol runs in (struct ckpt_step_mem). */
static int dmckpt_alloc(struct dm_ckpt *c, char **error)
{
	struct ckpt_step_mem *mem = &c->mem;
	const u32 n_chunks = c->sb->geo.n_chunks;
	const u64 cb = c->regions.plo_chunk_bytes;
	const u32 cover_words = ckpt_bitmap_words(cb >> SECTOR_SHIFT);
	struct dm_ckpt_upd_target upd;
	u32 n_stages;
	unsigned int i;
	int ret;

	n_stages = ckpt_stage_count((u64)c->args.staging_kb << 10, cb, n_chunks);
	ret = dmckpt_check_memory(c, n_stages, error);
	if (ret)
		return ret;

	mem->claimed = kvcalloc(ckpt_bitmap_words(n_chunks), sizeof(u64), DM_CKPT_GFP_BIG);
	mem->applied = kvcalloc(ckpt_bitmap_words(n_chunks), sizeof(u64), DM_CKPT_GFP_BIG);
	mem->stage_of = kvmalloc_array(n_chunks, sizeof(u32), DM_CKPT_GFP_BIG);
	mem->sumsq = kvcalloc(n_chunks, sizeof(u64), DM_CKPT_GFP_BIG);
	if (!mem->claimed || !mem->applied || !mem->stage_of || !mem->sumsq) {
		*error = "Cannot allocate the per-chunk bitmaps";
		return -ENOMEM;
	}
	if (c->sb->feature_incompat & CKPT_FEATURE_INCOMPAT_COUNTS) {
		/* what the open step does with each block (1 B per 2048 params) */
		mem->modes = kvzalloc(ckpt_step_blocks(&c->regions), DM_CKPT_GFP_BIG);
		if (!mem->modes) {
			*error = "Cannot allocate the per-block step modes";
			return -ENOMEM;
		}
	}
	mem->cmd = kzalloc(sizeof(*mem->cmd), GFP_KERNEL);
	if (!mem->cmd) {
		*error = "Cannot allocate memory";
		return -ENOMEM;
	}
	/* The superblock is encoded in the scratch page, under cmd_lock. */
	mem->block = c->page;

	/* One buffer per stage: no single allocation grows with staging_kb. */
	mem->stages = kvcalloc(n_stages, sizeof(*mem->stages), DM_CKPT_GFP_BIG);
	c->cover_mem = kvcalloc((size_t)n_stages * cover_words, sizeof(u64), DM_CKPT_GFP_BIG);
	if (!mem->stages || !c->cover_mem) {
		*error = "Cannot allocate staging memory: reduce staging_kb";
		return -ENOMEM;
	}
	mem->n_stages = n_stages;
	for (i = 0; i < n_stages; i++) {
		mem->stages[i].cover = c->cover_mem + (size_t)i * cover_words;
		mem->stages[i].grad = kvmalloc(cb, DM_CKPT_GFP_BIG);
		if (!mem->stages[i].grad) {
			*error = "Cannot allocate staging memory: reduce staging_kb";
			return -ENOMEM;
		}
		if (!(i & 1023))
			cond_resched();
	}
	upd = (struct dm_ckpt_upd_target){
		.md = &c->md,
		.regions = &c->regions,
		.step = &c->step,
		.sm_lock = &c->sm_lock,
		.failed = dmckpt_update_failed,
		.ctx = c,
	};
	c->upd = dm_ckpt_upd_create(&upd, c->args.queue_depth, error);
	if (IS_ERR(c->upd)) {
		ret = PTR_ERR(c->upd);
		c->upd = NULL;
		return ret;
	}
	return 0;
}

/*
 * ckpt <backing_dev> [#opt_args] [queue_depth N] [staging_kb K]
 */
static int dmckpt_ctr(struct dm_target *ti, unsigned int argc, char **argv)
{
	struct ckpt_table_args args;
	const char *err;
	struct dm_ckpt *c;
	int ret;

	if (ckpt_table_parse(argc, argv, &args, &err)) {
		ti->error = (char *)err;
		return -EINVAL;
	}
	c = kzalloc(sizeof(*c), GFP_KERNEL);
	if (!c) {
		ti->error = "Cannot allocate context";
		return -ENOMEM;
	}
	c->ti = ti;
	spin_lock_init(&c->bio_lock);
	bio_list_init(&c->bios);
	INIT_WORK(&c->bio_work, dmckpt_bio_work);
	mutex_init(&c->cmd_lock);
	spin_lock_init(&c->sm_lock);
	atomic_set(&c->readers[0], 0);
	atomic_set(&c->readers[1], 0);
	init_waitqueue_head(&c->readers_wait);
#ifdef CKPT_HAVE_BLK_MODE_T
	c->read_only = !(dm_table_get_mode(ti->table) & BLK_OPEN_WRITE);
#else
	c->read_only = !(dm_table_get_mode(ti->table) & FMODE_WRITE);
#endif
	atomic64_set(&c->param_bytes, 0);

	c->args = args;

	ret = dm_ckpt_md_open(&c->md, ti, args.dev, &ti->error);
	if (ret)
		goto bad;

	c->sb = kzalloc(sizeof(*c->sb), GFP_KERNEL);
	c->mem.spare = kzalloc(sizeof(*c->mem.spare), GFP_KERNEL);
	c->st = kzalloc(sizeof(*c->st), GFP_KERNEL);
	c->page = kzalloc(CKPT_BLOCK, GFP_KERNEL);
	if (!c->sb || !c->mem.spare || !c->st || !c->page) {
		ti->error = "Cannot allocate memory";
		ret = -ENOMEM;
		goto bad;
	}

	/* The core's spare superblock is the scratch of the checks (no commit yet). */
	ret = dm_ckpt_md_read_sb(&c->md, c->sb, c->mem.spare, &c->groups, &ti->error);
	if (ret)
		goto bad;
	ret = dm_ckpt_md_claim(&c->md, c->sb->uuid, &ti->error);
	if (ret)
		goto bad;
	c->regions = c->sb->regions;
	memcpy(c->uuid, c->sb->uuid, sizeof(c->uuid));
	c->dtype = c->sb->geo.dtype;

	if (ti->len != c->regions.virt_bytes >> SECTOR_SHIFT) {
		DMERR("%s: the table has %llu sectors, the device's virtual size is %llu sectors",
		      dm_ckpt_name(c), (unsigned long long)ti->len,
		      c->regions.virt_bytes >> SECTOR_SHIFT);
		ti->error = "Target length does not match the virtual size in the superblock";
		ret = -EINVAL;
		goto bad;
	}

	ret = dmckpt_alloc(c, &ti->error);
	if (ret)
		goto bad;

	c->ctl_wq = alloc_ordered_workqueue("dm-ckpt-ctl", WQ_MEM_RECLAIM);
	if (!c->ctl_wq) {
		ti->error = "Cannot allocate workqueues";
		ret = -ENOMEM;
		goto bad;
	}

	ckpt_step_init(&c->step, &dmckpt_step_ops, c, c->sb, &c->mem);

	ti->num_flush_bios = 1;
	ti->num_discard_bios = 0;
	ti->num_write_zeroes_bios = 0;
	ti->per_io_data_size = sizeof(struct dm_ckpt_io);
	ti->private = c;
	return 0;
bad:
	dmckpt_free(c);
	return ret;
}

static void dmckpt_dtr(struct dm_target *ti)
{
	struct dm_ckpt *c = ti->private;

	flush_workqueue(c->ctl_wq);
	dm_ckpt_upd_drain(c->upd);
	dmckpt_free(c);
}

/* ---------------------------------------------------------------- suspend/resume */

static void dmckpt_postsuspend(struct dm_target *ti)
{
	struct dm_ckpt *c = ti->private;

	/* dm core waited for our bios; nothing may still touch the device. */
	flush_workqueue(c->ctl_wq);
	dm_ckpt_upd_drain(c->upd);
}

/*
 * Every resume checks that the backing device still holds the image this
 * table was loaded for (same uuid and geometry). The first resume of a table
 * then starts from the superblock as it is now: a table loaded while an
 * older one was live (a reload) must not use what that one has since
 * committed, and an open step of the old instance is dropped. A later resume
 * keeps the open step, so the image must not have changed meanwhile.
 */
static int dmckpt_preresume(struct dm_target *ti)
{
	struct dm_ckpt *c = ti->private;
	/* The core's spare superblock: it uses it only inside a commit (cmd_lock). */
	struct ckpt_sb *now = c->mem.spare;
	char *error = NULL;
	int ret;

	mutex_lock(&c->cmd_lock);
	ret = dm_ckpt_md_read_sb(&c->md, now, now, NULL, &error);
	if (ret) {
		DMERR("%s: resume: %s", dm_ckpt_name(c), error);
		goto out;
	}
	if (memcmp(&now->geo, &c->sb->geo, sizeof(now->geo)) ||
	    memcmp(now->uuid, c->sb->uuid, sizeof(now->uuid))) {
		DMERR("%s: resume: the device was reformatted since the table was loaded",
		      dm_ckpt_name(c));
		ret = -EINVAL;
		goto out;
	}
	if (now->sequence != c->sb->sequence) {
		if (c->started) {
			DMERR("%s: resume: the image changed while the device was suspended (superblock sequence %llu, this table committed %llu)",
			      dm_ckpt_name(c), now->sequence, c->sb->sequence);
			ret = -EINVAL;
			goto out;
		}
		*c->sb = *now;
		ckpt_step_restart(&c->step);
	}
	c->started = true;
out:
	mutex_unlock(&c->cmd_lock);
	return ret;
}

/* ---------------------------------------------------------------- status */

static void dmckpt_counters(struct dm_ckpt *c, struct ckpt_counters *k)
{
	spin_lock(&c->sm_lock);
	ckpt_sm_counters(&c->step.sm, c->step.grad_bytes, atomic64_read(&c->param_bytes), k);
	spin_unlock(&c->sm_lock);
}

/*
 * Status format:
 *
 * <state> <committed_step> <open_step> <chunks_done>/<n_chunks> <overflow>
 * <last_result> <last_error> <first_io_error> <steps_committed>
 * <steps_skipped> <steps_aborted> <commands_rejected> <grad_bytes>
 * <param_bytes> <io_errors>
 *
 * state is idle, open or failed; open_step, chunks_done and overflow are 0
 * unless a step is open; last_result is none, committed, overflow, aborted
 * or rejected, and last_error the enum ckpt_err of the last refusal (0 if
 * none); first_io_error is the errno of the backing device error that put
 * the target in failed mode (0 if none); the rest are counters since the
 * table was loaded. The order is CKPT_STATUS_FIELDS (ckpt_abi.h), and the
 * core prints the line (ckpt_status_line), as the engine's status does.
 *
 * The table status echoes the table line: <backing_dev> [<#opt_args> <opt>...].
 * The IMA status (dmsetup measure) is key=value pairs: target_name,
 * target_version, dev_name, the optional arguments, uuid (the image's),
 * state and first_io_error.
 */
static void dmckpt_status(struct dm_target *ti, status_type_t type, unsigned int status_flags,
			  char *result, unsigned int maxlen)
{
	struct dm_ckpt *c = ti->private;
	unsigned int sz = 0;
	struct ckpt_counters k;
	char line[CKPT_STATUS_LINE_MAX];

	switch (type) {
	case STATUSTYPE_INFO:
		dmckpt_counters(c, &k);
		/* Always fits; DMEMIT truncates so that dm core sees a full buffer. */
		ckpt_status_line(&k, c->step.sm.n_chunks, line, sizeof(line));
		DMEMIT("%s", line);
		break;
	case STATUSTYPE_TABLE:
		DMEMIT("%s", c->md.dev->name);
		if (c->args.n_opts) {
			unsigned int i, o;

			DMEMIT(" %u", 2 * c->args.n_opts);
			for (i = 0; i < c->args.n_opts; i++) {
				o = c->args.order[i];
				DMEMIT(" %s %u", ckpt_table_opt_name(o),
				       ckpt_table_opt_value(&c->args, o));
			}
		}
		break;
	case STATUSTYPE_IMA:
		dmckpt_counters(c, &k);
		DMEMIT_TARGET_NAME_VERSION(ti->type);
		DMEMIT(",dev_name=%s,queue_depth=%u,staging_kb=%u,uuid=%pUb,state=%s,first_io_error=%u;",
		       c->md.dev->name, c->args.queue_depth, c->args.staging_kb, c->uuid,
		       ckpt_state_name(k.state), k.first_io_error);
		break;
	}
}

/* ---------------------------------------------------------------- messages */

static int dmckpt_stats(struct dm_ckpt *c, char *result, unsigned int maxlen)
{
	unsigned int sz = 0;
	struct ckpt_counters k;
	u32 used, n_stages, busy;

	dmckpt_counters(c, &k);
	mutex_lock(&c->cmd_lock);
	used = ckpt_step_stages_used(&c->step);
	n_stages = c->step.mem.n_stages;
	busy = dm_ckpt_upd_busy(c->upd);
	DMEMIT("state %s\ncommitted_step %llu\ncommitted_slot %u\nsequence %llu\n",
	       ckpt_state_name(k.state), k.committed_step, k.committed_slot,
	       c->sb->sequence);
	DMEMIT("open_step %llu\nchunks_done %llu\nn_chunks %u\nchunk_params %llu\n",
	       k.open_step, k.chunks_done, c->step.sm.n_chunks, c->regions.chunk_params);
	DMEMIT("n_groups %u\ndtype %s\noverflow %u\nlast_result %s\n",
	       c->step.sm.n_groups, c->dtype == CKPT_DTYPE_BF16 ? "bf16" : "fp16",
	       k.overflow, ckpt_result_name(k.last_result));
	DMEMIT("last_error %u %s\nfirst_io_error %u\n", k.last_error,
	       k.last_error ? ckpt_strerror(k.last_error) : "-", k.first_io_error);
	DMEMIT("steps_committed %llu\nsteps_skipped %llu\nsteps_aborted %llu\n",
	       k.steps_committed, k.steps_skipped, k.steps_aborted);
	DMEMIT("commands_rejected %llu\nio_errors %llu\ngrad_bytes %llu\nparam_bytes %llu\n",
	       k.commands_rejected, k.io_errors, k.grad_bytes, k.param_bytes);
	DMEMIT("blob_len %u\nstaging %u/%u\nqueue %u/%u\nfpu %s\n", c->sb->blob_len,
	       used, n_stages, busy, c->args.queue_depth, dm_ckpt_upd_fpu_name());
	mutex_unlock(&c->cmd_lock);
	return 1;
}

/* A group token: CKPT_HPARAMS_N comma-separated fp32 hex words (flags optional). */
static int dmckpt_parse_group(char *tok, struct ckpt_hparams *hp)
{
	u32 v[CKPT_HPARAMS_N];
	unsigned int n = 0;
	char *f;

	while ((f = strsep(&tok, ",")) != NULL) {
		if (n == CKPT_HPARAMS_N || kstrtou32(f, 16, &v[n]))
			return -EINVAL;
		n++;
	}
	return ckpt_hparams_from_words(hp, v, n) ? -EINVAL : 0;
}

/*
 * Caller holds cmd_lock (the core's command buffer). Fill the core's command
 * from a message; -EINVAL with a usage line on a syntax error.
 */
static int __dmckpt_parse_message(struct dm_ckpt *c, unsigned int argc, char **argv)
{
	struct ckpt_cmd *cmd = c->step.mem.cmd;
	unsigned int i;

	memset(cmd, 0, sizeof(*cmd));
	if (!strcasecmp(argv[0], "begin")) {
		if (argc < 4 || argc - 3 > CKPT_MAX_GROUPS)
			goto usage;
		cmd->opcode = CKPT_OP_BEGIN;
		if (kstrtou64(argv[1], 10, &cmd->step) || kstrtou32(argv[2], 16, &cmd->grad_scale))
			goto usage;
		cmd->n_groups = argc - 3;
		for (i = 0; i < cmd->n_groups; i++)
			if (dmckpt_parse_group(argv[3 + i], &cmd->groups[i]))
				goto usage;
		return 0;
	}
	if (!strcasecmp(argv[0], "commit")) {
		if (argc < 2 || argc > 3)
			goto usage;
		cmd->opcode = CKPT_OP_COMMIT;
		if (kstrtou64(argv[1], 10, &cmd->step))
			goto usage;
		if (argc == 3) {
			size_t n = strlen(argv[2]);

			if ((n & 1) || n / 2 > CKPT_BLOB_MAX ||
			    hex2bin(cmd->blob, argv[2], n / 2))
				goto usage;
			cmd->blob_len = n / 2;
		}
		return 0;
	}
	if (!strcasecmp(argv[0], "abort")) {
		if (argc > 2)
			goto usage;
		cmd->opcode = CKPT_OP_ABORT;
		if (argc == 2 && kstrtou64(argv[1], 10, &cmd->step))
			goto usage;
		return 0;
	}
	if (!strcasecmp(argv[0], "rollback")) {
		if (argc > 2)
			goto usage;
		cmd->opcode = CKPT_OP_ROLLBACK;
		if (argc == 2 && kstrtou64(argv[1], 10, &cmd->step))
			goto usage;
		return 0;
	}
	DMWARN_LIMIT("%s: unknown message '%s' (begin, commit, abort, rollback, stats)", dm_ckpt_name(c),
		     argv[0]);
	return -EINVAL;
usage:
	DMWARN_LIMIT("%s: usage: begin <step> <scale> <g>..., commit <step> [<blob>], abort [<step>], rollback [<step>]",
		     dm_ckpt_name(c));
	return -EINVAL;
}

static int dmckpt_message(struct dm_target *ti, unsigned int argc, char **argv,
			  char *result, unsigned int maxlen)
{
	struct dm_ckpt *c = ti->private;
	unsigned int sz = 0;
	u32 opcode = 0;
	u64 step = 0;
	int ret, io = 0;

	if (!argc)
		return -EINVAL;
	if (!strcasecmp(argv[0], "stats")) {
		if (argc != 1)
			return -EINVAL;
		return dmckpt_stats(c, result, maxlen);
	}
	if (c->read_only) {
		DMWARN_LIMIT("%s: message %s refused: the table is read-only",
			     dm_ckpt_name(c), argv[0]);
		return -EROFS;
	}
	mutex_lock(&c->cmd_lock);
	if (__dmckpt_parse_message(c, argc, argv)) {
		mutex_unlock(&c->cmd_lock);
		return -EINVAL;
	}
	opcode = c->step.mem.cmd->opcode;
	step = c->step.mem.cmd->step;
	ret = ckpt_step_exec(&c->step, c->step.mem.cmd, &io);
	__dmckpt_rollback_said(c, ret);
	if (opcode == CKPT_OP_ROLLBACK)
		step = c->sb->committed_step;
	mutex_unlock(&c->cmd_lock);
	if (ret < 0) {
		DMWARN_LIMIT("%s: message %s refused: %s", dm_ckpt_name(c), argv[0],
			     ckpt_strerror(ret));
		/* A failed commit answers the device's errno, the rest CKPT_ERRORS's. */
		return ret == -CKPT_E_IO && io < 0 ? io : -ckpt_err_errno(ret);
	}
	if (opcode == CKPT_OP_COMMIT) {
		DMEMIT("%s %llu", ret == CKPT_RESULT_OVERFLOW ? "overflow" : "committed", step);
		return 1;
	}
	if (opcode == CKPT_OP_ROLLBACK) {
		DMEMIT("rolled_back %llu", step);
		return 1;
	}
	return 0;
}

/* ---------------------------------------------------------------- limits */

static int dmckpt_iterate_devices(struct dm_target *ti, iterate_devices_callout_fn fn,
				  void *data)
{
	struct dm_ckpt *c = ti->private;

	return fn(ti, c->md.dev, 0, c->regions.dev_bytes >> SECTOR_SHIFT, data);
}

static void dmckpt_io_hints(struct dm_target *ti, struct queue_limits *limits)
{
	struct dm_ckpt *c = ti->private;

	/* Whole chunks go straight to the update; anything less is staged. */
	limits->io_opt = c->regions.plo_chunk_bytes;
}

static struct target_type dmckpt_target = {
	.name = "ckpt",
	.version = { 1, 0, 0 },
	.module = THIS_MODULE,
	.ctr = dmckpt_ctr,
	.dtr = dmckpt_dtr,
	.map = dmckpt_map,
	.end_io = dmckpt_end_io,
	.postsuspend = dmckpt_postsuspend,
	.preresume = dmckpt_preresume,
	.status = dmckpt_status,
	.message = dmckpt_message,
	.iterate_devices = dmckpt_iterate_devices,
	.io_hints = dmckpt_io_hints,
};

static int __init dm_ckpt_init(void)
{
	int ret;

	dm_ckpt_upd_init();
	ret = dm_register_target(&dmckpt_target);
	if (ret < 0) {
		DMERR("register failed %d", ret);
		return ret;
	}
	DMINFO("version %u.%u.%u loaded, update: %s", dmckpt_target.version[0],
	       dmckpt_target.version[1], dmckpt_target.version[2],
	       dm_ckpt_upd_fpu_name());
	return 0;
}

static void __exit dm_ckpt_exit(void)
{
	dm_unregister_target(&dmckpt_target);
}

module_init(dm_ckpt_init);
module_exit(dm_ckpt_exit);

MODULE_DESCRIPTION(DM_NAME " target running the AdamW step on the backing device");
MODULE_AUTHOR("dm-ckpt developers");
MODULE_LICENSE("GPL");
MODULE_VERSION(CKPT_VERSION);
