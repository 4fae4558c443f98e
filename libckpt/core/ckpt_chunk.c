// SPDX-License-Identifier: GPL-2.0 OR MIT
/*
 * The update of one chunk, the whole sequence both targets run (the engine's
 * workers, the kernel's update work): the committed record checked, the
 * block counts, the runs the step gives each block, the update build the
 * host picked, the gradients' sum, the record sealed for the open step. The
 * host reads the record before and writes it after; nothing else.
 *
 * No I/O, no allocation and no float here: the float code is the host's
 * update builds and ckpt_grad_sumsq, called between ops->fpu_begin and
 * ops->fpu_end.
 */
#include "ckpt_step.h"
#include "ckpt_update.h"

void ckpt_step_job(const struct ckpt_step *cs, u32 chunk, u32 group, u64 step,
		   struct ckpt_update_job *job)
{
	job->chunk = chunk;
	job->group = group;
	job->grad_scale = cs->sm.grad_scale;
	ckpt_rec_committed(cs->sb, chunk, &job->src);
	ckpt_rec_next(cs->sb, chunk, step, &job->dst);
}

/* Params [first, first + n) of the job's chunk with hp, in the host's slices. */
static u32 update_run(const struct ckpt_step *cs, const struct ckpt_update_ops *ops, void *host,
		      struct ckpt_update_job *job, const struct ckpt_hparams *hp, u64 first, u64 n,
		      u32 *p, const u16 *grad, u16 *plo, u32 *tmp)
{
	const struct ckpt_sb *sb = cs->sb;
	const u32 incompat = sb->feature_incompat;
	const u32 dtype = sb->geo.dtype;
	const u64 cp = cs->regions.chunk_params;
	const u64 seed = ckpt_sr_seed(sb->uuid);
	struct ckpt_q8_state q;
	struct ckpt_sr sr;
	u32 nonfinite = 0;
	u64 i, k, at;

	for (i = 0; i < n; i += k) {
		k = ops->slice && n - i > ops->slice ? ops->slice : n - i;
		at = first + i;
		if (ops->fpu_begin)
			ops->fpu_begin(host);
		job->sumsq = ckpt_grad_sumsq(dtype, grad + at, k, job->sumsq);
		if (incompat & CKPT_FEATURE_INCOMPAT_Q8)
			ckpt_q8_state_at(p, sb->geo.chunk_shift, incompat, at, &q);
		if (incompat & CKPT_FEATURE_INCOMPAT_BF16M) {
			ckpt_sr_at(seed, job->dst.step, (u64)job->chunk * cp + at, &sr);
			nonfinite |= ops->update_q8bf(hp, job->grad_scale, grad + at,
						      (u16 *)p + at, &q, tmp, plo + at, k, &sr);
		} else if (incompat & CKPT_FEATURE_INCOMPAT_Q8) {
			nonfinite |= ops->update_q8(hp, job->grad_scale, dtype, grad + at,
						    p + at, &q, tmp, plo + at, k);
		} else {
			nonfinite |= ops->update(hp, job->grad_scale, dtype, grad + at, p + at,
						 p + cp + at, p + 2 * cp + at, plo + at, k);
		}
		if (ops->fpu_end)
			ops->fpu_end(host);
	}
	return nonfinite;
}

enum ckpt_update_result ckpt_step_update(const struct ckpt_step *cs,
					 const struct ckpt_update_ops *ops, void *host,
					 struct ckpt_update_job *job, void *rec, const u16 *grad,
					 u16 *plo, u32 *tmp)
{
	const struct ckpt_sb *sb = cs->sb;
	const u32 incompat = sb->feature_incompat;
	u32 *p = (u32 *)((u8 *)rec + CKPT_BLOCK);
	struct ckpt_run run;
	u32 nonfinite = 0;
	u64 pos = 0;

	/* A step must not turn bit rot into new committed state with a fresh checksum. */
	job->fault = ckpt_rec_check(rec, p, NULL, &job->src, incompat, &job->got);
	if (job->fault != CKPT_REC_OK)
		return CKPT_UPDATE_DAMAGED;
	if (ckpt_step_counts(cs, job->chunk, rec))
		return CKPT_UPDATE_COUNT_FAULT;
	job->sumsq = 0;
	while (ckpt_step_run(cs, job->chunk, job->group, &pos, &run)) {
		/* a skipped block keeps p, m, v; its p_lo is rounded again (integers) */
		if (run.skip && (incompat & CKPT_FEATURE_INCOMPAT_BF16M))
			memcpy(plo + run.first, (const u16 *)p + run.first, run.n * 2);
		else if (run.skip)
			ckpt_round_params_int(sb->geo.dtype, p + run.first, plo + run.first, run.n);
		else
			nonfinite |= update_run(cs, ops, host, job, &run.hp, run.first, run.n,
						p, grad, plo, tmp);
	}
	if (nonfinite)
		return CKPT_UPDATE_NONFINITE;
	ckpt_rec_seal(rec, p, plo, &job->dst, incompat);
	return CKPT_UPDATE_WRITE;
}

void ckpt_step_update_done(struct ckpt_step *cs, const struct ckpt_update_job *job,
			   enum ckpt_update_result result)
{
	switch (result) {
	case CKPT_UPDATE_WRITE:
	case CKPT_UPDATE_NONFINITE:
		ckpt_step_sumsq(cs, job->chunk, job->sumsq);
		ckpt_sm_applied(&cs->sm, job->chunk, result == CKPT_UPDATE_NONFINITE,
				result == CKPT_UPDATE_WRITE);
		break;
	case CKPT_UPDATE_COUNT_FAULT:
		ckpt_sm_count_fault(&cs->sm, job->chunk);
		break;
	case CKPT_UPDATE_DAMAGED:
		break;	/* the host fails the device */
	}
}
