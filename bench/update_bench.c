/* SPDX-License-Identifier: GPL-2.0 OR MIT */
/*
 * ckpt_bench_update: the fused AdamW update against the memory ceiling, one
 * thread, in one run.
 *
 *   ceiling: a loop moving the same 28 B/param as the update (fp16 grad in,
 *            fp32 p/m/v in and out, fp16 copy out) with no math, built for
 *            SSE2, AVX2 and AVX-512 (aarch64: NEON and SVE); the best of them
 *            is the ceiling.
 *   update:  ckpt_update_chunk (each variant and the dispatched one) over the
 *            same arrays, in chunks of 65536 params.
 *   q8:      ckpt_update_chunk_q8 (each variant), the same step on 8-bit
 *            moments (feature Q8): its speed against the fp32 update's.
 *
 * 64 Mi params, buffers allocated once with MADV_HUGEPAGE and touched before
 * timing; every measurement repeated several times, interleaved (A B C A B C
 * ...), each reported as its median with min and max. The fraction of the
 * ceiling is of medians. The last line is JSON: loop_fraction_of_bound (the
 * dispatched fp16 update) and each variant's.
 *
 * usage: ckpt_bench_update [n_params_log2 (26)] [repeats (7)]
 */
#define _GNU_SOURCE
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

#include "ckpt_update.h"
#include "ckpt_update_variants.h"

#ifdef CKPT_BENCH_KMOD_FPU
/* the kernel module's float units, built with its float flags (bench/CMakeLists.txt) */
#include "dm-ckpt-fpu.h"
#endif

#define CHUNK 65536u

static double now(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static void *big_alloc(size_t bytes)
{
	size_t sz = (bytes + (2u << 20) - 1) & ~(size_t)((2u << 20) - 1);
	void *p = aligned_alloc(2u << 20, sz);

	if (!p) {
		perror("aligned_alloc");
		exit(1);
	}
	madvise(p, sz, MADV_HUGEPAGE);
	return p;
}

static u32 fbits(float f)
{
	u32 u;

	memcpy(&u, &f, 4);
	return u;
}

/* A runtime zero the compiler cannot see through: the ceiling loops cannot be elided. */
static volatile u32 g_zero;

/*
 * The ceiling: same bytes, no math. XOR with a runtime zero keeps every load
 * and store (stores of a just-loaded value could be removed) and vectorizes.
 */
#define CEILING_BODY                                                           \
	{                                                                      \
		for (u64 i = 0; i < n; i++) {                                  \
			p[i] ^= k;                                             \
			m[i] ^= k;                                             \
			v[i] ^= k;                                             \
			plo[i] = (u16)(g[i] ^ k);                              \
		}                                                              \
	}
#define CEILING_ARGS const u16 *__restrict g, u32 *__restrict p, u32 *__restrict m, \
		u32 *__restrict v, u16 *__restrict plo, u64 n, u32 k

#if defined(__x86_64__)
__attribute__((noinline, optimize("O3"))) static void ceiling_sse2(CEILING_ARGS)
CEILING_BODY
__attribute__((noinline, optimize("O3"), target("avx2"))) static void ceiling_avx2(CEILING_ARGS)
CEILING_BODY
__attribute__((noinline, optimize("O3"), target("arch=x86-64-v4"))) static void
ceiling_avx512(CEILING_ARGS)
CEILING_BODY
#elif defined(__aarch64__)
__attribute__((noinline, optimize("O3"))) static void ceiling_neon(CEILING_ARGS)
CEILING_BODY
__attribute__((noinline, optimize("O3"), target("+sve"))) static void ceiling_sve(CEILING_ARGS)
CEILING_BODY
#endif

typedef void (*ceiling_fn)(CEILING_ARGS);

struct meas {
	const char *name;
	int kind;		/* 0 ceiling, 1 update, 2 q8 update */
	ceiling_fn cfn;
	ckpt_update_fn ufn;
	ckpt_update_q8_fn qfn;
	u32 dtype;
	int ok;
	double t[64];	/* each repeat's time */
	double med, min, max;
};

static struct meas meas_of(const char *name, int kind, ceiling_fn cfn, ckpt_update_fn ufn,
			   u32 dtype, int ok)
{
	return (struct meas){.name = name, .kind = kind, .cfn = cfn, .ufn = ufn, .dtype = dtype,
			     .ok = ok};
}

static int cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;

	return (x > y) - (x < y);
}

/* median, min and max of x->t[0..n) */
static void summarize(struct meas *x, int n)
{
	double s[64];

	memcpy(s, x->t, n * sizeof(s[0]));
	qsort(s, n, sizeof(s[0]), cmp_double);
	x->min = s[0];
	x->max = s[n - 1];
	x->med = n % 2 ? s[n / 2] : (s[n / 2 - 1] + s[n / 2]) / 2;
}

int main(int argc, char **argv)
{
	unsigned lg = argc > 1 ? (unsigned)atoi(argv[1]) : 26;
	int reps = argc > 2 ? atoi(argv[2]) : 7;
	u64 n = 1ull << lg;
	u16 *g, *gb, *plo;
	u32 *p, *m, *v, *qscale;
	u32 qtmp[CKPT_Q8_TMP_WORDS];
	struct ckpt_q8_state q8;
	struct ckpt_hparams hp;
	u32 scale = fbits(1.0f);
	u32 seed = 12345;

	if (lg < 16 || lg > 32 || reps < 1 || reps > 64) {
		fprintf(stderr, "usage: ckpt_bench_update [n_params_log2 16..32 (26)] [repeats 1..64 (7)]\n");
		return 64;
	}
	g = big_alloc(n * 2);
	gb = big_alloc(n * 2);
	plo = big_alloc(n * 2);
	p = big_alloc(n * 4);
	m = big_alloc(n * 4);
	v = big_alloc(n * 4);

	/* touch everything; realistic magnitudes (no denormals in the math) */
	for (u64 i = 0; i < n; i++) {
		float r;

		seed = seed * 1664525u + 1013904223u;
		r = (float)((int)(seed >> 8) - (1 << 23)) / (float)(1 << 23); /* [-1, 1) */
		g[i] = ckpt_f32_to_f16(fbits(r * 1e-2f));
		gb[i] = ckpt_f32_to_bf16(fbits(r * 1e-2f));
		p[i] = fbits(r * 0.05f);
		m[i] = fbits(r * 1e-3f);
		v[i] = fbits(r * r * 1e-5f + 1e-9f);
		plo[i] = 0;
	}
	q8.m = big_alloc(n);
	q8.v = big_alloc(n);
	qscale = big_alloc(n / CKPT_Q8_BLOCK * 8);
	q8.m_scale = qscale;
	q8.v_scale = qscale + n / CKPT_Q8_BLOCK;
	ckpt_q8_encode(&q8, m, v, n);
	memset(&hp, 0, sizeof(hp));
	hp.lr = fbits(1e-3f);
	hp.beta1 = fbits(0.9f);
	hp.beta2 = fbits(0.999f);
	hp.eps = fbits(1e-8f);
	hp.weight_decay = fbits(0.01f);
	hp.one_minus_beta1 = fbits(0.1f);
	hp.one_minus_beta2 = fbits(0.001f);
	hp.step_size = fbits(1e-3f / 0.1f);
	hp.bc2_sqrt = fbits(0.0316069f);
	hp.decay = fbits(1.0f - 1e-5f);

	struct meas ms[32];
	int nm = 0;
	struct ckpt_update_variant var[CKPT_UPDATE_VARIANTS_MAX];
	unsigned int nv = ckpt_update_variants(var);
	u32 flags = 0;
	double ceiling = 1e30, dispatched_med = 0, q8_med = 0;

#if defined(__x86_64__)
	ms[nm++] = meas_of("ceiling[sse2]", 0, ceiling_sse2, NULL, 0, 1);
	ms[nm++] = meas_of("ceiling[avx2]", 0, ceiling_avx2, NULL, 0, ckpt_cpu_has_avx2());
	ms[nm++] = meas_of("ceiling[avx512]", 0, ceiling_avx512, NULL, 0, ckpt_cpu_has_avx512());
#elif defined(__aarch64__)
	ms[nm++] = meas_of("ceiling[neon]", 0, ceiling_neon, NULL, 0, 1);
	ms[nm++] = meas_of("ceiling[sve]", 0, ceiling_sve, NULL, 0, ckpt_cpu_has_sve());
#endif
	for (unsigned int i = 0; i < nv; i++) {
		static char names[CKPT_UPDATE_VARIANTS_MAX][40];

		snprintf(names[i], sizeof(names[i]), "update[%s]", var[i].name);
		ms[nm++] = meas_of(names[i], 1, NULL, var[i].update, CKPT_DTYPE_FP16,
					 var[i].available);
	}
	ms[nm++] = meas_of("update[dispatched,bf16]", 1, NULL, ckpt_update_chunk,
				 CKPT_DTYPE_BF16, 1);
	for (unsigned int i = 0; i < nv; i++) {
		static char names[CKPT_UPDATE_VARIANTS_MAX][40];

		if (!strcmp(var[i].name, "avx2+f16c") || !strcmp(var[i].name, "avx512+f16c"))
			continue;	/* the same Q8 builds as avx2 and avx512 */
		snprintf(names[i], sizeof(names[i]), "q8[%s]", var[i].name);
		ms[nm] = meas_of(names[i], 2, NULL, NULL, CKPT_DTYPE_FP16, var[i].available);
		ms[nm++].qfn = var[i].update_q8;
	}
#ifdef CKPT_BENCH_KMOD_FPU
	ms[nm++] = meas_of("update[kmod sse2]", 1, NULL, dm_ckpt_update_sse2, CKPT_DTYPE_FP16,
				 1);
	ms[nm++] = meas_of("update[kmod avx2+f16c]", 1, NULL, dm_ckpt_update_avx2,
				 CKPT_DTYPE_FP16, ckpt_cpu_has_f16c());
	ms[nm++] = meas_of("update[kmod avx512+f16c]", 1, NULL, dm_ckpt_update_avx512,
				 CKPT_DTYPE_FP16, ckpt_cpu_has_avx512());
#endif

	printf("ckpt_bench_update: %llu params (%.0f MiB touched per pass, 28 B/param), "
	       "chunks of %u, median (min..max) of %d interleaved runs, 1 thread\n",
	       (unsigned long long)n, n * 28.0 / (1 << 20), CHUNK, reps);
	for (int r = 0; r < reps; r++) {
		for (int j = 0; j < nm; j++) {
			struct meas *x = &ms[j];
			double t0, t;

			if (!x->ok)
				continue;
			t0 = now();
			if (x->kind == 0) {
				x->cfn(g, p, m, v, plo, n, g_zero);
			} else if (x->kind == 2) {
				for (u64 off = 0; off < n; off += CHUNK) {
					u64 len = n - off < CHUNK ? n - off : CHUNK;
					struct ckpt_q8_state at = {
						q8.m + off, q8.v + off,
						q8.m_scale + off / CKPT_Q8_BLOCK,
						q8.v_scale + off / CKPT_Q8_BLOCK,
					};

					flags |= x->qfn(&hp, scale, x->dtype, g + off, p + off, &at,
							qtmp, plo + off, len);
				}
			} else {
				for (u64 off = 0; off < n; off += CHUNK) {
					u64 len = n - off < CHUNK ? n - off : CHUNK;

					const u16 *gs = x->dtype == CKPT_DTYPE_BF16 ? gb : g;

					flags |= x->ufn(&hp, scale, x->dtype, gs + off, p + off,
							m + off, v + off, plo + off, len);
				}
			}
			t = now() - t0;
			x->t[r] = t;
		}
	}
	for (int j = 0; j < nm; j++) {
		if (!ms[j].ok)
			continue;
		summarize(&ms[j], reps);
		if (ms[j].kind == 0 && ms[j].med < ceiling)
			ceiling = ms[j].med;
		if (!strcmp(ms[j].name, "update[dispatched]"))
			dispatched_med = ms[j].med;
		if (!strcmp(ms[j].name, "q8[dispatched]"))
			q8_med = ms[j].med;
	}
	for (int j = 0; j < nm; j++) {
		struct meas *x = &ms[j];

		if (!x->ok) {
			printf("%-34s (not supported by this CPU)\n", x->name);
			continue;
		}
		if (x->kind == 2) {
			printf("%-34s %6.3f Gparams/s (%.3f..%.3f)  %.2f of the fp32 update's speed\n",
			       x->name, n / x->med * 1e-9, n / x->max * 1e-9, n / x->min * 1e-9,
			       dispatched_med / x->med);
			continue;
		}
		printf("%-34s %6.3f Gparams/s (%.3f..%.3f)  %5.1f GB/s  %.2f of ceiling\n", x->name,
		       n / x->med * 1e-9, n / x->max * 1e-9, n / x->min * 1e-9, n * 28.0 / x->med * 1e-9,
		       ceiling / x->med);
	}
	if (flags)
		printf("(note: a non-finite gradient was flagged)\n");
	/* the JSON line: the dispatched fp16 update, then every variant */
	printf("{\"loop_fraction_of_bound\": %.4f, \"loop_bound_gparams_s\": %.4f, "
	       "\"q8_gparams_s\": %.4f, \"q8_vs_fp32_update\": %.4f",
	       ceiling / dispatched_med, n / ceiling * 1e-9, n / q8_med * 1e-9, dispatched_med / q8_med);
	for (int j = 0; j < nm; j++) {
		char key[64];
		const char *c = ms[j].name + strlen("update[");
		size_t k = 0;

		if (!ms[j].ok || ms[j].kind != 1)
			continue;
		/* update[avx2+f16c] -> loop_fraction_of_bound_avx2_f16c */
		for (; *c && *c != ']' && k < sizeof(key) - 1; c++)
			key[k++] = (*c >= 'a' && *c <= 'z') || (*c >= '0' && *c <= '9') ? *c : '_';
		key[k] = '\0';
		printf(", \"loop_fraction_of_bound_%s\": %.4f", key, ceiling / ms[j].med);
	}
	printf("}\n");
	return 0;
}
