// SPDX-License-Identifier: GPL-2.0
/*
 * dm-ckpt float code, AVX-512 (F, BW, DQ, VL) with F16C, chosen at load time
 * when the CPU has them and the kernel saves the AVX-512 state.
 *
 * The same core body as dm-ckpt-fpu-avx2.c (libckpt/core/ckpt_update_impl.h,
 * CKPT_UPDATE_F16C), compiled for AVX-512 as the userspace x86-64-v4 build:
 * the same bits as every other variant. Only ever called between
 * kernel_fpu_begin() and kernel_fpu_end() by the core (ckpt_update_ops).
 */
#define CKPT_UPDATE_F16C
#include "ckpt_update_builds.h"
#include "ckpt_update_impl.h"

u32 ckpt_update_chunk_avx512_f16c(const struct ckpt_hparams *hp, u32 grad_scale, u32 dtype,
				  const u16 *grad, u32 *p, u32 *m, u32 *v, u16 *plo, u64 n)
{
	return ckpt_update_chunk_f16c_body(hp, grad_scale, dtype, grad, p, m, v, plo, n);
}

u32 ckpt_update_chunk_q8_avx512(const struct ckpt_hparams *hp, u32 grad_scale, u32 dtype,
				const u16 *grad, u32 *p, const struct ckpt_q8_state *s,
				u32 *tmp, u16 *plo, u64 n)
{
	return ckpt_update_chunk_q8_body(hp, grad_scale, dtype, grad, p, s, tmp, plo, n);
}

u32 ckpt_update_chunk_q8bf_avx512(const struct ckpt_hparams *hp, u32 grad_scale,
				  const u16 *grad, u16 *p, const struct ckpt_q8_state *s,
				  u32 *tmp, u16 *plo, u64 n, const struct ckpt_sr *sr)
{
	return ckpt_update_chunk_q8bf_body(hp, grad_scale, grad, p, s, tmp, plo, n, sr);
}
