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
 * update loop are the portable core (core/, copied from libckpt/core at build
 * time): the userspace engine runs the same code, and both must leave
 * byte-identical backing images for the same command stream.
 *
 * Threads:
 *  - map() remaps PARAM reads (no copy), zero-fills GRAD reads, kills what is
 *    never allowed and defers control-block I/O and GRAD writes;
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
#include <linux/blkdev.h>
#include <linux/device-mapper.h>
#include <linux/dm-io.h>
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
#include <linux/sched.h>
#include <linux/ioprio.h>
#include <asm/cpufeature.h>

#include "ckpt_config.h"
#ifdef CKPT_HAVE_LINUX_FPU_H
#include <linux/fpu.h>
#else
#include <asm/fpu/api.h>
#endif

#include "ckpt_format.h"
#include "ckpt_step.h"
#include "dm-ckpt.h"

#define DM_MSG_PREFIX "ckpt"

#define CKPT_DEFAULT_QUEUE_DEPTH	8u
#define CKPT_MAX_QUEUE_DEPTH		128u
#define CKPT_DEFAULT_STAGING_KB		65536u	/* as the userspace engine */
#define CKPT_MAX_STAGING_KB		(4u << 20)
/* Params per kernel_fpu_begin/end section: preemption is off inside. */
#define CKPT_FPU_SLICE			4096u
#define CKPT_NO_STAGE			U32_MAX

static bool force_sse2;
module_param(force_sse2, bool, 0444);
MODULE_PARM_DESC(force_sse2, "Use the SSE2 update even on an AVX2/F16C CPU");

static bool ckpt_use_avx2;

/* Per-bio data: a gradient write completes when all its chunk updates have. */
struct ckpt_io {
	atomic_t pending;
	blk_status_t status;
};

/* A partially written chunk of gradients (staging_kb bounds them). */
struct ckpt_stage {
	u32 chunk;		/* or CKPT_NO_STAGE when free */
	u64 *cover;		/* sectors written so far */
	u8 *grad;		/* plo_chunk_bytes */
};

/* One chunk buffer and the update that uses it. */
struct ckpt_job {
	struct ckpt_c *c;
	struct work_struct work;
	struct list_head list;
	struct bio *bio;
	u32 chunk, src, dst;
	u32 grad_scale;
	u64 step;		/* the open step: the new record's step */
	u64 src_step;		/* the committed step: the source record's */
	u64 src_sequence;	/* the current superblock's sequence */
	u32 incompat;		/* the image's incompat feature bits */
	struct ckpt_hparams hp;
	u8 *rec;		/* record_bytes: 4 KiB header, fp32 p, m, v */
	u16 *plo;		/* plo_chunk_bytes */
	u16 *grad;		/* plo_chunk_bytes */
	atomic_t writes;
	int write_error;
	struct completion done;
};

struct ckpt_c {
	struct dm_target *ti;
	struct dm_dev *dev;
	struct dm_io_client *io;
	struct workqueue_struct *ctl_wq;
	struct workqueue_struct *upd_wq;
	struct ckpt_layout layout;	/* constant for the target's life */
	u32 chunk_shift;
	u32 cb_shift;			/* log2(plo_chunk_bytes) */
	u32 dtype;

	/* deferred bios, in arrival order */
	spinlock_t bio_lock;
	struct bio_list bios;
	struct work_struct bio_work;

	/*
	 * cmd_lock: commands, the superblock, staging, the scratch buffers and
	 * gradient dispatch. Held by the bio work item and by messages.
	 */
	struct mutex cmd_lock;
	struct ckpt_sb *sb;		/* the committed superblock */
	struct ckpt_sb *sb_next;
	u8 *groups;			/* chunk -> group */
	struct ckpt_cmd *cmd;
	struct ckpt_status *st;
	u8 *page;			/* 4 KiB scratch: commands, status, superblock */
	struct ckpt_stage *stages;
	u32 n_stages;
	u32 free_stages;
	u32 *stage_of;			/* chunk -> stage index */
	u8 *stage_mem;
	u64 *cover_mem;
	bool started;

	/* sm_lock: the state machine, from map, updates and commands */
	spinlock_t sm_lock;
	struct ckpt_step_sm sm;
	u64 *claimed;
	u64 *applied;

	/* chunk buffers */
	struct ckpt_job *jobs;
	unsigned int queue_depth;
	spinlock_t job_lock;		/* free_jobs, jobs_busy */
	struct list_head free_jobs;
	unsigned int jobs_busy;
	wait_queue_head_t job_wait;

	atomic64_t grad_bytes;
	atomic64_t param_bytes;

	/* the table line's optional arguments, in the order given */
	unsigned int staging_kb;
	unsigned int n_opts;
	unsigned int opt_order[2];	/* indices into ckpt_opt_args */
};

/* ---------------------------------------------------------------- helpers */

static const char *ckpt_name(struct ckpt_c *c)
{
	return dm_device_name(dm_table_get_md(c->ti->table));
}

static int ckpt_dm_io(struct dm_io_request *req, struct dm_io_region *where,
		      unsigned long *error_bits)
{
#ifdef CKPT_HAVE_DM_IO_IOPRIO
	return dm_io(req, 1, where, error_bits, IOPRIO_DEFAULT);
#else
	return dm_io(req, 1, where, error_bits);
#endif
}

static void ckpt_io_prep(struct ckpt_c *c, struct dm_io_request *req,
			 struct dm_io_region *where, blk_opf_t opf, void *buf,
			 u64 off, u64 len)
{
	where->bdev = c->dev->bdev;
	where->sector = off >> SECTOR_SHIFT;
	where->count = len >> SECTOR_SHIFT;
	req->bi_opf = opf;
	req->mem.type = is_vmalloc_addr(buf) ? DM_IO_VMA : DM_IO_KMEM;
	req->mem.offset = 0;
	req->mem.ptr.addr = buf;
	req->notify.fn = NULL;
	req->notify.context = NULL;
	req->client = c->io;
}

/* Synchronous I/O on the backing device: off and len in bytes, 512 B aligned. */
static int ckpt_io_sync(struct ckpt_c *c, blk_opf_t opf, void *buf, u64 off, u64 len)
{
	struct dm_io_request req;
	struct dm_io_region where;
	unsigned long bits = 0;

	ckpt_io_prep(c, &req, &where, opf, buf, off, len);
	return ckpt_dm_io(&req, &where, &bits);
}

/* Copy len bytes of the bio at *it to dst, advancing *it. */
static void ckpt_bio_copy_from(struct bio *bio, struct bvec_iter *it, void *dst,
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

static void ckpt_bio_copy_to(struct bio *bio, const void *src)
{
	struct bvec_iter it;
	struct bio_vec bv;
	const u8 *s = src;

	bio_for_each_segment(bv, bio, it) {
		memcpy_to_bvec(&bv, s);
		s += bv.bv_len;
	}
}

static struct ckpt_io *ckpt_io_of(struct bio *bio)
{
	return dm_per_bio_data(bio, sizeof(struct ckpt_io));
}

/* Drop one reference of a deferred bio; the last one completes it. */
static void ckpt_bio_put(struct bio *bio, blk_status_t status)
{
	struct ckpt_io *io = ckpt_io_of(bio);

	if (status)
		WRITE_ONCE(io->status, status);
	if (atomic_dec_and_test(&io->pending)) {
		bio->bi_status = READ_ONCE(io->status);
		bio_endio(bio);
	}
}

/* A command or write the protocol refuses: the status page tells why. */
static void ckpt_rejected(struct ckpt_c *c, int err)
{
	spin_lock(&c->sm_lock);
	ckpt_sm_rejected(&c->sm, err);
	spin_unlock(&c->sm_lock);
}

static void ckpt_fail(struct ckpt_c *c, int err)
{
	spin_lock(&c->sm_lock);
	ckpt_sm_fail(&c->sm, err);
	spin_unlock(&c->sm_lock);
}

static u32 ckpt_state(struct ckpt_c *c)
{
	u32 state;

	spin_lock(&c->sm_lock);
	state = c->sm.state;
	spin_unlock(&c->sm_lock);
	return state;
}

/* ---------------------------------------------------------------- chunk buffers */

static bool ckpt_job_available(struct ckpt_c *c)
{
	bool r;

	spin_lock(&c->job_lock);
	r = !list_empty(&c->free_jobs);
	spin_unlock(&c->job_lock);
	return r;
}

static struct ckpt_job *ckpt_get_job(struct ckpt_c *c)
{
	struct ckpt_job *j;

	wait_event(c->job_wait, ckpt_job_available(c));
	spin_lock(&c->job_lock);
	j = list_first_entry(&c->free_jobs, struct ckpt_job, list);
	list_del(&j->list);
	c->jobs_busy++;
	spin_unlock(&c->job_lock);
	return j;
}

static void ckpt_put_job(struct ckpt_c *c, struct ckpt_job *j)
{
	spin_lock(&c->job_lock);
	list_add(&j->list, &c->free_jobs);
	c->jobs_busy--;
	spin_unlock(&c->job_lock);
	wake_up_all(&c->job_wait);
}

static bool ckpt_idle(struct ckpt_c *c)
{
	bool r;

	spin_lock(&c->job_lock);
	r = !c->jobs_busy;
	spin_unlock(&c->job_lock);
	return r;
}

/* Wait until no chunk update is in flight. */
static void ckpt_drain(struct ckpt_c *c)
{
	wait_event(c->job_wait, ckpt_idle(c));
}

/* ---------------------------------------------------------------- chunk update */

static u32 ckpt_run_update(struct ckpt_job *j, u32 *p, u32 *m, u32 *v, u64 n)
{
	u32 nonfinite = 0;
	u64 i, k;

	for (i = 0; i < n; i += k) {
		k = min_t(u64, n - i, CKPT_FPU_SLICE);
		kernel_fpu_begin();
		if (ckpt_use_avx2)
			nonfinite |= dm_ckpt_update_avx2(&j->hp, j->grad_scale, j->c->dtype,
							 j->grad + i, p + i, m + i, v + i,
							 j->plo + i, k);
		else
			nonfinite |= dm_ckpt_update_sse2(&j->hp, j->grad_scale, j->c->dtype,
							 j->grad + i, p + i, m + i, v + i,
							 j->plo + i, k);
		kernel_fpu_end();
		cond_resched();
	}
	return nonfinite;
}

/*
 * The record a step reads must be the committed state of its chunk, intact:
 * bit rot built upon would become new committed state with a fresh checksum.
 */
static int ckpt_check_record(struct ckpt_c *c, struct ckpt_job *j)
{
	struct ckpt_rec want = {
		.chunk = j->chunk,
		.slot = j->src,
		.chunk_shift = c->chunk_shift,
		.step = j->src_step,
		.sequence = j->src_sequence,
	};
	struct ckpt_rec got;
	enum ckpt_rec_fault f = ckpt_rec_check(j->rec, j->rec + CKPT_BLOCK, NULL,
						&want, 0, &got);

	if (f == CKPT_REC_OK)
		return 0;
	if (f == CKPT_REC_HEADER)
		DMERR_LIMIT("%s: state record of chunk %u slot %u: %s (%s)", ckpt_name(c),
			    j->chunk, j->src, ckpt_rec_fault_str(f),
			    ckpt_strerror(ckpt_rec_decode(j->rec, &got)));
	else
		DMERR_LIMIT("%s: state record of chunk %u slot %u: %s (holds chunk %u slot %u step %llu seq %llu, want step %llu seq %llu)",
			    ckpt_name(c), j->chunk, j->src, ckpt_rec_fault_str(f),
			    got.chunk, got.slot, got.step, got.sequence,
			    j->src_step, j->src_sequence);
	return -EIO;
}

static void ckpt_write_done(unsigned long error, void *context)
{
	struct ckpt_job *j = context;

	if (error)
		WRITE_ONCE(j->write_error, -EIO);
	if (atomic_dec_and_test(&j->writes))
		complete(&j->done);
}

/* Write the record and p_lo of the job's chunk to the destination slot. */
static int ckpt_write_state(struct ckpt_c *c, struct ckpt_job *j)
{
	const struct ckpt_layout *l = &c->layout;
	struct dm_io_request req;
	struct dm_io_region where;
	int ret;

	j->write_error = 0;
	atomic_set(&j->writes, 2);
	reinit_completion(&j->done);

	ckpt_io_prep(c, &req, &where, REQ_OP_WRITE, j->rec,
		     ckpt_record_offset(l, j->dst, j->chunk), l->record_bytes);
	req.notify.fn = ckpt_write_done;
	req.notify.context = j;
	ret = ckpt_dm_io(&req, &where, NULL);
	if (ret)
		ckpt_write_done(1, j);

	ckpt_io_prep(c, &req, &where, REQ_OP_WRITE, j->plo,
		     ckpt_plo_offset(l, j->dst, j->chunk), l->plo_chunk_bytes);
	req.notify.fn = ckpt_write_done;
	req.notify.context = j;
	ret = ckpt_dm_io(&req, &where, NULL);
	if (ret)
		ckpt_write_done(1, j);

	wait_for_completion_io(&j->done);
	return READ_ONCE(j->write_error);
}

static void ckpt_job_work(struct work_struct *work)
{
	struct ckpt_job *j = container_of(work, struct ckpt_job, work);
	struct ckpt_c *c = j->c;
	const struct ckpt_layout *l = &c->layout;
	const u64 cp = l->chunk_params;
	u32 *p = (u32 *)(j->rec + CKPT_BLOCK);
	blk_status_t status = BLK_STS_OK;
	struct ckpt_rec rec;
	u32 nonfinite;
	int ret;

	ret = ckpt_io_sync(c, REQ_OP_READ, j->rec, ckpt_record_offset(l, j->src, j->chunk),
			   l->record_bytes);
	if (ret) {
		DMERR_LIMIT("%s: reading the state of chunk %u failed: %d", ckpt_name(c),
			    j->chunk, ret);
		goto fail;
	}
	ret = ckpt_check_record(c, j);
	if (ret)
		goto fail;

	nonfinite = ckpt_run_update(j, p, p + cp, p + 2 * cp, cp);
	if (nonfinite) {
		/* The step will be skipped: this chunk is not written. */
		spin_lock(&c->sm_lock);
		ckpt_sm_applied(&c->sm, j->chunk, true, false);
		spin_unlock(&c->sm_lock);
		goto out;
	}

	memset(&rec, 0, sizeof(rec));
	rec.chunk = j->chunk;
	rec.slot = j->dst;
	rec.chunk_shift = c->chunk_shift;
	rec.step = j->step;
	rec.sequence = j->src_sequence + 1;
	rec.data_crc = ckpt_crc32c(p, 12 * cp);
	if (j->incompat & CKPT_FEATURE_INCOMPAT_PLO_CRC)
		rec.plo_crc = ckpt_plo_crc(j->plo, c->chunk_shift);
	ckpt_rec_encode(&rec, j->rec);
	ret = ckpt_write_state(c, j);
	if (ret) {
		DMERR_LIMIT("%s: writing the state of chunk %u failed: %d", ckpt_name(c),
			    j->chunk, ret);
		goto fail;
	}
	spin_lock(&c->sm_lock);
	ckpt_sm_applied(&c->sm, j->chunk, false, true);
	spin_unlock(&c->sm_lock);
	goto out;
fail:
	ckpt_fail(c, -EIO);
	status = BLK_STS_IOERR;
out:
	ckpt_bio_put(j->bio, status);
	ckpt_put_job(c, j);
}

/*
 * Hand one whole chunk of gradients to an update. Claims the chunk (the
 * caller checked that it can); blocks while all queue_depth buffers are busy.
 * Called with cmd_lock held; src is the gradient (bio iterator or stage).
 */
static void ckpt_dispatch(struct ckpt_c *c, struct bio *bio, u32 chunk,
			  struct bvec_iter *it, const u8 *stage_grad)
{
	struct ckpt_job *j = ckpt_get_job(c);
	int ret;

	if (it)
		ckpt_bio_copy_from(bio, it, j->grad, c->layout.plo_chunk_bytes);
	else
		memcpy(j->grad, stage_grad, c->layout.plo_chunk_bytes);

	j->bio = bio;
	j->chunk = chunk;
	j->src_step = c->sb->committed_step;
	j->src_sequence = c->sb->sequence;
	j->incompat = c->sb->feature_incompat;
	spin_lock(&c->sm_lock);
	ret = ckpt_sm_claim(&c->sm, chunk);
	j->src = ckpt_sm_src_slot(&c->sm);
	j->dst = ckpt_sm_dst_slot(&c->sm);
	j->step = c->sm.open_step;
	j->grad_scale = c->sm.grad_scale;
	j->hp = c->sm.groups[c->groups[chunk]];
	spin_unlock(&c->sm_lock);
	if (ret) {
		/* Cannot happen: checked under cmd_lock. Fail the write, not the box. */
		DMERR_LIMIT("%s: chunk %u: claim failed: %s", ckpt_name(c), chunk,
			    ckpt_strerror(ret));
		ckpt_put_job(c, j);
		WRITE_ONCE(ckpt_io_of(bio)->status, BLK_STS_IOERR);
		return;
	}
	atomic_inc(&ckpt_io_of(bio)->pending);
	queue_work(c->upd_wq, &j->work);
}

/* ---------------------------------------------------------------- staging */

static void ckpt_release_stage(struct ckpt_c *c, struct ckpt_stage *s)
{
	u32 words = ckpt_bitmap_words(c->layout.plo_chunk_bytes >> SECTOR_SHIFT);

	c->stage_of[s->chunk] = CKPT_NO_STAGE;
	s->chunk = CKPT_NO_STAGE;
	memset(s->cover, 0, words * sizeof(u64));
	c->free_stages++;
}

static void ckpt_release_stages(struct ckpt_c *c)
{
	u32 i;

	for (i = 0; i < c->n_stages; i++)
		if (c->stages[i].chunk != CKPT_NO_STAGE)
			ckpt_release_stage(c, &c->stages[i]);
}

static struct ckpt_stage *ckpt_new_stage(struct ckpt_c *c, u32 chunk)
{
	u32 i;

	for (i = 0; i < c->n_stages; i++) {
		if (c->stages[i].chunk == CKPT_NO_STAGE) {
			c->stages[i].chunk = chunk;
			c->stage_of[chunk] = i;
			c->free_stages--;
			return &c->stages[i];
		}
	}
	return NULL;
}

static bool ckpt_cover_any(const u64 *bits, u32 first, u32 count)
{
	u32 s;

	for (s = first; s < first + count; s++)
		if ((bits[s >> 6] >> (s & 63)) & 1)
			return true;
	return false;
}

static bool ckpt_claimed(struct ckpt_c *c, u32 chunk)
{
	bool r;

	spin_lock(&c->sm_lock);
	r = (c->sm.claimed[chunk >> 6] >> (chunk & 63)) & 1;
	spin_unlock(&c->sm_lock);
	return r;
}

/*
 * Check every piece of a gradient write before changing anything, so that a
 * refused write leaves the step exactly as it was. Returns 0 or -CKPT_E_*.
 */
static int ckpt_grad_check(struct ckpt_c *c, u64 off, u64 len)
{
	const u64 cb = c->layout.plo_chunk_bytes;
	u32 free = c->free_stages;
	u32 state = ckpt_state(c);

	if (state == CKPT_STATE_FAILED)
		return -CKPT_E_FAILED;
	if (state != CKPT_STATE_OPEN)
		return -CKPT_E_STATE;
	while (len) {
		u32 chunk = off >> c->cb_shift;
		u64 in = off & (cb - 1);
		u64 n = min(len, cb - in);
		u32 si = c->stage_of[chunk];

		if (ckpt_claimed(c, chunk))
			return -CKPT_E_TWICE;
		if (n == cb) {
			/* A whole chunk over sectors already staged: written twice. */
			if (si != CKPT_NO_STAGE)
				return -CKPT_E_TWICE;
		} else if (si == CKPT_NO_STAGE) {
			if (!free)
				return -CKPT_E_NOSPC;
			free--;
		} else if (ckpt_cover_any(c->stages[si].cover, in >> SECTOR_SHIFT,
					  n >> SECTOR_SHIFT)) {
			return -CKPT_E_TWICE;
		}
		off += n;
		len -= n;
	}
	return 0;
}

static void ckpt_grad_write(struct ckpt_c *c, struct bio *bio)
{
	const u64 cb = c->layout.plo_chunk_bytes;
	const u32 sectors = cb >> SECTOR_SHIFT;
	u64 off = (dm_target_offset(c->ti, bio->bi_iter.bi_sector) << SECTOR_SHIFT) -
		  c->layout.grad_off;
	u64 len = bio->bi_iter.bi_size;
	struct bvec_iter it = bio->bi_iter;
	int ret;

	ret = ckpt_grad_check(c, off, len);
	if (ret) {
		DMDEBUG_LIMIT("%s: gradient write of %llu bytes at %llu refused: %s",
			      ckpt_name(c), len, off, ckpt_strerror(ret));
		ckpt_rejected(c, ret);
		ckpt_bio_put(bio, BLK_STS_IOERR);
		return;
	}
	atomic64_add(len, &c->grad_bytes);

	while (len) {
		u32 chunk = off >> c->cb_shift;
		u64 in = off & (cb - 1);
		u64 n = min(len, cb - in);
		struct ckpt_stage *s;

		if (n == cb) {
			ckpt_dispatch(c, bio, chunk, &it, NULL);
		} else {
			u32 si = c->stage_of[chunk];

			s = si == CKPT_NO_STAGE ? ckpt_new_stage(c, chunk) : &c->stages[si];
			ckpt_bio_copy_from(bio, &it, s->grad + in, n);
			ckpt_cover_add(s->cover, sectors, in >> SECTOR_SHIFT, n >> SECTOR_SHIFT);
			if (ckpt_cover_full(s->cover, sectors)) {
				ckpt_dispatch(c, bio, chunk, NULL, s->grad);
				ckpt_release_stage(c, s);
			}
		}
		off += n;
		len -= n;
	}
	ckpt_bio_put(bio, BLK_STS_OK);
}

/* ---------------------------------------------------------------- commands */

/* Flush, then the next superblock copy with FUA (never over the current one). */
static int ckpt_write_sb(struct ckpt_c *c, const struct ckpt_sb *next)
{
	int ret;

	ret = blkdev_issue_flush(c->dev->bdev);
	if (ret)
		return ret;
	ret = ckpt_sb_encode(next, c->page);
	if (ret) {
		DMERR("%s: cannot encode the superblock: %s", ckpt_name(c), ckpt_strerror(ret));
		return -EINVAL;
	}
	return ckpt_io_sync(c, REQ_OP_WRITE | REQ_SYNC | REQ_FUA, c->page,
			    ckpt_sb_next_offset(c->sb), CKPT_BLOCK);
}

static int ckpt_commit(struct ckpt_c *c, const struct ckpt_cmd *cmd)
{
	struct ckpt_sb *next = c->sb_next;
	int ret;

	*next = *c->sb;
	next->sequence++;
	spin_lock(&c->sm_lock);
	next->committed_step = c->sm.open_step;
	next->committed_slot = ckpt_sm_dst_slot(&c->sm);
	spin_unlock(&c->sm_lock);
	next->blob_len = cmd->blob_len;
	memset(next->blob, 0, sizeof(next->blob));
	memcpy(next->blob, cmd->blob, cmd->blob_len);

	ret = ckpt_write_sb(c, next);
	if (ret) {
		DMERR("%s: committing step %llu failed: %d; step %llu stays committed",
		      ckpt_name(c), next->committed_step, ret, c->sb->committed_step);
		spin_lock(&c->sm_lock);
		ckpt_sm_commit_failed(&c->sm, ret);
		spin_unlock(&c->sm_lock);
		return -CKPT_E_IO;
	}
	spin_lock(&c->sm_lock);
	ckpt_sm_committed(&c->sm);
	spin_unlock(&c->sm_lock);
	c->sb_next = c->sb;
	c->sb = next;
	ckpt_release_stages(c);
	return CKPT_RESULT_COMMITTED;
}

/*
 * Run a decoded command, exactly as Engine::control_write does. Returns >= 0
 * (a CKPT_RESULT_* for COMMIT), -CKPT_E_IO when the backing device failed, or
 * another -CKPT_E_* when the command was refused (recorded for the status
 * page). Called with cmd_lock held.
 */
static int ckpt_exec(struct ckpt_c *c, const struct ckpt_cmd *cmd)
{
	int ret;

	/* Everything dispatched before the command is on the device first. */
	ckpt_drain(c);
	switch (cmd->opcode) {
	case CKPT_OP_BEGIN:
		spin_lock(&c->sm_lock);
		ret = ckpt_sm_begin(&c->sm, cmd);
		spin_unlock(&c->sm_lock);
		break;
	case CKPT_OP_ABORT:
		spin_lock(&c->sm_lock);
		ret = ckpt_sm_abort(&c->sm, cmd);
		spin_unlock(&c->sm_lock);
		if (ret >= 0)
			ckpt_release_stages(c);
		break;
	case CKPT_OP_COMMIT:
		spin_lock(&c->sm_lock);
		ret = ckpt_sm_commit(&c->sm, cmd);
		spin_unlock(&c->sm_lock);
		if (ret == CKPT_RESULT_OVERFLOW)
			ckpt_release_stages(c);
		else if (ret == CKPT_RESULT_COMMITTED)
			return ckpt_commit(c, cmd);
		break;
	default:
		ret = -CKPT_E_OPCODE;
		break;
	}
	if (ret < 0)
		ckpt_rejected(c, ret);
	return ret;
}

static void ckpt_control_write(struct ckpt_c *c, struct bio *bio)
{
	struct bvec_iter it = bio->bi_iter;
	u32 len = bio->bi_iter.bi_size;
	int ret;

	memset(c->page, 0, CKPT_BLOCK);
	ckpt_bio_copy_from(bio, &it, c->page, len);
	ret = ckpt_cmd_decode(c->page, len, c->cmd);
	if (ret < 0)
		ckpt_rejected(c, ret);
	else
		ret = ckpt_exec(c, c->cmd);
	if (ret < 0)
		DMDEBUG_LIMIT("%s: command refused: %s", ckpt_name(c), ckpt_strerror(ret));
	ckpt_bio_put(bio, ret < 0 ? BLK_STS_IOERR : BLK_STS_OK);
}

static void ckpt_fill_status(struct ckpt_c *c)
{
	spin_lock(&c->sm_lock);
	ckpt_sm_status(&c->sm, c->sb, c->st);
	spin_unlock(&c->sm_lock);
	c->st->grad_bytes = atomic64_read(&c->grad_bytes);
	c->st->param_bytes = atomic64_read(&c->param_bytes);
}

static void ckpt_control_read(struct ckpt_c *c, struct bio *bio)
{
	u64 off = dm_target_offset(c->ti, bio->bi_iter.bi_sector) << SECTOR_SHIFT;

	ckpt_fill_status(c);
	ckpt_status_encode(c->st, c->page);
	ckpt_bio_copy_to(bio, c->page + off);
	ckpt_bio_put(bio, BLK_STS_OK);
}

static void ckpt_bio_work(struct work_struct *work)
{
	struct ckpt_c *c = container_of(work, struct ckpt_c, bio_work);
	struct bio_list bios;
	struct bio *bio;
	unsigned long flags;

	spin_lock_irqsave(&c->bio_lock, flags);
	bios = c->bios;
	bio_list_init(&c->bios);
	spin_unlock_irqrestore(&c->bio_lock, flags);

	while ((bio = bio_list_pop(&bios))) {
		u64 off = dm_target_offset(c->ti, bio->bi_iter.bi_sector) << SECTOR_SHIFT;

		mutex_lock(&c->cmd_lock);
		if (off >= c->layout.grad_off)
			ckpt_grad_write(c, bio);
		else if (bio_data_dir(bio) == WRITE)
			ckpt_control_write(c, bio);
		else
			ckpt_control_read(c, bio);
		mutex_unlock(&c->cmd_lock);
		cond_resched();
	}
}

/* ---------------------------------------------------------------- map */

static void ckpt_defer(struct ckpt_c *c, struct bio *bio)
{
	struct ckpt_io *io = ckpt_io_of(bio);
	unsigned long flags;

	atomic_set(&io->pending, 1);
	io->status = BLK_STS_OK;
	spin_lock_irqsave(&c->bio_lock, flags);
	bio_list_add(&c->bios, bio);
	spin_unlock_irqrestore(&c->bio_lock, flags);
	queue_work(c->ctl_wq, &c->bio_work);
}

static int ckpt_kill(struct ckpt_c *c, int err)
{
	ckpt_rejected(c, err);
	return DM_MAPIO_KILL;
}

static int ckpt_map(struct dm_target *ti, struct bio *bio)
{
	struct ckpt_c *c = ti->private;
	const struct ckpt_layout *l = &c->layout;
	const u64 cb = l->plo_chunk_bytes;
	u64 off, len, in;
	u32 chunk, slot;

	if (bio->bi_opf & REQ_PREFLUSH) {
		/* Empty flush (dm core splits flush+data): pass to the backing device. */
		bio_set_dev(bio, c->dev->bdev);
		return DM_MAPIO_REMAPPED;
	}
	if (bio_op(bio) != REQ_OP_READ && bio_op(bio) != REQ_OP_WRITE)
		return DM_MAPIO_KILL;

	off = dm_target_offset(ti, bio->bi_iter.bi_sector) << SECTOR_SHIFT;
	len = bio->bi_iter.bi_size;

	if (off < l->grad_off) {
		if (bio_data_dir(bio) == WRITE) {
			/* A command is one write at offset 0 of at most 4 KiB. */
			if (off || len > CKPT_BLOCK)
				return ckpt_kill(c, -CKPT_E_RANGE);
		} else if (off + len > l->grad_off) {
			dm_accept_partial_bio(bio, (l->grad_off - off) >> SECTOR_SHIFT);
		}
		ckpt_defer(c, bio);
		return DM_MAPIO_SUBMITTED;
	}

	if (off < l->param_off) {
		if (bio_data_dir(bio) == WRITE) {
			if (off + len > l->param_off)
				return ckpt_kill(c, -CKPT_E_RANGE);
			ckpt_defer(c, bio);
			return DM_MAPIO_SUBMITTED;
		}
		if (off + len > l->param_off)
			dm_accept_partial_bio(bio, (l->param_off - off) >> SECTOR_SHIFT);
		zero_fill_bio(bio);
		bio_endio(bio);
		return DM_MAPIO_SUBMITTED;
	}

	if (bio_data_dir(bio) == WRITE)
		return ckpt_kill(c, -CKPT_E_READONLY);

	/* PARAM read: one chunk per bio, remapped to the slot with its latest values. */
	off -= l->param_off;
	chunk = off >> c->cb_shift;
	in = off & (cb - 1);
	if (in + len > cb) {
		dm_accept_partial_bio(bio, (cb - in) >> SECTOR_SHIFT);
		len = cb - in;
	}
	spin_lock(&c->sm_lock);
	slot = ckpt_sm_read_slot(&c->sm, chunk);
	spin_unlock(&c->sm_lock);
	atomic64_add(len, &c->param_bytes);
	bio_set_dev(bio, c->dev->bdev);
	bio->bi_iter.bi_sector = (ckpt_plo_offset(l, slot, chunk) + in) >> SECTOR_SHIFT;
	return DM_MAPIO_REMAPPED;
}

/* ---------------------------------------------------------------- superblock */

static const char *ckpt_sb_error(int err)
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
 * Returns 0, -EIO, or -EINVAL with *why set.
 */
static int ckpt_read_groups(struct ckpt_c *c, const struct ckpt_sb *sb, u32 copy,
			    u8 *table, const char **why)
{
	int ret;

	ret = ckpt_io_sync(c, REQ_OP_READ | REQ_SYNC, table,
			   ckpt_group_offset(&sb->layout, copy), sb->layout.group_bytes);
	if (ret) {
		*why = "read error";
		return ret;
	}
	ret = ckpt_group_table_check(sb, table);
	if (ret) {
		*why = ret == -CKPT_E_CRC ? "checksum mismatch" : "a chunk's group is out of range";
		return -EINVAL;
	}
	return 0;
}

/*
 * Read both superblock copies and the group table into sb and groups (n_chunks
 * bytes, or NULL to skip the group table). The group table comes from the
 * first copy that checks out; a damaged superblock or group table copy that
 * was skipped is logged. Returns 0 or -errno with *error set to a static
 * message.
 */
static int ckpt_read_sb(struct ckpt_c *c, struct ckpt_sb *sb, struct ckpt_sb *scratch,
			u8 **groups, char **error)
{
	u64 dev_bytes = bdev_nr_bytes(c->dev->bdev);
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
	ret = ckpt_io_sync(c, REQ_OP_READ | REQ_SYNC, buf, 0, 2 * CKPT_BLOCK);
	if (ret) {
		*error = "Cannot read the superblock";
		goto out;
	}
	ret = ckpt_sb_pick(buf, buf + CKPT_BLOCK, dev_bytes, sb);
	if (ret < 0) {
		r0 = ckpt_sb_decode(buf, dev_bytes, scratch);
		r1 = ckpt_sb_decode(buf + CKPT_BLOCK, dev_bytes, scratch);
		DMERR("%s: no usable superblock on %s (%llu bytes): copy 0: %s, copy 1: %s",
		      ckpt_name(c), c->dev->name, dev_bytes,
		      r0 ? ckpt_strerror(r0) : "wrong parity",
		      r1 ? ckpt_strerror(r1) : "wrong parity");
		*error = (char *)ckpt_sb_error(ret);
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
		       ckpt_name(c), other, c->dev->name,
		       r1 == -CKPT_E_NO_SB ? "its sequence belongs to the other copy" :
		       ckpt_strerror(r1), copy, sb->sequence, sb->committed_step);

	table = kvmalloc(sb->layout.group_bytes, GFP_KERNEL);
	if (!table) {
		*error = "Cannot allocate the group table";
		ret = -ENOMEM;
		goto out;
	}
	copies = ckpt_meta_copies(&sb->layout);
	for (copy = 0; copy < copies; copy++) {
		ret = ckpt_read_groups(c, sb, copy, table, &why[copy]);
		if (!ret)
			break;
	}
	if (ret) {
		DMERR("%s: group table on %s: copy 0: %s%s%s", ckpt_name(c), c->dev->name,
		      why[0], copies > 1 ? ", copy 1: " : "", copies > 1 ? why[1] : "");
		if (copies > 1)
			*error = "Group table: no intact copy";
		else if (ret == -EINVAL)
			*error = "Group table: a chunk's group is out of range";
		else
			*error = "Cannot read the group table";
		goto out;
	}
	if (copy)
		DMWARN("%s: group table copy 0 on %s is damaged (%s): using copy 1",
		       ckpt_name(c), c->dev->name, why[0]);
	*groups = table;
	table = NULL;
out:
	kvfree(table);
	kvfree(buf);
	return ret;
}

/* ---------------------------------------------------------------- ctr/dtr */

static void ckpt_free(struct ckpt_c *c)
{
	unsigned int i;

	if (c->upd_wq)
		destroy_workqueue(c->upd_wq);
	if (c->ctl_wq)
		destroy_workqueue(c->ctl_wq);
	if (c->jobs) {
		for (i = 0; i < c->queue_depth; i++) {
			kvfree(c->jobs[i].rec);
			kvfree(c->jobs[i].plo);
		}
		kfree(c->jobs);
	}
	kvfree(c->stage_mem);
	kvfree(c->cover_mem);
	kfree(c->stages);
	kvfree(c->stage_of);
	kvfree(c->claimed);
	kvfree(c->applied);
	kvfree(c->groups);
	kfree(c->page);
	kfree(c->st);
	kfree(c->cmd);
	kfree(c->sb_next);
	kfree(c->sb);
	if (c->io)
		dm_io_client_destroy(c->io);
	if (c->dev)
		dm_put_device(c->ti, c->dev);
	kfree(c);
}

/* The optional table arguments: "<name> <value>" pairs, each at most once. */
static const struct ckpt_opt_arg {
	const char *name;
	unsigned int min, max;
	const char *err_dup, *err_missing, *err_nan, *err_range;
} ckpt_opt_args[] = {
	{ "queue_depth", 1, CKPT_MAX_QUEUE_DEPTH,
	  "Duplicate queue_depth argument", "queue_depth needs a value",
	  "Invalid queue_depth (not a number)", "queue_depth out of range (1..128)" },
	{ "staging_kb", 1, CKPT_MAX_STAGING_KB,
	  "Duplicate staging_kb argument", "staging_kb needs a value",
	  "Invalid staging_kb (not a number)", "staging_kb out of range (1..4194304)" },
};

static unsigned int *ckpt_opt_value(struct ckpt_c *c, unsigned int i)
{
	return i == 0 ? &c->queue_depth : &c->staging_kb;
}

static int ckpt_parse_opts(struct ckpt_c *c, struct dm_arg_set *as, char **error)
{
	static const struct dm_arg arg_count = {
		0, 4, "Invalid number of optional arguments (0, 2 or 4)"
	};
	bool seen[ARRAY_SIZE(ckpt_opt_args)] = { };
	const struct ckpt_opt_arg *o;
	unsigned int n, v, i;
	const char *name;
	int ret;

	c->queue_depth = CKPT_DEFAULT_QUEUE_DEPTH;
	c->staging_kb = CKPT_DEFAULT_STAGING_KB;
	if (!as->argc)
		return 0;
	ret = dm_read_arg_group(&arg_count, as, &n, error);
	if (ret)
		return ret;
	while (n) {
		name = dm_shift_arg(as);
		n--;
		for (i = 0; i < ARRAY_SIZE(ckpt_opt_args); i++)
			if (!strcasecmp(name, ckpt_opt_args[i].name))
				break;
		if (i == ARRAY_SIZE(ckpt_opt_args)) {
			*error = "Unknown optional argument";
			return -EINVAL;
		}
		o = &ckpt_opt_args[i];
		if (seen[i]) {
			*error = (char *)o->err_dup;
			return -EINVAL;
		}
		if (!n) {
			*error = (char *)o->err_missing;
			return -EINVAL;
		}
		n--;
		if (kstrtouint(dm_shift_arg(as), 10, &v)) {
			*error = (char *)o->err_nan;
			return -EINVAL;
		}
		if (v < o->min || v > o->max) {
			*error = (char *)o->err_range;
			return -EINVAL;
		}
		*ckpt_opt_value(c, i) = v;
		seen[i] = true;
		c->opt_order[c->n_opts++] = i;
	}
	if (as->argc) {
		*error = "Too many arguments";
		return -EINVAL;
	}
	return 0;
}

static int ckpt_alloc(struct ckpt_c *c, char **error)
{
	const struct ckpt_layout *l = &c->layout;
	const u32 n_chunks = c->sb->geo.n_chunks;
	const u64 cb = l->plo_chunk_bytes;
	const u32 cover_words = ckpt_bitmap_words(cb >> SECTOR_SHIFT);
	u64 n_stages;
	unsigned int i;

	c->claimed = kvcalloc(ckpt_bitmap_words(n_chunks), sizeof(u64), GFP_KERNEL);
	c->applied = kvcalloc(ckpt_bitmap_words(n_chunks), sizeof(u64), GFP_KERNEL);
	c->stage_of = kvmalloc_array(n_chunks, sizeof(u32), GFP_KERNEL);
	if (!c->claimed || !c->applied || !c->stage_of)
		goto nomem;
	memset(c->stage_of, 0xff, n_chunks * sizeof(u32));

	/* As the engine: staging / chunk bytes, at least 2, at most max(2, n_chunks). */
	n_stages = ((u64)c->staging_kb << 10) >> c->cb_shift;
	n_stages = clamp_t(u64, n_stages, 2, max(2u, n_chunks));
	c->n_stages = n_stages;
	c->free_stages = n_stages;
	c->stages = kcalloc(n_stages, sizeof(*c->stages), GFP_KERNEL);
	c->stage_mem = kvmalloc_array(n_stages, cb, GFP_KERNEL);
	c->cover_mem = kvcalloc(n_stages * cover_words, sizeof(u64), GFP_KERNEL);
	if (!c->stages || !c->stage_mem || !c->cover_mem) {
		*error = "Cannot allocate staging memory (reduce staging_kb)";
		return -ENOMEM;
	}
	for (i = 0; i < n_stages; i++) {
		c->stages[i].chunk = CKPT_NO_STAGE;
		c->stages[i].grad = c->stage_mem + i * cb;
		c->stages[i].cover = c->cover_mem + i * cover_words;
	}

	c->jobs = kcalloc(c->queue_depth, sizeof(*c->jobs), GFP_KERNEL);
	if (!c->jobs)
		goto nomem;
	for (i = 0; i < c->queue_depth; i++) {
		struct ckpt_job *j = &c->jobs[i];

		j->c = c;
		INIT_WORK(&j->work, ckpt_job_work);
		init_completion(&j->done);
		j->rec = kvmalloc(l->record_bytes, GFP_KERNEL);
		j->plo = kvmalloc(2 * cb, GFP_KERNEL);
		if (!j->rec || !j->plo) {
			*error = "Cannot allocate chunk buffers (reduce queue_depth)";
			return -ENOMEM;
		}
		j->grad = j->plo + (cb >> 1);
		list_add_tail(&j->list, &c->free_jobs);
	}
	return 0;
nomem:
	*error = "Cannot allocate memory";
	return -ENOMEM;
}

/*
 * ckpt <backing_dev> [#opt_args] [queue_depth N] [staging_kb K]
 */
static int ckpt_ctr(struct dm_target *ti, unsigned int argc, char **argv)
{
	struct dm_arg_set as;
	struct ckpt_c *c;
	int ret;

	if (argc < 1) {
		ti->error = "Invalid argument count: ckpt <dev> [#opts] [queue_depth N] [staging_kb K]";
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
	INIT_WORK(&c->bio_work, ckpt_bio_work);
	mutex_init(&c->cmd_lock);
	spin_lock_init(&c->sm_lock);
	spin_lock_init(&c->job_lock);
	INIT_LIST_HEAD(&c->free_jobs);
	init_waitqueue_head(&c->job_wait);
	atomic64_set(&c->grad_bytes, 0);
	atomic64_set(&c->param_bytes, 0);

	as.argc = argc - 1;
	as.argv = argv + 1;
	ret = ckpt_parse_opts(c, &as, &ti->error);
	if (ret)
		goto bad;

	ret = dm_get_device(ti, argv[0], dm_table_get_mode(ti->table), &c->dev);
	if (ret) {
		ti->error = "Backing device lookup failed";
		goto bad;
	}
	if (bdev_logical_block_size(c->dev->bdev) > CKPT_BLOCK) {
		ti->error = "Backing device logical block size above 4096 is not supported";
		ret = -EINVAL;
		goto bad;
	}
	c->io = dm_io_client_create();
	if (IS_ERR(c->io)) {
		ret = PTR_ERR(c->io);
		c->io = NULL;
		ti->error = "Cannot create dm-io client";
		goto bad;
	}

	c->sb = kzalloc(sizeof(*c->sb), GFP_KERNEL);
	c->sb_next = kzalloc(sizeof(*c->sb_next), GFP_KERNEL);
	c->cmd = kzalloc(sizeof(*c->cmd), GFP_KERNEL);
	c->st = kzalloc(sizeof(*c->st), GFP_KERNEL);
	c->page = kzalloc(CKPT_BLOCK, GFP_KERNEL);
	if (!c->sb || !c->sb_next || !c->cmd || !c->st || !c->page) {
		ti->error = "Cannot allocate memory";
		ret = -ENOMEM;
		goto bad;
	}

	ret = ckpt_read_sb(c, c->sb, c->sb_next, &c->groups, &ti->error);
	if (ret)
		goto bad;
	c->layout = c->sb->layout;
	c->chunk_shift = c->sb->geo.chunk_shift;
	c->cb_shift = c->chunk_shift + 1;
	c->dtype = c->sb->geo.dtype;

	if (ti->len != c->layout.virt_bytes >> SECTOR_SHIFT) {
		DMERR("%s: the table has %llu sectors, the device's virtual size is %llu sectors",
		      ckpt_name(c), (unsigned long long)ti->len,
		      c->layout.virt_bytes >> SECTOR_SHIFT);
		ti->error = "Target length does not match the virtual size in the superblock";
		ret = -EINVAL;
		goto bad;
	}

	ret = ckpt_alloc(c, &ti->error);
	if (ret)
		goto bad;

	c->ctl_wq = alloc_ordered_workqueue("dm-ckpt-ctl", WQ_MEM_RECLAIM);
	c->upd_wq = alloc_workqueue("dm-ckpt-upd", WQ_MEM_RECLAIM | WQ_UNBOUND,
				    c->queue_depth);
	if (!c->ctl_wq || !c->upd_wq) {
		ti->error = "Cannot allocate workqueues";
		ret = -ENOMEM;
		goto bad;
	}

	ckpt_sm_init(&c->sm, c->sb, c->claimed, c->applied);

	ti->num_flush_bios = 1;
	ti->num_discard_bios = 0;
	ti->num_write_zeroes_bios = 0;
	ti->per_io_data_size = sizeof(struct ckpt_io);
	ti->private = c;
	return 0;
bad:
	ckpt_free(c);
	return ret;
}

static void ckpt_dtr(struct dm_target *ti)
{
	struct ckpt_c *c = ti->private;

	flush_workqueue(c->ctl_wq);
	ckpt_drain(c);
	ckpt_free(c);
}

/* ---------------------------------------------------------------- suspend/resume */

static void ckpt_postsuspend(struct dm_target *ti)
{
	struct ckpt_c *c = ti->private;

	/* dm core waited for our bios; nothing may still touch the device. */
	flush_workqueue(c->ctl_wq);
	ckpt_drain(c);
}

/*
 * The first resume of a table starts from the superblock on the device as it
 * is now: a table loaded while an older one was live (a reload) must not use
 * what that one has since committed. An open step of the old instance is
 * dropped. Later resumes keep the open step.
 */
static int ckpt_preresume(struct dm_target *ti)
{
	struct ckpt_c *c = ti->private;
	char *error = NULL;
	int ret = 0;

	mutex_lock(&c->cmd_lock);
	if (c->started)
		goto out;
	ret = ckpt_read_sb(c, c->sb_next, c->sb_next, NULL, &error);
	if (ret) {
		DMERR("%s: resume: %s", ckpt_name(c), error);
		goto out;
	}
	if (c->sb_next->sequence != c->sb->sequence) {
		if (memcmp(&c->sb_next->geo, &c->sb->geo, sizeof(c->sb->geo)) ||
		    memcmp(c->sb_next->uuid, c->sb->uuid, sizeof(c->sb->uuid))) {
			DMERR("%s: resume: the device was reformatted since the table was loaded",
			      ckpt_name(c));
			ret = -EINVAL;
			goto out;
		}
		swap(c->sb, c->sb_next);
		spin_lock(&c->sm_lock);
		ckpt_sm_init(&c->sm, c->sb, c->claimed, c->applied);
		spin_unlock(&c->sm_lock);
		ckpt_release_stages(c);
	}
	c->started = true;
out:
	mutex_unlock(&c->cmd_lock);
	return ret;
}

/* ---------------------------------------------------------------- status */

struct ckpt_counts {
	u32 state, last_result, last_error, first_io_error, overflow;
	u64 committed_step, open_step, chunks_done;
	u64 steps_committed, steps_skipped, steps_aborted, commands_rejected, io_errors;
	u32 committed_slot;
};

static void ckpt_counts(struct ckpt_c *c, struct ckpt_counts *k)
{
	const struct ckpt_step_sm *sm = &c->sm;
	bool open;

	spin_lock(&c->sm_lock);
	open = sm->state == CKPT_STATE_OPEN;
	k->state = sm->state;
	k->last_result = sm->last_result;
	k->last_error = sm->last_error;
	k->first_io_error = sm->first_io_error;
	k->overflow = open ? sm->overflow : 0;
	k->committed_step = sm->committed_step;
	k->committed_slot = sm->committed_slot;
	k->open_step = open ? sm->open_step : 0;
	k->chunks_done = open ? sm->chunks_applied : 0;
	k->steps_committed = sm->steps_committed;
	k->steps_skipped = sm->steps_skipped;
	k->steps_aborted = sm->steps_aborted;
	k->commands_rejected = sm->commands_rejected;
	k->io_errors = sm->io_errors;
	spin_unlock(&c->sm_lock);
}

static void ckpt_status(struct dm_target *ti, status_type_t type, unsigned int status_flags,
			char *result, unsigned int maxlen)
{
	struct ckpt_c *c = ti->private;
	unsigned int sz = 0;
	struct ckpt_counts k;

	switch (type) {
	case STATUSTYPE_INFO:
		ckpt_counts(c, &k);
		DMEMIT("%s %llu %llu %llu/%u %u %s %u %u %llu %llu %llu %llu %llu %llu %llu",
		       ckpt_state_name(k.state), k.committed_step, k.open_step,
		       k.chunks_done, c->sm.n_chunks, k.overflow,
		       ckpt_result_name(k.last_result), k.last_error, k.first_io_error,
		       k.steps_committed, k.steps_skipped, k.steps_aborted,
		       k.commands_rejected, (u64)atomic64_read(&c->grad_bytes),
		       (u64)atomic64_read(&c->param_bytes), k.io_errors);
		break;
	case STATUSTYPE_TABLE:
		DMEMIT("%s", c->dev->name);
		if (c->n_opts) {
			unsigned int i;

			DMEMIT(" %u", 2 * c->n_opts);
			for (i = 0; i < c->n_opts; i++)
				DMEMIT(" %s %u", ckpt_opt_args[c->opt_order[i]].name,
				       *ckpt_opt_value(c, c->opt_order[i]));
		}
		break;
	default:
		break;
	}
}

/* ---------------------------------------------------------------- messages */

static int ckpt_stats(struct ckpt_c *c, char *result, unsigned int maxlen)
{
	unsigned int sz = 0;
	struct ckpt_counts k;
	u32 used, n_stages, busy;

	ckpt_counts(c, &k);
	mutex_lock(&c->cmd_lock);
	used = c->n_stages - c->free_stages;
	n_stages = c->n_stages;
	spin_lock(&c->job_lock);
	busy = c->jobs_busy;
	spin_unlock(&c->job_lock);
	DMEMIT("state %s\ncommitted_step %llu\ncommitted_slot %u\nsequence %llu\n",
	       ckpt_state_name(k.state), k.committed_step, k.committed_slot,
	       c->sb->sequence);
	DMEMIT("open_step %llu\nchunks_done %llu\nn_chunks %u\nchunk_params %llu\n",
	       k.open_step, k.chunks_done, c->sm.n_chunks, c->layout.chunk_params);
	DMEMIT("n_groups %u\ndtype %s\noverflow %u\nlast_result %s\n",
	       c->sm.n_groups, c->dtype == CKPT_DTYPE_BF16 ? "bf16" : "fp16",
	       k.overflow, ckpt_result_name(k.last_result));
	DMEMIT("last_error %u %s\nfirst_io_error %u\n", k.last_error,
	       k.last_error ? ckpt_strerror(k.last_error) : "-", k.first_io_error);
	DMEMIT("steps_committed %llu\nsteps_skipped %llu\nsteps_aborted %llu\n",
	       k.steps_committed, k.steps_skipped, k.steps_aborted);
	DMEMIT("commands_rejected %llu\nio_errors %llu\ngrad_bytes %llu\nparam_bytes %llu\n",
	       k.commands_rejected, k.io_errors, (u64)atomic64_read(&c->grad_bytes),
	       (u64)atomic64_read(&c->param_bytes));
	DMEMIT("blob_len %u\nstaging %u/%u\nqueue %u/%u\nfpu %s\n", c->sb->blob_len,
	       used, n_stages, busy, c->queue_depth, ckpt_use_avx2 ? "avx2" : "sse2");
	mutex_unlock(&c->cmd_lock);
	return 1;
}

/* hparam fields of a group token, in this order, as fp32 hex bit patterns */
#define CKPT_HP_FIELDS 11

static int ckpt_parse_group(char *tok, struct ckpt_hparams *hp)
{
	u32 v[CKPT_HP_FIELDS] = { 0 };
	unsigned int n = 0;
	char *f;

	while ((f = strsep(&tok, ",")) != NULL) {
		if (n == CKPT_HP_FIELDS || kstrtou32(f, 16, &v[n]))
			return -EINVAL;
		n++;
	}
	if (n < CKPT_HP_FIELDS - 1)
		return -EINVAL;
	hp->lr = v[0];
	hp->beta1 = v[1];
	hp->beta2 = v[2];
	hp->eps = v[3];
	hp->weight_decay = v[4];
	hp->one_minus_beta1 = v[5];
	hp->one_minus_beta2 = v[6];
	hp->step_size = v[7];
	hp->bc2_sqrt = v[8];
	hp->decay = v[9];
	hp->flags = v[10];
	return 0;
}

/* Fill c->cmd from a message; -EINVAL with a usage line on a syntax error. */
static int ckpt_parse_message(struct ckpt_c *c, unsigned int argc, char **argv)
{
	struct ckpt_cmd *cmd = c->cmd;
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
			if (ckpt_parse_group(argv[3 + i], &cmd->groups[i]))
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
	DMWARN("%s: unknown message '%s' (begin, commit, abort, stats)", ckpt_name(c), argv[0]);
	return -EINVAL;
usage:
	DMWARN("%s: usage: begin <step> <scale> <g>..., commit <step> [<blob>], abort [<step>]",
	       ckpt_name(c));
	return -EINVAL;
}

static int ckpt_message(struct dm_target *ti, unsigned int argc, char **argv,
			char *result, unsigned int maxlen)
{
	struct ckpt_c *c = ti->private;
	unsigned int sz = 0;
	u32 opcode = 0;
	u64 step = 0;
	int ret;

	if (!argc)
		return -EINVAL;
	if (!strcasecmp(argv[0], "stats")) {
		if (argc != 1)
			return -EINVAL;
		return ckpt_stats(c, result, maxlen);
	}
	mutex_lock(&c->cmd_lock);
	if (ckpt_parse_message(c, argc, argv)) {
		mutex_unlock(&c->cmd_lock);
		return -EINVAL;
	}
	opcode = c->cmd->opcode;
	step = c->cmd->step;
	ret = ckpt_exec(c, c->cmd);
	mutex_unlock(&c->cmd_lock);
	if (ret < 0) {
		DMWARN("%s: message %s refused: %s", ckpt_name(c), argv[0], ckpt_strerror(ret));
		return ret == -CKPT_E_IO || ret == -CKPT_E_FAILED ? -EIO : -EINVAL;
	}
	if (opcode == CKPT_OP_COMMIT) {
		DMEMIT("%s %llu", ret == CKPT_RESULT_OVERFLOW ? "overflow" : "committed", step);
		return 1;
	}
	return 0;
}

/* ---------------------------------------------------------------- limits */

static int ckpt_iterate_devices(struct dm_target *ti, iterate_devices_callout_fn fn,
				void *data)
{
	struct ckpt_c *c = ti->private;

	return fn(ti, c->dev, 0, c->layout.dev_bytes >> SECTOR_SHIFT, data);
}

static void ckpt_io_hints(struct dm_target *ti, struct queue_limits *limits)
{
	struct ckpt_c *c = ti->private;

	/* Whole chunks go straight to the update; anything less is staged. */
	limits->io_opt = c->layout.plo_chunk_bytes;
}

static struct target_type ckpt_target = {
	.name = "ckpt",
	.version = { 1, 0, 0 },
	.module = THIS_MODULE,
	.ctr = ckpt_ctr,
	.dtr = ckpt_dtr,
	.map = ckpt_map,
	.postsuspend = ckpt_postsuspend,
	.preresume = ckpt_preresume,
	.status = ckpt_status,
	.message = ckpt_message,
	.iterate_devices = ckpt_iterate_devices,
	.io_hints = ckpt_io_hints,
};

static int __init dm_ckpt_init(void)
{
	int ret;

	ckpt_use_avx2 = !force_sse2 && boot_cpu_has(X86_FEATURE_AVX2) &&
			boot_cpu_has(X86_FEATURE_F16C) &&
			cpu_has_xfeatures(XFEATURE_MASK_SSE | XFEATURE_MASK_YMM, NULL);
	ret = dm_register_target(&ckpt_target);
	if (ret < 0) {
		DMERR("register failed %d", ret);
		return ret;
	}
	DMINFO("version %u.%u.%u loaded, update: %s", ckpt_target.version[0],
	       ckpt_target.version[1], ckpt_target.version[2],
	       ckpt_use_avx2 ? "avx2" : "sse2");
	return 0;
}

static void __exit dm_ckpt_exit(void)
{
	dm_unregister_target(&ckpt_target);
}

module_init(dm_ckpt_init);
module_exit(dm_ckpt_exit);

MODULE_DESCRIPTION(DM_NAME " target running the AdamW step on the backing device");
MODULE_AUTHOR("dm-ckpt developers");
MODULE_LICENSE("GPL");
