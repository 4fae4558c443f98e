// SPDX-License-Identifier: GPL-2.0 OR MIT
/*
 * The table of the update's builds and the rule that picks one
 * (ckpt_update_builds.h). Function pointers only: no float here.
 */
#include "ckpt_update_builds.h"

const struct ckpt_update_build ckpt_update_builds[] = {
#if defined(__x86_64__)
	{ "sse2", 0, ckpt_update_chunk_sse2, ckpt_update_chunk_q8_sse2,
	  ckpt_update_chunk_q8bf_sse2 },
	{ "avx2", CKPT_CPU_AVX2_F16C, ckpt_update_chunk_avx2_f16c, ckpt_update_chunk_q8_avx2,
	  ckpt_update_chunk_q8bf_avx2 },
	{ "avx512", CKPT_CPU_AVX2_F16C | CKPT_CPU_AVX512, ckpt_update_chunk_avx512_f16c,
	  ckpt_update_chunk_q8_avx512, ckpt_update_chunk_q8bf_avx512 },
#elif defined(__aarch64__)
	{ "neon", 0, ckpt_update_chunk_neon, ckpt_update_chunk_q8_neon,
	  ckpt_update_chunk_q8bf_neon },
	{ "sve", CKPT_CPU_SVE, ckpt_update_chunk_sve, ckpt_update_chunk_q8_sve,
	  ckpt_update_chunk_q8bf_sve },
#else
#error "the update is built for x86-64 and aarch64 only"
#endif
};

const unsigned int ckpt_update_n_builds = ARRAY_SIZE(ckpt_update_builds);

const struct ckpt_update_build *ckpt_update_pick(u32 cpu)
{
	unsigned int i = ckpt_update_n_builds - 1;

	while (i && (ckpt_update_builds[i].needs & ~cpu))
		i--;
	return &ckpt_update_builds[i];
}
