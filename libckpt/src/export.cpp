// SPDX-License-Identifier: MIT
#include "export.hpp"

#include <functional>
#include <map>

#include <sys/stat.h>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "ckpt_admin.h"
#include "device.hpp"
#include "error.hpp"
#include "image.hpp"
#include "interchange.hpp"
#include "progress.hpp"
#include "safetensors.hpp"

namespace ckpt {

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

namespace {

// What an export reads: the committed step's identity and, per tensor, its
// fp32 p, m, v (m and v may be null) or its low-precision params.
struct Source {
	const Manifest *manifest;
	const struct ckpt_sb *sb;	// uuid, dtype; step and blob below
	uint64_t step;
	std::span<const uint8_t> blob;
	std::function<void(const Tensor &, float *, float *, float *)> state;
	std::function<void(const Tensor &, uint16_t *)> lowp;
	std::function<uint64_t(const Tensor &)> count;	// the tensor's step count
};

std::map<std::string, std::string> metadata(const Source &src, uint32_t flags, const std::string &meta_json)
{
	std::map<std::string, std::string> meta = {
		{"format", "pt"},
		{"step", std::to_string(src.step)},
		{"ckpt.dtype", ckpt_dtype_name(src.sb->geo.dtype)},
		{"ckpt.uuid", uuid_string(src.sb->uuid)},
	};
	interchange::Metadata ix;
	ix.dtype = src.sb->geo.dtype;
	ix.chunk_params = static_cast<uint32_t>(src.sb->regions.chunk_params);
	ix.step = src.step;
	ix.n_groups = src.sb->geo.n_groups;
	for (const Tensor &t : src.manifest->tensors()) {
		ix.tensor_group[t.name] = t.group;
		if (const uint64_t n = src.count(t); n != src.step)
			ix.tensor_step[t.name] = n;
	}
	ix.hparams = src.manifest->hparams();
	ix.q8 = src.sb->feature_incompat & CKPT_FEATURE_INCOMPAT_Q8;
	ix.bf16_master = src.sb->feature_incompat & CKPT_FEATURE_INCOMPAT_BF16M;
	interchange::write(ix, meta);
	if (flags & CKPT_EXPORT_LOWP)
		meta["ckpt.params"] = "lowp";
	if ((flags & CKPT_EXPORT_OPTIMIZER) && !src.blob.empty())
		meta["ckpt.trainer_blob"] = hex(src.blob.data(), src.blob.size());
	if (meta_json.empty())
		return meta;
	const nlohmann::json j = nlohmann::json::parse(meta_json, nullptr, false);
	if (j.is_discarded() || !j.is_object())
		fail(CKPT_E_INVAL, "export metadata is not a JSON object");
	for (const auto &[k, v] : j.items()) {
		if (!v.is_string())
			fail(CKPT_E_INVAL, "export metadata '{}' is not a string", k);
		if (k.rfind(interchange::prefix, 0) == 0)
			fail(CKPT_E_INVAL, "export metadata '{}': the {}* keys are the exporter's", k,
			     interchange::prefix);
		meta[k] = v.get<std::string>();
	}
	return meta;
}

ExportReport write(const Source &src, const std::string &out, uint32_t flags, const std::string &meta_json)
{
	constexpr uint32_t known = CKPT_EXPORT_LOWP | CKPT_EXPORT_OPTIMIZER | CKPT_EXPORT_FORCE;
	if (flags & ~known)
		fail(CKPT_E_INVAL, "export: unknown flags {:#x}", flags & ~known);
	const bool lowp = flags & CKPT_EXPORT_LOWP, opt = flags & CKPT_EXPORT_OPTIMIZER;
	const char *pdtype = lowp ? ckpt_dtype_safetensors(src.sb->geo.dtype) : "F32";
	std::vector<safetensors::Writer::Entry> entries;
	for (const Tensor &t : src.manifest->tensors()) {
		entries.push_back({t.name, pdtype, t.shape});
		if (opt) {
			entries.push_back({t.name + ".exp_avg", "F32", t.shape});
			entries.push_back({t.name + ".exp_avg_sq", "F32", t.shape});
		}
	}
	safetensors::Writer w(out, entries, metadata(src, flags, meta_json), flags & CKPT_EXPORT_FORCE);
	ExportReport r;
	r.step = src.step;
	uint64_t total = 0;
	for (const Tensor &t : src.manifest->tensors())
		total += t.numel;
	for (const Tensor &t : src.manifest->tensors()) {
		progress("export", r.params, total);
		std::vector<float> p(t.numel), m(opt ? t.numel : 0), v(opt ? t.numel : 0);
		if (lowp) {
			std::vector<uint16_t> lo(t.numel);
			src.lowp(t, lo.data());
			w.write(lo.data(), t.numel * 2);
			if (opt)
				src.state(t, p.data(), m.data(), v.data());
		} else {
			src.state(t, p.data(), opt ? m.data() : nullptr, opt ? v.data() : nullptr);
			w.write(p.data(), t.numel * 4);
		}
		if (opt) {
			w.write(m.data(), t.numel * 4);
			w.write(v.data(), t.numel * 4);
		}
		r.tensors++;
		r.params += t.numel;
	}
	w.finish();
	progress("export", total, total);
	return r;
}

// The rename at the end would replace the image itself.
void check_not_image(const Image &img, const std::string &out, const char *what)
{
	struct stat in, o;
	if (fstat(img.file.fd.get(), &in) == 0 && stat(out.c_str(), &o) == 0 && in.st_dev == o.st_dev &&
	    in.st_ino == o.st_ino)
		fail(CKPT_E_INVAL, "{}{} is the device itself", what, out);
}

} // namespace

ExportReport export_device(Device &dev, const std::string &out, uint32_t flags, const std::string &meta_json)
{
	const struct ckpt_status st = dev.status();
	if (st.state == CKPT_STATE_OPEN)
		fail(CKPT_E_STATE, "export: step {} is open: commit or abort it first", st.open_step);
	check_not_image(dev.image(), out, "export: the output ");
	Source src{&dev.manifest(), &dev.image().sb, st.committed_step, {st.blob, st.blob_len}, {}, {}, {}};
	std::vector<float> scratch;
	src.state = [&](const Tensor &t, float *p, float *m, float *v) {
		if (!m) {
			scratch.resize(2 * t.numel);
			m = scratch.data();
			v = m + t.numel;
		}
		dev.read_state(t.name, p, m, v, t.numel);
	};
	src.lowp = [&](const Tensor &t, uint16_t *lo) { dev.read_params(t.name, lo, t.numel); };
	src.count = [&](const Tensor &t) { return dev.tensor_step(t.name); };
	ExportReport r = write(src, out, flags, meta_json);
	r.path = dev.image().file.path;
	return r;
}

ExportReport export_image(const std::string &path, const std::string &out, uint32_t flags,
			  const std::string &meta_json)
{
	if (flags & CKPT_EXPORT_LOWP)
		fail(CKPT_E_INVAL, "export of a backing image writes the fp32 masters (no CKPT_EXPORT_LOWP)");
	Image img = Image::open(path, false, true);
	check_not_image(img, out, "--to ");	// ckptctl export's words
	const struct ckpt_sb sb = img.sb;
	Buffer bounce(sb.regions.record_bytes);
	std::vector<float> scratch;
	Source src{&img.manifest, &sb, sb.committed_step, {sb.blob, sb.blob_len}, {}, {}, {}};
	src.count = [&](const Tensor &t) { return img.tensor_count(sb, t); };
	// Every record header is checked against the superblock read at the
	// start: if a live target commits meanwhile, the export fails rather
	// than mixing steps.
	src.state = [&](const Tensor &t, float *p, float *m, float *v) {
		if (!m) {
			scratch.resize(2 * t.numel);
			m = scratch.data();
			v = m + t.numel;
		}
		img.read_state(sb.committed_slot, sb.committed_step, sb.sequence, t.offset, t.numel, p, m, v, bounce);
	};
	ExportReport r = write(src, out, flags, meta_json);
	r.path = img.file.path;
	r.warnings = img.warnings();
	return r;
}

} // namespace ckpt
