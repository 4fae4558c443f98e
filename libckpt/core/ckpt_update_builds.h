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
	ckpt_update_t *update;
	ckpt_update_q8_t *update_q8;
	ckpt_update_q8bf_t *update_q8bf;
};

#if defined(__x86_64__)
/*
 * SSE2, the baseline; AVX2 and x86-64-v4 (AVX-512) with the F16C
 * conversions of the fp32 update (CKPT_UPDATE_F16C in ckpt_update_impl.h).
 */
ckpt_update_t ckpt_update_chunk_sse2, ckpt_update_chunk_avx2_f16c, ckpt_update_chunk_avx512_f16c;
ckpt_update_q8_t ckpt_update_chunk_q8_sse2, ckpt_update_chunk_q8_avx2, ckpt_update_chunk_q8_avx512;
ckpt_update_q8bf_t ckpt_update_chunk_q8bf_sse2, ckpt_update_chunk_q8bf_avx2,
	ckpt_update_chunk_q8bf_avx512;
#elif defined(__aarch64__)
/* Advanced SIMD (NEON), the baseline, and SVE at any vector length */
ckpt_update_t ckpt_update_chunk_neon, ckpt_update_chunk_sve;
ckpt_update_q8_t ckpt_update_chunk_q8_neon, ckpt_update_chunk_q8_sve;
ckpt_update_q8bf_t ckpt_update_chunk_q8bf_neon, ckpt_update_chunk_q8bf_sve;
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
