/* SPDX-License-Identifier: GPL-2.0 OR MIT */
/*
 * Userspace only: the explicitly named builds of the one fused body
 * (ckpt_update_impl.h), for tests and benchmarks. ckpt_update_chunk itself is
 * the run-time dispatched one: target_clones (default, avx2, x86-64-v4) on
 * x86-64, an ifunc choosing NEON or SVE on aarch64 (docs/design.md).
 * ckpt_update_variants lists this architecture's builds with whether the CPU
 * can run each; call a named one only when it says so.
 */
#ifndef CKPT_UPDATE_VARIANTS_H
#define CKPT_UPDATE_VARIANTS_H

#include "ckpt_update_builds.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef ckpt_update_t *ckpt_update_fn;
typedef ckpt_update_q8_t *ckpt_update_q8_fn;
typedef ckpt_update_q8bf_t *ckpt_update_q8bf_fn;
typedef void (*ckpt_round_fn)(u32 dtype, const u32 *p, u16 *plo, u64 n);

/* Not vectorized (-fno-tree-vectorize): the reference every other must equal. */
u32 ckpt_update_chunk_scalar(const struct ckpt_hparams *hp, u32 grad_scale, u32 dtype,
			     const u16 *grad, u32 *p, u32 *m, u32 *v, u16 *plo, u64 n);
void ckpt_round_params_scalar(u32 dtype, const u32 *p, u16 *plo, u64 n);
u32 ckpt_update_chunk_q8_scalar(const struct ckpt_hparams *hp, u32 grad_scale, u32 dtype,
				const u16 *grad, u32 *p, const struct ckpt_q8_state *s, u32 *tmp,
				u16 *plo, u64 n);
u32 ckpt_update_chunk_q8bf_scalar(const struct ckpt_hparams *hp, u32 grad_scale, const u16 *grad,
				  u16 *p, const struct ckpt_q8_state *s, u32 *tmp, u16 *plo, u64 n,
				  const struct ckpt_sr *sr);

/* ckpt_grad_sumsq not vectorized: its reference. */
u64 ckpt_grad_sumsq_scalar(u32 dtype, const u16 *grad, u64 n, u64 acc);

/* fp16 -> fp32 over an array with the vector body's conversion (dispatched). */
void ckpt_f16_to_f32_array(const u16 *h, u32 *f, u64 n);

struct ckpt_update_variant {
	const char *name;	/* "scalar", "sse2", ..., "dispatched" */
	ckpt_update_fn update;
	ckpt_round_fn round;
	ckpt_update_q8_fn update_q8;
	ckpt_update_q8bf_fn update_q8bf;
	int available;		/* this CPU can run it */
};

#define CKPT_UPDATE_VARIANTS_MAX 8

/*
 * Fills out[] (room for CKPT_UPDATE_VARIANTS_MAX) with every build of this
 * architecture, scalar first and the dispatched one last; returns how many.
 */
unsigned int ckpt_update_variants(struct ckpt_update_variant *out);

#if defined(__x86_64__)
/* (the builds of ckpt_update_builds.h, and these: the emulated conversions) */
/* target("avx2") */
u32 ckpt_update_chunk_avx2(const struct ckpt_hparams *hp, u32 grad_scale, u32 dtype,
			   const u16 *grad, u32 *p, u32 *m, u32 *v, u16 *plo, u64 n);
/* target("arch=x86-64-v4"): AVX-512 F/BW/CD/DQ/VL */
u32 ckpt_update_chunk_avx512(const struct ckpt_hparams *hp, u32 grad_scale, u32 dtype,
			     const u16 *grad, u32 *p, u32 *m, u32 *v, u16 *plo, u64 n);

void ckpt_round_params_sse2(u32 dtype, const u32 *p, u16 *plo, u64 n);
void ckpt_round_params_avx2_f16c(u32 dtype, const u32 *p, u16 *plo, u64 n);
void ckpt_round_params_avx512_f16c(u32 dtype, const u32 *p, u16 *plo, u64 n);
void ckpt_round_params_avx2(u32 dtype, const u32 *p, u16 *plo, u64 n);
void ckpt_round_params_avx512(u32 dtype, const u32 *p, u16 *plo, u64 n);

int ckpt_cpu_has_avx2(void);
int ckpt_cpu_has_f16c(void);	/* AVX2 and F16C */
int ckpt_cpu_has_avx512(void);	/* everything x86-64-v4 needs */
#elif defined(__aarch64__)
void ckpt_round_params_neon(u32 dtype, const u32 *p, u16 *plo, u64 n);
void ckpt_round_params_sve(u32 dtype, const u32 *p, u16 *plo, u64 n);

int ckpt_cpu_has_sve(void);
#endif

#ifdef __cplusplus
}
#endif

#endif /* CKPT_UPDATE_VARIANTS_H */
