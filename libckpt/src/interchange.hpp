// SPDX-License-Identifier: MIT
// What a safetensors file written by export says about the image it came
// from, in its __metadata__ (string values, as the format requires), so that
// format --from-safetensors lays out the same image again:
//
//   dm-ckpt.format_version       "1" (CKPT_FORMAT_VERSION)
//   dm-ckpt.dtype                "bf16" | "fp16"
//   dm-ckpt.chunk_params         "65536"
//   dm-ckpt.step                 the committed step exported
//   dm-ckpt.n_groups             "2"
//   dm-ckpt.tensor_group.NAME    each tensor's group, "0".."n_groups-1"
//   dm-ckpt.tensor_step.NAME     a tensor's own step count (the committed
//                                steps that updated it), only where it lags
//                                dm-ckpt.step (a param skipped for want of a
//                                gradient); absent: dm-ckpt.step
//   dm-ckpt.group.G.lr, .beta1, .beta2, .eps, .weight_decay, .flags
//                                each group's hyperparameters (flags: 1 for
//                                Adam with L2), when the image records them
//   dm-ckpt.state                "fp32" | "8bit" (the moments' format,
//                                feature Q8); absent (exports before it): fp32
//   dm-ckpt.master               "fp32" | "bf16" (the masters' format, feature
//                                BF16M: only with 8bit and dtype bf16);
//                                absent: fp32
//
// The metadata is outside input: every dm-ckpt.* key is checked (known
// key, canonical number, values in range, consistent with each other), and
// any other key is left alone.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "manifest.hpp"

namespace ckpt::interchange {

inline constexpr const char *prefix = "dm-ckpt.";

struct Metadata {
	uint32_t dtype = 0;	// CKPT_DTYPE_*
	uint32_t chunk_params = 0;
	uint64_t step = 0;
	uint32_t n_groups = 0;
	std::map<std::string, uint32_t> tensor_group;
	std::map<std::string, uint64_t> tensor_step;	// only the tensors that lag step
	std::vector<GroupHparams> hparams;	// n_groups entries, or none
	bool q8 = false;			// 8-bit moments
	bool bf16_master = false;		// bf16 masters
};

// Adds m's keys to meta.
void write(const Metadata &m, std::map<std::string, std::string> &meta);
// The dm-ckpt.* keys of meta; nullopt when there are none. `what` (the file)
// starts every error message (CKPT_E_INVAL).
std::optional<Metadata> read(const std::map<std::string, std::string> &meta, const std::string &what);

} // namespace ckpt::interchange
