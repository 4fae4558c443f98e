// SPDX-License-Identifier: MIT
#include "manifest.hpp"

#include <algorithm>
#include <cctype>
#include <endian.h>
#include <cmath>
#include <limits>
#include <set>
#include <stdexcept>

#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include "ckpt.h"
#include "ckpt_admin.h"
#include "error.hpp"

namespace ckpt {

namespace {
constexpr size_t max_dims = CKPT_MAX_DIMS;
constexpr size_t max_name = 255;

uint64_t align_up(uint64_t v, uint64_t a) { return (v + a - 1) / a * a; }
} // namespace

const char *dtype_name(uint32_t dtype) { return ckpt_dtype_name(dtype); }

void check_hparams(const GroupHparams &g, const std::string &what)
{
	auto bad = [&](const char *field, double v, const char *rule) {
		fail(CKPT_E_HPARAM, "{}: {} = {} is invalid: it must be {}", what, field, v, rule);
	};
	if (!(g.lr >= 0) || !std::isfinite(g.lr))
		bad("lr", g.lr, "finite and >= 0");
	if (!(g.eps >= 0) || !std::isfinite(g.eps))
		bad("eps", g.eps, "finite and >= 0");
	if (!(g.beta1 >= 0 && g.beta1 < 1))
		bad("beta1", g.beta1, "in [0, 1)");
	if (!(g.beta2 >= 0 && g.beta2 < 1))
		bad("beta2", g.beta2, "in [0, 1)");
	if (!(g.weight_decay >= 0) || !std::isfinite(g.weight_decay))
		bad("weight_decay", g.weight_decay, "finite and >= 0");
}

uint64_t numel_of(const std::vector<uint64_t> &shape, const std::string &name)
{
	if (shape.size() > max_dims)
		fail(CKPT_E_INVAL, "tensor '{}': {} dimensions, at most {}", name, shape.size(), max_dims);
	uint64_t n = 1;
	for (uint64_t d : shape) {
		if (d == 0)
			fail(CKPT_E_INVAL, "tensor '{}': empty dimension", name);
		if (__builtin_mul_overflow(n, d, &n) || n > (uint64_t{1} << 40))
			fail(CKPT_E_INVAL, "tensor '{}': too many elements", name);
	}
	return n;
}

[[noreturn]] static void bad(const std::string &why)
{
	fail(CKPT_E_MANIFEST, "tensor manifest: {}", why);
}

namespace {

using nlohmann::json;

// A manifest's JSON is read strictly: every object has only the keys it may
// have, the required ones are there, and every value has its type. A
// mistake is reported with its JSON path ($.tensors[2].shape) in the
// project's words, as std::invalid_argument that the caller prefixes with
// what it read. nlohmann's own exceptions never reach a user: their text
// ("[json.exception.out_of_range.403] key 'shape' not found") names neither
// the file nor the place.
[[noreturn]] void invalid(const std::string &path, const std::string &why)
{
	throw std::invalid_argument(fmt::format("{}: {}", path, why));
}

// A value as an error message shows it: short, escaped.
std::string shown(const json &v)
{
	std::string s = v.dump(-1, ' ', true, json::error_handler_t::replace);
	return s.size() > 40 ? s.substr(0, 37) + "..." : s;
}

std::string path_of(const std::string &parent, std::string_view key)
{
	bool plain = !key.empty() && !isdigit(static_cast<unsigned char>(key[0]));
	for (unsigned char c : key)
		plain = plain && (isalnum(c) || c == '_');
	return plain ? fmt::format("{}.{}", parent, key) : fmt::format("{}[{}]", parent, shown(json(std::string(key))));
}

// An object with a fixed set of keys.
class Fields {
public:
	Fields(const json &v, std::string path, std::initializer_list<std::string_view> known)
		: v_(v), path_(std::move(path))
	{
		if (!v.is_object())
			invalid(path_, fmt::format("must be an object, not {}", shown(v)));
		for (const auto &[key, value] : v.items())
			if (std::find(known.begin(), known.end(), key) == known.end())
				invalid(path_of(path_, key),
					fmt::format("unknown key '{}' (known keys here: {})", key, fmt::join(known, ", ")));
	}
	const json *find(const char *key) const
	{
		auto it = v_.find(key);
		return it == v_.end() ? nullptr : &*it;
	}
	const json &at(const char *key) const
	{
		if (const json *v = find(key))
			return *v;
		invalid(path_, fmt::format("missing key '{}'", key));
	}
	std::string path(const char *key) const { return path_of(path_, key); }

private:
	const json &v_;
	std::string path_;
};

// A JSON integer in 0..max. nlohmann's get<unsigned>() takes a float or a
// negative number too, and converts it: 1.5 becomes 1, -1 wraps, and a float
// beyond the type's range is undefined behaviour.
template <typename T> T json_uint(const json &v, const std::string &path)
{
	if (!v.is_number_unsigned() || v.get<uint64_t>() > std::numeric_limits<T>::max())
		invalid(path, fmt::format("must be an integer from 0 to {}, not {}", std::numeric_limits<T>::max(),
					  shown(v)));
	return static_cast<T>(v.get<uint64_t>());
}

std::string json_string(const json &v, const std::string &path)
{
	if (!v.is_string())
		invalid(path, fmt::format("must be a string, not {}", shown(v)));
	return v.get<std::string>();
}

std::vector<uint64_t> json_shape(const json &v, const std::string &path)
{
	if (!v.is_array())
		invalid(path, fmt::format("must be an array of dimensions, not {}", shown(v)));
	std::vector<uint64_t> shape;
	for (size_t i = 0; i < v.size(); i++)
		shape.push_back(json_uint<uint64_t>(v[i], fmt::format("{}[{}]", path, i)));
	return shape;
}

const json &json_tensors(const Fields &f)
{
	const json &ts = f.at("tensors");
	if (!ts.is_array() || ts.empty())
		invalid(f.path("tensors"), fmt::format("must be a non-empty array of tensors, not {}", shown(ts)));
	return ts;
}

} // namespace

static void check_name(const std::string &name)
{
	if (name.empty() || name.size() > max_name)
		fail(CKPT_E_INVAL, "tensor name must have 1 to {} bytes: '{}'", max_name, name);
	for (unsigned char c : name)
		if (c < 0x20 || c == 0x7f)
			fail(CKPT_E_INVAL, "tensor name has a control character: '{}'", name);
}

// A group's hyperparameters in JSON: every key, of its type, and no other.
static GroupHparams json_hparams(const nlohmann::json &j, const std::string &what)
{
	static const std::set<std::string> keys = {"lr", "betas", "eps", "weight_decay", "adam_l2"};
	if (!j.is_object())
		throw std::invalid_argument(fmt::format("{}: not an object", what));
	for (const auto &[k, v] : j.items())
		if (!keys.count(k))
			throw std::invalid_argument(fmt::format("{}: unknown key '{}'", what, k));
	auto num = [&](const nlohmann::json &v, const char *key) {
		if (!v.is_number())
			throw std::invalid_argument(fmt::format("{}: {} must be a number, not {}", what, key, v.dump()));
		return v.get<double>();
	};
	for (const char *k : {"lr", "betas", "eps", "weight_decay", "adam_l2"})
		if (!j.contains(k))
			throw std::invalid_argument(fmt::format("{}: no {}", what, k));
	GroupHparams g;
	g.lr = num(j["lr"], "lr");
	const nlohmann::json &b = j["betas"];
	if (!b.is_array() || b.size() != 2)
		throw std::invalid_argument(fmt::format("{}: betas must be [beta1, beta2], not {}", what, b.dump()));
	g.beta1 = num(b[0], "beta1");
	g.beta2 = num(b[1], "beta2");
	g.eps = num(j["eps"], "eps");
	g.weight_decay = num(j["weight_decay"], "weight_decay");
	if (!j["adam_l2"].is_boolean())
		throw std::invalid_argument(fmt::format("{}: adam_l2 must be true or false", what));
	g.adam_l2 = j["adam_l2"].get<bool>();
	try {
		check_hparams(g, what);
	} catch (const Error &e) {
		throw std::invalid_argument(e.what());
	}
	return g;
}

static std::vector<GroupHparams> json_groups(const nlohmann::json &v)
{
	if (!v.is_array() || v.empty() || v.size() > CKPT_MAX_GROUPS)
		throw std::invalid_argument(fmt::format("\"groups\" must be an array of 1 to {} groups",
							CKPT_MAX_GROUPS));
	std::vector<GroupHparams> out;
	for (size_t i = 0; i < v.size(); i++)
		out.push_back(json_hparams(v[i], fmt::format("group {}", i)));
	return out;
}

static nlohmann::json groups_json(const std::vector<GroupHparams> &groups)
{
	nlohmann::json a = nlohmann::json::array();
	for (const GroupHparams &g : groups)
		a.push_back({{"lr", g.lr}, {"betas", {g.beta1, g.beta2}}, {"eps", g.eps},
			     {"weight_decay", g.weight_decay}, {"adam_l2", g.adam_l2}});
	return a;
}

void Layout::add(std::string name, std::vector<uint64_t> shape, uint32_t group)
{
	check_name(name);
	if (group >= CKPT_MAX_GROUPS)
		fail(CKPT_E_INVAL, "tensor '{}': group {} out of range (0..{})", name, group,
		     CKPT_MAX_GROUPS - 1);
	for (const Tensor &t : specs_)
		if (t.name == name)
			fail(CKPT_E_INVAL, "tensor '{}' added twice", name);
	Tensor t;
	t.numel = numel_of(shape, name);
	t.name = std::move(name);
	t.shape = std::move(shape);
	t.group = group;
	specs_.push_back(std::move(t));
}

uint32_t Layout::digest() const
{
	uint32_t crc = ~0u;
	for (const Tensor &t : specs_) {
		crc = ckpt_crc32c_raw(crc, t.name.c_str(), t.name.size() + 1);
		for (uint64_t d : t.shape) {
			const uint64_t le = htole64(d);
			crc = ckpt_crc32c_raw(crc, &le, sizeof(le));
		}
		const uint32_t end = htole32(0xffffffffu), group = htole32(t.group);
		crc = ckpt_crc32c_raw(crc, &end, sizeof(end));
		crc = ckpt_crc32c_raw(crc, &group, sizeof(group));
	}
	return ~crc;
}

std::vector<uint64_t> shard_bounds(const std::vector<uint64_t> &numels, uint32_t world, uint32_t rule)
{
	if (rule != CKPT_SHARD_RULE_EVEN && rule != CKPT_SHARD_RULE_Q8)
		fail(CKPT_E_INVAL, "shard rule {} is none of dm-ckpt's ({} even, {} aligned to 8-bit blocks)", rule,
		     CKPT_SHARD_RULE_EVEN, CKPT_SHARD_RULE_Q8);
	uint64_t n = 0;
	for (uint64_t k : numels)
		n += k;
	if (world == 0 || n < world)
		fail(CKPT_E_INVAL, "{} params cannot be shared by {} ranks", n, world);
	std::vector<uint64_t> bounds(world + 1, n);
	bounds[0] = 0;
	size_t i = 0;
	uint64_t off = 0;	// of param i
	for (uint32_t r = 1; r < world; r++) {
		uint64_t b = static_cast<uint64_t>(static_cast<unsigned __int128>(n) * r / world);
		if (rule == CKPT_SHARD_RULE_Q8) {
			while (b >= off + numels[i])
				off += numels[i++];
			b = off + (b - off) / CKPT_Q8_BLOCK * CKPT_Q8_BLOCK;
		}
		bounds[r] = b;
	}
	for (uint32_t r = 0; r < world; r++)
		if (bounds[r] >= bounds[r + 1])
			fail(CKPT_E_INVAL, "{} params over {} ranks leave rank {} none (a param is cut only at "
					   "multiples of {} params from its start)", n, world, r, CKPT_Q8_BLOCK);
	return bounds;
}

Layout Layout::shard(uint32_t rank, uint32_t world, uint32_t rule) const
{
	if (shard_)
		fail(CKPT_E_INVAL, "the layout is rank {}'s share of {} already", shard_->rank, shard_->world);
	if (rank >= world)
		fail(CKPT_E_INVAL, "rank {} of {} ranks", rank, world);
	std::vector<uint64_t> numels;
	for (const Tensor &t : specs_)
		numels.push_back(t.numel);
	const std::vector<uint64_t> bounds = shard_bounds(numels, world, rule);
	const uint64_t lo = bounds[rank], hi = bounds[rank + 1];
	Layout out;
	uint64_t off = 0;
	uint32_t max_group = 0;
	std::set<std::string> names;
	for (const Tensor &t : specs_) {
		const uint64_t first = off;
		off += t.numel;
		if (off <= lo || first >= hi)
			continue;
		const uint64_t a = std::max(lo, first) - first, b = std::min(hi, off) - first;
		Tensor p = t;
		if (a != 0 || b != t.numel) {
			p.name = fmt::format("{}[{}:{}]", t.name, a, b);
			check_name(p.name);
			p.shape = {b - a};
			p.numel = b - a;
			p.piece = Piece{t.name, t.shape, a};
		}
		if (!names.insert(p.name).second)
			fail(CKPT_E_INVAL, "tensor '{}' is both a param and a piece of one", p.name);
		max_group = std::max(max_group, p.group);
		out.specs_.push_back(std::move(p));
	}
	if (!hparams_.empty())
		out.hparams_.assign(hparams_.begin(), hparams_.begin() + max_group + 1);
	if (world > 1) {
		out.shard_ = ShardRecord{rank, world, rule, off, digest()};
		out.bounds_ = bounds;
	}
	return out;
}

Layout::Placed Layout::place(uint32_t chunk_shift, uint32_t dtype) const
{
	if (specs_.empty())
		fail(CKPT_E_INVAL, "the layout has no tensors");
	if (chunk_shift < CKPT_MIN_CHUNK_SHIFT || chunk_shift > CKPT_MAX_CHUNK_SHIFT)
		fail(CKPT_E_GEOMETRY, "chunk_params must be a power of two from {} to {}",
		     1u << CKPT_MIN_CHUNK_SHIFT, 1u << CKPT_MAX_CHUNK_SHIFT);
	const uint64_t cp = uint64_t{1} << chunk_shift;
	Placed out;
	out.tensors = specs_;
	uint64_t off = 0;
	uint32_t max_group = 0;
	for (size_t i = 0; i < out.tensors.size(); i++) {
		Tensor &t = out.tensors[i];
		if (i > 0 && t.group != out.tensors[i - 1].group)
			off = align_up(off, cp);
		else
			off = align_up(off, CKPT_TENSOR_ALIGN);
		t.offset = off;
		off += t.numel;
		max_group = std::max(max_group, t.group);
	}
	const uint64_t n_params = align_up(off, cp);
	for (size_t i = 0; i < out.tensors.size(); i++) {
		uint64_t end = i + 1 < out.tensors.size() ? out.tensors[i + 1].offset : n_params;
		out.tensors[i].extent = end - out.tensors[i].offset;
	}
	const uint64_t n_chunks = n_params >> chunk_shift;
	if (n_chunks > CKPT_MAX_CHUNKS)
		fail(CKPT_E_GEOMETRY, "{} params need {} chunks, at most {}", n_params, n_chunks,
		     CKPT_MAX_CHUNKS);
	out.group_table.assign(n_chunks, 0);
	for (const Tensor &t : out.tensors)
		for (uint64_t c = t.offset >> chunk_shift; c <= (t.offset + t.extent - 1) >> chunk_shift; c++)
			out.group_table[c] = static_cast<uint8_t>(t.group);

	if (!hparams_.empty() && hparams_.size() != max_group + 1)
		fail(CKPT_E_INVAL, "hyperparameters for {} groups, but the tensors use groups 0 to {}",
		     hparams_.size(), max_group);
	std::string manifest = Manifest::encode(out.tensors, dtype, cp, hparams_, shard_);
	out.geo = {};
	out.geo.n_chunks = static_cast<uint32_t>(n_chunks);
	out.geo.chunk_shift = chunk_shift;
	out.geo.n_groups = max_group + 1;
	out.geo.dtype = dtype;
	out.geo.optimizer = CKPT_OPT_ADAM;
	out.geo.manifest_bytes = static_cast<uint32_t>(align_up(manifest.size(), CKPT_BLOCK));
	if (manifest.size() > CKPT_MANIFEST_MAX)
		fail(CKPT_E_MANIFEST, "the tensor manifest needs {} bytes, at most {}", manifest.size(),
		     CKPT_MANIFEST_MAX);
	return out;
}

Manifest::Manifest(std::vector<Tensor> tensors, std::vector<GroupHparams> hparams,
		   std::optional<ShardRecord> shard)
	: tensors_(std::move(tensors)), hparams_(std::move(hparams)), shard_(std::move(shard))
{
	for (size_t i = 0; i < tensors_.size(); i++)
		index_.emplace(tensors_[i].name, i);
}

const Tensor &Manifest::find(std::string_view name) const
{
	auto it = index_.find(std::string(name));
	if (it == index_.end())
		fail(CKPT_E_NAME, "no tensor named '{}' on this device", name);
	return tensors_[it->second];
}

std::string Manifest::encode(const std::vector<Tensor> &tensors, uint32_t dtype, uint64_t chunk_params,
			    const std::vector<GroupHparams> &hparams, const std::optional<ShardRecord> &shard)
{
	nlohmann::json j;
	j["format"] = "dm-ckpt-manifest";
	j["version"] = 1;
	j["dtype"] = dtype_name(dtype);
	j["chunk_params"] = chunk_params;
	auto &arr = j["tensors"] = nlohmann::json::array();
	for (const Tensor &t : tensors) {
		arr.push_back({{"name", t.name}, {"shape", t.shape}, {"group", t.group},
			       {"offset", t.offset}, {"numel", t.numel}});
		if (t.piece)
			arr.back()["piece"] = {{"param", t.piece->param}, {"shape", t.piece->shape},
					       {"begin", t.piece->begin}};
	}
	// absent rather than empty: older readers see the manifest they know
	if (!hparams.empty())
		j["groups"] = groups_json(hparams);
	if (shard)
		j["shard"] = {{"rank", shard->rank}, {"world", shard->world}, {"rule", shard->rule},
			      {"params", shard->params}, {"digest", shard->digest}};
	return j.dump();
}

// A piece's record: its name says the same, and it lies inside its param.
static Piece json_piece(const nlohmann::json &v, const std::string &path, const Tensor &t)
{
	const Fields f(v, path, {"param", "shape", "begin"});
	Piece p;
	p.param = json_string(f.at("param"), f.path("param"));
	p.shape = json_shape(f.at("shape"), f.path("shape"));
	p.begin = json_uint<uint64_t>(f.at("begin"), f.path("begin"));
	const uint64_t whole = numel_of(p.shape, p.param);
	if (t.shape.size() != 1 || p.begin > whole || t.numel > whole - p.begin ||
	    t.name != fmt::format("{}[{}:{}]", p.param, p.begin, p.begin + t.numel))
		invalid(path, fmt::format("'{}' is not params {}.. of '{}' (shape {})", t.name, p.begin, p.param,
					  fmt::join(p.shape, "x")));
	return p;
}

static ShardRecord json_shard(const nlohmann::json &v, const std::string &path, const std::vector<Tensor> &tensors)
{
	const Fields f(v, path, {"rank", "world", "rule", "params", "digest"});
	ShardRecord s;
	s.rank = json_uint<uint32_t>(f.at("rank"), f.path("rank"));
	s.world = json_uint<uint32_t>(f.at("world"), f.path("world"));
	s.rule = json_uint<uint32_t>(f.at("rule"), f.path("rule"));
	s.params = json_uint<uint64_t>(f.at("params"), f.path("params"));
	s.digest = json_uint<uint32_t>(f.at("digest"), f.path("digest"));
	uint64_t held = 0;
	for (const Tensor &t : tensors)
		held += t.numel;
	if (s.world < 2 || s.rank >= s.world || held > s.params ||
	    (s.rule != CKPT_SHARD_RULE_EVEN && s.rule != CKPT_SHARD_RULE_Q8))
		invalid(path, fmt::format("rank {} of {} by rule {} holding {} of {} params is no rank's share",
					  s.rank, s.world, s.rule, held, s.params));
	return s;
}

Manifest Manifest::decode(std::string_view text, const struct ckpt_regions &regions,
			  const struct ckpt_geometry &geo, const std::vector<uint8_t> &group_table)
{
	const json j = json::parse(text, nullptr, false);
	if (j.is_discarded() || !j.is_object())
		bad("not a JSON object");
	try {
		const Fields top(j, "$", {"format", "version", "dtype", "chunk_params", "tensors", "groups", "shard"});
		if (json_string(top.at("format"), top.path("format")) != "dm-ckpt-manifest" ||
		    json_uint<uint32_t>(top.at("version"), top.path("version")) != 1)
			bad("unknown format or version");
		if (json_string(top.at("dtype"), top.path("dtype")) != dtype_name(geo.dtype) ||
		    json_uint<uint64_t>(top.at("chunk_params"), top.path("chunk_params")) != regions.chunk_params)
			bad("dtype or chunk size disagree with the superblock");
		const json &arr = json_tensors(top);
		std::vector<Tensor> tensors;
		uint64_t next = 0;
		for (size_t i = 0; i < arr.size(); i++) {
			const Fields e(arr[i], fmt::format("$.tensors[{}]", i),
				       {"name", "shape", "group", "offset", "numel", "piece"});
			Tensor t;
			t.name = json_string(e.at("name"), e.path("name"));
			check_name(t.name);
			t.shape = json_shape(e.at("shape"), e.path("shape"));
			t.group = json_uint<uint32_t>(e.at("group"), e.path("group"));
			t.offset = json_uint<uint64_t>(e.at("offset"), e.path("offset"));
			t.numel = json_uint<uint64_t>(e.at("numel"), e.path("numel"));
			if (numel_of(t.shape, t.name) != t.numel)
				bad(fmt::format("'{}': numel disagrees with its shape", t.name));
			if (const json *v = e.find("piece"))
				t.piece = json_piece(*v, e.path("piece"), t);
			if (t.group >= geo.n_groups)
				bad(fmt::format("'{}': group {} out of range", t.name, t.group));
			if (t.offset < next || t.offset % CKPT_TENSOR_ALIGN ||
			    t.numel > regions.n_params || t.offset > regions.n_params - t.numel)
				bad(fmt::format("'{}': offset {} out of order or out of range", t.name, t.offset));
			if (!tensors.empty())
				tensors.back().extent = t.offset - tensors.back().offset;
			next = t.offset + t.numel;
			tensors.push_back(std::move(t));
		}
		if (tensors.front().offset != 0)
			bad("the first tensor does not start at param 0");
		tensors.back().extent = regions.n_params - tensors.back().offset;
		for (const Tensor &t : tensors) {
			uint64_t first = t.offset / regions.chunk_params;
			uint64_t last = (t.offset + t.extent - 1) / regions.chunk_params;
			for (uint64_t c = first; c <= last; c++)
				if (group_table[c] != t.group)
					bad(fmt::format("'{}': group {} disagrees with the group table (chunk {})",
							t.name, t.group, c));
		}
		std::vector<GroupHparams> hparams;
		if (const json *v = top.find("groups")) {
			hparams = json_groups(*v);
			if (hparams.size() != geo.n_groups)
				bad(fmt::format("hyperparameters for {} groups, the image has {}", hparams.size(),
						geo.n_groups));
		}
		std::optional<ShardRecord> shard;
		if (const json *v = top.find("shard"))
			shard = json_shard(*v, top.path("shard"), tensors);
		Manifest m(std::move(tensors), std::move(hparams), std::move(shard));
		if (m.index_.size() != m.tensors_.size())
			bad("duplicate tensor names");
		return m;
	} catch (const std::invalid_argument &e) {
		bad(e.what());
	}
}

LayoutFile parse_layout_json(std::string_view text, const std::string &what)
{
	const json j = json::parse(text, nullptr, false);
	if (j.is_discarded() || !j.is_object())
		fail(CKPT_E_MANIFEST, "{}: not a JSON object", what);
	LayoutFile m;
	try {
		const Fields top(j, "$", {"dtype", "chunk_params", "tensors", "groups"});
		if (const json *v = top.find("dtype"))
			m.dtype = json_string(*v, top.path("dtype"));
		if (const json *v = top.find("chunk_params"))
			m.chunk_params = json_uint<uint32_t>(*v, top.path("chunk_params"));
		const json &ts = json_tensors(top);
		for (size_t i = 0; i < ts.size(); i++) {
			const Fields t(ts[i], fmt::format("$.tensors[{}]", i), {"name", "shape", "group"});
			const std::string name = json_string(t.at("name"), t.path("name"));
			const json *group = t.find("group");
			try {
				m.layout.add(name, json_shape(t.at("shape"), t.path("shape")),
					     group ? json_uint<uint32_t>(*group, t.path("group")) : 0);
			} catch (const std::invalid_argument &e) {
				fail(CKPT_E_MANIFEST, "{}: tensor '{}': {}", what, name, e.what());
			}
		}
		if (const json *v = top.find("groups"))
			m.layout.set_hparams(json_groups(*v));
	} catch (const std::invalid_argument &e) {
		fail(CKPT_E_MANIFEST, "{}: {}", what, e.what());
	}
	return m;
}

} // namespace ckpt
