// SPDX-License-Identifier: GPL-2.0 OR MIT
/*
 * Loading state (initial masters, an import): when it is allowed, its
 * spans, its commit and the restart of the step machine from it.
 *
 * No I/O, no allocation, no float (fp32 values are checked as bit patterns).
 */
#include "ckpt_step_impl.h"

/* ---------------- loading state ---------------- */

int ckpt_step_load_check(struct ckpt_step *cs, u64 step, u64 blob_len)
{
	int ret = 0;

	cs->ops->lock(cs->host);
	if (cs->sm.state == CKPT_STATE_FAILED)
		ret = -CKPT_E_FAILED;
	else if (cs->sm.state != CKPT_STATE_IDLE || cs->sm.committed_step)
		ret = -CKPT_E_STATE;
	cs->ops->unlock(cs->host);
	if (ret)
		return ret;
	if (step > CKPT_STEP_MAX)
		return -CKPT_E_STEP;
	if (blob_len > CKPT_BLOB_MAX)
		return -CKPT_E_BLOB;
	return 0;
}

int ckpt_step_load_span(const struct ckpt_step *cs, u64 offset, u64 n)
{
	const u64 n_params = cs->regions.n_params;

	if (offset >= n_params || n > n_params - offset)
		return -CKPT_E_RANGE;
	return 0;
}

int ckpt_step_load_commit(struct ckpt_step *cs, u64 step, const void *blob, u32 blob_len)
{
	u32 slot;
	int ret;

	cs->ops->lock(cs->host);
	slot = ckpt_sm_dst_slot(&cs->sm);
	cs->ops->unlock(cs->host);
	ret = ckpt_step_write_sb(cs, step, slot, blob, blob_len);
	if (ret)
		return ret;
	ckpt_step_restart(cs);
	return 0;
}
