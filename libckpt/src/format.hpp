// SPDX-License-Identifier: MIT
#pragma once

#include <cstdint>
#include <string>

#include "manifest.hpp"

namespace ckpt {

struct FormatOptions {
	uint32_t dtype = CKPT_DTYPE_BF16;
	uint32_t chunk_params = 1u << CKPT_DEFAULT_CHUNK_SHIFT;
	uint64_t size = 0;	// 0: what the layout needs
	// Incompat feature bits of the new image (0 gives an image as the first
	// v1 release wrote it, for compatibility tests).
	uint32_t incompat = CKPT_FEATURE_INCOMPAT_DEFAULT;
	bool q8 = false;	// 8-bit moments (feature Q8)
	bool bf16_master = false;	// bf16 masters, stochastic rounding (feature BF16M; needs q8)
	bool force = false;	// format over an existing image or signature
};

// Creates (a file) or formats (a file or block device) path for layout:
// superblock, group table, manifest, and step-0 state (all zero) in slot 0.
// Without force, refuses a path holding a dm-ckpt image or any signature
// libblkid knows. Takes the writer's lock (as Engine::open does).
// A file is built beside path under a temporary name with all its space
// reserved (fallocate), and renamed over path only when complete and flushed:
// a failed format leaves the old file as it was and nothing new behind. A
// block device is written in place: its old superblocks are invalidated
// first, and the new one is written last, so an interrupted format leaves no
// image rather than a wrong one.
void format(const std::string &path, const Layout &layout, const FormatOptions &opts);

uint32_t parse_dtype(const std::string &name);	// "fp16" | "bf16"

} // namespace ckpt
