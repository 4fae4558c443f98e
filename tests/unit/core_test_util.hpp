// SPDX-License-Identifier: MIT
// Shared by the core's unit tests: fp32 bit patterns, valid hyperparameters,
// the geometry of a test image and the commands a test host sends.
#pragma once

#include <cstdint>
#include <cstring>
#include <memory>

extern "C" {
#include "ckpt_codec.h"
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

// The geometry of a test image (Adam): n_chunks chunks of 2^chunk_shift params.
inline ckpt_geometry test_geometry(uint32_t n_chunks, uint32_t chunk_shift, uint32_t n_groups,
				   uint32_t dtype, uint32_t manifest_bytes)
{
	return {.n_chunks = n_chunks, .chunk_shift = chunk_shift, .n_groups = n_groups,
		.dtype = dtype, .optimizer = CKPT_OPT_ADAM, .manifest_bytes = manifest_bytes};
}

// A command of op for step, all else zero; a BEGIN carries grad_scale and
// the hyperparameters test_hparams(0 .. n_groups - 1).
inline std::unique_ptr<ckpt_cmd> test_cmd(uint32_t op, uint64_t step, uint32_t n_groups = 0,
					  uint32_t grad_scale = f32(1.0f))
{
	auto c = std::make_unique<ckpt_cmd>();
	c->opcode = op;
	c->step = step;
	if (op == CKPT_OP_BEGIN) {
		c->grad_scale = grad_scale;
		c->n_groups = n_groups;
		for (uint32_t i = 0; i < n_groups && i < CKPT_MAX_GROUPS; i++)
			c->groups[i] = test_hparams(int(i));
	}
	return c;
}
