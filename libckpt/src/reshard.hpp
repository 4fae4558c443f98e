// SPDX-License-Identifier: MIT
// ckpt_reshard (ckpt_admin.h): rank's image over world ranks of the committed
// state of a sharded run's images; returns its report as JSON text and
// throws ckpt::Error.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace ckpt {

std::string reshard(const std::vector<std::string> &from, const std::string &path, uint32_t rank,
		    uint32_t world, const std::string &opts_json);

} // namespace ckpt
