/* SPDX-License-Identifier: GPL-2.0 OR MIT */
/*
 * The ONE source of the fused AdamW loop and of the fp16/bf16 conversions.
 *
 * Included by the userspace build (ckpt_update.c: scalar, SSE2, AVX2, AVX-512
 * variants of the same body on x86-64, NEON and SVE on aarch64) and by the
 * kernel module's FPU translation unit.
 * Every variant must produce the same bits, so:
 *
 *  - plain C, no intrinsics, no libm: sqrt is __builtin_sqrtf, which is the
 *    sqrtss/sqrtps instruction under -fno-math-errno (enforced below); the
 *    one exception, opt-in (CKPT_UPDATE_F16C, x86-64), converts fp16 with
 *    the F16C instructions the integer conversions are exact to;
 *  - no FMA contraction: the including TU must be compiled with
 *    -ffp-contract=off (the kernel and libckpt CMake do; the unit tests compare
 *    every variant, including x86-64-v4 which has FMA, to the scalar one);
 *  - conversions are integer bit operations with round to nearest even, and
 *    selects are mask arithmetic (m = 0u - cond; r = (m & a) | (~m & b)) so
 *    that gcc 12 vectorizes the loop for SSE2 and AVX2 as well as AVX-512
 *    ("control flow in loop" otherwise);
 *  - the non-finite check is an OR-reduction over the exponent bits of the
 *    scaled gradient and of the new p, m and v, no branch: a result that is
 *    not finite (eps = 0 with a zero gradient gives 0/0; m or v overflowing)
 *    skips the step like an overflowed gradient, instead of committing it.
 *
 * Two float operations appear inside the vector conversions, both exact or
 * rounding-mode-only dependent (MXCSR or FPCR default, RNE, which
 * kernel_fpu_begin() loads and userspace has by default): the fp16
 * subnormal -> fp32 magic subtraction (exact) and the fp32 -> fp16 subnormal
 * magic addition (it IS the round to nearest even). Neither is affected by FTZ/DAZ. The scalar
 * conversions (ckpt_*_int) are integer-only and may be used outside
 * kernel_fpu_begin/end; define CKPT_UPDATE_INT_ONLY before including this
 * header in a TU compiled without SSE to get only those.
 */
#ifndef CKPT_UPDATE_IMPL_H
#define CKPT_UPDATE_IMPL_H

#include "ckpt_update.h"


/* ------------------------------------------------------------------------ */
/* Integer-only scalar conversions (no FPU, usable anywhere).                */
/* ------------------------------------------------------------------------ */

static __always_inline u32 ckpt_f16_to_f32_int(u16 h)
{
	u32 sign = (u32)(h & 0x8000u) << 16;
	u32 e = (h >> 10) & 0x1fu;
	u32 mant = h & 0x3ffu;

	if (e == 0x1f) {
		/* Inf, or NaN: keep payload, set the quiet bit (as vcvtph2ps) */
		return sign | 0x7f800000u | (mant << 13) |
		       (mant ? 0x00400000u : 0u);
	}
	if (e == 0) {
		u32 sh;

		if (mant == 0)
			return sign;
		/* subnormal: normalize; value = mant * 2^-24 */
		sh = (u32)__builtin_clz(mant) - 21u;	/* leading zeros within 11 bits */
		mant <<= sh;				/* hidden bit now at bit 10 */
		return sign | ((113u - sh) << 23) | ((mant & 0x3ffu) << 13);
	}
	return sign | ((e + 112u) << 23) | (mant << 13);
}

static __always_inline u16 ckpt_f32_to_f16_int(u32 f)
{
	u32 sign = (f >> 16) & 0x8000u;
	u32 a = f & 0x7fffffffu;
	u32 e = a >> 23;

	if (a > 0x7f800000u)	/* NaN: quiet, keep sign and top payload bits */
		return (u16)(sign | 0x7e00u | ((a >> 13) & 0x3ffu));
	if (a >= 0x47800000u)	/* >= 2^16 (or Inf): Inf */
		return (u16)(sign | 0x7c00u);
	if (e < 113u) {
		/* fp16 subnormal or zero: value / 2^-24, rounded to nearest even */
		u32 m, sh, r, rem, half;

		if (e < 102u)	/* < 2^-25: rounds to zero (2^-25 is a tie to 0) */
			return (u16)sign;
		m = (a & 0x7fffffu) | 0x800000u;
		sh = 126u - e;			/* 14..24 */
		r = m >> sh;
		rem = m & ((1u << sh) - 1u);
		half = 1u << (sh - 1u);
		if (rem > half || (rem == half && (r & 1u)))
			r++;			/* may carry into the smallest normal: right */
		return (u16)(sign | r);
	}
	/* normal: rebias, round on the 13 dropped bits; carries may reach Inf */
	a += 0xc8000fffu + ((a >> 13) & 1u);	/* (15 - 127) << 23, + half - 1 + odd */
	return (u16)(sign | (a >> 13));
}

static __always_inline u32 ckpt_bf16_to_f32_int(u16 h)
{
	return (u32)h << 16;
}

static __always_inline u16 ckpt_f32_to_bf16_int(u32 f)
{
	if ((f & 0x7fffffffu) > 0x7f800000u)	/* NaN: quiet, keep sign */
		return (u16)((f >> 16) | 0x0040u);
	return (u16)((f + 0x7fffu + ((f >> 16) & 1u)) >> 16);
}

/*
 * BF16M: the 16-bit noise of param index first + i (ckpt_sr_at): Chris
 * Wellons' lowbias32 integer hash of key ^ index, its high half. 32-bit
 * multiplies, shifts and xors only, so the vectorized builds give the bits
 * of the scalar one.
 */
static __always_inline u32 ckpt_sr_noise(u32 key, u32 index)
{
	u32 x = key ^ index;

	x ^= x >> 16;
	x *= 0x7feb352du;
	x ^= x >> 15;
	x *= 0x846ca68bu;
	x ^= x >> 16;
	return x >> 16;
}

/*
 * Stochastic rounding of fp32 bits f to bf16: add the 16-bit noise to the
 * bits and truncate. The bf16 above |f| is taken with probability (low 16
 * bits of f) / 2^16, so the expected result is f (for finite f; a carry
 * into the exponent is the next binade, as it should be). Inf stays Inf;
 * a NaN may come out anything, which the caller's finiteness check catches.
 */
static __always_inline u32 ckpt_f32_to_bf16_sr(u32 f, u32 noise)
{
	return (f + noise) >> 16;
}

#ifndef CKPT_UPDATE_INT_ONLY

#include "ckpt_q8_tables.h"

#ifdef __FAST_MATH__
#error "ckpt_update_impl.h: never compile with -ffast-math (bit identity)"
#endif
#ifndef __NO_MATH_ERRNO__
#error "ckpt_update_impl.h: compile with -fno-math-errno (sqrt must be an instruction)"
#endif
#if defined(__FLT_EVAL_METHOD__) && __FLT_EVAL_METHOD__ != 0
#error "ckpt_update_impl.h: needs float evaluation in float (FLT_EVAL_METHOD 0)"
#endif

/* ------------------------------------------------------------------------ */
/* Branch-free conversions for the vectorized body.                         */
/* ------------------------------------------------------------------------ */

union ckpt_fu {
	u32 u;
	float f;
};

static __always_inline float ckpt_as_f(u32 u)
{
	union ckpt_fu x;

	x.u = u;
	return x.f;
}

static __always_inline u32 ckpt_as_u(float f)
{
	union ckpt_fu x;

	x.f = f;
	return x.u;
}

/* all-ones if c, else 0 (c is 0 or 1) */
#define CKPT_MASK(c) (0u - (u32)(c))
static __always_inline u32 ckpt_sel(u32 msk, u32 a, u32 b)
{
	return (msk & a) | (~msk & b);
}

/*
 * fp16 -> fp32: normal, Inf and NaN by rebiasing the exponent with an exact
 * multiply by 2^-112 (which also quiets a signalling NaN, keeping its payload,
 * exactly as vcvtph2ps does); subnormals by the exact magic subtraction
 * (0.5 + mant * 2^-24) - 0.5. One select.
 */
static __always_inline u32 ckpt_f16_to_f32_vec(u32 h)
{
	u32 a = h & 0x7fffu;
	u32 sub = CKPT_MASK((s32)a < 0x400);		/* exponent 0 */
	u32 nrm = ckpt_as_u(ckpt_as_f((a << 13) + 0x70000000u) *
			    ckpt_as_f(0x07800000u));	/* * 2^-112 */
	u32 den = ckpt_as_u(ckpt_as_f(a | 0x3f000000u) - ckpt_as_f(0x3f000000u));

	return ckpt_sel(sub, den, nrm) | ((h & 0x8000u) << 16);
}

/*
 * fp32 -> fp16, round to nearest even by the FPU's own rounding (MXCSR
 * default): |f| * 2^112 * 2^-110 overflows to Inf exactly for |f| >= 2^16 and
 * is otherwise |f| * 4, exact; adding 2^(max(E, -14) + 15) rounds it at the
 * fp16 ulp of its binade (or the subnormal ulp 2^-24), and the sum's bits hold
 * the fp16 exponent and mantissa (after Marat Dukhan's FP16 library). NaN:
 * quiet bit and top payload bits kept, as vcvtps2ph. Two selects.
 */
static __always_inline u32 ckpt_f32_to_f16_vec(u32 f)
{
	u32 a = f & 0x7fffffffu;
	u32 nan = CKPT_MASK((s32)a > 0x7f800000);
	s32 e = (s32)(f & 0x7f800000u);
	float base = (ckpt_as_f(a) * ckpt_as_f(0x77800000u)) *	/* 2^112 */
		     ckpt_as_f(0x08800000u);			/* 2^-110 */
	u32 lo = CKPT_MASK(e < 0x38800000);	/* max(E, -14), SSE2 has no pmaxsd */
	u32 r, o;

	r = ckpt_sel(lo, 0x38800000u, (u32)e);
	r = ckpt_as_u(ckpt_as_f(r + 0x07800000u) + base);
	o = ((r >> 13) & 0x7c00u) + (r & 0x0fffu);
	o = ckpt_sel(nan, 0x7e00u | ((a >> 13) & 0x3ffu), o);
	return o | ((f >> 16) & 0x8000u);
}

static __always_inline u32 ckpt_bf16_to_f32_vec(u32 h)
{
	return h << 16;
}

static __always_inline u32 ckpt_f32_to_bf16_vec(u32 f)
{
	u32 nan = CKPT_MASK((s32)(f & 0x7fffffffu) > (s32)0x7f800000);
	u32 r = (f + 0x7fffu + ((f >> 16) & 1u)) >> 16;
	u32 q = (f >> 16) | 0x0040u;

	return ckpt_sel(nan, q, r) & 0xffffu;
}

/* ------------------------------------------------------------------------ */
/* The fused loop.                                                          */
/* ------------------------------------------------------------------------ */

struct ckpt_upd_k {
	float scale, beta1, beta2, eps, wd, omb1, omb2, step_size, bc2, decay;
};

/*
 * One param's AdamW step on fp32 values: g the scaled gradient, *pp, *mm,
 * *vv the param and moments in and out. Returns the non-finite bits (bit 31
 * set if g or a new value is not finite).
 */
static __always_inline u32 ckpt_adam_one(const struct ckpt_upd_k *k, const int l2, float g,
					 float *pp, float *mm, float *vv)
{
	float p = *pp, m, v, denom;
	/* exponent all ones <=> not finite: sets bit 31 */
	u32 nf = (ckpt_as_u(g) & 0x7f800000u) + 0x00800000u;

	if (l2)
		g = g + k->wd * p;
	else
		p = p * k->decay;
	m = *mm * k->beta1 + g * k->omb1;
	v = *vv * k->beta2 + (g * g) * k->omb2;
	denom = __builtin_sqrtf(v) / k->bc2 + k->eps;
	p = p - k->step_size * (m / denom);
	nf |= ((ckpt_as_u(p) & 0x7f800000u) + 0x00800000u) |
	      ((ckpt_as_u(m) & 0x7f800000u) + 0x00800000u) |
	      ((ckpt_as_u(v) & 0x7f800000u) + 0x00800000u);
	*pp = p;
	*mm = m;
	*vv = v;
	return nf;
}

static __always_inline float ckpt_grad_f32(const struct ckpt_upd_k *k, const int bf16, u16 g)
{
	u32 gb = bf16 ? ckpt_bf16_to_f32_vec(g) : ckpt_f16_to_f32_vec(g);

	return ckpt_as_f(gb) * k->scale;
}

static __always_inline u16 ckpt_plo_of(const int bf16, float p)
{
	return (u16)(bf16 ? ckpt_f32_to_bf16_vec(ckpt_as_u(p)) : ckpt_f32_to_f16_vec(ckpt_as_u(p)));
}

/*
 * bf16 and l2 are compile-time constants at every call site, so each of the
 * combinations is its own branch-free loop. bf16 == CKPT_SRC_F32: the
 * gradients come already converted to fp32 bits in g32 (grad unused), and
 * the loop leaves plo to the caller (the F16C path below).
 */
#define CKPT_SRC_F32 2

static __always_inline u32 ckpt_update_loop(const struct ckpt_upd_k *k, const int bf16, const int l2,
			     const u16 *__restrict grad, const u32 *__restrict g32,
			     u32 *__restrict p, u32 *__restrict m, u32 *__restrict v,
			     u16 *__restrict plo, u64 n)
{
	u32 nf = 0;
	u64 i;

	for (i = 0; i < n; i++) {
		float pp = ckpt_as_f(p[i]), mm = ckpt_as_f(m[i]), vv = ckpt_as_f(v[i]);
		float g = bf16 == CKPT_SRC_F32 ? ckpt_as_f(g32[i]) * k->scale
					       : ckpt_grad_f32(k, bf16, grad[i]);

		nf |= ckpt_adam_one(k, l2, g, &pp, &mm, &vv);
		p[i] = ckpt_as_u(pp);
		m[i] = ckpt_as_u(mm);
		v[i] = ckpt_as_u(vv);
		if (bf16 != CKPT_SRC_F32)
			plo[i] = ckpt_plo_of(bf16, pp);
	}
	return nf >> 31;
}

/* ---------------------------------------------------------------------- */
/* The gradients' sum of squares (ckpt_grad_sumsq).                        */
/* ---------------------------------------------------------------------- */

union ckpt_du {
	u64 u;
	double d;
};

static __always_inline double ckpt_as_d(u64 u)
{
	union ckpt_du x;

	x.u = u;
	return x.d;
}

static __always_inline u64 ckpt_as_u64(double d)
{
	union ckpt_du x;

	x.d = d;
	return x.u;
}

/*
 * One order of additions, whatever the vector width: each block of
 * CKPT_SUMSQ_BLOCK params sums into CKPT_SUMSQ_LANES fp64 lanes (lane j takes
 * params j, j + LANES, ...), the lanes fold in halves (j += j + LANES/2, ...),
 * and the block totals add to acc in block order. A square of an fp32 value is
 * exact in fp64, so the additions are the only roundings, and they are the
 * same in every build.
 */
static __always_inline u64 ckpt_grad_sumsq_body(u32 dtype, const u16 *__restrict grad, u64 n,
						u64 acc_bits)
{
	const int bf16 = dtype == CKPT_DTYPE_BF16;
	double acc = ckpt_as_d(acc_bits);
	u64 b, i;
	u32 j, w;

	for (b = 0; b < n; b += CKPT_SUMSQ_BLOCK) {
		double lane[CKPT_SUMSQ_LANES] = { 0 };

		for (i = 0; i < CKPT_SUMSQ_BLOCK; i += CKPT_SUMSQ_LANES)
			for (j = 0; j < CKPT_SUMSQ_LANES; j++) {
				u16 h = grad[b + i + j];
				double g = (double)ckpt_as_f(bf16 ? ckpt_bf16_to_f32_vec(h)
								  : ckpt_f16_to_f32_vec(h));

				lane[j] += g * g;
			}
		for (w = CKPT_SUMSQ_LANES / 2; w; w >>= 1)
			for (j = 0; j < w; j++)
				lane[j] += lane[j + w];
		acc += lane[0];
	}
	return ckpt_as_u64(acc);
}

/* The sum of n fp64 values (bits), in index order. */
static __always_inline u64 ckpt_sum_f64_body(const u64 *v, u64 n)
{
	double acc = 0;
	u64 i;

	for (i = 0; i < n; i++)
		acc += ckpt_as_d(v[i]);
	return ckpt_as_u64(acc);
}

/* ---------------------------------------------------------------------- */
/* Q8: block-wise 8-bit moments (CKPT_FEATURE_INCOMPAT_Q8).                */
/* ---------------------------------------------------------------------- */

/*
 * The code nearest x (bits; |x| <= 1 or NaN): the number of the map's
 * midpoints below x, from its bucket table (scripts/gen_q8_tables.py). The
 * magnitude's high bits pick the bucket, which holds at most one midpoint, so
 * one compare of the low bits against it finishes the count: a load and a
 * few integer operations that vectorize (a gather), where a search over 256
 * midpoints is eight dependent loads. Integer only: the same index on every
 * build. NaN (a non-finite step, which is refused) takes 0.
 */
static __always_inline u32 ckpt_q8_index(const u32 *bkt, const u32 shift, const u32 klo,
					 const u32 nk, u32 x)
{
	u32 s = x >> 31, a = x & 0x7fffffffu;
	u32 nan = CKPT_MASK(a > 0x7f800000u);
	u32 k, e;

	a = ckpt_sel(CKPT_MASK(a < (klo << shift)), klo << shift, a);
	k = (a >> shift) - klo;
	k = ckpt_sel(CKPT_MASK(k > nk - 1), nk - 1, k);
	e = bkt[s * nk + k];
	return ((e >> 24) + ((u32)((a & ((1u << shift) - 1)) >= (e & 0x3ffffu)) ^ s)) & ~nan;
}

/*
 * The scale of a block (bits) from the largest magnitudes of its positive
 * values (p) and of its negative ones (n), chosen so that decoding a block
 * and encoding it again gives back its codes and scale (a load of state that
 * an export or read_state decoded rewrites the same bytes):
 *  - at least p: the positive extreme divides to exactly 1, the map's top
 *    code, which decodes to the scale itself;
 *  - for exp_avg's map, whose most negative code c0 is -0.993, at least the
 *    least scale t whose c0 * t (in fp32, as the decode computes it) reaches
 *    n: the negative extreme takes c0 and decodes to the least decodable
 *    value at or above its magnitude, from which this rule finds t again
 *    (the largest magnitude would shrink it 0.7% at every encode). n is
 *    capped where c0 * FLT_MAX stops, so t stays finite. exp_avg_sq's map
 *    has no negative code (negatives take 0): n plays no part;
 *  - at least 2^-126, the least normal fp32: with a subnormal scale the
 *    decode's products would be rounded to few bits, far enough to move a
 *    value to another code. At or above it a code's product errs by half
 *    an ulp or by 2^-150 at most, 2^-24 of the scale, inside every code's
 *    interval.
 * The first two bounds are monotone and tight, so they hold for the decoded
 * block with equality; every decoded value is below them; the codes come
 * back since every decoded value divides to within its code's interval.
 * A block whose largest magnitude is not finite (a step that is refused)
 * takes its bits.
 */
static __always_inline u32 ckpt_q8_scale(const int sq, u32 p, u32 n)
{
	const float c0 = ckpt_as_f(ckpt_q8_code_m[0] & 0x7fffffffu);
	const u32 ncap = ckpt_as_u(c0 * ckpt_as_f(0x7f7fffffu));	/* c0 * FLT_MAX */
	u32 s = p > 0x00800000u ? p : 0x00800000u, t;

	if ((p > n ? p : n) >= 0x7f800000u)
		return p > n ? p : n;
	if (!sq && n) {
		n = n < ncap ? n : ncap;
		/* the quotient is within an ulp of the least t: step to it */
		t = ckpt_as_u(ckpt_as_f(n) / c0);
		t -= ckpt_as_u(c0 * ckpt_as_f(t - 1)) >= n;
		t += ckpt_as_u(c0 * ckpt_as_f(t)) < n;
		s = t > s ? t : s;
	}
	return s;
}

/*
 * Quantize one block of CKPT_Q8_BLOCK fp32 values (bits): each value divided
 * by the block's scale (ckpt_q8_scale; correctly rounded, so within the map's
 * range) and stored as its nearest code: of exp_avg's map, or (sq, a
 * compile-time constant) of exp_avg_sq's. A positive exp_avg_sq never takes
 * the zero code: its nearest code may be zero where exp_avg's is not (the
 * map spans six decades of the variance, three of the gradient, exp_avg's
 * six), and a zero variance under a nonzero momentum steps by m / eps; it
 * takes the least positive code instead. A block whose codes are all zero
 * (all its values zero, or exp_avg's below half the least code at the least
 * scale) stores scale 0, which decodes to the same zeros.
 */
static __always_inline void ckpt_q8_quant_block(const int sq, const u32 *__restrict x,
						u8 *__restrict q, u32 *scale)
{
	const u32 *bkt = sq ? ckpt_q8_bkt_v : ckpt_q8_bkt_m;
	const u32 shift = sq ? CKPT_Q8_V_SHIFT : CKPT_Q8_M_SHIFT;
	const u32 klo = sq ? CKPT_Q8_V_KLO : CKPT_Q8_M_KLO;
	const u32 nk = sq ? CKPT_Q8_V_NK : CKPT_Q8_M_NK;
	const u32 zero = ckpt_q8_index(bkt, shift, klo, nk, 0);
	u32 pmax = 0, nmax = 0, nz = 0, s, i, lift;
	float d;

	/*
	 * |x| compares as an integer: finite non-negative floats order as their
	 * bits. Plain maxima, which the vectorizer knows as reductions.
	 */
	for (i = 0; i < CKPT_Q8_BLOCK; i++) {
		u32 a = x[i] & 0x7fffffffu, neg = CKPT_MASK(x[i] >> 31);
		u32 ap = a & ~neg, an = a & neg;

		pmax = ap > pmax ? ap : pmax;
		nmax = an > nmax ? an : nmax;
	}
	s = ckpt_q8_scale(sq, pmax, nmax);
	d = ckpt_as_f(s);
	/* a finite scale: a non-finite block (a refused step) keeps its zeros */
	lift = sq && s < 0x7f800000u;
	for (i = 0; i < CKPT_Q8_BLOCK; i++) {
		u32 c = ckpt_q8_index(bkt, shift, klo, nk, ckpt_as_u(ckpt_as_f(x[i]) / d));

		/* a positive finite x (bits 1 .. 0x7f7fffff) keeps a nonzero code */
		c += lift && c == zero && x[i] - 1u < 0x7f7fffffu;
		q[i] = (u8)c;
		nz |= q[i] ^ zero;
	}
	*scale = (nz || s >= 0x7f800000u) ? s : 0;
}

static __always_inline u32 ckpt_q8_value(const u32 *code, u8 q, float scale)
{
	return ckpt_as_u(ckpt_as_f(code[q]) * scale);
}

/*
 * The fused loop on Q8 state: each block's moments are decoded (code times
 * scale), stepped in fp32 exactly as ckpt_update_loop does (the param update
 * uses the new fp32 moments), then encoded again with the block's new scale.
 * tmp: 2 * CKPT_Q8_BLOCK words of scratch for the new fp32 moments.
 * bm (a compile-time constant like bf16 and l2): the masters at pv are bf16
 * (BF16M), widened for the step, rounded back stochastically with sr's noise
 * and copied to plo; else they are fp32 and sr is unused.
 */
static __always_inline u32 ckpt_update_loop_q8(const struct ckpt_upd_k *k, const int bf16,
					       const int l2, const u16 *__restrict grad,
					       void *__restrict pv, const struct ckpt_q8_state *s,
					       u32 *__restrict tmp, u16 *__restrict plo, u64 n,
					       const int bm, const struct ckpt_sr *sr)
{
	u32 *__restrict tm = tmp, *__restrict tv = tmp + CKPT_Q8_BLOCK;
	u32 key = bm ? sr->key : 0, first = bm ? sr->first : 0;
	u32 nf = 0;
	u64 b, i;

	for (b = 0; b < n; b += CKPT_Q8_BLOCK) {
		const u8 *mq = s->m + b, *vq = s->v + b;
		float ms = ckpt_as_f(s->m_scale[b >> CKPT_Q8_SHIFT]);
		float vs = ckpt_as_f(s->v_scale[b >> CKPT_Q8_SHIFT]);

		for (i = 0; i < CKPT_Q8_BLOCK; i++) {
			/* bm: bf16 masters (BF16M), else fp32 ones */
			float pp = bm ? ckpt_as_f(ckpt_bf16_to_f32_vec(((u16 *)pv)[b + i]))
				      : ckpt_as_f(((u32 *)pv)[b + i]);
			float mm = ckpt_as_f(ckpt_q8_value(ckpt_q8_code_m, mq[i], ms));
			float vv = ckpt_as_f(ckpt_q8_value(ckpt_q8_code_v, vq[i], vs));

			nf |= ckpt_adam_one(k, l2, ckpt_grad_f32(k, bf16, grad[b + i]),
					    &pp, &mm, &vv);
			tm[i] = ckpt_as_u(mm);
			tv[i] = ckpt_as_u(vv);
			if (bm) {
				u32 r = ckpt_f32_to_bf16_sr(ckpt_as_u(pp),
							    ckpt_sr_noise(key, first + (u32)(b + i)));

				nf |= ((r << 16) & 0x7f800000u) + 0x00800000u;
				((u16 *)pv)[b + i] = (u16)r;
				plo[b + i] = (u16)r;
			} else {
				((u32 *)pv)[b + i] = ckpt_as_u(pp);
				plo[b + i] = ckpt_plo_of(bf16, pp);
			}
		}
		ckpt_q8_quant_block(0, tm, s->m + b, &s->m_scale[b >> CKPT_Q8_SHIFT]);
		ckpt_q8_quant_block(1, tv, s->v + b, &s->v_scale[b >> CKPT_Q8_SHIFT]);
	}
	return nf >> 31;
}

static __always_inline void ckpt_upd_k_init(struct ckpt_upd_k *k, const struct ckpt_hparams *hp,
					    u32 grad_scale)
{
	k->scale = ckpt_as_f(grad_scale);
	k->beta1 = ckpt_as_f(hp->beta1);
	k->beta2 = ckpt_as_f(hp->beta2);
	k->eps = ckpt_as_f(hp->eps);
	k->wd = ckpt_as_f(hp->weight_decay);
	k->omb1 = ckpt_as_f(hp->one_minus_beta1);
	k->omb2 = ckpt_as_f(hp->one_minus_beta2);
	k->step_size = ckpt_as_f(hp->step_size);
	k->bc2 = ckpt_as_f(hp->bc2_sqrt);
	k->decay = ckpt_as_f(hp->decay);
}

/* The body of ckpt_update_chunk (same arguments and result). */
static __always_inline u32 ckpt_update_chunk_body(const struct ckpt_hparams *hp, u32 grad_scale,
				   u32 dtype, const u16 *grad, u32 *p, u32 *m,
				   u32 *v, u16 *plo, u64 n)
{
	struct ckpt_upd_k k;
	int bf16 = dtype == CKPT_DTYPE_BF16;
	int l2 = (hp->flags & CKPT_GROUP_ADAM_L2) != 0;

	ckpt_upd_k_init(&k, hp, grad_scale);
	if (bf16)
		return l2 ? ckpt_update_loop(&k, 1, 1, grad, NULL, p, m, v, plo, n)
			  : ckpt_update_loop(&k, 1, 0, grad, NULL, p, m, v, plo, n);
	return l2 ? ckpt_update_loop(&k, 0, 1, grad, NULL, p, m, v, plo, n)
		  : ckpt_update_loop(&k, 0, 0, grad, NULL, p, m, v, plo, n);
}

/* The body of ckpt_update_chunk_q8 (same arguments and result). */
static __always_inline u32 ckpt_update_chunk_q8_body(const struct ckpt_hparams *hp, u32 grad_scale,
						     u32 dtype, const u16 *grad, u32 *p,
						     const struct ckpt_q8_state *s, u32 *tmp,
						     u16 *plo, u64 n)
{
	struct ckpt_upd_k k;
	int bf16 = dtype == CKPT_DTYPE_BF16;
	int l2 = (hp->flags & CKPT_GROUP_ADAM_L2) != 0;

	ckpt_upd_k_init(&k, hp, grad_scale);
	if (bf16)
		return l2 ? ckpt_update_loop_q8(&k, 1, 1, grad, p, s, tmp, plo, n, 0, NULL)
			  : ckpt_update_loop_q8(&k, 1, 0, grad, p, s, tmp, plo, n, 0, NULL);
	return l2 ? ckpt_update_loop_q8(&k, 0, 1, grad, p, s, tmp, plo, n, 0, NULL)
		  : ckpt_update_loop_q8(&k, 0, 0, grad, p, s, tmp, plo, n, 0, NULL);
}

/* The body of ckpt_update_chunk_q8bf (same arguments and result). */
static __always_inline u32 ckpt_update_chunk_q8bf_body(const struct ckpt_hparams *hp,
						       u32 grad_scale, const u16 *grad, u16 *p,
						       const struct ckpt_q8_state *s, u32 *tmp,
						       u16 *plo, u64 n, const struct ckpt_sr *sr)
{
	struct ckpt_upd_k k;

	ckpt_upd_k_init(&k, hp, grad_scale);
	return (hp->flags & CKPT_GROUP_ADAM_L2) ?
		ckpt_update_loop_q8(&k, 1, 1, grad, p, s, tmp, plo, n, 1, sr) :
		ckpt_update_loop_q8(&k, 1, 0, grad, p, s, tmp, plo, n, 1, sr);
}

/* Q8 state of n params (a multiple of CKPT_Q8_BLOCK) to fp32 bits and back. */
static __always_inline void ckpt_q8_decode_body(const struct ckpt_q8_state *s, u32 *m, u32 *v,
						u64 n)
{
	u64 b, i;

	for (b = 0; b < n; b += CKPT_Q8_BLOCK) {
		float ms = ckpt_as_f(s->m_scale[b >> CKPT_Q8_SHIFT]);
		float vs = ckpt_as_f(s->v_scale[b >> CKPT_Q8_SHIFT]);

		for (i = b; i < b + CKPT_Q8_BLOCK; i++) {
			m[i] = ckpt_q8_value(ckpt_q8_code_m, s->m[i], ms);
			v[i] = ckpt_q8_value(ckpt_q8_code_v, s->v[i], vs);
		}
	}
}

static __always_inline void ckpt_q8_encode_body(const struct ckpt_q8_state *s, const u32 *m,
						const u32 *v, u64 n)
{
	u64 b;

	for (b = 0; b < n; b += CKPT_Q8_BLOCK) {
		ckpt_q8_quant_block(0, m + b, s->m + b, &s->m_scale[b >> CKPT_Q8_SHIFT]);
		ckpt_q8_quant_block(1, v + b, s->v + b, &s->v_scale[b >> CKPT_Q8_SHIFT]);
	}
}

/* The body of ckpt_round_params. */
static __always_inline void ckpt_round_params_body(u32 dtype, const u32 *__restrict p,
				    u16 *__restrict plo, u64 n)
{
	u64 i;

	if (dtype == CKPT_DTYPE_BF16) {
		for (i = 0; i < n; i++)
			plo[i] = (u16)ckpt_f32_to_bf16_vec(p[i]);
	} else {
		for (i = 0; i < n; i++)
			plo[i] = (u16)ckpt_f32_to_f16_vec(p[i]);
	}
}

/* Same conversions, array form (for tests and hosts that convert in bulk). */
static __always_inline void ckpt_f16_to_f32_array_body(const u16 *__restrict h, u32 *__restrict f,
					u64 n)
{
	u64 i;

	for (i = 0; i < n; i++)
		f[i] = ckpt_f16_to_f32_vec(h[i]);
}

#ifdef CKPT_UPDATE_F16C
/* ------------------------------------------------------------------------ */
/* x86-64 with F16C: fp16 conversions by vcvtph2ps/vcvtps2ph.               */
/* ------------------------------------------------------------------------ */

/*
 * Below AVX-512 the emulated fp16 conversions above are most of the loop's
 * work. A TU that defines CKPT_UPDATE_F16C (and calls these only on a CPU
 * with AVX and F16C) gets a path that converts with the instructions the
 * emulation is bit-identical to (the unit tests check every fp16 input and
 * every fp32 one against them): in blocks of CKPT_F16C_BLOCK params, the
 * gradients to fp32 into a buffer on the stack, the fused loop on fp32
 * gradients (no conversion left in it, so it vectorizes like any float
 * loop), then the new params of the block, still in L1, to fp16. The bytes
 * moved to and from memory are the same. vcvtps2ph's immediate 0 is round
 * to nearest even whatever MXCSR says. Compiler builtins, not
 * <immintrin.h>: the kernel cannot include it.
 */
#define CKPT_F16C_TARGET __attribute__((target("avx,f16c")))
#ifndef CKPT_F16C_BLOCK
#define CKPT_F16C_BLOCK 256
#endif

static __always_inline CKPT_F16C_TARGET void ckpt_f16_to_f32_f16c(const u16 *__restrict h,
								  u32 *__restrict f, u64 n)
{
	u64 i;

	for (i = 0; i + 8 <= n; i += 8) {
		short x __attribute__((vector_size(16)));
		float y __attribute__((vector_size(32)));

		__builtin_memcpy(&x, h + i, sizeof(x));
		y = __builtin_ia32_vcvtph2ps256(x);
		__builtin_memcpy(f + i, &y, sizeof(y));
	}
	for (; i < n; i++)
		f[i] = ckpt_f16_to_f32_vec(h[i]);
}

static __always_inline CKPT_F16C_TARGET void ckpt_f32_to_f16_f16c(const u32 *__restrict f,
								  u16 *__restrict h, u64 n)
{
	u64 i;

	for (i = 0; i + 8 <= n; i += 8) {
		float x __attribute__((vector_size(32)));
		short y __attribute__((vector_size(16)));

		__builtin_memcpy(&x, f + i, sizeof(x));
		y = __builtin_ia32_vcvtps2ph256(x, 0);
		__builtin_memcpy(h + i, &y, sizeof(y));
	}
	for (; i < n; i++)
		h[i] = (u16)ckpt_f32_to_f16_vec(f[i]);
}

/* ckpt_update_chunk_body with the F16C conversions for fp16 (bf16: as there). */
static __always_inline CKPT_F16C_TARGET u32 ckpt_update_chunk_f16c_body(const struct ckpt_hparams *hp,
									u32 grad_scale, u32 dtype,
									const u16 *grad, u32 *p, u32 *m,
									u32 *v, u16 *plo, u64 n)
{
	u32 g32[CKPT_F16C_BLOCK];
	struct ckpt_upd_k k;
	int l2 = (hp->flags & CKPT_GROUP_ADAM_L2) != 0;
	u32 nf = 0;
	u64 off, len;

	if (dtype == CKPT_DTYPE_BF16)
		return ckpt_update_chunk_body(hp, grad_scale, dtype, grad, p, m, v, plo, n);
	ckpt_upd_k_init(&k, hp, grad_scale);
	for (off = 0; off < n; off += len) {
		len = n - off < CKPT_F16C_BLOCK ? n - off : CKPT_F16C_BLOCK;
		ckpt_f16_to_f32_f16c(grad + off, g32, len);
		nf |= l2 ? ckpt_update_loop(&k, CKPT_SRC_F32, 1, NULL, g32, p + off, m + off, v + off, NULL, len)
			 : ckpt_update_loop(&k, CKPT_SRC_F32, 0, NULL, g32, p + off, m + off, v + off, NULL, len);
		ckpt_f32_to_f16_f16c(p + off, plo + off, len);
	}
	return nf;
}

/* ckpt_round_params_body with the F16C conversion for fp16. */
static __always_inline CKPT_F16C_TARGET void ckpt_round_params_f16c_body(u32 dtype, const u32 *__restrict p,
									 u16 *__restrict plo, u64 n)
{
	if (dtype == CKPT_DTYPE_BF16)
		ckpt_round_params_body(dtype, p, plo, n);
	else
		ckpt_f32_to_f16_f16c(p, plo, n);
}
#endif /* CKPT_UPDATE_F16C */

#undef CKPT_MASK

#endif /* !CKPT_UPDATE_INT_ONLY */


#endif /* CKPT_UPDATE_IMPL_H */
