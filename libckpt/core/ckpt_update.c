/* SPDX-License-Identifier: GPL-2.0 OR MIT */
/*
 * Userspace build of the fused update: the body lives in ckpt_update_impl.h,
 * compiled here several times for run-time dispatch and for tests. The kernel
 * module has its own wrapper files around the same header and does not use
 * this one.
 *
 * Must be compiled with -ffp-contract=off -fno-math-errno (libckpt/CMakeLists.txt):
 * x86-64-v4 and every aarch64 CPU have FMA, and contraction would change the
 * bits.
 */
#ifndef __KERNEL__

#if defined(__x86_64__)
#define CKPT_UPDATE_F16C	/* the F16C variants below */
#endif
#include "ckpt_update.h"
#include "ckpt_update_impl.h"
#include "ckpt_update_variants.h"

#define CKPT_UPDATE_ARGS                                                       \
	const struct ckpt_hparams *hp, u32 grad_scale, u32 dtype,              \
	const u16 *grad, u32 *p, u32 *m, u32 *v, u16 *plo, u64 n
#define CKPT_UPDATE_CALL hp, grad_scale, dtype, grad, p, m, v, plo, n

#define CKPT_Q8_ARGS                                                           \
	const struct ckpt_hparams *hp, u32 grad_scale, u32 dtype,              \
	const u16 *grad, u32 *p, const struct ckpt_q8_state *s, u32 *tmp,      \
	u16 *plo, u64 n
#define CKPT_Q8_CALL hp, grad_scale, dtype, grad, p, s, tmp, plo, n

#define CKPT_Q8BF_ARGS                                                         \
	const struct ckpt_hparams *hp, u32 grad_scale, const u16 *grad, u16 *p, \
	const struct ckpt_q8_state *s, u32 *tmp, u16 *plo, u64 n,              \
	const struct ckpt_sr *sr
#define CKPT_Q8BF_CALL hp, grad_scale, grad, p, s, tmp, plo, n, sr

#define CKPT_SCALAR __attribute__((optimize("no-tree-vectorize")))

/* ---- the scalar reference, every architecture ---- */

CKPT_SCALAR u32 ckpt_update_chunk_scalar(CKPT_UPDATE_ARGS)
{
	return ckpt_update_chunk_body(CKPT_UPDATE_CALL);
}

CKPT_SCALAR void ckpt_round_params_scalar(u32 dtype, const u32 *p, u16 *plo, u64 n)
{
	ckpt_round_params_body(dtype, p, plo, n);
}

CKPT_SCALAR u32 ckpt_update_chunk_q8_scalar(CKPT_Q8_ARGS)
{
	return ckpt_update_chunk_q8_body(CKPT_Q8_CALL);
}

CKPT_SCALAR u32 ckpt_update_chunk_q8bf_scalar(CKPT_Q8BF_ARGS)
{
	return ckpt_update_chunk_q8bf_body(CKPT_Q8BF_CALL);
}

CKPT_SCALAR u64 ckpt_grad_sumsq_scalar(u32 dtype, const u16 *grad, u64 n, u64 acc)
{
	return ckpt_grad_sumsq_body(dtype, grad, n, acc);
}

u64 ckpt_sum_f64(const u64 *v, u64 n)
{
	return ckpt_sum_f64_body(v, n);
}

/* integer only: the baseline build of every architecture */
void ckpt_sr_round(const struct ckpt_sr *sr, const u32 *x, u16 *out, u64 n)
{
	u64 i;

	for (i = 0; i < n; i++) {
		u32 r = ckpt_f32_to_bf16_sr(x[i], ckpt_sr_noise(sr->key, sr->first + (u32)i));

		if ((r & 0x7f80u) == 0x7f80u && (x[i] & 0x7f800000u) != 0x7f800000u)
			r = x[i] >> 16;		/* finite: never Inf */
		out[i] = (u16)r;
	}
}

#if defined(__x86_64__)

/*
 * x86-64: the update and the rounding dispatch to the baseline (SSE2) build
 * or to the AVX2 or x86-64-v4 (AVX-512) build with F16C conversions; the
 * array conversion is target_clones of the baseline, AVX2 and x86-64-v4
 * builds. The AVX2 and AVX-512 builds with the emulated conversions stay for
 * the tests and the benchmark.
 */
#if defined(__SANITIZE_THREAD__)
/*
 * Under ThreadSanitizer the clones' resolvers would run, instrumented, while
 * the program is relocated, before the TSan runtime is up (the static
 * library puts them in the executable): one build, the baseline.
 */
#define CKPT_CLONES
#else
#define CKPT_CLONES __attribute__((target_clones("default", "avx2", "arch=x86-64-v4")))
#endif

u32 ckpt_cpu_features(void)
{
	return (ckpt_cpu_has_f16c() ? CKPT_CPU_AVX2_F16C : 0) |
	       (ckpt_cpu_has_avx512() ? CKPT_CPU_AVX512 : 0);
}

/* The rounding: the F16C builds where the CPU has AVX2 (or AVX-512) and F16C. */

void ckpt_round_params(u32 dtype, const u32 *p, u16 *plo, u64 n)
{
	static ckpt_round_fn chosen;
	ckpt_round_fn f = __atomic_load_n(&chosen, __ATOMIC_RELAXED);

	if (!f) {
		f = ckpt_cpu_has_avx512() ? ckpt_round_params_avx512_f16c
		    : ckpt_cpu_has_f16c() ? ckpt_round_params_avx2_f16c
					  : ckpt_round_params_sse2;
		__atomic_store_n(&chosen, f, __ATOMIC_RELAXED);
	}
	f(dtype, p, plo, n);
}

CKPT_CLONES void ckpt_f16_to_f32_array(const u16 *h, u32 *f, u64 n)
{
	ckpt_f16_to_f32_array_body(h, f, n);
}

CKPT_CLONES void ckpt_q8_decode(const struct ckpt_q8_state *s, u32 *m, u32 *v, u64 n)
{
	ckpt_q8_decode_body(s, m, v, n);
}

CKPT_CLONES void ckpt_q8_encode(const struct ckpt_q8_state *s, const u32 *m, const u32 *v, u64 n)
{
	ckpt_q8_encode_body(s, m, v, n);
}

u32 ckpt_update_chunk_q8_sse2(CKPT_Q8_ARGS)
{
	return ckpt_update_chunk_q8_body(CKPT_Q8_CALL);
}

/* The gradients' sum of squares: the same bits in every clone (ckpt_update.h). */
CKPT_CLONES u64 ckpt_grad_sumsq(u32 dtype, const u16 *grad, u64 n, u64 acc)
{
	return ckpt_grad_sumsq_body(dtype, grad, n, acc);
}

u32 ckpt_update_chunk_q8bf_sse2(CKPT_Q8BF_ARGS)
{
	return ckpt_update_chunk_q8bf_body(CKPT_Q8BF_CALL);
}

__attribute__((target("avx2"))) u32 ckpt_update_chunk_q8bf_avx2(CKPT_Q8BF_ARGS)
{
	return ckpt_update_chunk_q8bf_body(CKPT_Q8BF_CALL);
}

__attribute__((target("arch=x86-64-v4"))) u32 ckpt_update_chunk_q8bf_avx512(CKPT_Q8BF_ARGS)
{
	return ckpt_update_chunk_q8bf_body(CKPT_Q8BF_CALL);
}

__attribute__((target("avx2"))) u32 ckpt_update_chunk_q8_avx2(CKPT_Q8_ARGS)
{
	return ckpt_update_chunk_q8_body(CKPT_Q8_CALL);
}

__attribute__((target("arch=x86-64-v4"))) u32 ckpt_update_chunk_q8_avx512(CKPT_Q8_ARGS)
{
	return ckpt_update_chunk_q8_body(CKPT_Q8_CALL);
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

/* the F16C conversions (ckpt_update_impl.h) in the AVX2 and AVX-512 builds */
__attribute__((target("avx2,f16c"))) u32 ckpt_update_chunk_avx2_f16c(CKPT_UPDATE_ARGS)
{
	return ckpt_update_chunk_f16c_body(CKPT_UPDATE_CALL);
}

__attribute__((target("arch=x86-64-v4"))) u32 ckpt_update_chunk_avx512_f16c(CKPT_UPDATE_ARGS)
{
	return ckpt_update_chunk_f16c_body(CKPT_UPDATE_CALL);
}

__attribute__((target("avx2,f16c")))
void ckpt_round_params_avx2_f16c(u32 dtype, const u32 *p, u16 *plo, u64 n)
{
	ckpt_round_params_f16c_body(dtype, p, plo, n);
}

__attribute__((target("arch=x86-64-v4")))
void ckpt_round_params_avx512_f16c(u32 dtype, const u32 *p, u16 *plo, u64 n)
{
	ckpt_round_params_f16c_body(dtype, p, plo, n);
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

int ckpt_cpu_has_f16c(void)
{
	__builtin_cpu_init();
	return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("f16c");
}

int ckpt_cpu_has_avx512(void)
{
	__builtin_cpu_init();
	return __builtin_cpu_supports("x86-64-v4");
}

unsigned int ckpt_update_variants(struct ckpt_update_variant *out)
{
	const struct ckpt_update_variant all[] = {
		{"scalar", ckpt_update_chunk_scalar, ckpt_round_params_scalar,
		 ckpt_update_chunk_q8_scalar, ckpt_update_chunk_q8bf_scalar, 1},
		{"sse2", ckpt_update_chunk_sse2, ckpt_round_params_sse2, ckpt_update_chunk_q8_sse2,
		 ckpt_update_chunk_q8bf_sse2, 1},
		{"avx2", ckpt_update_chunk_avx2, ckpt_round_params_avx2, ckpt_update_chunk_q8_avx2,
		 ckpt_update_chunk_q8bf_avx2, ckpt_cpu_has_avx2()},
		/* the Q8 updates have no F16C build: the fp16 conversions are per block there */
		{"avx2+f16c", ckpt_update_chunk_avx2_f16c, ckpt_round_params_avx2_f16c,
		 ckpt_update_chunk_q8_avx2, ckpt_update_chunk_q8bf_avx2, ckpt_cpu_has_f16c()},
		{"avx512", ckpt_update_chunk_avx512, ckpt_round_params_avx512,
		 ckpt_update_chunk_q8_avx512, ckpt_update_chunk_q8bf_avx512, ckpt_cpu_has_avx512()},
		{"avx512+f16c", ckpt_update_chunk_avx512_f16c, ckpt_round_params_avx512_f16c,
		 ckpt_update_chunk_q8_avx512, ckpt_update_chunk_q8bf_avx512, ckpt_cpu_has_avx512()},
		{"dispatched", ckpt_update_chunk, ckpt_round_params, ckpt_update_chunk_q8,
		 ckpt_update_chunk_q8bf, 1},
	};

	memcpy(out, all, sizeof(all));
	return ARRAY_SIZE(all);
}

#elif defined(__aarch64__)

#include <sys/auxv.h>

/*
 * aarch64: NEON (Advanced SIMD) is the baseline, so the default build is the
 * NEON one; SVE is a second build of the same body. GCC 12 has no
 * target_clones on aarch64: the update's entry points take the core's table
 * (below, as on x86), the rounding and the fp16 array conversion an ifunc
 * (what target_clones generates on x86) that picks SVE when the kernel
 * reports HWCAP_SVE.
 */
#define CKPT_SVE __attribute__((target("+sve")))

/* The gradients' sum of squares: NEON, the baseline (ckpt_update.h). */
u64 ckpt_grad_sumsq(u32 dtype, const u16 *grad, u64 n, u64 acc)
{
	return ckpt_grad_sumsq_body(dtype, grad, n, acc);
}

u32 ckpt_update_chunk_neon(CKPT_UPDATE_ARGS)
{
	return ckpt_update_chunk_body(CKPT_UPDATE_CALL);
}

CKPT_SVE u32 ckpt_update_chunk_sve(CKPT_UPDATE_ARGS)
{
	return ckpt_update_chunk_body(CKPT_UPDATE_CALL);
}

void ckpt_round_params_neon(u32 dtype, const u32 *p, u16 *plo, u64 n)
{
	ckpt_round_params_body(dtype, p, plo, n);
}

CKPT_SVE void ckpt_round_params_sve(u32 dtype, const u32 *p, u16 *plo, u64 n)
{
	ckpt_round_params_body(dtype, p, plo, n);
}

static void ckpt_f16_to_f32_array_neon(const u16 *h, u32 *f, u64 n)
{
	ckpt_f16_to_f32_array_body(h, f, n);
}

CKPT_SVE static void ckpt_f16_to_f32_array_sve(const u16 *h, u32 *f, u64 n)
{
	ckpt_f16_to_f32_array_body(h, f, n);
}

u32 ckpt_update_chunk_q8_neon(CKPT_Q8_ARGS)
{
	return ckpt_update_chunk_q8_body(CKPT_Q8_CALL);
}

CKPT_SVE u32 ckpt_update_chunk_q8_sve(CKPT_Q8_ARGS)
{
	return ckpt_update_chunk_q8_body(CKPT_Q8_CALL);
}

u32 ckpt_update_chunk_q8bf_neon(CKPT_Q8BF_ARGS)
{
	return ckpt_update_chunk_q8bf_body(CKPT_Q8BF_CALL);
}

CKPT_SVE u32 ckpt_update_chunk_q8bf_sve(CKPT_Q8BF_ARGS)
{
	return ckpt_update_chunk_q8bf_body(CKPT_Q8BF_CALL);
}

/* decode and encode run once per export or load: the baseline build */
void ckpt_q8_decode(const struct ckpt_q8_state *s, u32 *m, u32 *v, u64 n)
{
	ckpt_q8_decode_body(s, m, v, n);
}

void ckpt_q8_encode(const struct ckpt_q8_state *s, const u32 *m, const u32 *v, u64 n)
{
	ckpt_q8_encode_body(s, m, v, n);
}

/* glibc passes AT_HWCAP to an aarch64 ifunc resolver: no getauxval needed yet */
#define CKPT_PICK(hwcap, name) (((hwcap) & HWCAP_SVE) ? name##_sve : name##_neon)

static ckpt_round_fn ckpt_round_params_resolve(unsigned long hwcap)
{
	return CKPT_PICK(hwcap, ckpt_round_params);
}

typedef void (*ckpt_f16_array_fn)(const u16 *h, u32 *f, u64 n);
static ckpt_f16_array_fn ckpt_f16_to_f32_array_resolve(unsigned long hwcap)
{
	return CKPT_PICK(hwcap, ckpt_f16_to_f32_array);
}

void ckpt_round_params(u32 dtype, const u32 *p, u16 *plo, u64 n)
	__attribute__((ifunc("ckpt_round_params_resolve")));
void ckpt_f16_to_f32_array(const u16 *h, u32 *f, u64 n)
	__attribute__((ifunc("ckpt_f16_to_f32_array_resolve")));

int ckpt_cpu_has_sve(void)
{
	return (getauxval(AT_HWCAP) & HWCAP_SVE) != 0;
}

u32 ckpt_cpu_features(void)
{
	return ckpt_cpu_has_sve() ? CKPT_CPU_SVE : 0;
}

unsigned int ckpt_update_variants(struct ckpt_update_variant *out)
{
	const struct ckpt_update_variant all[] = {
		{"scalar", ckpt_update_chunk_scalar, ckpt_round_params_scalar,
		 ckpt_update_chunk_q8_scalar, ckpt_update_chunk_q8bf_scalar, 1},
		{"neon", ckpt_update_chunk_neon, ckpt_round_params_neon, ckpt_update_chunk_q8_neon,
		 ckpt_update_chunk_q8bf_neon, 1},
		{"sve", ckpt_update_chunk_sve, ckpt_round_params_sve, ckpt_update_chunk_q8_sve,
		 ckpt_update_chunk_q8bf_sve, ckpt_cpu_has_sve()},
		{"dispatched", ckpt_update_chunk, ckpt_round_params, ckpt_update_chunk_q8,
		 ckpt_update_chunk_q8bf, 1},
	};

	memcpy(out, all, sizeof(all));
	return ARRAY_SIZE(all);
}

#else
#error "ckpt_update.c: the update loop is built for x86-64 and aarch64 only"
#endif

/*
 * The update: this CPU's build in the core's table (ckpt_update_pick, the
 * kernel's rule too), chosen at the first call (a data race on a pointer
 * every thread computes the same, made atomic for TSan).
 */
static const struct ckpt_update_build *ckpt_update_build_here(void)
{
	static const struct ckpt_update_build *chosen;
	const struct ckpt_update_build *b = __atomic_load_n(&chosen, __ATOMIC_RELAXED);

	if (!b) {
		b = ckpt_update_pick(ckpt_cpu_features());
		__atomic_store_n(&chosen, b, __ATOMIC_RELAXED);
	}
	return b;
}

u32 ckpt_update_chunk(CKPT_UPDATE_ARGS)
{
	return ckpt_update_build_here()->update(CKPT_UPDATE_CALL);
}

u32 ckpt_update_chunk_q8(CKPT_Q8_ARGS)
{
	return ckpt_update_build_here()->update_q8(CKPT_Q8_CALL);
}

u32 ckpt_update_chunk_q8bf(CKPT_Q8BF_ARGS)
{
	return ckpt_update_build_here()->update_q8bf(CKPT_Q8BF_CALL);
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
