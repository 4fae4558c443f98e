// SPDX-License-Identifier: MIT
#include "commands.hpp"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <iostream>
#include <map>
#include <sstream>

#include <fcntl.h>
#include <fnmatch.h>
#include <sys/stat.h>
#include <unistd.h>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "block_target.hpp"
#include "device.hpp"
#include "dm.hpp"
#include "error.hpp"
#include "format.hpp"
#include "image.hpp"
#include "io.hpp"
#include "probe.hpp"
#include "safetensors.hpp"
#include "verify.hpp"

using nlohmann::json;
using ckpt::fail;

namespace ckptctl {

namespace {

// ------------------------------------------------------------------ helpers

std::string uuid_string(const uint8_t *u)
{
	std::string s;
	for (int i = 0; i < 16; i++) {
		if (i == 4 || i == 6 || i == 8 || i == 10)
			s += '-';
		s += fmt::format("{:02x}", u[i]);
	}
	return s;
}

std::string hex(const uint8_t *p, size_t n)
{
	std::string s;
	for (size_t i = 0; i < n; i++)
		s += fmt::format("{:02x}", p[i]);
	return s;
}

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

// A dm-ckpt device (/dev/mapper/NAME) stands for its backing device when
// reading; anything else is the backing file or device itself.
std::string backing_path(const std::string &dev)
{
	if (auto b = ckpt::BlockTarget::backing_of(dev))
		return *b;
	return dev;
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

void print_json(const json &j) { std::cout << j.dump(2) << "\n"; }

// Damaged copies the image was opened around, on stderr (the output stays
// what it was for scripts).
void print_warnings(const ckpt::Image &img)
{
	for (const std::string &w : img.warnings())
		fmt::print(stderr, "ckptctl: warning: {}: {}\n", img.file.path, w);
}

// --------------------------------------------------------------- format/info

json image_json(const ckpt::Image &img)
{
	const struct ckpt_sb &sb = img.sb;
	const struct ckpt_layout &l = sb.layout;
	json tensors = json::array();
	for (const ckpt::Tensor &t : img.manifest.tensors())
		tensors.push_back({{"name", t.name}, {"shape", t.shape}, {"group", t.group},
				   {"numel", t.numel}, {"offset", t.offset}});
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
		{"superblock_copy", img.sb_copy},
		{"metadata_copies", ckpt_meta_copies(&l)},
		{"warnings", img.warnings()},
		{"layout", {{"group_off", l.group_off}, {"manifest_off", l.manifest_off}, {"meta2_off", l.meta2_off},
			    {"manifest_bytes", l.manifest_bytes}, {"plo_off", {l.plo_off[0], l.plo_off[1]}},
			    {"rec_off", {l.rec_off[0], l.rec_off[1]}}, {"record_bytes", l.record_bytes},
			    {"plo_chunk_bytes", l.plo_chunk_bytes}, {"grad_off", l.grad_off},
			    {"param_off", l.param_off}}},
		{"tensors", tensors},
	};
}

void print_info(const json &j)
{
	fmt::print("{}: dm-ckpt format v{}, uuid {}\n", j["path"].get<std::string>(),
		   j["format_version"].get<int>(), j["uuid"].get<std::string>());
	fmt::print("  committed step  {} (slot {}, superblock sequence {}, blob {} bytes)\n",
		   j["committed_step"].get<uint64_t>(), j["committed_slot"].get<int>(),
		   j["sequence"].get<uint64_t>(), j["blob_bytes"].get<int>());
	fmt::print("  params          {} in {} chunks of {}, {} groups, {}\n",
		   j["n_params"].get<uint64_t>(), j["n_chunks"].get<uint64_t>(),
		   j["chunk_params"].get<uint64_t>(), j["n_groups"].get<int>(), j["dtype"].get<std::string>());
	fmt::print("  backing         {} bytes used of {}\n", j["backing_bytes"].get<uint64_t>(),
		   j["device_bytes"].get<uint64_t>());
	fmt::print("  virtual device  {} sectors\n", j["virtual_sectors"].get<uint64_t>());
	fmt::print("  metadata        superblock copy {}, {} cop{} of group table and manifest\n",
		   j["superblock_copy"].get<int>(), j["metadata_copies"].get<int>(),
		   j["metadata_copies"].get<int>() == 1 ? "y" : "ies");
	for (const json &w : j["warnings"])
		fmt::print("  WARNING         {}\n", w.get<std::string>());
	fmt::print("  tensors         {}\n", j["tensors"].size());
	for (const json &t : j["tensors"])
		fmt::print("    {:<40} group {:<2} offset {:>12} numel {:>12} shape {}\n",
			   t["name"].get<std::string>(), t["group"].get<int>(), t["offset"].get<uint64_t>(),
			   t["numel"].get<uint64_t>(), t["shape"].dump());
}

struct ManifestFile {
	ckpt::Layout layout;
	std::string dtype = "bf16";
	uint32_t chunk_params = 1u << CKPT_DEFAULT_CHUNK_SHIFT;
};

// A tensor manifest from a user: {"dtype": "bf16", "chunk_params": 65536,
// "tensors": [{"name": "w", "shape": [4, 4], "group": 0}, ...]}.
ManifestFile read_manifest(const std::string &path)
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
	json j = json::parse(text, nullptr, false);
	if (j.is_discarded() || !j.is_object())
		fail(CKPT_E_MANIFEST, "{}: not a JSON object", path);
	ManifestFile m;
	try {
		if (j.contains("dtype"))
			m.dtype = j["dtype"].get<std::string>();
		if (j.contains("chunk_params"))
			m.chunk_params = j["chunk_params"].get<uint32_t>();
		const json &ts = j.at("tensors");
		if (!ts.is_array() || ts.empty())
			fail(CKPT_E_MANIFEST, "{}: \"tensors\" must be a non-empty array", path);
		for (const json &t : ts)
			m.layout.add(t.at("name").get<std::string>(), t.at("shape").get<std::vector<uint64_t>>(),
				     t.value("group", 0u));
	} catch (const json::exception &e) {
		fail(CKPT_E_MANIFEST, "{}: {}", path, e.what());
	}
	return m;
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

// The layout of a safetensors file's float tensors, grouped by name.
ManifestFile manifest_from_safetensors(const FormatArgs &a, bool quiet)
{
	const auto st = ckpt::safetensors::Reader::open(a.safetensors);
	const std::vector<GroupRule> rules = parse_groups(a.groups);
	struct Pick {
		const ckpt::safetensors::TensorInfo *t;
		uint32_t group;
	};
	std::vector<Pick> picks;
	std::map<std::string, unsigned> skipped;
	std::map<std::string, unsigned> dtypes;
	for (const auto &t : st.header().tensors) {
		if (!ckpt::safetensors::is_float(t.dtype)) {
			skipped[fmt::format("not floating point ({})", t.dtype)]++;
			continue;
		}
		if (t.numel == 0) {
			skipped["empty"]++;
			continue;
		}
		for (const char *sfx : {".exp_avg", ".exp_avg_sq"})
			if (ends_with(t.name, sfx) && st.header().find(t.name.substr(0, t.name.size() - strlen(sfx)))) {
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
			for (const GroupRule &r : rules)
				if (matches(r.globs, t.name)) {
					g = r.group;
					break;
				}
			picks.push_back({&t, g});
			dtypes[t.dtype]++;
		}
	next:;
	}
	if (picks.empty())
		fail(CKPT_E_INVAL, "{}: no floating-point tensors to lay out", a.safetensors);
	// Tensors of one group share chunks; a group change starts a new chunk,
	// so keep each group together (file order within a group).
	std::stable_sort(picks.begin(), picks.end(), [](const Pick &x, const Pick &y) { return x.group < y.group; });
	ManifestFile m;
	std::map<uint32_t, std::pair<unsigned, uint64_t>> per_group;
	for (const Pick &p : picks) {
		m.layout.add(p.t->name, p.t->shape, p.group);
		per_group[p.group].first++;
		per_group[p.group].second += p.t->numel;
	}
	// fp16 training when the weights are all fp16, else bf16.
	m.dtype = dtypes.size() == 1 && dtypes.count("F16") ? "fp16" : "bf16";
	if (!quiet) {
		fmt::print(stderr, "{}: {} tensors\n", a.safetensors, picks.size());
		for (const auto &[g, c] : per_group)
			fmt::print(stderr, "  group {:<2} {:>6} tensors {:>14} params\n", g, c.first, c.second);
		for (const auto &[why, n] : skipped)
			fmt::print(stderr, "  skipped {} tensors: {}\n", n, why);
	}
	return m;
}

} // namespace

int cmd_format(const FormatArgs &a)
{
	ManifestFile m = a.safetensors.empty() ? read_manifest(a.manifest) : manifest_from_safetensors(a, a.json);
	ckpt::FormatOptions opts;
	opts.dtype = ckpt::parse_dtype(a.dtype.empty() ? m.dtype : a.dtype);
	opts.chunk_params = a.chunk_params ? a.chunk_params : m.chunk_params;
	opts.size = a.size;
	opts.force = a.force;
	check_unused(a.device, "format");
	ckpt::format(a.device, m.layout, opts);
	json j = image_json(ckpt::Image::open(a.device, false));
	if (a.json)
		print_json(j);
	else
		print_info(j);
	return exit_ok;
}

int cmd_info(const std::string &device, bool as_json, bool table)
{
	const std::string path = backing_path(device);
	ckpt::Image img = ckpt::Image::open(path, false);
	json j = image_json(img);
	if (table || as_json)
		print_warnings(img);
	if (table)
		fmt::print("0 {} ckpt {}\n", img.sb.layout.virt_bytes / CKPT_SECTOR, path);
	else if (as_json)
		print_json(j);
	else
		print_info(j);
	return exit_ok;
}

int cmd_probe(const std::string &device, uint32_t chunk_params, bool as_json)
{
	if (chunk_params && (chunk_params & (chunk_params - 1) || chunk_params < (1u << CKPT_MIN_CHUNK_SHIFT) ||
			     chunk_params > (1u << CKPT_MAX_CHUNK_SHIFT)))
		fail(CKPT_E_GEOMETRY, "--chunk-params must be a power of two from {} to {}",
		     1u << CKPT_MIN_CHUNK_SHIFT, 1u << CKPT_MAX_CHUNK_SHIFT);
	json j = probe(device, chunk_params);
	if (as_json)
		print_json(j);
	else
		print_probe(j);
	return exit_ok;
}

// ------------------------------------------------------------ import/export

int cmd_import(const ImportArgs &a)
{
	check_unused(a.device, "import");
	const auto st = ckpt::safetensors::Reader::open(a.from);
	const auto &h = st.header();
	// The engine opens the device writable, and so locked: nobody else
	// writes it from here on. Its image (which the items below point into,
	// so it lives as long as they do) is what the file is validated
	// against, names and shapes, before any data is read.
	const auto dev = ckpt::Device::open(a.device);
	if (!dev->engine())
		fail(CKPT_E_STATE, "{}: import needs the userspace engine on the backing device", a.device);
	const ckpt::Image &img = dev->engine()->image();
	if (img.sb.committed_step != 0)
		fail(CKPT_E_STATE, "{} has committed step {}: import only goes into a device before its first step "
				   "(format it again to start over)", a.device, img.sb.committed_step);
	struct Item {
		const ckpt::Tensor *dev;
		const ckpt::safetensors::TensorInfo *p, *m, *v;
	};
	std::vector<Item> items;
	std::vector<std::string> missing, unknown;
	std::map<std::string, bool> used;
	auto take = [&](const ckpt::Tensor &t, const std::string &name) -> const ckpt::safetensors::TensorInfo * {
		const auto *f = h.find(name);
		if (!f)
			return nullptr;
		used[name] = true;
		if (!ckpt::safetensors::is_float(f->dtype))
			fail(CKPT_E_DTYPE, "{}: tensor '{}' has dtype {}; import takes F32, F16, BF16 or F64", a.from,
			     name, f->dtype);
		if (f->shape != t.shape && !(f->shape.empty() && t.numel == 1))
			fail(CKPT_E_SIZE, "{}: tensor '{}' has shape {}, the device's '{}' has shape {}", a.from, name,
			     json(f->shape).dump(), t.name, json(t.shape).dump());
		return f;
	};
	for (const ckpt::Tensor &t : img.manifest.tensors()) {
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
		else if (!ckpt::safetensors::is_float(f.dtype))
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

	// Read and check the values: finite, and exp_avg_sq not negative.
	std::vector<std::vector<float>> p(items.size()), m(items.size()), v(items.size());
	uint64_t n_params = 0;
	for (size_t i = 0; i < items.size(); i++) {
		auto check = [&](const std::vector<float> &x, const std::string &name, bool nonneg) {
			for (size_t k = 0; k < x.size(); k++)
				if (!std::isfinite(x[k]) || (nonneg && x[k] < 0))
					fail(CKPT_E_HPARAM, "{}: tensor '{}' element {} is {}", a.from, name, k, x[k]);
		};
		p[i] = st.read_f32(*items[i].p);
		check(p[i], items[i].p->name, false);
		if (a.with_optimizer) {
			m[i] = st.read_f32(*items[i].m);
			v[i] = st.read_f32(*items[i].v);
			check(m[i], items[i].m->name, false);
			check(v[i], items[i].v->name, true);
		}
		n_params += items[i].dev->numel;
	}
	if (a.with_optimizer) {
		std::vector<ckpt::StateSpan> spans;
		for (size_t i = 0; i < items.size(); i++)
			spans.push_back({items[i].dev->offset, items[i].dev->numel, p[i].data(), m[i].data(), v[i].data()});
		dev->engine()->load_state(spans, step, blob);
	} else {
		std::vector<std::pair<std::string, std::span<const float>>> values;
		for (size_t i = 0; i < items.size(); i++)
			values.emplace_back(items[i].dev->name, std::span<const float>(p[i]));
		dev->load_params(values);
	}
	fmt::print("{}: imported {} tensors ({} params) from {}{}\n", a.device, items.size(), n_params, a.from,
		   a.with_optimizer ? fmt::format(" with exp_avg and exp_avg_sq; committed step {}{}", step,
						  blob.empty() ? "" : fmt::format(", trainer blob {} bytes", blob.size()))
				    : "; moments zero");
	if (!missing.empty())
		fmt::print("  kept {} tensors not in the file: {}\n", missing.size(), list(missing));
	if (!unknown.empty())
		fmt::print("  skipped {} tensors the device lacks: {}\n", unknown.size(), list(unknown));
	if (moments_ignored)
		fmt::print("  ignored {} exp_avg/exp_avg_sq tensors (import them with --with-optimizer)\n",
			   moments_ignored);
	if (buffers_ignored)
		fmt::print("  ignored {} tensors that are not floating point\n", buffers_ignored);
	return exit_ok;
}

int cmd_export(const std::string &device, const std::string &to, bool with_optimizer)
{
	const std::string path = backing_path(device);
	ckpt::Image img = ckpt::Image::open(path, false, true);
	print_warnings(img);
	struct stat in, out;
	if (fstat(img.file.fd.get(), &in) == 0 && stat(to.c_str(), &out) == 0 && in.st_dev == out.st_dev &&
	    in.st_ino == out.st_ino)
		fail(CKPT_E_INVAL, "--to {} is the device itself", to);
	const struct ckpt_sb sb = img.sb;
	std::vector<ckpt::safetensors::Writer::Entry> entries;
	for (const ckpt::Tensor &t : img.manifest.tensors()) {
		entries.push_back({t.name, "F32", t.shape});
		if (with_optimizer) {
			entries.push_back({t.name + ".exp_avg", "F32", t.shape});
			entries.push_back({t.name + ".exp_avg_sq", "F32", t.shape});
		}
	}
	std::map<std::string, std::string> meta = {
		{"format", "pt"},
		{"step", std::to_string(sb.committed_step)},
		{"ckpt.dtype", ckpt::dtype_name(sb.geo.dtype)},
		{"ckpt.uuid", uuid_string(sb.uuid)},
	};
	if (with_optimizer && sb.blob_len)
		meta["ckpt.trainer_blob"] = hex(sb.blob, sb.blob_len);
	ckpt::safetensors::Writer w(to, entries, meta);
	ckpt::Buffer bounce(sb.layout.record_bytes);
	uint64_t n_params = 0;
	for (const ckpt::Tensor &t : img.manifest.tensors()) {
		std::vector<float> p(t.numel), m(t.numel), v(t.numel);
		// Checks every record header against the superblock read at the
		// start: if a live target commits meanwhile, the export fails
		// rather than mixing steps.
		img.read_state(sb.committed_slot, sb.committed_step, sb.sequence, t.offset, t.numel, p.data(), m.data(),
			       v.data(), bounce);
		w.write(p.data(), t.numel * 4);
		if (with_optimizer) {
			w.write(m.data(), t.numel * 4);
			w.write(v.data(), t.numel * 4);
		}
		n_params += t.numel;
	}
	w.finish();
	fmt::print("{}: exported {} tensors ({} params{}) at committed step {} to {}\n", path,
		   img.manifest.tensors().size(), n_params, with_optimizer ? " with exp_avg, exp_avg_sq" : "",
		   sb.committed_step, to);
	return exit_ok;
}

// ----------------------------------------------------------- verify/restore

namespace {

json damage_json(const std::vector<ckpt::Damage> &d)
{
	json a = json::array();
	for (const ckpt::Damage &x : d)
		a.push_back({{"slot", x.slot}, {"chunk", x.chunk}, {"offset", x.offset}, {"what", x.what},
			     {"tensors", x.tensors}});
	return a;
}

void print_damage(const std::vector<ckpt::Damage> &d, size_t limit = 20)
{
	for (size_t i = 0; i < d.size() && i < limit; i++) {
		fmt::print("    at byte {}: {}\n", d[i].offset, d[i].what);
		std::string names;
		for (size_t k = 0; k < d[i].tensors.size() && k < 10; k++)
			names += (k ? ", " : "") + d[i].tensors[k];
		if (d[i].tensors.size() > 10)
			names += fmt::format(", ... ({} in all)", d[i].tensors.size());
		fmt::print("      tensors: {}\n", names.empty() ? "-" : names);
	}
	if (d.size() > limit)
		fmt::print("    ... {} more\n", d.size() - limit);
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

void print_copies(const std::array<ckpt::SuperblockCopy, 2> &c)
{
	for (const auto &x : c) {
		if (x.valid)
			fmt::print("  superblock {} (byte {}): valid, sequence {}, step {}, slot {}{}\n", x.index,
				   x.index * CKPT_BLOCK, x.sb.sequence, x.sb.committed_step, x.sb.committed_slot,
				   x.current ? " (current)" : "");
		else if (x.blank)
			fmt::print("  superblock {} (byte {}): blank (never written)\n", x.index, x.index * CKPT_BLOCK);
		else
			fmt::print("  superblock {} (byte {}): INVALID: {}\n", x.index, x.index * CKPT_BLOCK, x.error);
	}
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
Checked check_all(const std::string &path, bool writable, bool salvage)
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

json meta_json(const ckpt::Image &img)
{
	const struct ckpt_layout &l = img.sb.layout;
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

void print_meta(const ckpt::Image &img)
{
	const struct ckpt_layout &l = img.sb.layout;
	for (uint32_t k = 0; k < img.meta.size(); k++) {
		const ckpt::Image::MetaCopy &m = img.meta[k];
		fmt::print("  group table {} (byte {}): {}\n", k, ckpt_group_offset(&l, k),
			   m.group_error.empty() ? "ok" : "DAMAGED: " + m.group_error);
		fmt::print("  manifest {} (byte {}): {}\n", k, ckpt_manifest_offset(&l, k),
			   m.manifest_error.empty() ? "ok" : "DAMAGED: " + m.manifest_error);
	}
}

} // namespace

int cmd_verify(const std::string &device, bool as_json, bool repair)
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
	const int rc = !ok ? exit_corrupt : degraded ? exit_degraded : exit_ok;
	if (as_json) {
		json j = {{"path", c.path}, {"ok", ok && !degraded},
			  {"status", !ok ? "corrupt" : degraded ? "degraded" : "ok"},
			  {"superblocks", copies_json(c.copies)}, {"warnings", warnings}};
		if (repair)
			j["repaired"] = repaired;
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
		}
		print_json(j);
		return rc;
	}
	fmt::print("{}:\n", c.path);
	if (repair)
		fmt::print("  repair: {}\n", repaired ? fmt::format("rewrote {} damaged metadata cop{} from the intact "
								      "one (flushed)", repaired, repaired == 1 ? "y" : "ies")
						      : "no damaged metadata copy to rewrite");
	print_copies(c.copies);
	if (!c.open_error.empty()) {
		for (const std::string &w : warnings)
			fmt::print("  WARNING: {}\n", w);
		fmt::print("  image: {}\nverify: CORRUPT\n", c.open_error);
		return exit_corrupt;
	}
	const struct ckpt_sb &sb = c.img->sb;
	print_meta(*c.img);
	fmt::print("  group table, manifest: in use: copies {} and {} ({} tensors, {} groups)\n", c.img->group_copy,
		   c.img->manifest_copy, c.img->manifest.tensors().size(), sb.geo.n_groups);
	fmt::print("  committed step {}: slot {}, {} records (headers, data checksums, p_lo): {}\n", sb.committed_step,
		   sb.committed_slot, c.committed.chunks,
		   c.committed.ok() ? "ok" : fmt::format("{} DAMAGED", c.committed.damage.size()));
	print_damage(c.committed.damage);
	if (c.rollback.available)
		fmt::print("  rollback: step {} is readable in slot {}\n", c.rollback.step, c.rollback.slot);
	else
		fmt::print("  rollback: not available: {}\n", c.rollback.reason);
	for (const std::string &w : warnings)
		fmt::print("  WARNING: {}\n", w);
	if (!ok)
		fmt::print("verify: CORRUPT ({} problems)\n", c.committed.damage.size());
	else if (degraded) {
		std::string hint;
		if (!c.img->short_warning.empty())
			hint += "; the file is short: extend it, then verify --repair";
		else if (std::any_of(c.img->meta.begin(), c.img->meta.end(), [](const auto &m) { return !m.ok(); }))
			hint += "; ckptctl verify --repair rewrites the damaged metadata copies";
		if (!c.img->sb_warning.empty())
			hint += "; the next commit rewrites the damaged superblock copy";
		fmt::print("verify: DEGRADED ({} warning{}; the committed state is intact and readable{})\n",
			   warnings.size(), warnings.size() == 1 ? "" : "s", hint);
	}
	else
		fmt::print("verify: ok\n");
	return rc;
}

int cmd_restore(const std::string &device, bool do_rollback, bool as_json)
{
	if (do_rollback)
		check_unused(device, "restore --rollback");
	const std::string path = do_rollback ? device : backing_path(device);
	Checked c = check_all(path, do_rollback, false);
	if (!c.open_error.empty())
		fail(CKPT_E_RECORD, "{}: {}", path, c.open_error);
	print_warnings(*c.img);
	const struct ckpt_sb before = c.img->sb;
	bool rolled = false;
	if (do_rollback) {
		if (!c.rollback.available) {
			if (as_json)
				print_json({{"path", path}, {"rolled_back", false}, {"rollback", rollback_json(c.rollback)}});
			else
				fmt::print(stderr, "ckptctl: {}: cannot roll back to step {}: {}\n", path,
					   before.committed_step ? before.committed_step - 1 : 0, c.rollback.reason);
			return exit_corrupt;
		}
		ckpt::rollback(*c.img, c.rollback);
		rolled = true;
		c.committed = ckpt::check_committed(*c.img);
		c.copies = ckpt::inspect_superblocks(c.img->file);
		c.rollback = ckpt::check_rollback(*c.img, c.copies);
	}
	const struct ckpt_sb &sb = c.img->sb;
	if (as_json) {
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
		print_json(j);
	} else {
		if (rolled)
			fmt::print("{}: rolled back from step {} to step {}\n", path, before.committed_step, sb.committed_step);
		fmt::print("{}: committed step {} (slot {}, superblock sequence {})\n", path, sb.committed_step,
			   sb.committed_slot, sb.sequence);
		if (sb.blob_len)
			fmt::print("  trainer blob    {} bytes\n    hex           {}\n    printable     {}\n", sb.blob_len,
				   hex(sb.blob, sb.blob_len), printable(sb.blob, sb.blob_len));
		else
			fmt::print("  trainer blob    none\n");
		fmt::print("  state           {} ({} records checked)\n",
			   c.committed.ok() ? "intact" : fmt::format("DAMAGED in {} places", c.committed.damage.size()),
			   c.committed.chunks);
		print_damage(c.committed.damage);
		if (c.rollback.available)
			fmt::print("  previous step   {} is readable (slot {}, blob {} bytes){}\n", c.rollback.step,
				   c.rollback.slot, c.rollback.prev.blob_len,
				   rolled ? "" : ": ckptctl restore --rollback makes it the committed step");
		else
			fmt::print("  previous step   not readable: {}\n", c.rollback.reason);
	}
	return c.committed.ok() ? exit_ok : exit_corrupt;
}

// ------------------------------------------------------------ device-mapper

int cmd_create(const CreateArgs &a)
{
	dm::check_name(a.name);
	ckpt::Image img = [&] {
		try {
			return ckpt::Image::open(a.device, false);
		} catch (const ckpt::Error &e) {
			fail(e.code(), "refusing to create {} on {}: no valid dm-ckpt superblock ({}); format it first: "
				       "ckptctl format {} -m MANIFEST", a.name, a.device, e.what(), a.device);
		}
	}();
	if (!img.file.block_device)
		fail(CKPT_E_INVAL, "refusing to create {} on {}: a regular file; the kernel target needs a block "
				   "device (losetup --find --show {} gives one), or use the file directly with the "
				   "userspace engine", a.name, a.device, a.device);
	std::string params = a.device;
	std::vector<std::string> opts;
	if (a.queue_depth)
		opts.push_back(fmt::format("queue_depth {}", a.queue_depth));
	if (a.staging_kb)
		opts.push_back(fmt::format("staging_kb {}", a.staging_kb));
	if (!opts.empty()) {
		params += fmt::format(" {}", 2 * opts.size());
		for (const std::string &o : opts)
			params += " " + o;
	}
	const dm::Target t{0, img.sb.layout.virt_bytes / CKPT_SECTOR, "ckpt", params};
	const uint64_t step = img.sb.committed_step;
	img = {};
	const std::string node = dm::create(a.name, t);
	const dm::Info i = dm::info(a.name);
	if (a.json)
		print_json({{"name", a.name}, {"node", node}, {"major", i.major}, {"minor", i.minor},
			    {"table", fmt::format("{} {} {} {}", t.start, t.length, t.type, t.params)},
			    {"committed_step", step}});
	else
		fmt::print("{}: created {} ({}:{}), table '{} {} {} {}', committed step {}\n", a.name, node, i.major,
			   i.minor, t.start, t.length, t.type, t.params, step);
	return exit_ok;
}

int cmd_remove(const std::string &name, bool retry, bool force)
{
	if (!force) {
		auto tt = dm::table(name);
		if (tt.size() != 1 || tt[0].type != "ckpt")
			fail(CKPT_E_INVAL, "{} is not a dm-ckpt device (its table has {} targets{}): --force removes it "
					   "anyway", name, tt.size(), tt.empty() ? "" : ", the first of type " + tt[0].type);
	}
	dm::remove(name, retry);
	fmt::print("{}: removed\n", name);
	return exit_ok;
}

namespace {

// The kernel target's STATUSTYPE_INFO line, field by field.
json parse_status(const std::string &line)
{
	static const char *names[] = {"state", "committed_step", "open_step", "chunks", "overflow", "last_result",
				      "last_error", "first_io_error", "steps_committed", "steps_skipped",
				      "steps_aborted", "commands_rejected", "grad_bytes", "param_bytes", "io_errors"};
	std::vector<std::string> w;
	std::stringstream in(line);
	for (std::string s; in >> s;)
		w.push_back(s);
	json j = {{"raw", line}};
	if (w.size() != std::size(names)) {
		j["parse_error"] = fmt::format("{} fields, expected {}", w.size(), std::size(names));
		return j;
	}
	for (size_t i = 0; i < w.size(); i++) {
		const std::string n = names[i];
		if (n == "state" || n == "last_result") {
			j[n] = w[i];
		} else if (n == "chunks") {
			unsigned long long done = 0, total = 0;
			if (sscanf(w[i].c_str(), "%llu/%llu", &done, &total) == 2) {
				j["chunks_done"] = done;
				j["n_chunks"] = total;
			} else {
				j["parse_error"] = "chunks field is not DONE/TOTAL";
			}
		} else {
			char *end = nullptr;
			unsigned long long v = strtoull(w[i].c_str(), &end, 10);
			if (*end)
				j["parse_error"] = fmt::format("field {} ('{}') is not a number", n, w[i]);
			j[n] = v;
		}
	}
	if (j.contains("last_error") && j["last_error"].is_number())
		j["last_error_name"] = j["last_error"].get<int>() ? ckpt_strerror(j["last_error"].get<int>()) : "-";
	if (j.contains("first_io_error") && j["first_io_error"].is_number() && j["first_io_error"].get<int>())
		j["first_io_error_name"] = strerror(j["first_io_error"].get<int>());
	return j;
}

} // namespace

int cmd_status(const std::string &name, bool as_json)
{
	const dm::Info i = dm::info(name);
	if (!i.exists)
		fail(CKPT_E_NAME, "no device-mapper device named '{}'", name);
	const auto tt = dm::table(name);
	const auto ss = dm::status(name);
	if (tt.size() != 1 || tt[0].type != "ckpt" || ss.size() != 1)
		fail(CKPT_E_INVAL, "{} is not a dm-ckpt device (its table has {} targets{})", name, tt.size(),
		     tt.empty() ? "" : ", the first of type " + tt[0].type);
	json st = parse_status(ss[0].params);
	json j = {{"name", name},
		  {"node", dm::node(name, i)},
		  {"major", i.major},
		  {"minor", i.minor},
		  {"open_count", i.open_count},
		  {"suspended", i.suspended},
		  {"sectors", tt[0].length},
		  {"table", tt[0].params},
		  {"status", st}};
	if (as_json) {
		print_json(j);
		return exit_ok;
	}
	fmt::print("{}: dm-ckpt device {} ({}:{}), {} sectors, {}, open count {}\n", name,
		   j["node"].get<std::string>(), i.major, i.minor, tt[0].length, i.suspended ? "SUSPENDED" : "active",
		   i.open_count);
	fmt::print("  table           {}\n", tt[0].params);
	if (st.contains("parse_error")) {
		fmt::print("  status          {} (unexpected format: {})\n", ss[0].params, st["parse_error"].get<std::string>());
		return exit_ok;
	}
	auto u = [&](const char *k) { return st[k].get<uint64_t>(); };
	fmt::print("  state           {}, committed step {}", st["state"].get<std::string>(), u("committed_step"));
	if (st["state"] == "open")
		fmt::print(", open step {}: {}/{} chunks applied{}", u("open_step"), u("chunks_done"), u("n_chunks"),
			   u("overflow") ? ", OVERFLOW" : "");
	fmt::print("\n  last result     {}, last error {} ({})\n", st["last_result"].get<std::string>(), u("last_error"),
		   st["last_error_name"].get<std::string>());
	fmt::print("  steps           {} committed, {} skipped (overflow), {} aborted; {} commands rejected\n",
		   u("steps_committed"), u("steps_skipped"), u("steps_aborted"), u("commands_rejected"));
	fmt::print("  traffic         {} gradient bytes in, {} param bytes out\n", u("grad_bytes"), u("param_bytes"));
	fmt::print("  I/O errors      {}{}\n", u("io_errors"),
		   u("first_io_error") ? fmt::format(" (first: {})", st["first_io_error_name"].get<std::string>()) : "");
	return exit_ok;
}

int cmd_message(const std::string &name, const std::vector<std::string> &words)
{
	std::string text;
	for (const std::string &w : words)
		text += (text.empty() ? "" : " ") + w;
	std::string r = dm::message(name, text);
	if (!r.empty())
		fmt::print("{}{}", r, r.back() == '\n' ? "" : "\n");
	return exit_ok;
}

} // namespace ckptctl
