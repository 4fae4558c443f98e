/* SPDX-License-Identifier: GPL-2.0 OR MIT */
/*
 * The fused AdamW update and the fp16/bf16 conversions.
 *
 * No float crosses this interface: fp32 values travel as u32 bit patterns, so
 * a caller compiled without SSE (the kernel) and a callee compiled with it
 * agree on every argument.
 */
#ifndef CKPT_UPDATE_H
#define CKPT_UPDATE_H

#include "ckpt_codec.h"

#ifdef __cplusplus
extern "C" {
#endif

/*
 * One fused pass over n params of a chunk, for group hyperparameters hp and
 * the step's grad_scale (fp32 bits):
 *
 *   g  = f32(grad) * grad_scale                 (AdamW)
 *   g += weight_decay * p                       (Adam-L2 only)
 *   p *= decay                                  (AdamW only)
 *   m  = m * beta1 + g * (1 - beta1)
 *   v  = v * beta2 + (g * g) * (1 - beta2)
 *   p -= step_size * (m / (sqrt(v) / bc2_sqrt + eps))
 *   plo = round_nearest_even(p) in dtype
 *
 * p, m, v are fp32 arrays (as bits); grad and plo are fp16/bf16 per dtype.
 * Returns nonzero if any scaled gradient or any new p, m or v is not finite;
 * the outputs are then meaningless and the step must be discarded (skipped,
 * as torch's GradScaler skips an overflowed step).
 */
u32 ckpt_update_chunk(const struct ckpt_hparams *hp, u32 grad_scale, u32 dtype,
		      const u16 *grad, u32 *p, u32 *m, u32 *v, u16 *plo, u64 n);

/*
 * The same update on Q8 state (CKPT_FEATURE_INCOMPAT_Q8): exp_avg and
 * exp_avg_sq of n params (a multiple of CKPT_Q8_BLOCK) as block-wise 8-bit
 * codes with one scale per block each (s). Every block's moments are
 * decoded, stepped as above in fp32 (p uses the new fp32 moments), and
 * encoded with the block's new scale. tmp: CKPT_Q8_TMP_WORDS of scratch.
 */
#define CKPT_Q8_TMP_WORDS	(2 * CKPT_Q8_BLOCK)
u32 ckpt_update_chunk_q8(const struct ckpt_hparams *hp, u32 grad_scale, u32 dtype,
			 const u16 *grad, u32 *p, const struct ckpt_q8_state *s, u32 *tmp,
			 u16 *plo, u64 n);

/*
 * BF16M: stochastic rounding of fp32 to bf16. The noise of param index i
 * (in the image) at step t is a 16-bit draw from a counter-based hash of
 * (seed, t, i), integer operations only: the same in every build and in the
 * kernel. ckpt_sr_at gives the noise key of params [index, ...) up to the
 * next multiple of 2^32 (a chunk never crosses one); the per-param hash is
 * ckpt_sr_noise (ckpt_update_impl.h).
 */
struct ckpt_sr {
	u32 key;	/* of (seed, step, index >> 32) */
	u32 first;	/* low 32 bits of the index of the first param */
};

/* splitmix64's finalizer (Steele, Lea, Flood 2014) */
static inline u64 ckpt_mix64(u64 z)
{
	z += 0x9e3779b97f4a7c15ull;
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	return z ^ (z >> 31);
}

static inline void ckpt_sr_at(u64 seed, u64 step, u64 index, struct ckpt_sr *sr)
{
	sr->key = (u32)ckpt_mix64(seed ^ ckpt_mix64(step ^ ckpt_mix64(index >> 32)));
	sr->first = (u32)index;
}

/*
 * ckpt_update_chunk_q8 on BF16M state: the masters p are bf16 (dtype is
 * bf16), widened to fp32 for the step, and the new value is rounded to bf16
 * stochastically with sr's noise; plo gets the same bf16 (the low-precision
 * param is the master). A new master that rounds to Inf is non-finite.
 */
u32 ckpt_update_chunk_q8bf(const struct ckpt_hparams *hp, u32 grad_scale, const u16 *grad,
			   u16 *p, const struct ckpt_q8_state *s, u32 *tmp, u16 *plo, u64 n,
			   const struct ckpt_sr *sr);

/*
 * The gradients' sum of squares, for the global gradient norm a device
 * reports (ckpt_status.grad_sumsq): acc (fp64 bits) plus the squares of n
 * fp16/bf16 gradients (n a multiple of CKPT_SUMSQ_BLOCK), in fp64, in the
 * one order ckpt_update_impl.h fixes, so that chaining calls over a chunk's
 * runs in order gives the same bits in every build and in the kernel.
 * ckpt_sum_f64 adds n fp64 values (bits) in index order: the chunks' sums
 * into the step's. Both use the FPU (the kernel calls them between
 * kernel_fpu_begin and kernel_fpu_end).
 */
#define CKPT_SUMSQ_BLOCK	2048u
#define CKPT_SUMSQ_LANES	16u
u64 ckpt_grad_sumsq(u32 dtype, const u16 *grad, u64 n, u64 acc);
u64 ckpt_sum_f64(const u64 *v, u64 n);

#ifndef __KERNEL__
/*
 * fp32 values (bits) to bf16 with the update's stochastic rounding, for a
 * load of state (import, initial masters): a finite value never becomes
 * Inf (one that would is rounded toward zero instead).
 */
void ckpt_sr_round(const struct ckpt_sr *sr, const u32 *x, u16 *out, u64 n);

/*
 * Q8 state of n params (a multiple of CKPT_Q8_BLOCK) to fp32 moments (bits)
 * and back (each block's scale its largest magnitude, each value its
 * nearest code): what export and a load of state use.
 */
void ckpt_q8_decode(const struct ckpt_q8_state *s, u32 *m, u32 *v, u64 n);
void ckpt_q8_encode(const struct ckpt_q8_state *s, const u32 *m, const u32 *v, u64 n);
#endif

/*
 * The update's signatures (ckpt_update_chunk, _q8, _q8bf), as function types
 * that declare its builds (ckpt_update_builds.h) and point at them.
 */
typedef u32 (ckpt_update_t)(const struct ckpt_hparams *hp, u32 grad_scale, u32 dtype,
			    const u16 *grad, u32 *p, u32 *m, u32 *v, u16 *plo, u64 n);
typedef u32 (ckpt_update_q8_t)(const struct ckpt_hparams *hp, u32 grad_scale, u32 dtype,
			       const u16 *grad, u32 *p, const struct ckpt_q8_state *s, u32 *tmp,
			       u16 *plo, u64 n);
typedef u32 (ckpt_update_q8bf_t)(const struct ckpt_hparams *hp, u32 grad_scale, const u16 *grad,
				 u16 *p, const struct ckpt_q8_state *s, u32 *tmp, u16 *plo, u64 n,
				 const struct ckpt_sr *sr);

/* Low-precision copy of fp32 values (as bits), round to nearest even. */
void ckpt_round_params(u32 dtype, const u32 *p, u16 *plo, u64 n);

/* Bit-exact scalar conversions (integer arithmetic only). */
u32 ckpt_f16_to_f32(u16 h);
u16 ckpt_f32_to_f16(u32 f);
u32 ckpt_bf16_to_f32(u16 h);
u16 ckpt_f32_to_bf16(u32 f);

#ifdef __cplusplus
}
#endif

#endif /* CKPT_UPDATE_H */
