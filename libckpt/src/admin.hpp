// SPDX-License-Identifier: MIT
// The tool operations behind ckpt.h's ckpt_image_info, ckpt_format_manifest,
// ckpt_import, ckpt_export_image, ckpt_verify and ckpt_restore: each returns
// its report as JSON text and throws ckpt::Error.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "ckpt_admin.h"

namespace ckpt {

std::string image_info(const std::string &device);
std::string format_manifest(const std::string &device, const std::string &opts_json);
std::string import_safetensors(const std::string &device, const std::string &from, const std::string &opts_json);
std::string safetensors_header(const std::string &path);
std::string export_image_report(const std::string &device, const std::string &out, uint32_t flags);
std::string verify_report(const std::string &device, bool repair);
std::string restore_report(const std::string &device, bool rollback);
std::optional<std::string> backing_of(const std::string &path);
// A dm-ckpt device (/dev/mapper/NAME) stands for its backing device when
// reading; anything else is the backing file or device itself.
std::string backing_path(const std::string &dev);
struct ckpt_fit fit(uint64_t bytes, uint32_t chunk_params, uint64_t write_unit);

} // namespace ckpt
