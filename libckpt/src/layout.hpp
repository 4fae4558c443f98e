// SPDX-License-Identifier: MIT
// Tensors to param ranges of the flat parameter space, and the tensor manifest
// stored on the backing device.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

extern "C" {
#include "ckpt_format.h"
}

namespace ckpt {

struct Tensor {
	std::string name;
	std::vector<uint64_t> shape;
	uint32_t group = 0;
	uint64_t numel = 0;
	uint64_t offset = 0;	// first param
	uint64_t extent = 0;	// params owned up to the next tensor: numel + padding
};

class Layout {
public:
	void add(std::string name, std::vector<uint64_t> shape, uint32_t group);
	bool empty() const { return specs_.empty(); }

	// Places the tensors: each starts at a CKPT_TENSOR_ALIGN boundary, a
	// change of group starts a new chunk, and each tensor owns the padding
	// after it, so every param of the space belongs to exactly one tensor.
	struct Placed {
		struct ckpt_geometry geo;
		std::vector<Tensor> tensors;
		std::vector<uint8_t> group_table;	// one byte per chunk
	};
	Placed place(uint32_t chunk_shift, uint32_t dtype) const;

private:
	std::vector<Tensor> specs_;
};

// The manifest: tensors by name, validated against the superblock's geometry
// and the group table, since the bytes come from a device.
class Manifest {
public:
	Manifest() = default;
	explicit Manifest(std::vector<Tensor> tensors);
	static std::string encode(const std::vector<Tensor> &tensors, uint32_t dtype, uint64_t chunk_params);
	static Manifest decode(std::string_view json, const struct ckpt_layout &layout,
			       const struct ckpt_geometry &geo, const std::vector<uint8_t> &group_table);

	const std::vector<Tensor> &tensors() const { return tensors_; }
	const Tensor &find(std::string_view name) const;	// throws CKPT_E_NAME

private:
	std::vector<Tensor> tensors_;
	std::unordered_map<std::string, size_t> index_;
};

// A layout as a user writes it (ckptctl format --manifest FILE):
// {"dtype": "bf16", "chunk_params": 65536,
//  "tensors": [{"name": "w", "shape": [4, 4], "group": 0}, ...]}.
struct LayoutFile {
	Layout layout;
	std::string dtype = "bf16";
	uint32_t chunk_params = 1u << CKPT_DEFAULT_CHUNK_SHIFT;
};
// Parses the JSON text of such a file; `what` (its name) starts every
// error message. Throws ckpt::Error.
LayoutFile parse_layout_json(std::string_view text, const std::string &what);

uint64_t numel_of(const std::vector<uint64_t> &shape, const std::string &name);
const char *dtype_name(uint32_t dtype);

} // namespace ckpt
