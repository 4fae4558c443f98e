// SPDX-License-Identifier: MIT
// ckptctl probe: what an NVMe namespace offers a dm-ckpt backing device
// (identify controller/namespace through libnvme, queue limits from sysfs),
// and the geometry that fits it.
#pragma once

#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

namespace ckptctl {

// The largest layout for chunk_params (0: recommend one) on `bytes` of device.
struct Fit {
	uint32_t chunk_params = 0;
	uint32_t n_chunks = 0;
	uint64_t n_params = 0;
	uint64_t backing_bytes = 0;	// what that layout uses
};
Fit fit_params(uint64_t bytes, uint32_t chunk_params);

// Throws ckpt::Error with a clear message when dev is not an NVMe namespace.
nlohmann::json probe(const std::string &dev, uint32_t chunk_params);
void print_probe(const nlohmann::json &j);

} // namespace ckptctl
