/* SPDX-License-Identifier: GPL-2.0 OR MIT */
/*
 * What the core's step files share (ckpt_sm.c, ckpt_status_line.c,
 * ckpt_step.c, ckpt_range.c, ckpt_route.c, ckpt_load.c, ckpt_rollback.c;
 * docs/design.md's rule table says which rule each owns). Private to them.
 */
#ifndef CKPT_STEP_IMPL_H
#define CKPT_STEP_IMPL_H

#include "ckpt_step.h"

#define CKPT_EIO_ERRNO	5	/* EIO, for a failure reported without an errno */

#define CKPT_F32_EXP	0x7f800000u
#define CKPT_F32_SIGN	0x80000000u

/* Finite fp32 bit pattern: exponent not all ones (neither inf nor NaN). */
static inline bool ckpt_f32_finite(u32 bits)
{
	return (bits & CKPT_F32_EXP) != CKPT_F32_EXP;
}

static inline bool ckpt_bit_test(const u64 *bits, u32 i)
{
	return (bits[i >> 6] >> (i & 63)) & 1;
}

static inline void ckpt_bit_set(u64 *bits, u32 i)
{
	bits[i >> 6] |= (u64)1 << (i & 63);
}

static inline void ckpt_bits_clear(u64 *bits, u32 n_bits)
{
	if (bits)
		memset(bits, 0, ckpt_bitmap_words(n_bits) * sizeof(u64));
}

/* RANGE (ckpt_range.c), run by ckpt_step_exec. Caller holds the command lock. */
int ckpt_step_range(struct ckpt_step *cs, const struct ckpt_cmd *cmd);

/* A superblock write failed (ckpt_step.c): the machine fails, the host is told. */
void ckpt_step_sb_failed(struct ckpt_step *cs, int io);

#endif /* CKPT_STEP_IMPL_H */
