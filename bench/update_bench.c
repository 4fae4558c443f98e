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
 *   record:  a step of fp32 records (p, m, v of a chunk after one another),
 *            each chunk checked (crc32c of the committed record) and sealed
 *            (crc32c of the new record and of its bf16 params): in place
 *            (no second slot: what the checksums alone cost), and from one
 *            slot into the other three ways: the engine's sequence on a
 *            mapped image (copy in, check, update in place, seal, copy out
 *            with streaming stores); one pass from the committed record into
 *            a buffer, then streamed out; one pass from the committed record
 *            straight into the other slot. Each against the in-place update
 *            with no slots and no checksums (what an optimizer in RAM does).
 *            The one-pass loops are this bench's (the core's per-param step,
 *            ckpt_adam_one, with a source and a destination); the three
 *            slot-to-slot ways' bytes are compared before timing.
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
#include "ckpt_update_impl.h"
#include "ckpt_update_variants.h"

#if defined(__x86_64__)
#include <emmintrin.h>
#define CLONES __attribute__((target_clones("arch=x86-64-v4", "avx2", "default")))
#else
#define CLONES
#endif

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

/* ---- record pipelines: chunks of CHUNK params, p, m, v after one another ---- */

#define REC_BYTES ((size_t)12 * CHUNK)

/* The bf16 AdamW step of n params read from sp, sm, sv and written to p, m, v. */
CLONES __attribute__((noinline)) static u32
step_from(const struct ckpt_upd_k *k, const u16 *__restrict grad, const u32 *__restrict sp,
	  const u32 *__restrict sm, const u32 *__restrict sv, u32 *__restrict p,
	  u32 *__restrict m, u32 *__restrict v, u16 *__restrict plo, u64 n)
{
	u32 nf = 0;

	for (u64 i = 0; i < n; i++) {
		float pp = ckpt_as_f(sp[i]), mm = ckpt_as_f(sm[i]), vv = ckpt_as_f(sv[i]);

		nf |= ckpt_adam_one(k, 0, ckpt_grad_f32(k, 1, grad[i]), &pp, &mm, &vv);
		p[i] = ckpt_as_u(pp);
		m[i] = ckpt_as_u(mm);
		v[i] = ckpt_as_u(vv);
		plo[i] = ckpt_plo_of(1, pp);
	}
	return nf >> 31;
}

/* Copy len bytes (a multiple of 64, both 16-aligned) past the cache, as the engine writes a mapped slot. */
static void stream_out(void *dst, const void *src, size_t len)
{
#if defined(__x86_64__)
	for (size_t i = 0; i < len; i += 16)
		_mm_stream_si128((__m128i *)((u8 *)dst + i), _mm_load_si128((const __m128i *)((const u8 *)src + i)));
	_mm_sfence();
#else
	memcpy(dst, src, len);
#endif
}

enum pipeline { ENGINE_COPIES, ONE_PASS_BUFFER, ONE_PASS_SLOT, IN_PLACE_CHECKED };

/*
 * One step of n params (whole chunks) from slot a into slot b, plo the new
 * bf16 params; buf and bplo a worker's chunk buffers. Returns the checksums
 * folded together (each pipeline gives the same) or ~0 if a record's check
 * failed or the step was not finite. IN_PLACE_CHECKED updates slot a's
 * records where they are (no second slot), checked and sealed: what the
 * checksums alone cost; want follows.
 */
static u32 record_step(enum pipeline how, const struct ckpt_hparams *hp, u32 scale, const u16 *g,
		       u8 *a, u8 *b, u16 *plo, u8 *buf, u16 *bplo, u32 *want, u64 n)
{
	struct ckpt_upd_k k;
	u32 sum = 0;

	ckpt_upd_k_init(&k, hp, scale);
	for (u64 c = 0; c < n / CHUNK; c++) {
		u8 *src = a + c * REC_BYTES;
		u8 *dst = b + c * REC_BYTES;
		u8 *out = how == ONE_PASS_SLOT ? dst : how == IN_PLACE_CHECKED ? src : buf;
		u16 *po = how == ONE_PASS_SLOT || how == IN_PLACE_CHECKED ? plo + c * CHUNK : bplo;
		const u32 *s;
		u32 *o = (u32 *)out, nf, sealed;

		if (how == ENGINE_COPIES) {
			memcpy(buf, src, REC_BYTES);
			s = (const u32 *)buf;
		} else {
			s = (const u32 *)src;
		}
		if (ckpt_crc32c(s, REC_BYTES) != want[c])
			return ~0u;
		if (how == ENGINE_COPIES || how == IN_PLACE_CHECKED)
			nf = ckpt_update_chunk(hp, scale, CKPT_DTYPE_BF16, g + c * CHUNK, o, o + CHUNK,
					       o + 2 * CHUNK, po, CHUNK);
		else
			nf = step_from(&k, g + c * CHUNK, s, s + CHUNK, s + 2 * CHUNK, o, o + CHUNK,
				       o + 2 * CHUNK, po, CHUNK);
		if (nf)
			return ~0u;
		sealed = ckpt_crc32c(out, REC_BYTES);
		sum ^= sealed ^ ckpt_crc32c(po, CHUNK * 2);
		if (how == IN_PLACE_CHECKED)
			want[c] = sealed;
		else if (how != ONE_PASS_SLOT) {
			stream_out(dst, buf, REC_BYTES);
			stream_out(plo + c * CHUNK, bplo, CHUNK * 2);
		}
	}
	return sum;
}

struct meas {
	const char *name;
	int kind;		/* 0 ceiling, 1 update, 2 q8 update, 3 record pipeline */
	ceiling_fn cfn;
	ckpt_update_fn ufn;
	ckpt_update_q8_fn qfn;
	enum pipeline how;
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
	u32 *p, *m, *v, *qscale, *want;
	u8 *slot_a, *slot_b, *rbuf;
	u16 *rplo, *rbplo;
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
	/* slot a: the committed records of the same state, and their checksums */
	slot_a = big_alloc(n * 12);
	slot_b = big_alloc(n * 12);
	rplo = big_alloc(n * 2);
	rbuf = big_alloc(REC_BYTES);
	rbplo = big_alloc(CHUNK * 2);
	want = big_alloc(n / CHUNK * 4);
	for (u64 c = 0; c < n / CHUNK; c++) {
		u8 *r = slot_a + c * REC_BYTES;

		memcpy(r, p + c * CHUNK, CHUNK * 4);
		memcpy(r + CHUNK * 4, m + c * CHUNK, CHUNK * 4);
		memcpy(r + CHUNK * 8, v + c * CHUNK, CHUNK * 4);
		want[c] = ckpt_crc32c(r, REC_BYTES);
	}
	memset(slot_b, 0, n * 12);
	memset(rplo, 0, n * 2);
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
	double ceiling = 1e30, dispatched_med = 0, q8_med = 0, in_place_med = 0;
	double rec_med[4] = {0};

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
	ms[nm] = meas_of("record[in place, checked, sealed]", 3, NULL, NULL, CKPT_DTYPE_BF16, 1);
	ms[nm++].how = IN_PLACE_CHECKED;
	ms[nm] = meas_of("record[engine: copy in, out]", 3, NULL, NULL, CKPT_DTYPE_BF16, 1);
	ms[nm++].how = ENGINE_COPIES;
	ms[nm] = meas_of("record[one pass to a buffer]", 3, NULL, NULL, CKPT_DTYPE_BF16, 1);
	ms[nm++].how = ONE_PASS_BUFFER;
	ms[nm] = meas_of("record[one pass into the slot]", 3, NULL, NULL, CKPT_DTYPE_BF16, 1);
	ms[nm++].how = ONE_PASS_SLOT;
#ifdef CKPT_BENCH_KMOD_FPU
	ms[nm++] = meas_of("update[kmod sse2]", 1, NULL, dm_ckpt_update_sse2, CKPT_DTYPE_FP16,
				 1);
	ms[nm++] = meas_of("update[kmod avx2+f16c]", 1, NULL, dm_ckpt_update_avx2,
				 CKPT_DTYPE_FP16, ckpt_cpu_has_f16c());
	ms[nm++] = meas_of("update[kmod avx512+f16c]", 1, NULL, dm_ckpt_update_avx512,
				 CKPT_DTYPE_FP16, ckpt_cpu_has_avx512());
#endif

	/* the record pipelines give the same bytes: each run once, slot b compared */
	u32 first_b = 0, first_plo = 0;

	for (int j = 0; j < nm; j++) {
		u32 cb, cplo;

		if (ms[j].kind != 3 || ms[j].how == IN_PLACE_CHECKED)
			continue;
		memset(slot_b, 0, n * 12);
		if (record_step(ms[j].how, &hp, scale, gb, slot_a, slot_b, rplo, rbuf, rbplo, want,
				n) == ~0u) {
			fprintf(stderr, "%s: a record failed its check or the step was not finite\n",
				ms[j].name);
			return 1;
		}
		cb = ckpt_crc32c(slot_b, n * 12);
		cplo = ckpt_crc32c(rplo, n * 2);
		if (!first_b) {
			first_b = cb;
			first_plo = cplo;
		} else if (cb != first_b || cplo != first_plo) {
			fprintf(stderr, "%s: other bytes than the engine's sequence\n", ms[j].name);
			return 1;
		}
	}

	printf("ckpt_bench_update: %llu params (%.0f MiB touched per pass, 28 B/param; records 26), "
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
			} else if (x->kind == 3) {
				flags |= record_step(x->how, &hp, scale, gb, slot_a, slot_b, rplo, rbuf,
						     rbplo, want, n) == ~0u;
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
		if (!strcmp(ms[j].name, "update[dispatched,bf16]"))
			in_place_med = ms[j].med;
		if (ms[j].kind == 3)
			rec_med[ms[j].how] = ms[j].med;
	}
	for (int j = 0; j < nm; j++) {
		struct meas *x = &ms[j];

		if (!x->ok) {
			printf("%-34s (not supported by this CPU)\n", x->name);
			continue;
		}
		if (x->kind == 3) {
			printf("%-34s %6.3f Gparams/s (%.3f..%.3f)  %.2fx the in-place update's time, "
			       "%.2fx as fast as the engine's\n",
			       x->name, n / x->med * 1e-9, n / x->max * 1e-9, n / x->min * 1e-9,
			       x->med / in_place_med, rec_med[ENGINE_COPIES] / x->med);
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
	printf(", \"record_engine_vs_in_place\": %.4f, \"record_one_pass_buffer_vs_in_place\": %.4f, "
	       "\"record_one_pass_slot_vs_in_place\": %.4f, \"record_in_place_checked_vs_in_place\": %.4f",
	       rec_med[ENGINE_COPIES] / in_place_med, rec_med[ONE_PASS_BUFFER] / in_place_med,
	       rec_med[ONE_PASS_SLOT] / in_place_med, rec_med[IN_PLACE_CHECKED] / in_place_med);
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
