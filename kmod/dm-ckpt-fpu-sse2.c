// SPDX-License-Identifier: GPL-2.0
/*
 * dm-ckpt float code, the x86-64 baseline (SSE2): every CPU the kernel runs on.
 *
 * The body is the core's, unchanged (libckpt/core/ckpt_update_impl.h), so this build
 * gives the same bits as every other variant and as the userspace engine.
 * Compiled with the kernel's float flags (see Kbuild); only ever called
 * between kernel_fpu_begin() and kernel_fpu_end() by the core (ckpt_update_ops).
 */
#include "ckpt_update_builds.h"
#include "ckpt_update_impl.h"

u32 ckpt_update_chunk_sse2(const struct ckpt_hparams *hp, u32 grad_scale, u32 dtype,
			   const u16 *grad, u32 *p, u32 *m, u32 *v, u16 *plo, u64 n)
{
	return ckpt_update_chunk_body(hp, grad_scale, dtype, grad, p, m, v, plo, n);
}

u32 ckpt_update_chunk_q8_sse2(const struct ckpt_hparams *hp, u32 grad_scale, u32 dtype,
			      const u16 *grad, u32 *p, const struct ckpt_q8_state *s,
			      u32 *tmp, u16 *plo, u64 n)
{
	return ckpt_update_chunk_q8_body(hp, grad_scale, dtype, grad, p, s, tmp, plo, n);
}

u32 ckpt_update_chunk_q8bf_sse2(const struct ckpt_hparams *hp, u32 grad_scale,
				const u16 *grad, u16 *p, const struct ckpt_q8_state *s,
				u32 *tmp, u16 *plo, u64 n, const struct ckpt_sr *sr)
{
	return ckpt_update_chunk_q8bf_body(hp, grad_scale, grad, p, s, tmp, plo, n, sr);
}

/*
 * The core's gradient sums (ckpt_update.h), the kernel's build: SSE2 is
 * enough for one pass over 2 B a param.
 */
u64 ckpt_grad_sumsq(u32 dtype, const u16 *grad, u64 n, u64 acc)
{
	return ckpt_grad_sumsq_body(dtype, grad, n, acc);
}

u64 ckpt_sum_f64(const u64 *v, u64 n)
{
	return ckpt_sum_f64_body(v, n);
}
