// SPDX-License-Identifier: MIT
#include "image.hpp"

#include <cstring>

#include "error.hpp"

namespace ckpt {

void Image::reload_superblock()
{
	if (file.size < 2 * CKPT_BLOCK)
		fail(CKPT_E_NO_SB, "{} is not a dm-ckpt image: {} bytes, too small for a superblock",
		     file.path, file.size);
	Buffer block(2 * CKPT_BLOCK);
	file.pread_all(block.as(), 2 * CKPT_BLOCK, 0);
	int ret = ckpt_sb_pick(block.as(), block.as() + CKPT_BLOCK, file.size, &sb);
	if (ret < 0)
		fail(-ret, "{} is not a usable dm-ckpt image: superblock: {}", file.path,
		     ckpt_strerror(-ret));
}

Image Image::open(const std::string &path, bool writable)
{
	Image img;
	img.file = BackingFile::open(path, writable);
	img.reload_superblock();

	const struct ckpt_sb &sb = img.sb;
	const struct ckpt_layout &l = sb.layout;
	Buffer meta(l.group_bytes + l.manifest_bytes);
	img.file.pread_all(meta.as(), meta.size(), l.group_off);
	img.group_table.assign(meta.as(), meta.as() + sb.geo.n_chunks);
	for (uint32_t c = 0; c < sb.geo.n_chunks; c++)
		if (img.group_table[c] >= sb.geo.n_groups)
			fail(CKPT_E_LAYOUT, "{}: chunk {} has group {}, the device has {} groups", path, c,
			     img.group_table[c], sb.geo.n_groups);
	const uint8_t *text = meta.as() + (l.manifest_off - l.group_off);
	if (ckpt_crc32c(text, sb.manifest_len) != sb.manifest_crc)
		fail(CKPT_E_MANIFEST, "{}: tensor manifest checksum mismatch", path);
	img.manifest = Manifest::decode({reinterpret_cast<const char *>(text), sb.manifest_len}, l,
					sb.geo, img.group_table);
	return img;
}

std::string Image::tensors_of_chunk(uint32_t chunk) const
{
	const uint64_t cp = sb.layout.chunk_params, lo = chunk * cp, hi = lo + cp;
	std::string out;
	for (const Tensor &t : manifest.tensors())
		if (t.offset < hi && lo < t.offset + t.extent)
			out += fmt::format("{}'{}'", out.empty() ? "" : ", ", t.name);
	return out.empty() ? "no tensor" : out;
}

void Image::check_record(const uint8_t *block, uint32_t chunk, uint32_t slot, uint64_t step,
			 uint64_t sequence, bool data, const uint8_t *plo) const
{
	struct ckpt_rec want = {};
	want.chunk = chunk;
	want.slot = slot;
	want.chunk_shift = sb.geo.chunk_shift;
	want.step = step;
	want.sequence = sequence;
	struct ckpt_rec got;
	const enum ckpt_rec_fault f = ckpt_rec_check(block, data ? block + CKPT_BLOCK : nullptr, plo, &want,
						     sb.feature_incompat, &got);
	if (f == CKPT_REC_OK)
		return;
	std::string what = fmt::format("{}: state record of chunk {} slot {} ({}): {}", file.path, chunk,
				       slot, tensors_of_chunk(chunk), ckpt_rec_fault_str(f));
	if (f == CKPT_REC_HEADER)
		what += fmt::format(" ({})", ckpt_strerror(-ckpt_rec_decode(block, &got)));
	if (f == CKPT_REC_PLACE || f == CKPT_REC_STEP)
		what += fmt::format(" (it holds chunk {} slot {} step {} sequence {}, expected step {} "
				    "sequence {})",
				    got.chunk, got.slot, got.step, got.sequence, step, sequence);
	throw Error(CKPT_E_RECORD, what);
}

void Image::read_state(uint32_t slot, uint64_t step, uint64_t sequence, uint64_t offset, uint64_t n,
		       float *p, float *m, float *v, Buffer &bounce) const
{
	const struct ckpt_layout &l = sb.layout;
	if (offset >= l.n_params || n > l.n_params - offset)
		fail(CKPT_E_RANGE, "state read of {} params at {}: out of range", n, offset);
	const uint64_t cp = l.chunk_params;
	for_each_piece(offset, n, cp, [&](uint32_t c, uint64_t in, uint64_t k) {
		file.pread_all(bounce.as(), l.record_bytes, ckpt_record_offset(&l, slot, c));
		check_record(bounce.as(), c, slot, step, sequence, true);
		const auto *state = reinterpret_cast<const float *>(bounce.as() + CKPT_BLOCK);
		std::memcpy(p, state + in, k * 4);
		std::memcpy(m, state + cp + in, k * 4);
		std::memcpy(v, state + 2 * cp + in, k * 4);
		p += k;
		m += k;
		v += k;
	});
}

} // namespace ckpt
