// SPDX-License-Identifier: MIT
// The tool operations of the C ABI (ckpt.h): what ckptctl's info, format,
// import, export, verify and restore do with an image, as reports in JSON
// text. ckptctl only parses its command line and prints these reports.
#include <algorithm>
#include <cerrno>
#include <climits>
#include <cmath>
#include <cstring>
#include <map>
#include <optional>
#include <sstream>

#include <fcntl.h>
#include <fnmatch.h>
#include <sys/stat.h>
#include <unistd.h>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "block_target.hpp"
#include "ckpt_admin.h"
#include "device.hpp"
#include "error.hpp"
#include "export.hpp"
#include "format.hpp"
#include "image.hpp"
#include "interchange.hpp"
#include "io.hpp"
#include "progress.hpp"
#include "safetensors.hpp"
#include "admin.hpp"
#include "verify.hpp"

using nlohmann::json;

namespace ckpt {

namespace {

std::string printable(const uint8_t *p, size_t n)
{
	std::string s;
	for (size_t i = 0; i < n; i++)
		s += (p[i] >= 0x20 && p[i] < 0x7f) ? static_cast<char>(p[i]) : '.';
	return s;
}

std::vector<uint8_t> unhex(const std::string &s, const std::string &what)
{
	if (s.size() % 2)
		fail(CKPT_E_INVAL, "{}: odd number of hex digits", what);
	std::vector<uint8_t> out;
	for (size_t i = 0; i < s.size(); i += 2) {
		unsigned v;
		if (sscanf(s.c_str() + i, "%2x", &v) != 1 || !isxdigit(s[i]) || !isxdigit(s[i + 1]))
			fail(CKPT_E_INVAL, "{}: not hex", what);
		out.push_back(static_cast<uint8_t>(v));
	}
	return out;
}


// Before writing a backing device behind the kernel's back: not a dm-ckpt
// device, and (a block device) not held by one. Files cannot be checked: no
// engine may have one open.
void check_unused(const std::string &dev, const char *what)
{
	if (ckpt::BlockTarget::backing_of(dev))
		fail(CKPT_E_STATE, "{} is a device-mapper device; {} works on the backing device, with the "
				   "target removed (ckptctl remove NAME)", dev, what);
	struct stat st;
	if (stat(dev.c_str(), &st) == 0 && S_ISBLK(st.st_mode)) {
		int fd = ::open(dev.c_str(), O_RDONLY | O_EXCL | O_CLOEXEC);
		if (fd < 0 && errno == EBUSY)
			fail(CKPT_E_STATE, "{} is in use (a dm-ckpt target or a mount holds it): remove the target "
					   "first (ckptctl remove NAME)", dev);
		if (fd >= 0)
			::close(fd);
	}
}

json image_json(const ckpt::Image &img)
{
	const struct ckpt_sb &sb = img.sb;
	const struct ckpt_regions &l = sb.regions;
	json tensors = json::array();
	for (const ckpt::Tensor &t : img.manifest.tensors()) {
		tensors.push_back({{"name", t.name}, {"shape", t.shape}, {"group", t.group},
				   {"numel", t.numel}, {"offset", t.offset}});
		if (t.piece)
			tensors.back()["piece"] = {{"param", t.piece->param}, {"shape", t.piece->shape},
						   {"begin", t.piece->begin}};
	}
	json shard = nullptr;	// not a rank's share (or one of dm-ckpt before 0.4)
	if (const auto &s = img.manifest.shard())
		shard = {{"rank", s->rank}, {"world", s->world}, {"rule", s->rule}, {"params", s->params},
			 {"digest", s->digest}};
	return {
		{"path", img.file.path},
		{"uuid", uuid_string(sb.uuid)},
		{"format_version", CKPT_FORMAT_VERSION},
		{"sequence", sb.sequence},
		{"dtype", ckpt::dtype_name(sb.geo.dtype)},
		{"chunk_params", l.chunk_params},
		{"n_chunks", sb.geo.n_chunks},
		{"n_params", l.n_params},
		{"n_groups", sb.geo.n_groups},
		{"committed_step", sb.committed_step},
		{"committed_slot", sb.committed_slot},
		{"blob_bytes", sb.blob_len},
		{"backing_bytes", l.dev_bytes},
		{"device_bytes", img.file.size},
		{"virtual_sectors", l.virt_bytes / CKPT_SECTOR},
		{"feature_incompat", sb.feature_incompat},
		{"state", (sb.feature_incompat & CKPT_FEATURE_INCOMPAT_Q8) ? "8bit" : "fp32"},
		{"master", (sb.feature_incompat & CKPT_FEATURE_INCOMPAT_BF16M) ? "bf16" : "fp32"},
		{"superblock_copy", img.sb_copy},
		{"metadata_copies", ckpt_meta_copies(&l)},
		{"warnings", img.warnings()},
		{"regions", {{"group_off", l.group_off}, {"manifest_off", l.manifest_off}, {"meta2_off", l.meta2_off},
			    {"manifest_bytes", l.manifest_bytes}, {"plo_off", {l.plo_off[0], l.plo_off[1]}},
			    {"rec_off", {l.rec_off[0], l.rec_off[1]}}, {"record_bytes", l.record_bytes},
			    {"plo_chunk_bytes", l.plo_chunk_bytes}, {"grad_off", l.grad_off},
			    {"param_off", l.param_off}}},
		{"tensors", tensors},
		{"shard", shard},
	};
}

struct FormatArgs {
	std::string manifest, safetensors, dtype;
	std::vector<std::string> groups;	// "G:glob,glob"
	std::vector<std::string> include, exclude;
	uint32_t chunk_params = 0;
	uint64_t size = 0;
	bool force = false;
	std::string state;	// "fp32" or "8bit"; empty: not given
	std::string master;	// "fp32" or "bf16"; empty: not given
};

// A tensor manifest from a user (ckpt::parse_layout_json).
ckpt::LayoutFile read_manifest(const std::string &path)
{
	std::string text;
	try {
		struct stat st;
		ckpt::Fd fd = ckpt::open_file(path, O_RDONLY, false, st);
		char buf[65536];
		for (ssize_t n; (n = ::read(fd.get(), buf, sizeof(buf))) != 0;) {
			if (n < 0 && errno == EINTR)
				continue;
			if (n < 0)
				fail(CKPT_E_IO, "{}", strerror(errno));
			text.append(buf, static_cast<size_t>(n));
		}
	} catch (const ckpt::Error &e) {
		fail(e.code(), "cannot read manifest {}: {}", path, e.what());
	}
	return ckpt::parse_layout_json(text, path);
}

struct GroupRule {
	uint32_t group;
	std::vector<std::string> globs;
};

std::vector<GroupRule> parse_groups(const std::vector<std::string> &specs)
{
	std::vector<GroupRule> out;
	for (const std::string &s : specs) {
		size_t colon = s.find(':');
		char *end = nullptr;
		unsigned long g = colon == std::string::npos ? 0 : strtoul(s.c_str(), &end, 10);
		if (colon == std::string::npos || colon == 0 || end != s.c_str() + colon || g >= CKPT_MAX_GROUPS ||
		    colon + 1 == s.size())
			fail(CKPT_E_INVAL, "--group '{}': expected G:GLOB[,GLOB...] with G from 0 to {}", s,
			     CKPT_MAX_GROUPS - 1);
		GroupRule r{static_cast<uint32_t>(g), {}};
		std::stringstream globs(s.substr(colon + 1));
		for (std::string glob; std::getline(globs, glob, ',');)
			if (!glob.empty())
				r.globs.push_back(glob);
		out.push_back(std::move(r));
	}
	return out;
}

bool matches(const std::vector<std::string> &globs, const std::string &name)
{
	for (const std::string &g : globs)
		if (fnmatch(g.c_str(), name.c_str(), 0) == 0)
			return true;
	return false;
}

bool ends_with(const std::string &s, const std::string &suffix)
{
	return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// The layout of a checkpoint's float tensors. A file that export wrote
// (dm-ckpt.* metadata) gives the same layout again: its tensors in file
// order with their groups, its dtype, chunk size and hyperparameters, each
// overridden by an option given (and the summary says so). Any other file is
// grouped by --group, each group's tensors together, in file order.
ckpt::LayoutFile manifest_from_safetensors(const FormatArgs &a, json &summary)
{
	const auto st = ckpt::safetensors::Checkpoint::open(a.safetensors);
	const auto &h = st.header();
	const auto ix = interchange::read(h.metadata, st.path());
	const std::vector<GroupRule> rules = parse_groups(a.groups);
	const bool by_metadata = ix && rules.empty();
	struct Pick {
		const ckpt::safetensors::TensorInfo *t;
		uint32_t group;
	};
	std::vector<Pick> picks;
	std::map<std::string, unsigned> skipped;
	std::map<std::string, unsigned> dtypes;
	for (const auto &t : h.tensors) {
		if (!ckpt::safetensors::is_float(t.dtype)) {
			skipped[fmt::format("not floating point ({})", t.dtype)]++;
			continue;
		}
		if (t.numel == 0) {
			skipped["empty"]++;
			continue;
		}
		for (const char *sfx : {".exp_avg", ".exp_avg_sq"})
			if (ends_with(t.name, sfx) && h.find(t.name.substr(0, t.name.size() - strlen(sfx)))) {
				skipped["optimizer state of another tensor"]++;
				goto next;
			}
		if (!a.include.empty() && !matches(a.include, t.name)) {
			skipped["not matched by --include"]++;
			continue;
		}
		if (matches(a.exclude, t.name)) {
			skipped["matched by --exclude"]++;
			continue;
		}
		{
			uint32_t g = 0;
			if (by_metadata) {
				auto it = ix->tensor_group.find(t.name);
				if (it == ix->tensor_group.end())
					fail(CKPT_E_INVAL, "{}: __metadata__ has no {}tensor_group.{} for tensor '{}' (or "
							   "give --group)", st.path(), interchange::prefix, t.name, t.name);
				g = it->second;
			} else {
				for (const GroupRule &r : rules)
					if (matches(r.globs, t.name)) {
						g = r.group;
						break;
					}
			}
			picks.push_back({&t, g});
			dtypes[t.dtype]++;
		}
	next:;
	}
	if (picks.empty())
		fail(CKPT_E_INVAL, "{}: no floating-point tensors to lay out", a.safetensors);
	if (ix)
		for (const auto &[name, g] : ix->tensor_group)
			if (!h.find(name))
				fail(CKPT_E_INVAL, "{}: __metadata__ {}tensor_group.{} names no tensor of the file",
				     st.path(), interchange::prefix, name);
	// Tensors of one group share chunks; a group change starts a new chunk,
	// so keep each group together (file order within a group). The order
	// export wrote is the image's own.
	if (!by_metadata)
		std::stable_sort(picks.begin(), picks.end(),
				 [](const Pick &x, const Pick &y) { return x.group < y.group; });
	ckpt::LayoutFile m;
	std::map<uint32_t, std::pair<unsigned, uint64_t>> per_group;
	for (const Pick &p : picks) {
		m.layout.add(p.t->name, p.t->shape, p.group);
		per_group[p.group].first++;
		per_group[p.group].second += p.t->numel;
	}
	summary.push_back(fmt::format("{}: {} tensors", st.path(), picks.size()));
	if (ix) {
		const std::string dtype = dtype_name(ix->dtype);
		m.dtype = dtype;
		m.chunk_params = ix->chunk_params;
		const char *state = ix->q8 ? "8bit" : "fp32", *master = ix->bf16_master ? "bf16" : "fp32";
		m.q8 = ix->q8;
		m.bf16_master = ix->bf16_master;
		summary.push_back(fmt::format("  layout of the image it was exported from (dm-ckpt metadata): {}, "
					      "chunks of {}, {} groups{}, {} moments, {} masters", dtype,
					      ix->chunk_params, ix->n_groups,
					      ix->hparams.empty() ? "" : " with their hyperparameters", state, master));
		if (!a.dtype.empty() && a.dtype != dtype)
			summary.push_back(fmt::format("  --dtype {} overrides the file's {}", a.dtype, dtype));
		if (!a.state.empty() && a.state != state)
			summary.push_back(fmt::format("  --state {} overrides the file's {}", a.state, state));
		if (!a.master.empty() && a.master != master)
			summary.push_back(fmt::format("  --master {} overrides the file's {}", a.master, master));
		else if (a.master.empty() && ix->bf16_master && (a.state == "fp32" || a.dtype == "fp16")) {
			m.bf16_master = false;	// what the override asks for cannot have them
			summary.push_back("  the file's bf16 masters are dropped: they need 8-bit moments and dtype bf16");
		}
		if (a.chunk_params && a.chunk_params != ix->chunk_params)
			summary.push_back(fmt::format("  --chunk-params {} overrides the file's {}", a.chunk_params,
						      ix->chunk_params));
		if (!rules.empty())
			summary.push_back("  --group overrides the file's groups (and drops its hyperparameters)");
		else if (!ix->hparams.empty() && per_group.rbegin()->first + 1 != ix->n_groups)
			summary.push_back(fmt::format("  the tensors left use groups 0 to {}, not the file's {}: its "
						      "hyperparameters are dropped", per_group.rbegin()->first,
						      ix->n_groups));
		else
			m.layout.set_hparams(ix->hparams);
	} else {
		// fp16 training when the weights are all fp16, else bf16.
		m.dtype = dtypes.size() == 1 && dtypes.count("F16") ? "fp16" : "bf16";
	}
	for (const auto &[g, c] : per_group)
		summary.push_back(fmt::format("  group {:<2} {:>6} tensors {:>14} params", g, c.first, c.second));
	for (const auto &[why, n] : skipped)
		summary.push_back(fmt::format("  skipped {} tensors: {}", n, why));
	return m;
}

// The members of an options object, each of its expected type.
json options(const char *text, const char *what)
{
	if (!text || !*text)
		return json::object();
	json j = json::parse(text, nullptr, false);
	if (j.is_discarded() || !j.is_object())
		fail(CKPT_E_INVAL, "{} options are not a JSON object", what);
	return j;
}

template <typename T> T opt(const json &j, const char *key, T dflt, const char *what)
{
	if (!j.contains(key))
		return dflt;
	try {
		return j.at(key).get<T>();
	} catch (const json::exception &e) {
		fail(CKPT_E_INVAL, "{} option {}: {}", what, key, e.what());
	}
}

json damage_json(const std::vector<ckpt::Damage> &d)
{
	json a = json::array();
	for (const ckpt::Damage &x : d)
		a.push_back({{"slot", x.slot}, {"chunk", x.chunk}, {"offset", x.offset}, {"what", x.what},
			     {"tensors", x.tensors}});
	return a;
}

json copies_json(const std::array<ckpt::SuperblockCopy, 2> &c)
{
	json a = json::array();
	for (const auto &x : c) {
		json j = {{"index", x.index}, {"offset", x.index * CKPT_BLOCK}, {"valid", x.valid}, {"blank", x.blank},
			  {"current", x.current}};
		if (x.valid)
			j.update({{"sequence", x.sb.sequence}, {"committed_step", x.sb.committed_step},
				  {"committed_slot", x.sb.committed_slot}});
		else if (!x.blank)
			j["error"] = x.error;
		a.push_back(j);
	}
	return a;
}

json rollback_json(const ckpt::RollbackCheck &rb)
{
	json j = {{"available", rb.available}, {"step", rb.step}, {"slot", rb.slot}};
	if (rb.available) {
		j["blob_hex"] = hex(rb.prev.blob, rb.prev.blob_len);
		j["blob_printable"] = printable(rb.prev.blob, rb.prev.blob_len);
	} else {
		j["reason"] = rb.reason;
	}
	return j;
}

struct Checked {
	std::string path;
	std::array<ckpt::SuperblockCopy, 2> copies;
	std::optional<ckpt::Image> img;
	std::string open_error;
	ckpt::SlotCheck committed;
	ckpt::RollbackCheck rollback;
};

// salvage: a file shorter than its layout is checked as far as it goes.
Checked check_once(const std::string &path, bool writable, bool salvage)
{
	Checked c;
	c.path = path;
	{
		ckpt::BackingFile f = ckpt::BackingFile::open(path, false);
		c.copies = ckpt::inspect_superblocks(f);
	}
	if (!c.copies[0].magic && !c.copies[1].magic)
		fail(CKPT_E_NO_SB, "{} is not a dm-ckpt image: neither superblock copy has the magic number", path);
	try {
		c.img = ckpt::Image::open(path, writable, salvage);
	} catch (const ckpt::Error &e) {
		if (e.code() == CKPT_E_IO && !c.copies[0].valid && !c.copies[1].valid)
			throw;
		c.open_error = e.what();
		return c;
	}
	try {
		c.committed = ckpt::check_committed(*c.img);
		c.rollback = ckpt::check_rollback(*c.img, c.copies);
	} catch (const ckpt::Error &e) {
		if (c.img->short_warning.empty())
			throw;
		c.open_error = e.what();	// a record past the end of a short file
	}
	return c;
}

// The sequence of the newest valid superblock copy (0: none).
uint64_t newest_sequence(const std::array<ckpt::SuperblockCopy, 2> &copies)
{
	uint64_t seq = 0;
	for (const ckpt::SuperblockCopy &c : copies)
		if (c.valid)
			seq = std::max(seq, c.sb.sequence);
	return seq;
}

// ... of the newest valid superblock on path now.
uint64_t sequence_now(const std::string &path)
{
	const ckpt::BackingFile f = ckpt::BackingFile::open(path, false);
	return newest_sequence(ckpt::inspect_superblocks(f));
}

// Readers take no lock, so a trainer may commit while they check: the step
// after the commit rewrites the slot the check was reading, which looks
// like damage (records of a newer step). A read-only check therefore counts
// only when no commit happened during it, and is repeated until one holds
// still; an image that never does is refused, not called corrupt.
Checked check_all(const std::string &path, bool writable, bool salvage)
{
	for (unsigned tries = 1;; tries++) {
		Checked c = check_once(path, writable, salvage);
		if (writable)
			return c;
		if (sequence_now(path) == newest_sequence(c.copies))
			return c;
		if (tries == 50)
			fail(CKPT_E_STATE, "{} changed while it was checked, {} times in a row: a trainer is "
					   "committing steps; check it while the trainer is stopped", path, tries);
	}
}

json meta_json(const ckpt::Image &img)
{
	const struct ckpt_regions &l = img.sb.regions;
	json a = json::array();
	for (uint32_t k = 0; k < img.meta.size(); k++) {
		const ckpt::Image::MetaCopy &m = img.meta[k];
		json j = {{"index", k}, {"group_offset", ckpt_group_offset(&l, k)}, {"group_ok", m.group_error.empty()},
			  {"manifest_offset", ckpt_manifest_offset(&l, k)}, {"manifest_ok", m.manifest_error.empty()}};
		if (!m.group_error.empty())
			j["group_error"] = m.group_error;
		if (!m.manifest_error.empty())
			j["manifest_error"] = m.manifest_error;
		a.push_back(j);
	}
	return a;
}

} // namespace

std::string image_info(const std::string &device)
{
	// a dm-ckpt device's image through its IMAGE window (one served from
	// another machine has no backing device here)
	if (std::optional<Image> img = BlockTarget::image_of(device))
		return image_json(*img).dump();
	return image_json(Image::open(device, false)).dump();
}

std::string format_manifest(const std::string &device, const std::string &opts_json)
{
	const json o = options(opts_json.c_str(), "format");
	FormatArgs a;
	a.manifest = opt<std::string>(o, "manifest", "", "format");
	a.safetensors = opt<std::string>(o, "safetensors", "", "format");
	a.dtype = opt<std::string>(o, "dtype", "", "format");
	a.groups = opt<std::vector<std::string>>(o, "groups", {}, "format");
	a.include = opt<std::vector<std::string>>(o, "include", {}, "format");
	a.exclude = opt<std::vector<std::string>>(o, "exclude", {}, "format");
	a.chunk_params = opt<uint32_t>(o, "chunk_params", 0, "format");
	a.size = opt<uint64_t>(o, "size", 0, "format");
	a.force = opt<bool>(o, "force", false, "format");
	// empty: not given (fp32, or what an export's metadata says)
	a.state = opt<std::string>(o, "state", "", "format");
	if (!a.state.empty() && a.state != "fp32" && a.state != "8bit")
		fail(CKPT_E_INVAL, "format: state '{}': use fp32 or 8bit", a.state);
	a.master = opt<std::string>(o, "master", "", "format");
	if (!a.master.empty() && a.master != "fp32" && a.master != "bf16")
		fail(CKPT_E_INVAL, "format: master '{}': use fp32 or bf16", a.master);
	if (a.manifest.empty() == a.safetensors.empty())
		fail(CKPT_E_INVAL, "format: give a manifest or a safetensors file, one of them");
	json summary = json::array();
	ckpt::LayoutFile m = a.safetensors.empty() ? read_manifest(a.manifest) : manifest_from_safetensors(a, summary);
	FormatOptions fo;
	fo.dtype = parse_dtype(a.dtype.empty() ? m.dtype : a.dtype);
	fo.chunk_params = a.chunk_params ? a.chunk_params : m.chunk_params;
	fo.size = a.size;
	fo.force = a.force;
	fo.q8 = a.state.empty() ? m.q8 : a.state == "8bit";
	fo.bf16_master = a.master.empty() ? m.bf16_master : a.master == "bf16";
	check_unused(device, "format");
	format(device, m.layout, fo);
	json j = image_json(Image::open(device, false));
	j["summary"] = summary;
	return j.dump();
}

std::string import_safetensors(const std::string &device, const std::string &from, const std::string &opts_json)
{
	const json o = options(opts_json.c_str(), "import");
	struct {
		std::string device, from;
		bool with_optimizer, partial;
		std::optional<uint64_t> step;
	} a{device, from, opt<bool>(o, "with_optimizer", false, "import"), opt<bool>(o, "partial", false, "import"),
	    std::nullopt};
	if (o.contains("step"))
		a.step = opt<uint64_t>(o, "step", 0, "import");
	check_unused(a.device, "import");
	const auto st = safetensors::Checkpoint::open(a.from);
	const auto &h = st.header();
	const auto ix = interchange::read(h.metadata, st.path());
	// The engine opens the device writable, and so locked: nobody else
	// writes it from here on. Its image (which the items below point into,
	// so it lives as long as they do) is what the file is validated
	// against, names and shapes, before any data is read.
	const auto dev = Device::open(a.device);
	if (!dev->engine())
		fail(CKPT_E_STATE, "{}: import needs the userspace engine on the backing device", a.device);
	const Image &img = dev->engine()->image();
	if (img.sb.committed_step != 0)
		fail(CKPT_E_STATE, "{} has committed step {}: import only goes into a device before its first step "
				   "(format it again to start over)", a.device, img.sb.committed_step);
	struct Item {
		const Tensor *dev;
		const safetensors::TensorInfo *p, *m, *v;
	};
	std::vector<Item> items;
	std::vector<std::string> missing, unknown;
	std::map<std::string, bool> used;
	auto take = [&](const Tensor &t, const std::string &name) -> const safetensors::TensorInfo * {
		const auto *f = h.find(name);
		if (!f)
			return nullptr;
		used[name] = true;
		if (!safetensors::is_float(f->dtype))
			fail(CKPT_E_DTYPE, "{}: tensor '{}' has dtype {}; import takes F32, F16, BF16 or F64", a.from,
			     name, f->dtype);
		if (f->shape != t.shape && !(f->shape.empty() && t.numel == 1))
			fail(CKPT_E_SIZE, "{}: tensor '{}' has shape {}, the device's '{}' has shape {}", a.from, name,
			     json(f->shape).dump(), t.name, json(t.shape).dump());
		return f;
	};
	for (const Tensor &t : img.manifest.tensors()) {
		Item it{&t, take(t, t.name), nullptr, nullptr};
		if (a.with_optimizer) {
			it.m = take(t, t.name + ".exp_avg");
			it.v = take(t, t.name + ".exp_avg_sq");
			if (it.p && (!it.m || !it.v))
				fail(CKPT_E_NAME, "{}: --with-optimizer: '{}' has no '{}.exp_avg' and '{}.exp_avg_sq'",
				     a.from, t.name, t.name, t.name);
		}
		if (!it.p) {
			missing.push_back(t.name);
			continue;
		}
		items.push_back(it);
	}
	unsigned moments_ignored = 0, buffers_ignored = 0;
	for (const auto &f : h.tensors) {
		if (used.count(f.name))
			continue;
		bool moment = false;
		for (const char *sfx : {".exp_avg", ".exp_avg_sq"})
			if (ends_with(f.name, sfx) && used.count(f.name.substr(0, f.name.size() - strlen(sfx))))
				moment = true;
		if (moment)
			moments_ignored++;
		else if (!safetensors::is_float(f.dtype))
			buffers_ignored++;	// integer buffers: format skips them too
		else
			unknown.push_back(f.name);
	}
	auto list = [](const std::vector<std::string> &v) {
		std::string s;
		for (size_t i = 0; i < v.size() && i < 8; i++)
			s += (i ? ", " : "") + v[i];
		return v.size() > 8 ? s + fmt::format(", ... ({} in all)", v.size()) : s;
	};
	if (!a.partial && !missing.empty())
		fail(CKPT_E_NAME, "{} lacks tensors of the device: {} (--partial keeps their current values)", a.from,
		     list(missing));
	if (!a.partial && !unknown.empty())
		fail(CKPT_E_NAME, "{} has tensors the device lacks: {} (--partial skips them)", a.from, list(unknown));
	if (items.empty())
		fail(CKPT_E_NAME, "{}: no tensor of the device is in the file", a.from);

	uint64_t step = 0;
	std::vector<uint8_t> blob;
	if (a.with_optimizer) {
		if (a.step) {
			step = *a.step;
		} else if (ix) {
			step = ix->step;
			if (auto it = h.metadata.find("step"); it != h.metadata.end() && it->second != std::to_string(step))
				fail(CKPT_E_INVAL, "{}: __metadata__ step '{}' and {}step '{}' disagree", a.from,
				     it->second, interchange::prefix, step);
		} else {
			auto it = h.metadata.find("step");
			if (it == h.metadata.end())
				fail(CKPT_E_INVAL, "{}: no \"step\" in __metadata__: the moments need the optimizer step "
						   "they belong to (give it with --step)", a.from);
			char *end = nullptr;
			errno = 0;
			step = strtoull(it->second.c_str(), &end, 10);
			if (errno || it->second.empty() || *end || it->second[0] == '-')
				fail(CKPT_E_INVAL, "{}: __metadata__ step '{}' is not a step number", a.from, it->second);
		}
		if (step > CKPT_STEP_MAX)
			fail(CKPT_E_STEP, "{}: step {}{} leaves the device no next step: at most {}", a.from, step,
			     a.step ? " (--step)" : " (__metadata__)", CKPT_STEP_MAX);
		if (auto it = h.metadata.find("ckpt.trainer_blob"); it != h.metadata.end()) {
			blob = unhex(it->second, a.from + ": __metadata__ ckpt.trainer_blob");
			if (blob.size() > CKPT_BLOB_MAX)
				fail(CKPT_E_BLOB, "{}: trainer blob of {} bytes, at most {}", a.from, blob.size(), CKPT_BLOB_MAX);
		}
	}

	// Read and check the values (and the step counts of tensors that lagged
	// the step where they were exported: their next bias correction is the
	// original's) before anything is written.
	const bool counts = dev->image().sb.feature_incompat & CKPT_FEATURE_INCOMPAT_COUNTS;
	std::vector<std::vector<float>> p(items.size()), m(items.size()), v(items.size());
	std::vector<StateSpan> spans;
	uint64_t n_params = 0, total = 0;
	for (const auto &item : items)
		total += item.dev->numel;
	for (size_t i = 0; i < items.size(); i++) {
		progress("import", n_params, 2 * total);	// reading; then loading, the other half
		p[i] = st.read_f32(*items[i].p);
		StateSpan s{items[i].dev->offset, items[i].dev->numel, p[i].data(), nullptr, nullptr, ~0ULL,
			    items[i].dev->extent};
		if (a.with_optimizer) {
			m[i] = st.read_f32(*items[i].m);
			v[i] = st.read_f32(*items[i].v);
			s.m = m[i].data();
			s.v = v[i].data();
			if (ix && !a.step)
				if (auto it = ix->tensor_step.find(items[i].p->name); it != ix->tensor_step.end())
					s.count = it->second;
		}
		check_state_span(s, step, counts, fmt::format("{}: tensor '{}'", a.from, items[i].p->name));
		spans.push_back(s);
		n_params += items[i].dev->numel;
	}
	if (a.with_optimizer) {
		dev->engine()->load_state(spans, step, blob);
	} else {
		std::vector<std::pair<std::string, std::span<const float>>> values;
		for (size_t i = 0; i < items.size(); i++)
			values.emplace_back(items[i].dev->name, std::span<const float>(p[i]));
		dev->load_params(values);
	}
	progress("import", 2 * total, 2 * total);
	return json{{"device", a.device}, {"from", a.from}, {"tensors", items.size()}, {"params", n_params},
		    {"with_optimizer", a.with_optimizer}, {"step", step}, {"blob_bytes", blob.size()},
		    {"missing", missing}, {"unknown", unknown}, {"moments_ignored", moments_ignored},
		    {"buffers_ignored", buffers_ignored}}.dump();
}

std::string safetensors_header(const std::string &path)
{
	const auto st = safetensors::Checkpoint::open(path);
	const auto &h = st.header();
	interchange::read(h.metadata, st.path());	// refuses bad dm-ckpt keys here too
	json files = json::array(), tensors = json::array();
	for (const auto &f : st.files())
		files.push_back(f.path());
	for (const auto &t : h.tensors)
		tensors.push_back({{"name", t.name}, {"dtype", t.dtype}, {"shape", t.shape}, {"file", t.file},
				   {"offset", st.files()[t.file].header().data_offset + t.begin},
				   {"bytes", t.end - t.begin}});
	return json{{"path", st.path()}, {"files", files}, {"tensors", tensors}, {"metadata", h.metadata}}.dump();
}

// export_image fails rather than mix steps when a trainer commits during
// it (check_all says why that looks like damage); such an export is
// repeated, and refused only if the image never holds still.
std::string export_image_report(const std::string &device, const std::string &out, uint32_t flags)
{
	const std::string path = backing_path(device);
	std::optional<ExportReport> done;
	for (unsigned tries = 1; !done; tries++) {
		const uint64_t before = sequence_now(path);
		try {
			done = export_image(path, out, flags, "");
		} catch (const ckpt::Error &) {
			if (sequence_now(path) == before)
				throw;
			if (tries == 50)
				fail(CKPT_E_STATE, "{} changed during the export, {} times in a row: a trainer is "
						   "committing steps; export it while the trainer is stopped", path, tries);
		}
	}
	const ExportReport &r = *done;
	return json{{"path", r.path}, {"to", out}, {"tensors", r.tensors}, {"params", r.params},
		    {"step", r.step}, {"with_optimizer", (flags & CKPT_EXPORT_OPTIMIZER) != 0},
		    {"warnings", r.warnings}}.dump();
}

std::string verify_report(const std::string &device, bool repair)
{
	if (repair)
		check_unused(device, "verify --repair");
	Checked c = check_all(repair ? device : backing_path(device), repair, true);
	unsigned repaired = 0;
	if (repair && c.img) {
		repaired = c.img->repair_meta();
		if (repaired)
			c = check_all(c.path, false, true);
	}
	const bool ok = c.open_error.empty() && c.committed.ok();
	const std::vector<std::string> warnings = c.img ? c.img->warnings() : std::vector<std::string>{};
	const bool degraded = ok && !warnings.empty();
	json j = {{"path", c.path}, {"ok", ok && !degraded}, {"status", !ok ? "corrupt" : degraded ? "degraded" : "ok"},
		  {"superblocks", copies_json(c.copies)}, {"warnings", warnings}};
	if (repair)
		j["repaired"] = repaired;
	json extra = json::object();
	if (!c.open_error.empty()) {
		j["error"] = c.open_error;
	} else {
		const struct ckpt_sb &sb = c.img->sb;
		j.update({{"committed_step", sb.committed_step}, {"committed_slot", sb.committed_slot},
			  {"sequence", sb.sequence}, {"superblock_copy", c.img->sb_copy},
			  {"manifest_ok", true}, {"metadata", meta_json(*c.img)},
			  {"tensors", c.img->manifest.tensors().size()},
			  {"records_checked", c.committed.chunks}, {"damage", damage_json(c.committed.damage)},
			  {"rollback", rollback_json(c.rollback)}});
		extra = {{"group_copy", c.img->group_copy}, {"manifest_copy", c.img->manifest_copy},
			 {"n_groups", sb.geo.n_groups}, {"short", !c.img->short_warning.empty()},
			 {"meta_damaged", std::any_of(c.img->meta.begin(), c.img->meta.end(),
						      [](const auto &m) { return !m.ok(); })},
			 {"superblock_damaged", !c.img->sb_warning.empty()}};
	}
	return json{{"report", j}, {"extra", extra}}.dump();
}

std::string restore_report(const std::string &device, bool do_rollback)
{
	if (do_rollback)
		check_unused(device, "restore --rollback");
	const std::string path = do_rollback ? device : backing_path(device);
	Checked c = check_all(path, do_rollback, false);
	if (!c.open_error.empty())
		fail(CKPT_E_RECORD, "{}: {}", path, c.open_error);
	const std::vector<std::string> warnings = c.img->warnings();
	const struct ckpt_sb before = c.img->sb;
	if (do_rollback && !c.rollback.available)
		return json{{"report", {{"path", path}, {"rolled_back", false}, {"rollback", rollback_json(c.rollback)}}},
			    {"refused", true}, {"before_step", before.committed_step}, {"warnings", warnings}}.dump();
	bool rolled = false;
	if (do_rollback) {
		rollback(*c.img, c.rollback);
		rolled = true;
		c.committed = check_committed(*c.img);
		c.copies = inspect_superblocks(c.img->file);
		c.rollback = check_rollback(*c.img, c.copies);
	}
	const struct ckpt_sb &sb = c.img->sb;
	json j = {{"path", path},
		  {"committed_step", sb.committed_step},
		  {"committed_slot", sb.committed_slot},
		  {"sequence", sb.sequence},
		  {"blob_hex", hex(sb.blob, sb.blob_len)},
		  {"blob_printable", printable(sb.blob, sb.blob_len)},
		  {"committed_ok", c.committed.ok()},
		  {"damage", damage_json(c.committed.damage)},
		  {"rollback", rollback_json(c.rollback)},
		  {"rolled_back", rolled}};
	if (rolled)
		j["rolled_back_from"] = before.committed_step;
	return json{{"report", j}, {"refused", false}, {"before_step", before.committed_step},
		    {"blob_bytes", sb.blob_len}, {"records_checked", c.committed.chunks},
		    {"rollback_blob_bytes", c.rollback.available ? c.rollback.prev.blob_len : 0},
		    {"warnings", warnings}}.dump();
}

std::optional<std::string> backing_of(const std::string &path) { return BlockTarget::backing_of(path); }

std::string backing_path(const std::string &dev)
{
	if (auto b = BlockTarget::backing_of(dev))
		return *b;
	return dev;
}

namespace {

// Space for the manifest assumed by the capacity estimate (a few thousand
// tensors); format reserves what the real manifest needs.
constexpr uint32_t manifest_estimate = 1u << 20;

bool layout_of(uint32_t n_chunks, uint32_t shift, struct ckpt_regions *l)
{
	struct ckpt_geometry g = {};
	g.n_chunks = n_chunks;
	g.chunk_shift = shift;
	g.n_groups = 1;
	g.dtype = CKPT_DTYPE_BF16;
	g.optimizer = CKPT_OPT_ADAM;
	g.manifest_bytes = manifest_estimate;
	return ckpt_regions_compute_features(&g, CKPT_FEATURE_INCOMPAT_DEFAULT, l) == 0;
}

} // namespace

struct ckpt_fit fit(uint64_t bytes, uint32_t chunk_params, uint64_t write_unit)
{
	if (chunk_params && (chunk_params & (chunk_params - 1) || chunk_params < (1u << CKPT_MIN_CHUNK_SHIFT) ||
			     chunk_params > (1u << CKPT_MAX_CHUNK_SHIFT)))
		fail(CKPT_E_GEOMETRY, "--chunk-params must be a power of two from {} to {}",
		     1u << CKPT_MIN_CHUNK_SHIFT, 1u << CKPT_MAX_CHUNK_SHIFT);
	struct ckpt_fit f = {};
	// The default, raised so that a chunk's p_lo (2 B a param) covers
	// whole write units of the device.
	uint32_t cp = chunk_params;
	if (!cp) {
		cp = 1u << CKPT_DEFAULT_CHUNK_SHIFT;
		while (2ull * cp < write_unit && cp < (1u << CKPT_MAX_CHUNK_SHIFT))
			cp <<= 1;
	}
	f.chunk_params = cp;
	f.record_bytes = CKPT_BLOCK + 12ull * cp;
	const uint32_t shift = static_cast<uint32_t>(__builtin_ctz(cp));
	struct ckpt_regions l;
	// The layout grows with n_chunks: the largest count that fits.
	uint32_t lo = 0, hi = CKPT_MAX_CHUNKS;
	while (lo < hi) {
		uint32_t mid = lo + (hi - lo + 1) / 2;
		if (layout_of(mid, shift, &l) && l.dev_bytes <= bytes)
			lo = mid;
		else
			hi = mid - 1;
	}
	f.n_chunks = lo;
	if (lo && layout_of(lo, shift, &l)) {
		f.n_params = l.n_params;
		f.backing_bytes = l.dev_bytes;
	}
	return f;
}

} // namespace ckpt
