// SPDX-License-Identifier: MIT
// ckpt_reshard: one rank's image of a sharded run's state on another number
// of ranks, made from the run's images.
#include "reshard.hpp"

#include <algorithm>
#include <cstring>
#include <optional>
#include <regex>

#include <sys/stat.h>
#include <unistd.h>

#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include "admin.hpp"
#include "device.hpp"
#include "engine.hpp"
#include "error.hpp"
#include "format.hpp"
#include "image.hpp"

namespace ckpt {

namespace {

using nlohmann::json;

// One input image, opened read-only, and the superblock it is read at.
struct Source {
	std::string path;	// as given
	Image img;
	struct ckpt_sb sb;
	Buffer bounce;

	explicit Source(const std::string &p)
		: path(p), img(Image::open(backing_path(p), false)), sb(img.sb), bounce(sb.regions.record_bytes)
	{
	}
};

// A tensor of an input that holds params [begin, begin + numel) of a param.
struct Part {
	Source *src;
	const Tensor *t;
	uint64_t begin;
};

// A param of the whole layout and the parts of it the inputs hold, in order.
struct Param {
	std::string name;
	std::optional<std::vector<uint64_t>> shape;	// unknown: cut by a pre-0.4 image
	uint32_t group = 0;
	uint64_t numel = 0;	// held by the parts so far
	std::vector<Part> parts;
};

// A pre-0.4 image names a piece "NAME[a:b]" and records nothing else.
std::optional<Piece> legacy_piece(const Tensor &t)
{
	static const std::regex re(R"(^(.+)\[([0-9]{1,19}):([0-9]{1,19})\]$)");
	std::smatch m;
	if (t.shape.size() != 1 || !std::regex_match(t.name, m, re))
		return std::nullopt;
	const uint64_t a = std::stoull(m[2]), b = std::stoull(m[3]);
	if (b <= a || b - a != t.numel)
		return std::nullopt;
	return Piece{m[1].str(), {}, a};
}

// The inputs in rank order: by their shard records, or (pre-0.4 images, none
// recorded) in the order given.
std::vector<Source *> rank_order(const std::vector<std::unique_ptr<Source>> &in)
{
	const auto &first = in[0]->img.manifest.shard();
	std::vector<Source *> order(in.size(), nullptr);
	for (size_t i = 0; i < in.size(); i++) {
		const auto &s = in[i]->img.manifest.shard();
		if (!first && !s) {
			order[i] = in[i].get();
			continue;
		}
		if (!first || !s)
			fail(CKPT_E_STATE, "reshard: {} {} a rank of a sharded run and {} {}: not one run's images",
			     in[0]->path, first ? "is" : "is not", in[i]->path, s ? "is" : "is not");
		if (s->world != in.size())
			fail(CKPT_E_STATE, "reshard: {} is rank {} of {} ranks, and {} images are given: give every "
					   "rank's image", in[i]->path, s->rank, s->world, in.size());
		if (s->params != first->params || s->digest != first->digest || s->rule != first->rule)
			fail(CKPT_E_STATE, "reshard: {} and {} hold shares of different layouts (another run or "
					   "model)", in[0]->path, in[i]->path);
		if (order[s->rank])
			fail(CKPT_E_STATE, "reshard: {} and {} are both rank {}", order[s->rank]->path, in[i]->path,
			     s->rank);
		order[s->rank] = in[i].get();
	}
	return order;
}

// Every input at one committed step with one blob, of one format.
void check_alike(const std::vector<Source *> &order)
{
	const struct ckpt_sb &a = order[0]->sb;
	constexpr uint32_t formats = CKPT_FEATURE_INCOMPAT_Q8 | CKPT_FEATURE_INCOMPAT_BF16M;
	for (Source *s : order) {
		const struct ckpt_sb &b = s->sb;
		if (b.committed_step != a.committed_step) {
			std::vector<uint64_t> steps;
			for (Source *o : order)
				steps.push_back(o->sb.committed_step);
			fail(CKPT_E_STATE, "reshard: the images are at committed steps {} (in rank order): open the "
					   "run on its own ranks once (a rank one step ahead rolls back), then reshard",
			     steps);
		}
		if (b.blob_len != a.blob_len || memcmp(b.blob, a.blob, a.blob_len) != 0)
			fail(CKPT_E_STATE, "reshard: {} and {} hold different trainer blobs at step {}: not one run's "
					   "images", order[0]->path, s->path, a.committed_step);
		if (b.geo.dtype != a.geo.dtype || b.regions.chunk_params != a.regions.chunk_params ||
		    (b.feature_incompat & formats) != (a.feature_incompat & formats))
			fail(CKPT_E_STATE, "reshard: {} and {} differ in dtype, chunk size or state format",
			     order[0]->path, s->path);
	}
}

// The whole layout's params from the inputs' tensors in rank order; shapes
// the inputs do not record come from given (the caller's whole layout).
std::vector<Param> whole_params(const std::vector<Source *> &order, const Layout *given)
{
	std::vector<Param> params;
	for (Source *s : order) {
		const bool legacy = !s->img.manifest.shard();
		for (const Tensor &t : s->img.manifest.tensors()) {
			std::optional<Piece> piece = legacy ? legacy_piece(t) : t.piece;
			if (piece && piece->begin > 0) {
				Param *last = params.empty() ? nullptr : &params.back();
				if (!last || last->name != piece->param || last->numel != piece->begin)
					fail(CKPT_E_STATE, "reshard: {}: '{}' does not continue the params before it (a rank's "
							   "image missing, or the images of different runs)", s->path, t.name);
				last->parts.push_back({s, &t, piece->begin});
				last->numel += t.numel;
				continue;
			}
			Param p;
			p.name = piece ? piece->param : t.name;
			if (!piece)
				p.shape = t.shape;
			else if (!piece->shape.empty())
				p.shape = piece->shape;
			p.group = t.group;
			p.numel = t.numel;
			p.parts.push_back({s, &t, 0});
			params.push_back(std::move(p));
		}
	}
	if (given) {
		const auto &g = given->tensors();
		if (g.size() != params.size())
			fail(CKPT_E_INVAL, "reshard: the layout given has {} params, the images {}", g.size(),
			     params.size());
		for (size_t i = 0; i < g.size(); i++) {
			if (g[i].name != params[i].name || g[i].numel != params[i].numel || g[i].group != params[i].group)
				fail(CKPT_E_INVAL, "reshard: param {} of the layout given is '{}' ({} params, group {}), "
						   "of the images '{}' ({} params, group {})", i, g[i].name, g[i].numel,
				     g[i].group, params[i].name, params[i].numel, params[i].group);
			if (params[i].shape && *params[i].shape != g[i].shape)
				fail(CKPT_E_INVAL, "reshard: '{}' has shape {} in the images and {} in the layout given",
				     g[i].name, *params[i].shape, g[i].shape);
			params[i].shape = g[i].shape;
		}
	}
	for (const Param &p : params) {
		if (!p.shape)
			fail(CKPT_E_INVAL, "reshard: '{}' is cut into pieces by images of dm-ckpt before 0.4, which do "
					   "not record its shape: give the whole layout (ckptctl reshard --params FILE)",
			     p.name);
		if (numel_of(*p.shape, p.name) != p.numel)
			fail(CKPT_E_STATE, "reshard: the images hold {} of the {} params of '{}' (a rank's image "
					   "missing, or the images of different runs)", p.numel,
			     numel_of(*p.shape, p.name), p.name);
		for (const Part &part : p.parts)
			if (part.t->group != p.group)
				fail(CKPT_E_STATE, "reshard: the pieces of '{}' are in different groups", p.name);
	}
	return params;
}

// The hyperparameters the inputs record: the longest list, which every
// other one begins.
std::vector<GroupHparams> whole_hparams(const std::vector<Source *> &order)
{
	std::vector<GroupHparams> all;
	for (Source *s : order) {
		const auto &h = s->img.manifest.hparams();
		const size_t common = std::min(h.size(), all.size());
		if (!std::equal(h.begin(), h.begin() + common, all.begin()))
			fail(CKPT_E_STATE, "reshard: {} records other hyperparameters than the ranks before it", s->path);
		if (h.size() > all.size())
			all = h;
	}
	return all;
}

// The state of params [a, b) of p, read from its parts, and its step count.
uint64_t read_range(const Param &p, uint64_t a, uint64_t b, float *pv, float *m, float *v)
{
	std::optional<uint64_t> count;
	for (const Part &part : p.parts) {
		const uint64_t lo = std::max(a, part.begin), hi = std::min(b, part.begin + part.t->numel);
		if (lo >= hi)
			continue;
		Source &s = *part.src;
		s.img.read_state(s.sb.committed_slot, s.sb.committed_step, s.sb.sequence,
				 part.t->offset + (lo - part.begin), hi - lo, pv + (lo - a), m + (lo - a), v + (lo - a),
				 s.bounce);
		const uint64_t c = s.img.tensor_count(s.sb, *part.t);
		if (count && *count != c)
			fail(CKPT_E_STATE, "reshard: the pieces of '{}' are at step counts {} and {}", p.name, *count, c);
		count = c;
	}
	return *count;
}

} // namespace

std::string reshard(const std::vector<std::string> &from, const std::string &path, uint32_t rank,
		    uint32_t world, const std::string &opts_json)
{
	if (from.empty())
		fail(CKPT_E_INVAL, "reshard: no images given");
	std::optional<LayoutFile> given;
	if (!opts_json.empty()) {
		const json o = json::parse(opts_json, nullptr, false);
		if (o.is_discarded() || !o.is_object())
			fail(CKPT_E_INVAL, "reshard: options are not a JSON object");
		for (const auto &[k, v] : o.items())
			if (k != "params")
				fail(CKPT_E_INVAL, "reshard: unknown option '{}'", k);
		if (o.contains("params"))
			given = parse_layout_json(json{{"tensors", o["params"]}}.dump(), "reshard: params");
	}
	struct stat st;
	if (lstat(path.c_str(), &st) == 0)
		fail(CKPT_E_STATE, "reshard: {} exists: the new image goes to a new path", path);

	std::vector<std::unique_ptr<Source>> in;
	for (const std::string &p : from)
		in.push_back(std::make_unique<Source>(p));
	const std::vector<Source *> order = rank_order(in);
	check_alike(order);
	const std::vector<Param> params = whole_params(order, given ? &given->layout : nullptr);
	Layout whole;
	for (const Param &p : params)
		whole.add(p.name, *p.shape, p.group);
	whole.set_hparams(whole_hparams(order));
	if (const auto &s = order[0]->img.manifest.shard(); s && (whole.digest() != s->digest))
		fail(CKPT_E_STATE, "reshard: the images' params are not the layout they record (damaged manifests, "
				   "or images of different runs)");
	const Layout mine = whole.shard(rank, world, CKPT_SHARD_RULE_Q8);

	const struct ckpt_sb &sb = order[0]->sb;
	FormatOptions fo;
	fo.dtype = sb.geo.dtype;
	fo.chunk_params = static_cast<uint32_t>(sb.regions.chunk_params);
	fo.q8 = sb.feature_incompat & CKPT_FEATURE_INCOMPAT_Q8;
	fo.bf16_master = sb.feature_incompat & CKPT_FEATURE_INCOMPAT_BF16M;
	format(path, mine, fo);
	if (lstat(path.c_str(), &st) != 0)
		fail(CKPT_E_IO, "reshard: {} vanished after its format", path);
	try {
		const auto dev = Device::open(path);
		std::map<std::string, const Param *> by_name;
		for (const Param &p : params)
			by_name[p.name] = &p;
		const std::vector<Tensor> &out = dev->manifest().tensors();
		std::vector<std::vector<float>> state(out.size());
		std::vector<StateSpan> spans;
		uint64_t n_params = 0;
		for (size_t i = 0; i < out.size(); i++) {
			const Tensor &t = out[i];
			const Param &p = *by_name.at(t.piece ? t.piece->param : t.name);
			const uint64_t a = t.piece ? t.piece->begin : 0;
			state[i].resize(3 * t.numel);
			float *pv = state[i].data(), *m = pv + t.numel, *v = m + t.numel;
			const uint64_t count = read_range(p, a, a + t.numel, pv, m, v);
			spans.push_back({t.offset, t.numel, pv, m, v, count, t.extent});
			check_state_span(spans.back(), sb.committed_step, dev->image().sb.feature_incompat &
					 CKPT_FEATURE_INCOMPAT_COUNTS, fmt::format("reshard: '{}'", t.name));
			n_params += t.numel;
		}
		dev->engine()->load_state(spans, sb.committed_step, {sb.blob, sb.blob_len});
		// The proof that nothing changed: what the new image holds is what
		// was read, bit for bit (8-bit moments re-encoded from whole blocks
		// give their codes back; blocks an even cut split would not).
		const auto &rec = order[0]->img.manifest.shard();
		const bool cut_blocks = fo.q8 && order.size() > 1 && (!rec || rec->rule == CKPT_SHARD_RULE_EVEN);
		std::vector<float> back;
		for (size_t i = 0; i < out.size(); i++) {
			const Tensor &t = out[i];
			back.resize(3 * t.numel);
			dev->read_state(t.name, back.data(), back.data() + t.numel, back.data() + 2 * t.numel, t.numel);
			static const char *const what[] = {"master", "exp_avg", "exp_avg_sq"};
			for (int k = 0; k < 3; k++)
				if (memcmp(back.data() + k * t.numel, state[i].data() + k * t.numel, 4 * t.numel) != 0)
					fail(CKPT_E_STATE, "reshard: '{}' would not keep its {} values exactly{}", t.name,
					     what[k], k && cut_blocks ? " (the images' shares, cut evenly as dm-ckpt "
									"before 0.4 cut them, split 8-bit blocks)" : "");
			if (dev->tensor_step(t.name) != spans[i].count)
				fail(CKPT_E_STATE, "reshard: '{}' would not keep its step count", t.name);
		}
		for (Source *s : order) {
			Image now = Image::open(backing_path(s->path), false);
			if (now.sb.sequence != s->sb.sequence)
				fail(CKPT_E_STATE, "reshard: {} was committed to during the reshard: stop its trainer "
						   "and reshard again", s->path);
		}
		json from_json = json::array();
		for (Source *s : order)
			from_json.push_back(s->path);
		return json{{"path", path}, {"rank", rank}, {"world", world}, {"step", sb.committed_step},
			    {"tensors", out.size()}, {"params", n_params}, {"from", from_json}}.dump();
	} catch (...) {
		struct stat now;
		if (lstat(path.c_str(), &now) == 0 && now.st_dev == st.st_dev && now.st_ino == st.st_ino)
			unlink(path.c_str());
		throw;
	}
}

} // namespace ckpt
