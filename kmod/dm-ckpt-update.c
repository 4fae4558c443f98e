// SPDX-License-Identifier: GPL-2.0
/*
 * dm-ckpt update: the chunk buffers and the chunk update job: read the
 * committed record, the core's update of the chunk (ckpt_step_update: the
 * check, the counts, the fused AdamW update in bounded FPU sections, the
 * seal), write the new record.
 */
#include <linux/bio.h>
#include <linux/blk-cgroup.h>
#include <linux/completion.h>
#include <linux/kthread.h>
#include <linux/kernel.h>
#include <linux/mm.h>
#include <linux/module.h>
#include <linux/sched.h>
#include <linux/slab.h>
#include <linux/spinlock.h>
#include <linux/wait.h>
#include <linux/workqueue.h>
#include <asm/cpufeature.h>

#define DM_MSG_PREFIX "ckpt"

#include "ckpt_config.h"
#ifdef CKPT_HAVE_LINUX_FPU_H
#include <linux/fpu.h>
#else
#include <asm/fpu/api.h>
#endif

#include "ckpt_update_builds.h"
#include "dm-ckpt-io.h"
#include "dm-ckpt-update.h"

/* Params per kernel_fpu_begin/end section: preemption is off inside. */
#define CKPT_FPU_SLICE			4096u

static bool force_sse2;
module_param(force_sse2, bool, 0444);
MODULE_PARM_DESC(force_sse2, "Use the SSE2 update even on an AVX2/F16C CPU");

static bool force_avx2;
module_param(force_avx2, bool, 0444);
MODULE_PARM_DESC(force_avx2, "Use the AVX2/F16C update even on an AVX-512 CPU");


struct dm_ckpt_job;

struct dm_ckpt_update {
	struct dm_ckpt_upd_target t;
	struct workqueue_struct *wq;	/* unbound, queue_depth items at once */
	struct dm_ckpt_job *jobs;
	unsigned int queue_depth;
	spinlock_t job_lock;		/* free_jobs, jobs_busy */
	struct list_head free_jobs;
	unsigned int jobs_busy;
	wait_queue_head_t job_wait;
};

/* One chunk buffer and the update that uses it. */
struct dm_ckpt_job {
	struct dm_ckpt_update *u;
	struct work_struct work;
	struct list_head list;
	struct bio *bio;
	struct ckpt_update_job upd;	/* what the core's update of it is for */
	u8 *rec;		/* record_bytes: 4 KiB header, then the state */
	u16 *plo;		/* plo_chunk_bytes */
	u16 *grad;		/* plo_chunk_bytes */
	atomic_t writes;
	int write_error;
	struct completion done;
	u32 q8_tmp[CKPT_Q8_TMP_WORDS];	/* Q8: the update's scratch */
};

/*
 * The core's brackets of float code (ckpt_step_ops and ckpt_update_ops
 * fpu_begin, fpu_end), process context: preemption is off inside, so others
 * may run after each.
 */
void dm_ckpt_fpu_begin(void *host)
{
	kernel_fpu_begin();
}

void dm_ckpt_fpu_end(void *host)
{
	kernel_fpu_end();
	cond_resched();
}

/* The builds for this CPU (dm_ckpt_upd_init), in FPU sections of 4096 params. */
static const struct ckpt_update_build *update_build;
static struct ckpt_update_ops update_ops = {
	.fpu_begin = dm_ckpt_fpu_begin,
	.fpu_end = dm_ckpt_fpu_end,
	.slice = CKPT_FPU_SLICE,
};

/* What the CPU has that a build needs, and the kernel saving its state. */
static u32 cpu_features(void)
{
	const bool avx2 = boot_cpu_has(X86_FEATURE_AVX2) && boot_cpu_has(X86_FEATURE_F16C) &&
			  cpu_has_xfeatures(XFEATURE_MASK_SSE | XFEATURE_MASK_YMM, NULL);
	const bool v4 = boot_cpu_has(X86_FEATURE_FMA) && boot_cpu_has(X86_FEATURE_AVX512F) &&
			boot_cpu_has(X86_FEATURE_AVX512BW) &&
			boot_cpu_has(X86_FEATURE_AVX512CD) &&
			boot_cpu_has(X86_FEATURE_AVX512DQ) &&
			boot_cpu_has(X86_FEATURE_AVX512VL) &&
			cpu_has_xfeatures(XFEATURE_MASK_SSE | XFEATURE_MASK_YMM |
					  XFEATURE_MASK_AVX512, NULL);
	u32 cpu = 0;

	if (avx2 && !force_sse2)
		cpu |= CKPT_CPU_AVX2_F16C;
	if (v4 && !force_sse2 && !force_avx2)
		cpu |= CKPT_CPU_AVX512;
	return cpu;
}

void dm_ckpt_upd_init(void)
{
	update_build = ckpt_update_pick(cpu_features());
	update_ops.update = update_build->update;
	update_ops.update_q8 = update_build->update_q8;
	update_ops.update_q8bf = update_build->update_q8bf;
}

const char *dm_ckpt_upd_fpu_name(void)
{
	return update_build->name;
}

static bool job_available(struct dm_ckpt_update *u)
{
	bool r;

	spin_lock(&u->job_lock);
	r = !list_empty(&u->free_jobs);
	spin_unlock(&u->job_lock);
	return r;
}

/* Caller holds cmd_lock: only dispatch takes jobs, so a free one stays free. */
static struct dm_ckpt_job *__get_job(struct dm_ckpt_update *u)
{
	struct dm_ckpt_job *j;

	wait_event(u->job_wait, job_available(u));
	spin_lock(&u->job_lock);
	j = list_first_entry(&u->free_jobs, struct dm_ckpt_job, list);
	list_del(&j->list);
	u->jobs_busy++;
	spin_unlock(&u->job_lock);
	return j;
}

static void put_job(struct dm_ckpt_update *u, struct dm_ckpt_job *j)
{
	spin_lock(&u->job_lock);
	list_add(&j->list, &u->free_jobs);
	u->jobs_busy--;
	spin_unlock(&u->job_lock);
	wake_up_all(&u->job_wait);
}

static bool upd_idle(struct dm_ckpt_update *u)
{
	bool r;

	spin_lock(&u->job_lock);
	r = !u->jobs_busy;
	spin_unlock(&u->job_lock);
	return r;
}

void dm_ckpt_upd_drain(struct dm_ckpt_update *u)
{
	wait_event(u->job_wait, upd_idle(u));
}

/*
 * The record a step reads must be the committed state of its chunk, intact
 * (ckpt_step_update checks it): bit rot built upon would become new
 * committed state with a fresh checksum. Says what is wrong; the update
 * fails with -EILSEQ, as dm-integrity reports a checksum mismatch.
 */
static void record_damaged(struct dm_ckpt_update *upd, struct dm_ckpt_job *j)
{
	const struct ckpt_update_job *u = &j->upd;
	const char *name = dm_ckpt_md_name(upd->t.md);
	struct ckpt_rec header;

	if (u->fault == CKPT_REC_HEADER)
		DMERR_LIMIT("%s: state record of chunk %u slot %u: %s (%s)", name,
			    u->chunk, u->src.slot, ckpt_rec_fault_str(u->fault),
			    ckpt_strerror(ckpt_rec_decode(j->rec, &header)));
	else
		DMERR_LIMIT("%s: state record of chunk %u slot %u: %s (holds chunk %u slot %u step %llu seq %llu, want step %llu seq %llu)",
			    name, u->chunk, u->src.slot, ckpt_rec_fault_str(u->fault),
			    u->got.chunk, u->got.slot, u->got.step, u->got.sequence,
			    u->src.step, u->src.sequence);
}

/*
 * dm-io's completion gives only a bitmap of the regions that failed, not the
 * bio's status: an asynchronous write error is -EIO here.
 */
static void write_done(unsigned long error, void *context)
{
	struct dm_ckpt_job *j = context;

	if (error)
		WRITE_ONCE(j->write_error, -EIO);
	if (atomic_dec_and_test(&j->writes))
		complete(&j->done);
}

/*
 * Write the record and p_lo of the job's chunk to the destination slot.
 *
 * Each write completes through write_done exactly once. An asynchronous
 * dm_io() either calls notify (from its completion, error or not) and
 * returns 0, or returns an error without having called it: dp_init()
 * refusing the memory type. The one path that calls notify and also returns
 * an error (6.1's async_io() with several regions and a read) is not
 * reachable with one region and a write. So notifying here on a non-zero
 * return is never a second notification.
 */
static int write_state(struct dm_ckpt_update *u, struct dm_ckpt_job *j)
{
	const struct ckpt_regions *l = u->t.regions;
	struct dm_io_request req;
	struct dm_io_region where;
	int ret;

	j->write_error = 0;
	atomic_set(&j->writes, 2);
	reinit_completion(&j->done);

	dm_ckpt_md_io_prep(u->t.md, &req, &where, REQ_OP_WRITE | REQ_SYNC, j->rec,
			   ckpt_record_offset(l, j->upd.dst.slot, j->upd.chunk), l->record_bytes);
	req.notify.fn = write_done;
	req.notify.context = j;
	ret = dm_ckpt_md_submit(&req, &where, NULL);
	if (ret)
		write_done(1, j);

	dm_ckpt_md_io_prep(u->t.md, &req, &where, REQ_OP_WRITE | REQ_SYNC, j->plo,
			   ckpt_plo_offset(l, j->upd.dst.slot, j->upd.chunk), l->plo_chunk_bytes);
	req.notify.fn = write_done;
	req.notify.context = j;
	ret = dm_ckpt_md_submit(&req, &where, NULL);
	if (ret)
		write_done(1, j);

	wait_for_completion_io(&j->done);
	return READ_ONCE(j->write_error);
}

static void job_work(struct work_struct *work)
{
	struct dm_ckpt_job *j = container_of(work, struct dm_ckpt_job, work);
	struct dm_ckpt_update *u = j->u;
	const struct ckpt_regions *l = u->t.regions;
	const u32 chunk = j->upd.chunk;
	blk_status_t status = BLK_STS_OK;
	enum ckpt_update_result res;
	int ret;

	/*
	 * The chunk's I/O is the writer's: charge it to the blk-cgroup of the
	 * gradient bio that caused it, as loop charges its workers' I/O, so
	 * that io.weight and io.max of a job's cgroup hold for its target
	 * (dm-io allocates its bios with the worker's association).
	 */
	kthread_associate_blkcg(bio_blkcg_css(j->bio));
	/* dm-io's synchronous path reports -EIO for every failure. */
	ret = dm_ckpt_md_io(u->t.md, REQ_OP_READ | REQ_SYNC, j->rec,
			    ckpt_record_offset(l, j->upd.src.slot, chunk), l->record_bytes);
	if (ret) {
		DMERR_LIMIT("%s: reading the state of chunk %u failed: %d",
			    dm_ckpt_md_name(u->t.md), chunk, ret);
		goto fail;
	}
	res = ckpt_step_update(u->t.step, &update_ops, u, &j->upd, j->rec, j->grad, j->plo,
			       j->q8_tmp);
	if (res == CKPT_UPDATE_DAMAGED) {
		record_damaged(u, j);
		ret = -EILSEQ;
		goto fail;
	}
	if (res == CKPT_UPDATE_WRITE) {
		ret = write_state(u, j);
		if (ret) {
			DMERR_LIMIT("%s: writing the state of chunk %u failed: %d",
				    dm_ckpt_md_name(u->t.md), chunk, ret);
			goto fail;
		}
	}
	spin_lock(u->t.sm_lock);
	ckpt_step_update_done(u->t.step, &j->upd, res);
	spin_unlock(u->t.sm_lock);
	goto out;
fail:
	u->t.failed(u->t.ctx, ret);
	status = BLK_STS_IOERR;
out:
	kthread_associate_blkcg(NULL);
	dm_ckpt_bio_put(j->bio, status);
	put_job(u, j);
}

void dm_ckpt_upd_dispatch(struct dm_ckpt_update *u, struct bio *bio, u32 chunk, u8 group,
			  struct bvec_iter *it, const u8 *stage_grad)
{
	struct dm_ckpt_job *j = __get_job(u);
	const u64 cb = u->t.regions->plo_chunk_bytes;

	if (it)
		dm_ckpt_bio_copy_from(bio, it, j->grad, cb);
	else
		memcpy(j->grad, stage_grad, cb);

	j->bio = bio;
	spin_lock(u->t.sm_lock);
	ckpt_step_job(u->t.step, chunk, group, u->t.step->sm.open_step, &j->upd);
	spin_unlock(u->t.sm_lock);
	atomic_inc(&dm_ckpt_io_of(bio)->pending);
	queue_work(u->wq, &j->work);
}

unsigned int dm_ckpt_upd_busy(struct dm_ckpt_update *u)
{
	unsigned int busy;

	spin_lock(&u->job_lock);
	busy = u->jobs_busy;
	spin_unlock(&u->job_lock);
	return busy;
}

u64 dm_ckpt_upd_bytes(const struct ckpt_regions *l, unsigned int queue_depth)
{
	return (u64)queue_depth * (sizeof(struct dm_ckpt_job) + l->record_bytes +
				   2 * l->plo_chunk_bytes);
}

struct dm_ckpt_update *dm_ckpt_upd_create(const struct dm_ckpt_upd_target *t,
					  unsigned int queue_depth, char **error)
{
	const struct ckpt_regions *l = t->regions;
	const u64 cb = l->plo_chunk_bytes;
	struct dm_ckpt_update *u;
	unsigned int i;

	u = kzalloc(sizeof(*u), GFP_KERNEL);
	if (!u) {
		*error = "Cannot allocate memory";
		return ERR_PTR(-ENOMEM);
	}
	u->t = *t;
	spin_lock_init(&u->job_lock);
	INIT_LIST_HEAD(&u->free_jobs);
	init_waitqueue_head(&u->job_wait);
	u->jobs = kvcalloc(queue_depth, sizeof(*u->jobs), GFP_KERNEL);
	if (!u->jobs) {
		*error = "Cannot allocate memory";
		goto bad;
	}
	u->queue_depth = queue_depth;
	for (i = 0; i < queue_depth; i++) {
		struct dm_ckpt_job *j = &u->jobs[i];

		j->u = u;
		INIT_WORK(&j->work, job_work);
		init_completion(&j->done);
		j->rec = kvmalloc(l->record_bytes, DM_CKPT_GFP_BIG);
		j->plo = kvmalloc(2 * cb, DM_CKPT_GFP_BIG);
		if (!j->rec || !j->plo) {
			*error = "Cannot allocate chunk buffers (reduce queue_depth)";
			goto bad;
		}
		j->grad = j->plo + (cb >> 1);
		list_add_tail(&j->list, &u->free_jobs);
	}
	u->wq = alloc_workqueue("dm-ckpt-upd", WQ_MEM_RECLAIM | WQ_UNBOUND, queue_depth);
	if (!u->wq) {
		*error = "Cannot allocate workqueues";
		goto bad;
	}
	return u;
bad:
	dm_ckpt_upd_destroy(u);
	return ERR_PTR(-ENOMEM);
}

void dm_ckpt_upd_destroy(struct dm_ckpt_update *u)
{
	unsigned int i;

	if (!u)
		return;
	if (u->wq)
		destroy_workqueue(u->wq);
	if (u->jobs) {
		for (i = 0; i < u->queue_depth; i++) {
			kvfree(u->jobs[i].rec);
			kvfree(u->jobs[i].plo);
		}
		kvfree(u->jobs);
	}
	kfree(u);
}
