// SPDX-License-Identifier: MIT
// Shared by the core's unit tests: fp32 bit patterns and valid hyperparameters.
#pragma once

#include <cstdint>
#include <cstring>

extern "C" {
#include "ckpt_format.h"
}

inline uint32_t f32(float f)
{
	uint32_t u;
	std::memcpy(&u, &f, 4);
	return u;
}

// Finite, plausible hyperparameters of group i (odd groups: Adam-L2).
inline ckpt_hparams test_hparams(int i)
{
	ckpt_hparams h{};
	h.lr = f32(1e-3f * float(i + 1));
	h.beta1 = f32(0.9f);
	h.beta2 = f32(0.999f);
	h.eps = f32(1e-8f);
	h.weight_decay = f32(0.01f);
	h.one_minus_beta1 = f32(0.1f);
	h.one_minus_beta2 = f32(0.001f);
	h.step_size = f32(0.01f);
	h.bc2_sqrt = f32(0.0447f);
	h.decay = f32(0.99999f);
	h.flags = (i & 1) ? CKPT_GROUP_ADAM_L2 : 0;
	return h;
}
