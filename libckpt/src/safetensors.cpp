// SPDX-License-Identifier: MIT
#include "safetensors.hpp"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <set>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include "error.hpp"
#include "io.hpp"

extern "C" {
#include "ckpt_update.h"
}

namespace ckpt::safetensors {

using nlohmann::json;

namespace {

constexpr size_t max_dims = 64;

[[noreturn]] void bad(const std::string &what, const std::string &why)
{
	fail(CKPT_E_INVAL, "{}: not a valid safetensors file: {}", what, why);
}

void pread_exact(int fd, void *buf, uint64_t len, uint64_t off, const std::string &path)
{
	auto *p = static_cast<uint8_t *>(buf);
	while (len) {
		ssize_t n = ::pread(fd, p, std::min<uint64_t>(len, 1u << 30), static_cast<off_t>(off));
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0)
			fail(CKPT_E_IO, "{}: read of {} bytes at {} failed: {}", path, len, off, strerror(errno));
		if (n == 0)
			fail(CKPT_E_IO, "{}: unexpected end of file at {}", path, off);
		p += n;
		off += static_cast<uint64_t>(n);
		len -= static_cast<uint64_t>(n);
	}
}

void write_all(int fd, const void *buf, uint64_t len, const std::string &path)
{
	auto *p = static_cast<const uint8_t *>(buf);
	while (len) {
		ssize_t n = ::write(fd, p, std::min<uint64_t>(len, 1u << 30));
		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0)
			fail(CKPT_E_IO, "{}: write failed: {}", path, n < 0 ? strerror(errno) : "no progress");
		p += n;
		len -= static_cast<uint64_t>(n);
	}
}

std::string printable(std::string_view s, size_t max = 80)
{
	std::string out;
	for (unsigned char c : s.substr(0, max))
		out += (c >= 0x20 && c < 0x7f) ? static_cast<char>(c) : '?';
	return out;
}

// JSON text parsed. nlohmann keeps the last of duplicate keys, which makes
// a file that names a key twice (a tensor, a field, a shard, a __metadata__
// key) ambiguous: dup gets the first key named twice in any object.
json parse_unique(std::string_view text, std::string &dup)
{
	std::vector<std::set<std::string>> keys;	// of each object being parsed
	json::parser_callback_t cb = [&](int, json::parse_event_t ev, json &parsed) {
		if (ev == json::parse_event_t::object_start)
			keys.emplace_back();
		else if (ev == json::parse_event_t::object_end)
			keys.pop_back();
		else if (ev == json::parse_event_t::key && dup.empty() &&
			 !keys.back().insert(parsed.get_ref<const std::string &>()).second)
			dup = parsed.get_ref<const std::string &>();
		return true;
	};
	return json::parse(text, cb);
}

} // namespace

unsigned dtype_bytes(std::string_view d)
{
	static const std::map<std::string_view, unsigned> sizes = {
		{"BOOL", 1}, {"U8", 1},	  {"I8", 1},   {"F8_E5M2", 1}, {"F8_E4M3", 1},
		{"I16", 2},  {"U16", 2},  {"F16", 2},  {"BF16", 2},    {"I32", 4},
		{"U32", 4},  {"F32", 4},  {"I64", 8},  {"U64", 8},     {"F64", 8},
	};
	auto it = sizes.find(d);
	return it == sizes.end() ? 0 : it->second;
}

bool is_float(std::string_view d)
{
	return d == "F32" || d == "F16" || d == "BF16" || d == "F64";
}

const TensorInfo *Header::find(std::string_view name) const
{
	for (const TensorInfo &t : tensors)
		if (t.name == name)
			return &t;
	return nullptr;
}

Header parse_header(std::string_view text, uint64_t data_bytes, const std::string &what)
{
	if (text.empty() || text.front() != '{')
		bad(what, "the header does not start with '{'");
	std::string dup;
	json j;
	try {
		j = parse_unique(text, dup);
	} catch (const json::exception &e) {
		// e.g. "ill-formed UTF-8 byte" for non-UTF-8 text
		bad(what, fmt::format("the header is not valid JSON: {}", printable(e.what(), 400)));
	}
	if (!dup.empty())
		bad(what, fmt::format("the header names '{}' twice", printable(dup)));
	if (!j.is_object())
		bad(what, "the header is not a JSON object");

	Header h;
	h.data_bytes = data_bytes;
	for (auto it = j.begin(); it != j.end(); ++it) {
		const std::string &name = it.key();
		const json &v = it.value();
		if (name == "__metadata__") {
			if (!v.is_object())
				bad(what, "__metadata__ is not an object");
			for (auto m = v.begin(); m != v.end(); ++m) {
				if (!m.value().is_string())
					bad(what, fmt::format("__metadata__ entry '{}' is not a string", printable(m.key())));
				h.metadata[m.key()] = m.value().get<std::string>();
			}
			continue;
		}
		const std::string shown = printable(name);
		if (name.empty())
			bad(what, "a tensor has an empty name");
		if (!v.is_object())
			bad(what, fmt::format("tensor '{}': entry is not an object", shown));
		TensorInfo t;
		t.name = name;
		const json *dt = v.contains("dtype") ? &v["dtype"] : nullptr;
		const json *sh = v.contains("shape") ? &v["shape"] : nullptr;
		const json *off = v.contains("data_offsets") ? &v["data_offsets"] : nullptr;
		if (!dt || !dt->is_string())
			bad(what, fmt::format("tensor '{}': no dtype string", shown));
		t.dtype = dt->get<std::string>();
		t.dtype_bytes = dtype_bytes(t.dtype);
		if (!t.dtype_bytes)
			bad(what, fmt::format("tensor '{}': unknown dtype '{}'", shown, printable(t.dtype)));
		if (!sh || !sh->is_array())
			bad(what, fmt::format("tensor '{}': no shape array", shown));
		if (sh->size() > max_dims)
			bad(what, fmt::format("tensor '{}': {} dimensions, at most {}", shown, sh->size(), max_dims));
		t.numel = 1;
		for (const json &d : *sh) {
			if (!d.is_number_unsigned())
				bad(what, fmt::format("tensor '{}': shape {} is not a list of non-negative integers",
						      shown, sh->dump()));
			uint64_t dim = d.get<uint64_t>();
			t.shape.push_back(dim);
			if (__builtin_mul_overflow(t.numel, dim, &t.numel))
				bad(what, fmt::format("tensor '{}': shape {} overflows", shown, sh->dump()));
		}
		if (!off || !off->is_array() || off->size() != 2 || !(*off)[0].is_number_unsigned() ||
		    !(*off)[1].is_number_unsigned())
			bad(what, fmt::format("tensor '{}': data_offsets must be [begin, end]", shown));
		t.begin = (*off)[0].get<uint64_t>();
		t.end = (*off)[1].get<uint64_t>();
		if (t.begin > t.end)
			bad(what, fmt::format("tensor '{}': data_offsets [{}, {}] end before they begin", shown,
					      t.begin, t.end));
		if (t.end > data_bytes)
			bad(what, fmt::format("tensor '{}': data_offsets [{}, {}] run past the end of the data "
					      "({} bytes)", shown, t.begin, t.end, data_bytes));
		uint64_t bytes;
		if (__builtin_mul_overflow(t.numel, uint64_t{t.dtype_bytes}, &bytes) || bytes != t.end - t.begin)
			bad(what, fmt::format("tensor '{}': shape {} of {} needs {} bytes, data_offsets [{}, {}] "
					      "span {}", shown, sh->dump(), t.dtype,
					      t.numel > UINT64_MAX / t.dtype_bytes ? std::string("too many")
										   : std::to_string(bytes),
					      t.begin, t.end, t.end - t.begin));
		h.tensors.push_back(std::move(t));
	}
	std::stable_sort(h.tensors.begin(), h.tensors.end(), [](const TensorInfo &a, const TensorInfo &b) {
		return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
	});
	uint64_t at = 0;
	for (const TensorInfo &t : h.tensors) {
		if (t.begin < at)
			bad(what, fmt::format("tensor '{}': data_offsets [{}, {}] overlap another tensor's "
					      "(which ends at {})", printable(t.name), t.begin, t.end, at));
		if (t.begin > at)
			bad(what, fmt::format("bytes {}..{} of the data belong to no tensor (a gap before '{}')",
					      at, t.begin, printable(t.name)));
		at = t.end;
	}
	if (at != data_bytes)
		bad(what, fmt::format("the data has {} bytes, the tensors cover {}", data_bytes, at));
	return h;
}

Reader Reader::open(const std::string &path)
{
	Reader r;
	r.path_ = path;
	struct stat st;
	r.fd_ = open_file(path, O_RDONLY, false, st);
	const int fd = r.fd_.get();
	const uint64_t size = static_cast<uint64_t>(st.st_size);
	if (size < 8)
		bad(path, fmt::format("{} bytes, too short for the header length", size));
	uint8_t len_le[8];
	pread_exact(fd, len_le, 8, 0, path);
	uint64_t n = 0;
	for (int i = 7; i >= 0; i--)
		n = n << 8 | len_le[i];
	// Both bounds before the header is read into memory.
	if (n > max_header_bytes)
		bad(path, fmt::format("header length {} exceeds the format's limit of {} bytes", n,
				      max_header_bytes));
	if (n > size - 8)
		bad(path, fmt::format("header length {} is larger than the file ({} bytes)", n, size));
	if (n < 2)
		bad(path, fmt::format("header length {} is too short for a JSON object", n));
	std::string text(n, '\0');
	pread_exact(fd, text.data(), n, 8, path);
	r.h_ = parse_header(text, size - 8 - n, path);
	r.h_.data_offset = 8 + n;
	return r;
}

void Reader::read_raw(const TensorInfo &t, void *out) const
{
	pread_exact(fd_.get(), out, t.end - t.begin, h_.data_offset + t.begin, path_);
}

std::vector<float> Reader::read_f32(const TensorInfo &t) const
{
	if (!is_float(t.dtype))
		fail(CKPT_E_DTYPE, "{}: tensor '{}' has dtype {}; only F32, F16, BF16 and F64 convert to fp32",
		     path_, t.name, t.dtype);
	std::vector<float> out(t.numel);
	if (t.dtype == "F32") {
		read_raw(t, out.data());
		return out;
	}
	// In pieces through a bounded buffer, converting as it goes.
	constexpr uint64_t piece = 1u << 20;
	std::vector<uint8_t> buf(std::min(t.end - t.begin, piece * t.dtype_bytes));
	for (uint64_t i = 0; i < t.numel;) {
		uint64_t k = std::min(piece, t.numel - i);
		pread_exact(fd_.get(), buf.data(), k * t.dtype_bytes, h_.data_offset + t.begin + i * t.dtype_bytes,
			    path_);
		for (uint64_t e = 0; e < k; e++) {
			uint32_t bits;
			if (t.dtype == "F64") {
				double d;
				std::memcpy(&d, buf.data() + e * 8, 8);
				out[i + e] = static_cast<float>(d);
				continue;
			}
			uint16_t h;
			std::memcpy(&h, buf.data() + e * 2, 2);
			bits = t.dtype == "F16" ? ckpt_f16_to_f32(h) : ckpt_bf16_to_f32(h);
			std::memcpy(&out[i + e], &bits, 4);
		}
		i += k;
	}
	return out;
}

std::map<std::string, std::string> parse_index(std::string_view text, const std::string &what)
{
	auto bad_index = [&](const std::string &why) {
		fail(CKPT_E_INVAL, "{}: not a valid safetensors index: {}", what, why);
	};
	std::string dup;
	json j;
	try {
		j = parse_unique(text, dup);
	} catch (const json::exception &e) {
		bad_index(fmt::format("not valid JSON: {}", printable(e.what(), 400)));
	}
	if (!dup.empty())
		bad_index(fmt::format("it names '{}' twice", printable(dup)));
	if (!j.is_object())
		bad_index("not a JSON object");
	for (auto it = j.begin(); it != j.end(); ++it)
		if (it.key() != "metadata" && it.key() != "weight_map")
			bad_index(fmt::format("unknown key '{}' (an index has \"metadata\" and \"weight_map\")",
					      printable(it.key())));
	if (j.contains("metadata") && !j["metadata"].is_object())
		bad_index("\"metadata\" is not an object");
	if (!j.contains("weight_map") || !j["weight_map"].is_object() || j["weight_map"].empty())
		bad_index("no \"weight_map\" object naming each tensor's shard");
	std::map<std::string, std::string> out;
	for (auto it = j["weight_map"].begin(); it != j["weight_map"].end(); ++it) {
		const std::string shown = printable(it.key());
		if (it.key().empty())
			bad_index("weight_map has an empty tensor name");
		if (!it.value().is_string())
			bad_index(fmt::format("weight_map '{}': the shard is not a string", shown));
		const std::string &f = it.value().get_ref<const std::string &>();
		const bool plain = !f.empty() && f.size() <= 255 && f != "." && f != ".." &&
				   std::none_of(f.begin(), f.end(), [](unsigned char c) { return c == '/' || c < 0x20; });
		if (!plain)
			bad_index(fmt::format("weight_map '{}': shard '{}' is not a file name in the index's folder",
					      shown, printable(f)));
		out[it.key()] = f;
	}
	return out;
}

namespace {

bool ends_with(const std::string &s, std::string_view suffix)
{
	return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

bool exists(const std::string &path)
{
	struct stat st;
	return stat(path.c_str(), &st) == 0;
}

std::string read_index(const std::string &path)
{
	struct stat st;
	Fd fd = open_file(path, O_RDONLY, false, st);
	if (static_cast<uint64_t>(st.st_size) > max_header_bytes)
		fail(CKPT_E_INVAL, "{}: not a valid safetensors index: {} bytes, at most {}", path, st.st_size,
		     max_header_bytes);
	std::string text(static_cast<size_t>(st.st_size), '\0');
	pread_exact(fd.get(), text.data(), text.size(), 0, path);
	return text;
}

} // namespace

Checkpoint Checkpoint::open(const std::string &given)
{
	Checkpoint c;
	c.path_ = given;
	struct stat st;
	if (stat(given.c_str(), &st) == 0 && S_ISDIR(st.st_mode)) {
		const std::string single = given + "/model.safetensors", index = single + ".index.json";
		const bool s = exists(single), i = exists(index);
		if (s && i)
			fail(CKPT_E_INVAL, "{} holds both model.safetensors and model.safetensors.index.json: "
					   "give the one to read", given);
		if (!s && !i)
			fail(CKPT_E_INVAL, "{} is a folder without model.safetensors or "
					   "model.safetensors.index.json", given);
		c.path_ = s ? single : index;
	}
	if (!ends_with(c.path_, ".json")) {
		c.files_.push_back(Reader::open(c.path_));
		c.h_ = c.files_[0].header();
		return c;
	}
	const std::map<std::string, std::string> map = parse_index(read_index(c.path_), c.path_);
	const size_t slash = c.path_.rfind('/');
	const std::string dir = slash == std::string::npos ? "" : c.path_.substr(0, slash + 1);
	std::vector<std::string> shards;
	for (const auto &[name, shard] : map)
		shards.push_back(shard);
	std::sort(shards.begin(), shards.end());
	shards.erase(std::unique(shards.begin(), shards.end()), shards.end());
	std::map<std::string, std::string> meta_from;	// which shard set a metadata key
	size_t found = 0;
	for (uint32_t k = 0; k < shards.size(); k++) {
		c.files_.push_back(Reader::open(dir + shards[k]));
		const Reader &r = c.files_.back();
		for (TensorInfo t : r.header().tensors) {
			auto it = map.find(t.name);
			if (it == map.end())
				fail(CKPT_E_INVAL, "{}: shard {} has tensor '{}', which the index does not name", c.path_,
				     shards[k], printable(t.name));
			if (it->second != shards[k])
				fail(CKPT_E_INVAL, "{}: tensor '{}' is in shard {}, the index names shard {}", c.path_,
				     printable(t.name), shards[k], it->second);
			t.file = k;
			c.h_.tensors.push_back(std::move(t));
			found++;
		}
		for (const auto &[key, value] : r.header().metadata) {
			auto [it, fresh] = c.h_.metadata.emplace(key, value);
			if (!fresh && it->second != value)
				fail(CKPT_E_INVAL, "{}: shards {} and {} disagree on __metadata__ '{}'", c.path_,
				     meta_from[key], shards[k], printable(key));
			meta_from.emplace(key, shards[k]);
		}
	}
	if (found != map.size())
		for (const auto &[name, shard] : map)
			if (!c.h_.find(name))
				fail(CKPT_E_INVAL, "{}: the index puts tensor '{}' in shard {}, which does not have it",
				     c.path_, printable(name), shard);
	return c;
}

Writer::Writer(const std::string &path, std::vector<Entry> entries,
	       const std::map<std::string, std::string> &metadata, bool force)
	: path_(path), entries_(std::move(entries)), force_(force),
	  tmp_((claim_output(path, force), path), "tmp", O_WRONLY)	// refused before any work
{
	json h = json::object();
	if (!metadata.empty())
		h["__metadata__"] = metadata;
	uint64_t at = 0;
	std::set<std::string> names;
	for (const Entry &e : entries_) {
		unsigned b = dtype_bytes(e.dtype);
		if (!b)
			fail(CKPT_E_DTYPE, "{}: unknown dtype '{}'", path, e.dtype);
		if (e.name == "__metadata__" || !names.insert(e.name).second)
			fail(CKPT_E_INVAL, "{}: tensor name '{}' used twice or reserved", path, e.name);
		uint64_t n = 1;
		for (uint64_t d : e.shape)
			n *= d;
		sizes_.push_back(n * b);
		h[e.name] = {{"dtype", e.dtype}, {"shape", e.shape}, {"data_offsets", {at, at + n * b}}};
		at += n * b;
	}
	std::string text = h.dump();
	// The data buffer starts 8-byte aligned: pad the header with spaces.
	text.append((8 - text.size() % 8) % 8, ' ');
	uint8_t len_le[8];
	for (int i = 0; i < 8; i++)
		len_le[i] = static_cast<uint8_t>(static_cast<uint64_t>(text.size()) >> (8 * i));
	write_all(tmp_.fd(), len_le, 8, tmp_.path());
	write_all(tmp_.fd(), text.data(), text.size(), tmp_.path());
}

void Writer::write(const void *data, uint64_t bytes)
{
	if (next_ >= entries_.size() || bytes != sizes_[next_])
		fail(CKPT_E_SIZE, "{}: data of {} bytes for entry {} does not match its header", path_, bytes,
		     next_);
	write_all(tmp_.fd(), data, bytes, tmp_.path());
	next_++;
}

void Writer::finish()
{
	if (next_ != entries_.size())
		fail(CKPT_E_SIZE, "{}: {} of {} tensors written", path_, next_, entries_.size());
	if (fsync(tmp_.fd()) < 0)
		fail(CKPT_E_IO, "{}: fsync failed: {}", tmp_.path(), strerror(errno));
	tmp_.close();
	// Checked again, as it is now, and claimed until the rename is done: a
	// new path is still never replaced if it has appeared meanwhile.
	const Fd held = claim_output(path_, force_);
	if (held)
		tmp_.rename_over(path_, true);
	else
		tmp_.link_new(path_, true);
}

} // namespace ckpt::safetensors
