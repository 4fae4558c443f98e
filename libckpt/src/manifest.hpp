// SPDX-License-Identifier: MIT
// Tensors to param ranges of the flat parameter space, and the tensor manifest
// stored on the backing device.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

extern "C" {
#include "ckpt_codec.h"
}

namespace ckpt {

// One hyperparameter group of torch.optim.AdamW, in double as PyTorch keeps it.
struct GroupHparams {
	double lr = 1e-3;
	double beta1 = 0.9;
	double beta2 = 0.999;
	double eps = 1e-8;
	double weight_decay = 0.01;
	bool adam_l2 = false;

	bool operator==(const GroupHparams &) const = default;
};

// What torch.optim.AdamW refuses (negative lr, eps or weight decay, a beta
// outside [0, 1), anything not finite); `what` starts the message.
void check_hparams(const GroupHparams &g, const std::string &what);

// Part of a param that a sharded run split over ranks: the tensor is named
// "param[begin:begin + numel]" and is flat; the param's own shape is here.
struct Piece {
	std::string param;
	std::vector<uint64_t> shape;
	uint64_t begin = 0;

	bool operator==(const Piece &) const = default;
};

struct Tensor {
	std::string name;
	std::vector<uint64_t> shape;
	uint32_t group = 0;
	uint64_t numel = 0;
	uint64_t offset = 0;	// first param
	uint64_t extent = 0;	// params owned up to the next tensor: numel + padding
	std::optional<Piece> piece;
};

// The share of a whole layout that one rank's image holds (Layout::shard),
// recorded in its manifest: what a resume checks the ranks against and what
// a reshard rebuilds the whole layout from.
struct ShardRecord {
	uint32_t rank = 0;
	uint32_t world = 1;
	uint32_t rule = 0;	// CKPT_SHARD_RULE_* (ckpt_admin.h)
	uint64_t params = 0;	// of the whole layout
	uint32_t digest = 0;	// of the whole layout (Layout::digest)

	bool operator==(const ShardRecord &) const = default;
};

class Layout {
public:
	void add(std::string name, std::vector<uint64_t> shape, uint32_t group);
	bool empty() const { return specs_.empty(); }
	const std::vector<Tensor> &tensors() const { return specs_; }

	// Rank's share of this layout of whole params over world ranks: the
	// params flattened in order, cut at the bounds the rule gives
	// (shard_bounds); a param cut by a bound is held as pieces. The result
	// records where it came from (ShardRecord).
	Layout shard(uint32_t rank, uint32_t world, uint32_t rule) const;
	const std::optional<ShardRecord> &shard_record() const { return shard_; }
	// A share's: the bounds of every rank's share (shard_bounds).
	const std::vector<uint64_t> &bounds() const { return bounds_; }
	// crc32c of the names, shapes and groups, in order: two layouts of
	// whole params are the same model's when their digests agree.
	uint32_t digest() const;
	// The hyperparameters the image is made for, one per group (or none):
	// recorded in the manifest for export, not applied (each step's begin
	// gives the ones it uses).
	void set_hparams(std::vector<GroupHparams> groups) { hparams_ = std::move(groups); }
	const std::vector<GroupHparams> &hparams() const { return hparams_; }

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
	std::vector<GroupHparams> hparams_;
	std::optional<ShardRecord> shard_;
	std::vector<uint64_t> bounds_;
};

// The world + 1 bounds of the ranks' shares of params of these sizes, in
// flat param offsets: rank r holds [bounds[r], bounds[r + 1]). The rule:
// CKPT_SHARD_RULE_EVEN, n r / world (dm-ckpt before 0.4); CKPT_SHARD_RULE_Q8,
// the same bound moved down to the nearest multiple of CKPT_Q8_BLOCK from the
// start of the param it falls in, so that no 8-bit block of any rank
// straddles two ranks and every reshard keeps the blocks whole. A rank left
// with no params is refused (CKPT_E_INVAL).
std::vector<uint64_t> shard_bounds(const std::vector<uint64_t> &numels, uint32_t world, uint32_t rule);

// The manifest: tensors by name, validated against the superblock's geometry
// and the group table, since the bytes come from a device.
class Manifest {
public:
	Manifest() = default;
	explicit Manifest(std::vector<Tensor> tensors, std::vector<GroupHparams> hparams = {},
			  std::optional<ShardRecord> shard = std::nullopt);
	static std::string encode(const std::vector<Tensor> &tensors, uint32_t dtype, uint64_t chunk_params,
				  const std::vector<GroupHparams> &hparams,
				  const std::optional<ShardRecord> &shard = std::nullopt);
	static Manifest decode(std::string_view json, const struct ckpt_regions &regions,
			       const struct ckpt_geometry &geo, const std::vector<uint8_t> &group_table);

	const std::vector<Tensor> &tensors() const { return tensors_; }
	const Tensor &find(std::string_view name) const;	// throws CKPT_E_NAME
	// The recorded hyperparameters, one per group, or empty (none recorded).
	const std::vector<GroupHparams> &hparams() const { return hparams_; }
	// The rank's share this image holds, when a sharded run made it (0.4 on).
	const std::optional<ShardRecord> &shard() const { return shard_; }

private:
	std::vector<Tensor> tensors_;
	std::vector<GroupHparams> hparams_;
	std::optional<ShardRecord> shard_;
	std::unordered_map<std::string, size_t> index_;
};

// A layout as a user writes it (ckptctl format --manifest FILE):
// {"dtype": "bf16", "chunk_params": 65536,
//  "tensors": [{"name": "w", "shape": [4, 4], "group": 0}, ...],
//  "groups": [{"lr": 1e-3, "betas": [0.9, 0.999], "eps": 1e-8,
//              "weight_decay": 0.01, "adam_l2": false}, ...]} ("groups"
// optional: one entry per group, every key required; the stored manifest
// records them in the same form).
struct LayoutFile {
	Layout layout;
	std::string dtype = "bf16";
	uint32_t chunk_params = 1u << CKPT_DEFAULT_CHUNK_SHIFT;
	// the state formats of the image an export came from (a manifest's
	// JSON has none: fp32)
	bool q8 = false, bf16_master = false;
};
// Parses the JSON text of such a file; `what` (its name) starts every
// error message. Throws ckpt::Error.
LayoutFile parse_layout_json(std::string_view text, const std::string &what);

uint64_t numel_of(const std::vector<uint64_t> &shape, const std::string &name);
const char *dtype_name(uint32_t dtype);

} // namespace ckpt
