// SPDX-License-Identifier: GPL-2.0 OR MIT
/*
 * Routing of the virtual device: which window an access hits, what each
 * window refuses, where a read is cut.
 *
 * No I/O, no allocation, no float (fp32 values are checked as bit patterns).
 */
#include "ckpt_step_impl.h"

/* ---------------- the virtual device's windows ---------------- */

int ckpt_route(const struct ckpt_regions *l, u64 off, u64 len, u32 flags, struct ckpt_route *r)
{
	const bool write = flags & CKPT_ROUTE_WRITE;
	u64 end = 0;

	memset(r, 0, sizeof(*r));
	if (!len)
		return 0;
	if (off < l->virt_bytes) {
		if (off < l->grad_off) {
			r->window = CKPT_WIN_CTRL;
			r->off = off;
			end = l->grad_off;
		} else if (off < l->param_off) {
			r->window = CKPT_WIN_GRAD;
			r->off = off - l->grad_off;
			end = l->param_off;
		} else if (off < l->image_off) {
			/* p_lo chunks are a power of two: a shift, no 64-bit division */
			r->window = CKPT_WIN_PARAM;
			r->off = off - l->param_off;
			r->chunk = (u32)(r->off >> __builtin_ctzll(l->plo_chunk_bytes));
			r->in = r->off & (l->plo_chunk_bytes - 1);
			end = off - r->in + l->plo_chunk_bytes;
		} else {
			r->window = CKPT_WIN_IMAGE;
			r->off = off - l->image_off;
			end = l->virt_bytes;
		}
	}
	if (write && ((off | len) & (CKPT_SECTOR - 1)))
		return -CKPT_E_ALIGN;
	/* Written so that off + len cannot wrap. */
	if (off >= l->virt_bytes || len > l->virt_bytes - off) {
		r->window = CKPT_WIN_NONE;
		r->off = 0;
		r->chunk = 0;
		r->in = 0;
		return -CKPT_E_RANGE;
	}
	if (!write) {
		r->len = len < end - off ? len : end - off;
		return 0;
	}
	if (flags & CKPT_ROUTE_READ_ONLY)
		return -CKPT_E_READONLY;
	switch (r->window) {
	case CKPT_WIN_CTRL:
		if (off || len > CKPT_BLOCK)
			return -CKPT_E_RANGE;
		break;
	case CKPT_WIN_GRAD:
		if (len > l->param_off - off)
			return -CKPT_E_RANGE;
		break;
	default:
		return -CKPT_E_READONLY;
	}
	r->len = len;
	return 0;
}

int ckpt_step_route(struct ckpt_step *cs, u64 off, u64 len, u32 flags, struct ckpt_route *r)
{
	int ret = ckpt_route(&cs->regions, off, len, flags, r);

	if (ret && (flags & CKPT_ROUTE_WRITE)) {
		cs->ops->lock(cs->host);
		ckpt_sm_rejected(&cs->sm, ret);
		cs->ops->unlock(cs->host);
	}
	return ret;
}
