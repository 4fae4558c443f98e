// SPDX-License-Identifier: MIT
// safetensors files (https://github.com/huggingface/safetensors, format as
// published): 8-byte little-endian header length N, N bytes of JSON
// {"name": {"dtype": "F32", "shape": [..], "data_offsets": [begin, end]}, ...,
// "__metadata__": {"key": "value"}} padded with spaces, then the data buffer,
// every byte of which belongs to exactly one tensor.
//
// The reader trusts nothing in the file: the header length is bounded before
// it is read, and every entry is checked (known dtype, shape x dtype size ==
// its byte span, spans inside the file, sorted, no overlap, no gap, no
// duplicate names) before any memory a tensor asks for is allocated.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "io.hpp"

namespace ckpt::safetensors {

// The published format's limit on the header.
constexpr uint64_t max_header_bytes = 100'000'000;

struct TensorInfo {
	std::string name;
	std::string dtype;	// "F32", "F16", "BF16", ...
	unsigned dtype_bytes = 0;
	std::vector<uint64_t> shape;
	uint64_t numel = 0;
	uint64_t begin = 0, end = 0;	// byte range in the data buffer
	uint32_t file = 0;		// which file of a Checkpoint holds it
};

struct Header {
	std::vector<TensorInfo> tensors;	// in data order
	std::map<std::string, std::string> metadata;
	uint64_t data_offset = 0;		// 8 + header length
	uint64_t data_bytes = 0;

	const TensorInfo *find(std::string_view name) const;
};

// Bytes per element of a dtype name of the format, 0 if unknown.
unsigned dtype_bytes(std::string_view dtype);
// Whether read_f32 converts this dtype: F32, F16, BF16, F64.
bool is_float(std::string_view dtype);

// Validates the JSON text of a header for a data buffer of data_bytes.
// `what` (the file name) starts every error message. Throws ckpt::Error.
Header parse_header(std::string_view json_text, uint64_t data_bytes, const std::string &what);

class Reader {
public:
	static Reader open(const std::string &path);
	const Header &header() const { return h_; }
	const std::string &path() const { return path_; }
	// The raw bytes of t (t.end - t.begin of them).
	void read_raw(const TensorInfo &t, void *out) const;
	// t converted to fp32 (F16/BF16 exactly, F64 rounded to nearest).
	std::vector<float> read_f32(const TensorInfo &t) const;

private:
	Fd fd_;
	std::string path_;
	Header h_;
};

// Writes a file tensor by tensor without holding it in memory: the header
// (all offsets) is written first, then the data of each entry in order.
// The file appears under its name only on finish() (written as NAME.tmp,
// flushed, renamed), so a failed export leaves no half file.
class Writer {
public:
	struct Entry {
		std::string name;
		std::string dtype;
		std::vector<uint64_t> shape;
	};
	// path: what claim_output() takes (force: a dm-ckpt image there may be
	// replaced), checked here and again when finish() puts the file there.
	Writer(const std::string &path, std::vector<Entry> entries,
	       const std::map<std::string, std::string> &metadata, bool force);
	Writer(const Writer &) = delete;
	Writer &operator=(const Writer &) = delete;
	// The next entry's data, exactly its size in bytes.
	void write(const void *data, uint64_t bytes);
	void finish();

private:
	std::string path_;
	std::vector<Entry> entries_;
	std::vector<uint64_t> sizes_;
	size_t next_ = 0;
	bool force_;
	TempFile tmp_;	// becomes path_ in finish(); removed on any failure
};

// The weight_map of a sharded checkpoint's index (model.safetensors.index.json:
// {"metadata": {...}, "weight_map": {"tensor": "model-00001-of-00002.safetensors",
// ...}}): tensor name -> shard file name. Nothing but "metadata" (an object)
// and "weight_map"; no tensor named twice; every shard a plain file name in
// the index's folder (no '/', not "." or ".."). `what` (the index file) starts
// every error message. Throws ckpt::Error.
std::map<std::string, std::string> parse_index(std::string_view json_text, const std::string &what);

// What import and format --from-safetensors read: a safetensors file, a
// sharded checkpoint's index (a path ending in .json), or a Hugging Face
// model folder holding model.safetensors or model.safetensors.index.json.
// The shards of an index are checked against it before any data is read:
// every tensor of the index is in the shard it names, and in no other.
class Checkpoint {
public:
	static Checkpoint open(const std::string &path);
	// Every tensor (TensorInfo::file says which file: shards in name order,
	// each in data order) and the union of the files' __metadata__.
	const Header &header() const { return h_; }
	const std::string &path() const { return path_; }	// the file or index used
	void read_raw(const TensorInfo &t, void *out) const { files_.at(t.file).read_raw(t, out); }
	std::vector<float> read_f32(const TensorInfo &t) const { return files_.at(t.file).read_f32(t); }
	const std::vector<Reader> &files() const { return files_; }

private:
	std::string path_;
	std::vector<Reader> files_;
	Header h_;
};

} // namespace ckpt::safetensors
