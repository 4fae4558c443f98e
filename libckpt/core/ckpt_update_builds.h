/* SPDX-License-Identifier: GPL-2.0 OR MIT */
/*
 * The builds of the update that a step runs, one table for both hosts
 * (after OpenZFS's raidz_all_maths[]): each host compiles the same bodies
 * (ckpt_update_impl.h) under the same names below, the kernel in
 * kmod/dm-ckpt-fpu-{sse2,avx2,avx512}.c with its float flags, userspace in
 * ckpt_update.c with target attributes; ckpt_update_builds[]
 * (ckpt_update_builds.c) lists them and ckpt_update_pick() is the one rule
 * that chooses a CPU's. Every build gives the same bits: the choice is
 * speed only. The kernel calls them between kernel_fpu_begin() and
 * kernel_fpu_end() (ckpt_update_ops).
 */
#ifndef CKPT_UPDATE_BUILDS_H
#define CKPT_UPDATE_BUILDS_H

#include "ckpt_update.h"

#ifdef __cplusplus
extern "C" {
#endif

/* What a CPU has that a build needs (the host tells: cpuid, boot_cpu_has). */
#define CKPT_CPU_AVX2_F16C	(1u << 0)	/* x86-64: AVX2 and F16C */
#define CKPT_CPU_AVX512		(1u << 1)	/* x86-64: x86-64-v4 (AVX-512 F/BW/CD/DQ/VL, FMA) */
#define CKPT_CPU_SVE		(1u << 2)	/* aarch64 */

struct ckpt_update_build {
	const char *name;
	u32 needs;		/* CKPT_CPU_* */
	ckpt_update_fn update;
	ckpt_update_q8_fn update_q8;
	ckpt_update_q8bf_fn update_q8bf;
};

#if defined(__x86_64__)
/* The baseline (SSE2), the kernel's default. */
u32 ckpt_update_chunk_sse2(const struct ckpt_hparams *hp, u32 grad_scale, u32 dtype,
			   const u16 *grad, u32 *p, u32 *m, u32 *v, u16 *plo, u64 n);
u32 ckpt_update_chunk_q8_sse2(const struct ckpt_hparams *hp, u32 grad_scale, u32 dtype,
			      const u16 *grad, u32 *p, const struct ckpt_q8_state *s, u32 *tmp,
			      u16 *plo, u64 n);
u32 ckpt_update_chunk_q8bf_sse2(const struct ckpt_hparams *hp, u32 grad_scale, const u16 *grad,
				u16 *p, const struct ckpt_q8_state *s, u32 *tmp, u16 *plo, u64 n,
				const struct ckpt_sr *sr);
/* AVX2 with the F16C conversions (CKPT_UPDATE_F16C in ckpt_update_impl.h) */
u32 ckpt_update_chunk_avx2_f16c(const struct ckpt_hparams *hp, u32 grad_scale, u32 dtype,
				const u16 *grad, u32 *p, u32 *m, u32 *v, u16 *plo, u64 n);
u32 ckpt_update_chunk_q8_avx2(const struct ckpt_hparams *hp, u32 grad_scale, u32 dtype,
			      const u16 *grad, u32 *p, const struct ckpt_q8_state *s, u32 *tmp,
			      u16 *plo, u64 n);
u32 ckpt_update_chunk_q8bf_avx2(const struct ckpt_hparams *hp, u32 grad_scale, const u16 *grad,
				u16 *p, const struct ckpt_q8_state *s, u32 *tmp, u16 *plo, u64 n,
				const struct ckpt_sr *sr);
/* x86-64-v4 (AVX-512) with the F16C conversions */
u32 ckpt_update_chunk_avx512_f16c(const struct ckpt_hparams *hp, u32 grad_scale, u32 dtype,
				  const u16 *grad, u32 *p, u32 *m, u32 *v, u16 *plo, u64 n);
u32 ckpt_update_chunk_q8_avx512(const struct ckpt_hparams *hp, u32 grad_scale, u32 dtype,
				const u16 *grad, u32 *p, const struct ckpt_q8_state *s, u32 *tmp,
				u16 *plo, u64 n);
u32 ckpt_update_chunk_q8bf_avx512(const struct ckpt_hparams *hp, u32 grad_scale,
				  const u16 *grad, u16 *p, const struct ckpt_q8_state *s, u32 *tmp,
				  u16 *plo, u64 n, const struct ckpt_sr *sr);
#elif defined(__aarch64__)
/* Advanced SIMD (NEON), the baseline, and SVE at any vector length */
u32 ckpt_update_chunk_neon(const struct ckpt_hparams *hp, u32 grad_scale, u32 dtype,
			   const u16 *grad, u32 *p, u32 *m, u32 *v, u16 *plo, u64 n);
u32 ckpt_update_chunk_q8_neon(const struct ckpt_hparams *hp, u32 grad_scale, u32 dtype,
			      const u16 *grad, u32 *p, const struct ckpt_q8_state *s, u32 *tmp,
			      u16 *plo, u64 n);
u32 ckpt_update_chunk_q8bf_neon(const struct ckpt_hparams *hp, u32 grad_scale, const u16 *grad,
				u16 *p, const struct ckpt_q8_state *s, u32 *tmp, u16 *plo, u64 n,
				const struct ckpt_sr *sr);
u32 ckpt_update_chunk_sve(const struct ckpt_hparams *hp, u32 grad_scale, u32 dtype,
			  const u16 *grad, u32 *p, u32 *m, u32 *v, u16 *plo, u64 n);
u32 ckpt_update_chunk_q8_sve(const struct ckpt_hparams *hp, u32 grad_scale, u32 dtype,
			     const u16 *grad, u32 *p, const struct ckpt_q8_state *s, u32 *tmp,
			     u16 *plo, u64 n);
u32 ckpt_update_chunk_q8bf_sve(const struct ckpt_hparams *hp, u32 grad_scale, const u16 *grad,
			       u16 *p, const struct ckpt_q8_state *s, u32 *tmp, u16 *plo, u64 n,
			       const struct ckpt_sr *sr);
#endif

/* This architecture's builds, the baseline first; n_builds of them. */
extern const struct ckpt_update_build ckpt_update_builds[];
extern const unsigned int ckpt_update_n_builds;

/* The build a CPU with cpu (CKPT_CPU_*) runs: the last one whose needs it has. */
const struct ckpt_update_build *ckpt_update_pick(u32 cpu);

#ifndef __KERNEL__
/* This CPU's CKPT_CPU_* (userspace: cpuid, AT_HWCAP). */
u32 ckpt_cpu_features(void);
#endif

#ifdef __cplusplus
}
#endif

#endif /* CKPT_UPDATE_BUILDS_H */
