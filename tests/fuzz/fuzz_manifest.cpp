// SPDX-License-Identifier: MIT
// The tensor manifests (manifest.cpp): the JSON a user gives ckptctl format
// (parse_layout_json, then Layout::place), and the manifest read back from
// a device (Manifest::decode), which must accept what place() encoded.
//
// Input: JSON text. Parsed as a user layout and placed, it gives the
// geometry and group table the same text is then decoded against as a
// device's manifest (which the strict reader refuses: a user layout lacks
// the manifest's format, version, offset and numel); otherwise a fixed small
// geometry, which a device's manifest (the corpus) is decoded against.
#include <string>
#include <string_view>

#include "error.hpp"
#include "fuzz_util.hpp"
#include "manifest.hpp"

namespace {

void decode(std::string_view text, const ckpt_geometry &geo, const std::vector<uint8_t> &table)
{
	ckpt_regions l;
	FUZZ_ASSERT(ckpt_regions_compute_features(&geo, CKPT_FEATURE_INCOMPAT_DEFAULT, &l) == 0);
	try {
		const ckpt::Manifest m = ckpt::Manifest::decode(text, l, geo, table);
		uint64_t next = 0;
		for (const ckpt::Tensor &t : m.tensors()) {
			FUZZ_ASSERT(t.offset == next && t.extent >= t.numel && t.group < geo.n_groups);
			FUZZ_ASSERT(&m.find(t.name) == &t);
			next = t.offset + t.extent;
		}
		FUZZ_ASSERT(next == l.n_params);
	} catch (const ckpt::Error &e) {
		FUZZ_ASSERT(e.code() == CKPT_E_MANIFEST || e.code() == CKPT_E_INVAL);
	}
}

} // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	if (size > 65536)
		return 0;
	const std::string_view text(reinterpret_cast<const char *>(data), size);
	ckpt::LayoutFile f;
	ckpt::Layout::Placed p;
	bool placed = false;
	try {
		f = ckpt::parse_layout_json(text, "fuzz");
		const int dtype = ckpt_dtype_parse(f.dtype.c_str());
		const uint32_t cp = f.chunk_params;
		if (dtype > 0 && cp && !(cp & (cp - 1))) {
			p = f.layout.place(static_cast<uint32_t>(__builtin_ctz(cp)), static_cast<uint32_t>(dtype));
			placed = true;
		}
	} catch (const ckpt::Error &e) {
		FUZZ_ASSERT(e.code() == CKPT_E_MANIFEST || e.code() == CKPT_E_INVAL ||
			    e.code() == CKPT_E_GEOMETRY);
	}
	if (placed) {
		// place() keeps its promises, and what it encodes decodes.
		FUZZ_ASSERT(ckpt_geometry_check(&p.geo) == 0);
		FUZZ_ASSERT(p.group_table.size() == p.geo.n_chunks);
		const uint64_t cp = uint64_t{1} << p.geo.chunk_shift;
		if (p.geo.n_chunks <= (1u << 16)) {
			const std::string enc = ckpt::Manifest::encode(p.tensors, p.geo.dtype, cp, f.layout.hparams());
			ckpt_regions l;
			FUZZ_ASSERT(ckpt_regions_compute_features(&p.geo, CKPT_FEATURE_INCOMPAT_DEFAULT, &l) == 0);
			const ckpt::Manifest m = ckpt::Manifest::decode(enc, l, p.geo, p.group_table);
			FUZZ_ASSERT(m.tensors().size() == p.tensors.size());
			FUZZ_ASSERT(m.hparams() == f.layout.hparams());
			decode(text, p.geo, p.group_table);
		}
		return 0;
	}
	// 4 chunks of 2048 params, groups 0 0 1 1
	ckpt_geometry geo{};
	geo.n_chunks = 4;
	geo.chunk_shift = CKPT_MIN_CHUNK_SHIFT;
	geo.n_groups = 2;
	geo.dtype = CKPT_DTYPE_BF16;
	geo.optimizer = CKPT_OPT_ADAM;
	geo.manifest_bytes = CKPT_BLOCK;
	decode(text, geo, {0, 0, 1, 1});
	return 0;
}
