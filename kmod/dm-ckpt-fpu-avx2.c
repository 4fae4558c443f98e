// SPDX-License-Identifier: GPL-2.0
/*
 * dm-ckpt float code, AVX2 and F16C, chosen at load time when the CPU has both.
 *
 * The body is the core's, unchanged (libckpt/core/ckpt_update_impl.h), with
 * its F16C conversions (CKPT_UPDATE_F16C), so this build gives the same bits
 * as every other variant and as the userspace engine. Compiled with the
 * kernel's float flags (see Kbuild); only ever called between
 * kernel_fpu_begin() and kernel_fpu_end() by the core (ckpt_update_ops).
 */
#define CKPT_UPDATE_F16C
#include "ckpt_update_builds.h"
#include "ckpt_update_impl.h"

u32 ckpt_update_chunk_avx2_f16c(const struct ckpt_hparams *hp, u32 grad_scale, u32 dtype,
				const u16 *grad, u32 *p, u32 *m, u32 *v, u16 *plo, u64 n)
{
	return ckpt_update_chunk_f16c_body(hp, grad_scale, dtype, grad, p, m, v, plo, n);
}

u32 ckpt_update_chunk_q8_avx2(const struct ckpt_hparams *hp, u32 grad_scale, u32 dtype,
			      const u16 *grad, u32 *p, const struct ckpt_q8_state *s,
			      u32 *tmp, u16 *plo, u64 n)
{
	return ckpt_update_chunk_q8_body(hp, grad_scale, dtype, grad, p, s, tmp, plo, n);
}

u32 ckpt_update_chunk_q8bf_avx2(const struct ckpt_hparams *hp, u32 grad_scale,
				const u16 *grad, u16 *p, const struct ckpt_q8_state *s,
				u32 *tmp, u16 *plo, u64 n, const struct ckpt_sr *sr)
{
	return ckpt_update_chunk_q8bf_body(hp, grad_scale, grad, p, s, tmp, plo, n, sr);
}
