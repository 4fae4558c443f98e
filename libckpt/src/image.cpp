// SPDX-License-Identifier: MIT
#include "image.hpp"

#include "error.hpp"

namespace ckpt {

Image Image::open(const std::string &path, bool writable)
{
	Image img;
	img.file = BackingFile::open(path, writable);
	if (img.file.size < 2 * CKPT_BLOCK)
		fail(CKPT_E_NO_SB, "{} is not a dm-ckpt image: {} bytes, too small for a superblock", path,
		     img.file.size);
	Buffer block(2 * CKPT_BLOCK);
	img.file.pread_all(block.as(), 2 * CKPT_BLOCK, 0);
	int ret = ckpt_sb_pick(block.as(), block.as() + CKPT_BLOCK, img.file.size, &img.sb);
	if (ret < 0)
		fail(-ret, "{} is not a usable dm-ckpt image: superblock: {}", path, ckpt_strerror(-ret));

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

} // namespace ckpt
