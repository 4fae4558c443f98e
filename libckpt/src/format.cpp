// SPDX-License-Identifier: MIT
#include "format.hpp"

#include <cerrno>
#include <cstring>
#include <random>

#include <fcntl.h>
#include <unistd.h>

#include "error.hpp"
#include "io.hpp"

namespace ckpt {

uint32_t parse_dtype(const std::string &name)
{
	if (name == "bf16")
		return CKPT_DTYPE_BF16;
	if (name == "fp16")
		return CKPT_DTYPE_FP16;
	fail(CKPT_E_DTYPE, "unknown dtype '{}': use bf16 or fp16", name);
}

void format(const std::string &path, const Layout &layout, const FormatOptions &opts)
{
	const uint32_t cp = opts.chunk_params;
	if (cp == 0 || (cp & (cp - 1)))
		fail(CKPT_E_GEOMETRY, "chunk_params {} is not a power of two", cp);
	if (opts.dtype != CKPT_DTYPE_BF16 && opts.dtype != CKPT_DTYPE_FP16)
		fail(CKPT_E_DTYPE, "unknown dtype {}", opts.dtype);
	if (opts.incompat & ~CKPT_FEATURE_INCOMPAT_SUPP)
		fail(CKPT_E_FEATURE, "unknown incompat feature bits {:#x}", opts.incompat);
	const Layout::Placed placed = layout.place(static_cast<uint32_t>(__builtin_ctz(cp)), opts.dtype);
	struct ckpt_layout l;
	check_core(ckpt_layout_compute_features(&placed.geo, opts.incompat, &l), "layout");
	const std::string manifest = Manifest::encode(placed.tensors, opts.dtype, cp);

	int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
	if (fd < 0)
		fail(CKPT_E_IO, "cannot create {}: {}", path, strerror(errno));
	Fd guard(fd);
	BackingFile f = BackingFile::open(path, true);
	if (!f.block_device) {
		uint64_t want = std::max(opts.size, l.dev_bytes);
		if (opts.size && opts.size < l.dev_bytes)
			fail(CKPT_E_TOO_SMALL, "{}: size {} is too small: this layout needs {} bytes", path,
			     opts.size, l.dev_bytes);
		if (ftruncate(f.fd.get(), 0) < 0 || ftruncate(f.fd.get(), static_cast<off_t>(want)) < 0)
			fail(CKPT_E_IO, "cannot size {} to {} bytes: {}", path, want, strerror(errno));
		f.size = want;
	} else if (f.size < l.dev_bytes) {
		fail(CKPT_E_TOO_SMALL, "{} has {} bytes: this layout needs {}", path, f.size, l.dev_bytes);
	}

	Buffer zero(2 * CKPT_BLOCK);
	f.pwrite_all(zero.as(), 2 * CKPT_BLOCK, 0);	// no old superblock survives
	f.flush();

	Buffer meta(l.group_bytes + l.manifest_bytes);
	std::memcpy(meta.as(), placed.group_table.data(), placed.group_table.size());
	std::memcpy(meta.as() + (l.manifest_off - l.group_off), manifest.data(), manifest.size());
	f.pwrite_all(meta.as(), meta.size(), l.group_off);
	if (ckpt_meta_copies(&l) > 1)	// the second copy: same bytes, at the end
		f.pwrite_all(meta.as(), meta.size(), ckpt_group_offset(&l, 1));

	// Step 0: all state zero in slot 0. p_lo in large pieces, then each record.
	Buffer chunk(std::max<uint64_t>(l.record_bytes, 8u << 20));
	for (uint64_t off = 0; off < l.n_params * 2;) {
		uint64_t n = std::min<uint64_t>(chunk.size(), l.n_params * 2 - off);
		f.pwrite_all(chunk.as(), n, l.plo_off[0] + off);
		off += n;
	}
	struct ckpt_rec rec = {};
	rec.slot = 0;
	rec.chunk_shift = placed.geo.chunk_shift;
	rec.step = 0;
	rec.sequence = 1;
	rec.data_crc = ckpt_crc32c(chunk.as() + CKPT_BLOCK, 12 * l.chunk_params);
	if (opts.incompat & CKPT_FEATURE_INCOMPAT_PLO_CRC)	// of zeros too
		rec.plo_crc = ckpt_plo_crc(chunk.as() + CKPT_BLOCK, placed.geo.chunk_shift);
	for (uint32_t c = 0; c < placed.geo.n_chunks; c++) {
		rec.chunk = c;
		ckpt_rec_encode(&rec, chunk.as());
		f.pwrite_all(chunk.as(), l.record_bytes, ckpt_record_offset(&l, 0, c));
	}
	f.flush();

	struct ckpt_sb sb = {};
	std::random_device rd;
	for (auto &b : sb.uuid)
		b = static_cast<uint8_t>(rd());
	sb.uuid[6] = (sb.uuid[6] & 0x0f) | 0x40;	// RFC 4122 version 4
	sb.uuid[8] = (sb.uuid[8] & 0x3f) | 0x80;
	sb.sequence = 1;
	sb.feature_incompat = opts.incompat;
	sb.geo = placed.geo;
	sb.layout = l;
	sb.manifest_len = static_cast<uint32_t>(manifest.size());
	sb.manifest_crc = ckpt_crc32c(manifest.data(), manifest.size());
	sb.group_crc = ckpt_crc32c(placed.group_table.data(), placed.group_table.size());
	sb.committed_step = 0;
	sb.committed_slot = 0;
	check_core(ckpt_sb_encode(&sb, zero.as()), "encode superblock");
	f.pwrite_durable(zero.as(), CKPT_BLOCK, (sb.sequence & 1) * CKPT_BLOCK);
}

} // namespace ckpt
