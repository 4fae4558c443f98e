// SPDX-License-Identifier: MIT
// ckptctl probe: what an NVMe namespace offers a dm-ckpt backing device
// (identify controller/namespace through libnvme, queue limits from sysfs),
// and the geometry that fits it.
#pragma once

#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

namespace ckptctl {

// Throws ckptctl::Error with a clear message when dev is not an NVMe namespace.
nlohmann::json probe(const std::string &dev, uint32_t chunk_params);
void print_probe(const nlohmann::json &j);

} // namespace ckptctl
