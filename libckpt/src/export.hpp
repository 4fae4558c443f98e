// SPDX-License-Identifier: MIT
// A device's committed state as a safetensors file: the one exporter behind
// ckpt_export (the Python package) and ckpt_export_image (ckptctl export).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace ckpt {

class Device;

struct ExportReport {
	std::string path;		// the image exported from
	uint64_t tensors = 0;
	uint64_t params = 0;
	uint64_t step = 0;		// the committed step written
	std::vector<std::string> warnings;	// damaged copies the image was read around
};

// flags: CKPT_EXPORT_*. meta_json: a JSON object of strings or empty.
ExportReport export_device(Device &dev, const std::string &out, uint32_t flags, const std::string &meta_json);
// The committed step of the backing image at path (read-only; salvage: a
// short file is read as far as it goes), every record checked on the way.
ExportReport export_image(const std::string &path, const std::string &out, uint32_t flags,
			  const std::string &meta_json);

// Text forms shared by the tool operations.
std::string uuid_string(const uint8_t *uuid);
std::string hex(const uint8_t *p, size_t n);

} // namespace ckpt
