// SPDX-License-Identifier: MIT
// A dm-ckpt backing image opened and validated: superblock, group table and
// manifest. What the engine runs on and what ckptctl inspects.
#pragma once

#include <string>
#include <vector>

#include "io.hpp"
#include "layout.hpp"

namespace ckpt {

struct Image {
	BackingFile file;
	struct ckpt_sb sb {};
	std::vector<uint8_t> group_table;	// one byte per chunk
	Manifest manifest;

	static Image open(const std::string &path, bool writable);
};

} // namespace ckpt
