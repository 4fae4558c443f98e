// SPDX-License-Identifier: MIT
/*
 * The scalar fp16/bf16 conversions of ckpt_update.c for the fuzz build:
 * that file's target_clones and cpu checks are gcc's, and the parsers need
 * only these two, from the same header; the step's commit adds the chunks'
 * gradient sums (ckpt_sum_f64).
 */
#include "ckpt_update.h"
#include "ckpt_update_impl.h"

u32 ckpt_f16_to_f32(u16 h)
{
	return ckpt_f16_to_f32_int(h);
}

u32 ckpt_bf16_to_f32(u16 h)
{
	return ckpt_bf16_to_f32_int(h);
}

u64 ckpt_sum_f64(const u64 *v, u64 n)
{
	return ckpt_sum_f64_body(v, n);
}
