// SPDX-License-Identifier: MIT
#include "image.hpp"

#include <bit>
#include <cstring>
#include <optional>

#include "error.hpp"

extern "C" {
#include "ckpt_update.h"
}

namespace ckpt {

namespace {

// The bytes a truncated image lacks, when a copy decodes but for its size.
std::string missing_bytes(const BackingFile &f, const uint8_t *blocks)
{
	struct ckpt_sb sb;
	for (unsigned i = 0; i < 2; i++)
		if (ckpt_sb_decode(blocks + i * CKPT_BLOCK, UINT64_MAX, &sb) == 0 &&
		    sb.regions.dev_bytes > f.size)
			return fmt::format("smaller than the layout: {} bytes, its dm-ckpt layout needs {}: the "
					   "last {} bytes are missing (truncated?)",
					   f.size, sb.regions.dev_bytes, sb.regions.dev_bytes - f.size);
	return {};
}

// Why one copy of the group table is not usable, or "".
std::string group_error(const struct ckpt_sb &sb, const uint8_t *table)
{
	int ret = ckpt_group_table_check(&sb, table);
	if (ret == -CKPT_E_CRC)
		return fmt::format("checksum mismatch: crc32c {:#010x}, the superblock says {:#010x}",
				   ckpt_crc32c(table, sb.geo.n_chunks), sb.group_crc);
	if (ret < 0)
		for (uint32_t c = 0; c < sb.geo.n_chunks; c++)
			if (table[c] >= sb.geo.n_groups)
				return fmt::format("chunk {} has group {}, the device has {} groups", c, table[c],
						   sb.geo.n_groups);
	return ret < 0 ? ckpt_strerror(-ret) : "";
}

} // namespace

void Image::reload_superblock()
{
	if (file.size < 2 * CKPT_BLOCK)
		fail(CKPT_E_NO_SB, "{} is not a dm-ckpt image: {} bytes, too small for a superblock",
		     file.path, file.size);
	Buffer block(2 * CKPT_BLOCK);
	file.pread_all(block.as(), 2 * CKPT_BLOCK, 0);
	uint64_t dev = file.size;
	short_warning.clear();
	int ret = ckpt_sb_pick(block.as(), block.as() + CKPT_BLOCK, dev, &sb);
	if (ret < 0) {
		std::string why = missing_bytes(file, block.as());
		if (why.empty())
			fail(-ret, "{} is not a usable dm-ckpt image: superblock: {}", file.path,
			     ckpt_strerror(-ret));
		if (!salvage)
			fail(CKPT_E_TOO_SMALL, "{} is {}", file.path, why);
		// Read what is there: reads past the end fail where they happen.
		dev = UINT64_MAX;
		ret = ckpt_sb_pick(block.as(), block.as() + CKPT_BLOCK, dev, &sb);
		if (ret < 0)
			fail(CKPT_E_TOO_SMALL, "{} is {}", file.path, why);
		short_warning = "the file is " + why;
	}
	sb_copy = static_cast<uint32_t>(ret);
	sb_warning.clear();
	const uint32_t other = sb_copy ^ 1;
	struct ckpt_sb scratch;
	ret = ckpt_sb_check_other(block.as() + other * CKPT_BLOCK, other, dev, &sb, &scratch);
	if (ret < 0)
		sb_warning = fmt::format("superblock copy {} (byte {}) is damaged ({}): using copy {} (sequence {}, "
					 "committed step {}); a newer commit may have been lost (or one was torn by "
					 "a crash)",
					 other, other * CKPT_BLOCK,
					 ret == -CKPT_E_NO_SB ? "its sequence belongs to the other copy"
							       : ckpt_strerror(-ret),
					 sb_copy, sb.sequence, sb.committed_step);
}

Image Image::open(const std::string &path, bool writable, bool salvage)
{
	return open(BackingFile::open(path, writable), salvage);
}

Image Image::open(BackingFile file, bool salvage)
{
	Image img;
	img.file = std::move(file);
	img.salvage = salvage;
	img.reload_superblock();

	const struct ckpt_sb &sb = img.sb;
	const struct ckpt_regions &l = sb.regions;
	const uint32_t copies = ckpt_meta_copies(&l);
	// Each copy: group table, then manifest (contiguous in both copies).
	std::vector<Buffer> bufs;
	auto read = [&](uint8_t *buf, uint64_t len, uint64_t off, std::string &error) {
		try {
			img.file.pread_all(buf, len, off);
			return true;
		} catch (const Error &e) {
			if (!img.salvage)
				throw;
			error = e.what();	// past the end of a short file
			return false;
		}
	};
	for (uint32_t k = 0; k < copies; k++) {
		Buffer &meta = bufs.emplace_back(l.group_bytes + l.manifest_bytes);
		MetaCopy &c = img.meta.emplace_back();
		if (read(meta.as(), l.group_bytes, ckpt_group_offset(&l, k), c.group_error))
			c.group_error = group_error(sb, meta.as());
		const uint8_t *text = meta.as() + l.group_bytes;
		if (read(meta.as() + l.group_bytes, l.manifest_bytes, ckpt_manifest_offset(&l, k), c.manifest_error) &&
		    ckpt_crc32c(text, sb.manifest_len) != sb.manifest_crc)
			c.manifest_error = "checksum mismatch";
	}
	auto first_good = [&](auto bad) -> std::optional<uint32_t> {
		for (uint32_t k = 0; k < copies; k++)
			if (bad(img.meta[k]).empty())
				return k;
		return std::nullopt;
	};
	auto all_bad = [&](const char *what, auto bad, auto offset) {
		std::string why;
		for (uint32_t k = 0; k < copies; k++)
			why += fmt::format("{}{}{}", k ? "; " : "",
					   copies > 1 ? fmt::format("copy {} at byte {}: ", k, offset(&l, k)) : "",
					   bad(img.meta[k]));
		return fmt::format("{}: {}: {}", img.file.path, what, why);
	};
	auto group_bad = [](const MetaCopy &c) { return c.group_error; };
	auto manifest_bad = [](const MetaCopy &c) { return c.manifest_error; };
	const auto g = first_good(group_bad);
	if (!g)
		fail(CKPT_E_LAYOUT, "{}", all_bad("group table", group_bad, ckpt_group_offset));
	const auto m = first_good(manifest_bad);
	if (!m)
		fail(CKPT_E_MANIFEST, "{}", all_bad("tensor manifest", manifest_bad, ckpt_manifest_offset));
	img.group_copy = *g;
	img.manifest_copy = *m;
	img.group_table.assign(bufs[*g].as(), bufs[*g].as() + sb.geo.n_chunks);
	const uint8_t *text = bufs[*m].as() + l.group_bytes;
	img.manifest = Manifest::decode({reinterpret_cast<const char *>(text), sb.manifest_len}, l,
					sb.geo, img.group_table);
	return img;
}

std::vector<std::string> Image::warnings() const
{
	std::vector<std::string> out;
	if (!short_warning.empty())
		out.push_back(short_warning);
	if (!sb_warning.empty())
		out.push_back(sb_warning);
	const struct ckpt_regions &l = sb.regions;
	for (uint32_t k = 0; k < meta.size(); k++) {
		if (!meta[k].group_error.empty())
			out.push_back(fmt::format("group table copy {} (byte {}) is damaged ({}): using copy {}", k,
						  ckpt_group_offset(&l, k), meta[k].group_error, group_copy));
		if (!meta[k].manifest_error.empty())
			out.push_back(fmt::format("tensor manifest copy {} (byte {}) is damaged ({}): using copy {}",
						  k, ckpt_manifest_offset(&l, k), meta[k].manifest_error,
						  manifest_copy));
	}
	return out;
}

unsigned Image::repair_meta()
{
	const struct ckpt_regions &l = sb.regions;
	if (!short_warning.empty())
		fail(CKPT_E_TOO_SMALL, "{}: cannot repair: {}; extend it to {} bytes first (truncate -s {} {})",
		     file.path, short_warning, l.dev_bytes, l.dev_bytes, file.path);
	unsigned written = 0;
	Buffer buf(std::max(l.group_bytes, l.manifest_bytes));
	for (uint32_t k = 0; k < meta.size(); k++) {
		if (!meta[k].group_error.empty()) {
			file.pread_all(buf.as(), l.group_bytes, ckpt_group_offset(&l, group_copy));
			if (ckpt_group_table_check(&sb, buf.as()) != 0)
				fail(CKPT_E_LAYOUT, "{}: group table copy {} changed under us", file.path, group_copy);
			file.pwrite_all(buf.as(), l.group_bytes, ckpt_group_offset(&l, k));
			written++;
		}
		if (!meta[k].manifest_error.empty()) {
			file.pread_all(buf.as(), l.manifest_bytes, ckpt_manifest_offset(&l, manifest_copy));
			if (ckpt_crc32c(buf.as(), sb.manifest_len) != sb.manifest_crc)
				fail(CKPT_E_MANIFEST, "{}: manifest copy {} changed under us", file.path, manifest_copy);
			file.pwrite_all(buf.as(), l.manifest_bytes, ckpt_manifest_offset(&l, k));
			written++;
		}
	}
	if (written) {
		file.flush();
		for (MetaCopy &c : meta)
			c = {};
	}
	return written;
}

std::string Image::tensors_of_chunk(uint32_t chunk) const
{
	const uint64_t cp = sb.regions.chunk_params, lo = chunk * cp, hi = lo + cp;
	std::string out;
	for (const Tensor &t : manifest.tensors())
		if (t.offset < hi && lo < t.offset + t.extent)
			out += fmt::format("{}'{}'", out.empty() ? "" : ", ", t.name);
	return out.empty() ? "no tensor" : out;
}

void Image::check_record(const uint8_t *block, const struct ckpt_rec &want, bool data,
			 const uint8_t *plo) const
{
	struct ckpt_rec got;
	const enum ckpt_rec_fault f = ckpt_rec_check(block, data ? block + CKPT_BLOCK : nullptr, plo, &want,
						     sb.feature_incompat, &got);
	if (f != CKPT_REC_OK)
		fail_record(block, want, f, got);
}

void Image::fail_record(const uint8_t *block, const struct ckpt_rec &want, enum ckpt_rec_fault f,
			const struct ckpt_rec &got) const
{
	std::string what = fmt::format("{}: state record of chunk {} slot {} ({}): {}", file.path, want.chunk,
				       want.slot, tensors_of_chunk(want.chunk), ckpt_rec_fault_str(f));
	if (f == CKPT_REC_HEADER) {
		struct ckpt_rec header;
		what += fmt::format(" ({})", ckpt_strerror(-ckpt_rec_decode(block, &header)));
	}
	if (f == CKPT_REC_PLACE || f == CKPT_REC_STEP)
		what += fmt::format(" (it holds chunk {} slot {} step {} sequence {}, expected step {} "
				    "sequence {})",
				    got.chunk, got.slot, got.step, got.sequence, want.step, want.sequence);
	throw Error(CKPT_E_RECORD, what);
}

void Image::read_state(const struct ckpt_rec &id, uint64_t offset, uint64_t n, float *p, float *m,
		       float *v, Buffer &bounce) const
{
	const struct ckpt_regions &l = sb.regions;
	if (offset >= l.n_params || n > l.n_params - offset)
		fail(CKPT_E_RANGE, "state read of {} params at {}: out of range", n, offset);
	const uint64_t cp = l.chunk_params;
	for_each_piece(offset, n, cp, [&](uint32_t c, uint64_t in, uint64_t k) {
		struct ckpt_rec want = id;
		want.chunk = c;
		file.pread_all(bounce.as(), l.record_bytes, ckpt_record_offset(&l, want.slot, c));
		check_record(bounce.as(), want, true);
		const auto *state = reinterpret_cast<const float *>(bounce.as() + CKPT_BLOCK);
		if (sb.feature_incompat & CKPT_FEATURE_INCOMPAT_BF16M) {	// bf16 masters, exact in fp32
			const auto *p16 = reinterpret_cast<const uint16_t *>(state) + in;
			for (uint64_t i = 0; i < k; i++)
				p[i] = std::bit_cast<float>(static_cast<uint32_t>(p16[i]) << 16);
		} else
			std::memcpy(p, state + in, k * 4);
		if (sb.feature_incompat & CKPT_FEATURE_INCOMPAT_Q8) {
			// the 8-bit moments of the blocks covering [in, in + k), decoded
			const uint64_t qlo = in / CKPT_Q8_BLOCK * CKPT_Q8_BLOCK;
			const uint64_t qn = (in + k + CKPT_Q8_BLOCK - 1) / CKPT_Q8_BLOCK * CKPT_Q8_BLOCK - qlo;
			std::vector<uint32_t> mv(2 * qn);
			struct ckpt_q8_state q;
			ckpt_q8_state_at(bounce.as() + CKPT_BLOCK, sb.geo.chunk_shift, sb.feature_incompat, qlo, &q);
			ckpt_q8_decode(&q, mv.data(), mv.data() + qn, qn);
			std::memcpy(m, mv.data() + (in - qlo), k * 4);
			std::memcpy(v, mv.data() + qn + (in - qlo), k * 4);
		} else {
			std::memcpy(m, state + cp + in, k * 4);
			std::memcpy(v, state + 2 * cp + in, k * 4);
		}
		p += k;
		m += k;
		v += k;
	});
}

namespace {

struct ckpt_rec identity(const struct ckpt_sb &sb, uint32_t chunk, uint32_t slot, uint64_t step,
			 uint64_t sequence)
{
	struct ckpt_rec id;
	ckpt_rec_committed(&sb, chunk, &id);
	id.slot = slot;
	id.step = step;
	id.sequence = sequence;
	return id;
}

} // namespace

void Image::read_state(uint32_t slot, uint64_t step, uint64_t sequence, uint64_t offset, uint64_t n,
		       float *p, float *m, float *v, Buffer &bounce) const
{
	read_state(identity(sb, 0, slot, step, sequence), offset, n, p, m, v, bounce);
}

uint64_t Image::tensor_count(const struct ckpt_sb &at, const Tensor &t) const
{
	if (!(at.feature_incompat & CKPT_FEATURE_INCOMPAT_COUNTS))
		return at.committed_step;
	const struct ckpt_regions &l = at.regions;
	const uint32_t chunk = static_cast<uint32_t>(t.offset / l.chunk_params);
	Buffer header(CKPT_BLOCK);
	file.pread_all(header.as(), CKPT_BLOCK, ckpt_record_offset(&l, at.committed_slot, chunk));
	check_record(header.as(), chunk, at.committed_slot, at.committed_step, at.sequence, false);
	return ckpt_rec_count(header.as(), static_cast<uint32_t>((t.offset % l.chunk_params) >> CKPT_BLOCK_SHIFT));
}

void Image::check_record(const uint8_t *block, uint32_t chunk, uint32_t slot, uint64_t step,
			 uint64_t sequence, bool data, const uint8_t *plo) const
{
	check_record(block, identity(sb, chunk, slot, step, sequence), data, plo);
}

} // namespace ckpt
