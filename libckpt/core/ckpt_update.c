/* SPDX-License-Identifier: GPL-2.0 OR MIT */
/*
 * Userspace build of the fused update: the body lives in ckpt_update_impl.h,
 * compiled here several times for run-time dispatch and for tests. The kernel
 * module has its own wrapper files around the same header and does not use
 * this one.
 *
 * Must be compiled with -ffp-contract=off -fno-math-errno (libckpt/CMakeLists.txt):
 * x86-64-v4 has FMA, and contraction would change the bits.
 */
#ifndef __KERNEL__

#include "ckpt_update.h"
#include "ckpt_update_impl.h"
#include "ckpt_update_variants.h"

#define CKPT_UPDATE_ARGS                                                       \
	const struct ckpt_hparams *hp, u32 grad_scale, u32 dtype,              \
	const u16 *grad, u32 *p, u32 *m, u32 *v, u16 *plo, u64 n
#define CKPT_UPDATE_CALL hp, grad_scale, dtype, grad, p, m, v, plo, n

#define CKPT_SCALAR __attribute__((optimize("no-tree-vectorize")))
#define CKPT_CLONES __attribute__((target_clones("default", "avx2", "arch=x86-64-v4")))

/* ---- the dispatched entry points (the public API) ---- */

CKPT_CLONES u32 ckpt_update_chunk(CKPT_UPDATE_ARGS)
{
	return ckpt_update_chunk_body(CKPT_UPDATE_CALL);
}

CKPT_CLONES void ckpt_round_params(u32 dtype, const u32 *p, u16 *plo, u64 n)
{
	ckpt_round_params_body(dtype, p, plo, n);
}

CKPT_CLONES void ckpt_f16_to_f32_array(const u16 *h, u32 *f, u64 n)
{
	ckpt_f16_to_f32_array_body(h, f, n);
}

/* ---- named variants, same body ---- */

CKPT_SCALAR u32 ckpt_update_chunk_scalar(CKPT_UPDATE_ARGS)
{
	return ckpt_update_chunk_body(CKPT_UPDATE_CALL);
}

u32 ckpt_update_chunk_sse2(CKPT_UPDATE_ARGS)
{
	return ckpt_update_chunk_body(CKPT_UPDATE_CALL);
}

__attribute__((target("avx2"))) u32 ckpt_update_chunk_avx2(CKPT_UPDATE_ARGS)
{
	return ckpt_update_chunk_body(CKPT_UPDATE_CALL);
}

__attribute__((target("arch=x86-64-v4"))) u32 ckpt_update_chunk_avx512(CKPT_UPDATE_ARGS)
{
	return ckpt_update_chunk_body(CKPT_UPDATE_CALL);
}

CKPT_SCALAR void ckpt_round_params_scalar(u32 dtype, const u32 *p, u16 *plo, u64 n)
{
	ckpt_round_params_body(dtype, p, plo, n);
}

void ckpt_round_params_sse2(u32 dtype, const u32 *p, u16 *plo, u64 n)
{
	ckpt_round_params_body(dtype, p, plo, n);
}

__attribute__((target("avx2")))
void ckpt_round_params_avx2(u32 dtype, const u32 *p, u16 *plo, u64 n)
{
	ckpt_round_params_body(dtype, p, plo, n);
}

__attribute__((target("arch=x86-64-v4")))
void ckpt_round_params_avx512(u32 dtype, const u32 *p, u16 *plo, u64 n)
{
	ckpt_round_params_body(dtype, p, plo, n);
}

int ckpt_cpu_has_avx2(void)
{
	__builtin_cpu_init();
	return __builtin_cpu_supports("avx2");
}

int ckpt_cpu_has_avx512(void)
{
	__builtin_cpu_init();
	return __builtin_cpu_supports("x86-64-v4");
}

/* ---- integer-only scalar conversions ---- */

u32 ckpt_f16_to_f32(u16 h)
{
	return ckpt_f16_to_f32_int(h);
}

u16 ckpt_f32_to_f16(u32 f)
{
	return ckpt_f32_to_f16_int(f);
}

u32 ckpt_bf16_to_f32(u16 h)
{
	return ckpt_bf16_to_f32_int(h);
}

u16 ckpt_f32_to_bf16(u32 f)
{
	return ckpt_f32_to_bf16_int(f);
}

#endif /* !__KERNEL__ */
