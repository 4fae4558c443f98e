/* SPDX-License-Identifier: GPL-2.0 */
/*
 * dm-ckpt: the float translation units, as dm-ckpt-update.c calls them.
 *
 * The fused AdamW body (libckpt/core/ckpt_update_impl.h) is compiled three
 * times, in dm-ckpt-fpu-sse2.c (x86-64 baseline), dm-ckpt-fpu-avx2.c
 * (AVX2/F16C) and dm-ckpt-fpu-avx512.c (AVX-512/F16C), each with its own
 * float flags. No float crosses these calls: fp32 values
 * are u32 bit patterns. Call them only between kernel_fpu_begin() and
 * kernel_fpu_end(), on at most a few thousand params at a time.
 */
#ifndef DM_CKPT_FPU_H
#define DM_CKPT_FPU_H

#include "ckpt_update.h"

u32 dm_ckpt_update_sse2(const struct ckpt_hparams *hp, u32 grad_scale, u32 dtype,
			const u16 *grad, u32 *p, u32 *m, u32 *v, u16 *plo, u64 n);
u32 dm_ckpt_update_avx2(const struct ckpt_hparams *hp, u32 grad_scale, u32 dtype,
			const u16 *grad, u32 *p, u32 *m, u32 *v, u16 *plo, u64 n);
u32 dm_ckpt_update_avx512(const struct ckpt_hparams *hp, u32 grad_scale, u32 dtype,
			  const u16 *grad, u32 *p, u32 *m, u32 *v, u16 *plo, u64 n);

/* The same on 8-bit moments (feature Q8): ckpt_update_chunk_q8. */
u32 dm_ckpt_update_q8_sse2(const struct ckpt_hparams *hp, u32 grad_scale, u32 dtype,
			   const u16 *grad, u32 *p, const struct ckpt_q8_state *s, u32 *tmp,
			   u16 *plo, u64 n);
u32 dm_ckpt_update_q8_avx2(const struct ckpt_hparams *hp, u32 grad_scale, u32 dtype,
			   const u16 *grad, u32 *p, const struct ckpt_q8_state *s, u32 *tmp,
			   u16 *plo, u64 n);

/* The same on bf16 masters (feature BF16M): ckpt_update_chunk_q8bf. */
u32 dm_ckpt_update_q8bf_sse2(const struct ckpt_hparams *hp, u32 grad_scale, const u16 *grad,
			     u16 *p, const struct ckpt_q8_state *s, u32 *tmp, u16 *plo, u64 n,
			     const struct ckpt_sr *sr);
u32 dm_ckpt_update_q8bf_avx2(const struct ckpt_hparams *hp, u32 grad_scale, const u16 *grad,
			     u16 *p, const struct ckpt_q8_state *s, u32 *tmp, u16 *plo, u64 n,
			     const struct ckpt_sr *sr);

#endif /* DM_CKPT_FPU_H */
