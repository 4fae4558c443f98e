// SPDX-License-Identifier: MIT
#include "format.hpp"
#include "progress.hpp"

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>

#include <blkid/blkid.h>
#include <endian.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include "error.hpp"
#include "io.hpp"

extern "C" {
#include "ckpt_update.h"
}

namespace ckpt {

uint32_t parse_dtype(const std::string &name)
{
	if (name == "bf16")
		return CKPT_DTYPE_BF16;
	if (name == "fp16")
		return CKPT_DTYPE_FP16;
	fail(CKPT_E_DTYPE, "unknown dtype '{}': use bf16 or fp16", name);
}

namespace {

// What format would destroy on path: a dm-ckpt image (the magic in either
// superblock copy), or anything libblkid recognizes (a file system, a
// partition table, RAID or LVM metadata); "" when there is nothing.
std::string signature(const std::string &path)
{
	struct stat st;
	Fd fd = open_file(path, O_RDONLY, true, st);	// no O_DIRECT: libblkid reads unaligned
	if (has_image_magic(fd.get()))
		return "a dm-ckpt image";
	std::unique_ptr<std::remove_pointer_t<blkid_probe>, decltype(&blkid_free_probe)> pr(blkid_new_probe(),
											       blkid_free_probe);
	if (!pr)
		fail(CKPT_E_NOMEM, "{}: cannot allocate a libblkid probe", path);
	if (blkid_probe_set_device(pr.get(), fd.get(), 0, 0) < 0)
		fail(CKPT_E_IO, "{}: libblkid cannot probe it", path);
	blkid_probe_enable_superblocks(pr.get(), 1);
	blkid_probe_enable_partitions(pr.get(), 1);
	const int ret = blkid_do_safeprobe(pr.get());
	if (ret == -2)
		return "several conflicting signatures (blkid)";
	if (ret != 0)
		return {};
	const char *v = nullptr;
	if (blkid_probe_lookup_value(pr.get(), "TYPE", &v, nullptr) == 0)
		return fmt::format("a {} signature (blkid)", v);
	if (blkid_probe_lookup_value(pr.get(), "PTTYPE", &v, nullptr) == 0)
		return fmt::format("a {} partition table (blkid)", v);
	return "a signature blkid recognizes";
}

// What a stripe set holds that format would destroy: a dm-ckpt image (the
// drives' own signatures are their business: they were given to the set).
std::string image_on(const BackingFile &f)
{
	if (f.size < 2 * CKPT_BLOCK)
		return {};
	Buffer b(2 * CKPT_BLOCK);
	f.pread_all(b.as(), 2 * CKPT_BLOCK, 0);
	for (uint64_t copy = 0; copy < 2; copy++)
		if (le32toh(*reinterpret_cast<const uint32_t *>(b.as() + copy * CKPT_BLOCK)) == CKPT_SB_MAGIC)
			return "a dm-ckpt image";
	return {};
}

// The new image of a regular file, built beside it under a temporary name so
// that the old file stays whole until the new one is complete and flushed.
class NewFile {
public:
	NewFile(const std::string &path, const struct stat *old)
		: path_(path), replaces_(old != nullptr), tmp_(path, "format", O_RDWR)
	{
		if (old) {	// the image replaces the file: keep its mode and owner
			if (fchmod(tmp_.fd(), old->st_mode & 07777) < 0)
				fail(CKPT_E_IO, "cannot set the mode of {}: {}", tmp_.path(), strerror(errno));
			(void)!fchown(tmp_.fd(), old->st_uid, old->st_gid);	// only root can; fine if not
		}
	}
	const std::string &tmp() const { return tmp_.path(); }

	// Reserves the whole image now, so that a full file system fails the
	// format rather than a later step. posix_fallocate emulates where
	// fallocate is missing; where even that is not possible the file is
	// only sized (sparse).
	void reserve(uint64_t bytes)
	{
		// Asked first: a fallocate that fails fills the file system up to
		// the brim before it gives up, for everyone on it.
		struct statvfs vfs;
		const uint64_t avail = fstatvfs(tmp_.fd(), &vfs) == 0 ? uint64_t{vfs.f_bavail} * vfs.f_frsize : 0;
		auto full = [&](const char *why) {
			fail(CKPT_E_IO, "not enough space for {}: the image needs {} bytes, the file system has {} "
					"free{}", path_, bytes, avail, why);
		};
		if (avail && bytes > avail)
			full("");
		int ret = posix_fallocate(tmp_.fd(), 0, static_cast<off_t>(bytes));
		if (ret == ENOSPC)
			full("");
		if (ret == EDQUOT)
			full(" (disk quota exceeded)");
		if (ret == EOPNOTSUPP || ret == EINVAL)
			ret = ftruncate(tmp_.fd(), static_cast<off_t>(bytes)) < 0 ? errno : 0;
		if (ret)
			fail(CKPT_E_IO, "cannot size {} to {} bytes: {}", path_, bytes, strerror(ret));
	}

	// The complete, flushed image takes the file's name; the directory is
	// flushed so that the rename survives a crash. A new path is never
	// replaced: another process that created it meanwhile keeps its image.
	void replace()
	{
		if (fsync(tmp_.fd()) < 0)
			fail(CKPT_E_IO, "flush of {} failed: {}", tmp_.path(), strerror(errno));
		if (replaces_)
			tmp_.rename_over(path_, true);
		else
			tmp_.link_new(path_, true);
	}

private:
	std::string path_;
	bool replaces_;
	TempFile tmp_;
};

// Writes the image into f: the old superblocks are invalidated first and the
// new one is written last, so an interrupted format of a device leaves no
// image, never a mix.
void write_image(const BackingFile &f, const Layout::Placed &placed, const struct ckpt_regions &l,
		 const std::string &manifest, uint32_t incompat)
{
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
	if (incompat & CKPT_FEATURE_INCOMPAT_Q8) {	// zero moments have a code too
		const std::vector<uint32_t> zeros(l.chunk_params);
		struct ckpt_q8_state q;
		ckpt_q8_state_at(chunk.as() + CKPT_BLOCK, placed.geo.chunk_shift, incompat, 0, &q);
		ckpt_q8_encode(&q, zeros.data(), zeros.data(), l.chunk_params);
	}
	struct ckpt_sb sb;
	uint8_t uuid[16];
	std::random_device rd;
	for (auto &b : uuid)
		b = static_cast<uint8_t>(rd());
	uuid[6] = (uuid[6] & 0x0f) | 0x40;	// RFC 4122 version 4
	uuid[8] = (uuid[8] & 0x3f) | 0x80;
	ckpt_sb_first(&sb, uuid, &placed.geo, &l, incompat, static_cast<uint32_t>(manifest.size()),
		      ckpt_crc32c(manifest.data(), manifest.size()),
		      ckpt_crc32c(placed.group_table.data(), placed.group_table.size()));
	// The records the first superblock commits (p_lo and state of zeros).
	for (uint32_t c = 0; c < placed.geo.n_chunks; c++) {
		progress("format", c, placed.geo.n_chunks);
		struct ckpt_rec id;
		ckpt_rec_committed(&sb, c, &id);
		ckpt_rec_seal(chunk.as(), chunk.as() + CKPT_BLOCK, chunk.as() + CKPT_BLOCK, &id, incompat);
		f.pwrite_all(chunk.as(), l.record_bytes, ckpt_record_offset(&l, 0, c));
	}
	f.flush();
	progress("format", placed.geo.n_chunks, placed.geo.n_chunks);

	check_core(ckpt_sb_encode(&sb, zero.as()), "encode superblock");
	f.pwrite_durable(zero.as(), CKPT_BLOCK, ckpt_sb_offset(&sb));
}

} // namespace

void format(const std::string &path_arg, const Layout &layout, const FormatOptions &opts)
{
	const uint32_t cp = opts.chunk_params;
	if (cp == 0 || (cp & (cp - 1)))
		fail(CKPT_E_GEOMETRY, "chunk_params {} is not a power of two", cp);
	if (opts.dtype != CKPT_DTYPE_BF16 && opts.dtype != CKPT_DTYPE_FP16)
		fail(CKPT_E_DTYPE, "unknown dtype {}", opts.dtype);
	if (opts.incompat & ~CKPT_FEATURE_INCOMPAT_SUPP)
		fail(CKPT_E_FEATURE, "unknown incompat feature bits {:#x}", opts.incompat);
	const Layout::Placed placed = layout.place(static_cast<uint32_t>(__builtin_ctz(cp)), opts.dtype);
	// Block counts fit the record header of chunks up to 2^CKPT_COUNTS_MAX_SHIFT
	// params; larger chunks get the other default features.
	uint32_t incompat = opts.incompat;
	if (incompat == CKPT_FEATURE_INCOMPAT_DEFAULT && placed.geo.chunk_shift > CKPT_COUNTS_MAX_SHIFT)
		incompat &= ~CKPT_FEATURE_INCOMPAT_COUNTS;
	if (opts.q8)
		incompat |= CKPT_FEATURE_INCOMPAT_Q8;
	if (opts.bf16_master) {
		if (!opts.q8 || opts.dtype != CKPT_DTYPE_BF16)
			fail(CKPT_E_FEATURE, "bf16 masters need 8-bit moments (state 8bit) and dtype bf16: "
					     "the update implements that combination only");
		incompat |= CKPT_FEATURE_INCOMPAT_BF16M;
	}
	struct ckpt_regions l;
	check_core(ckpt_regions_compute_features(&placed.geo, incompat, &l), "layout");
	const std::string manifest = Manifest::encode(placed.tensors, opts.dtype, cp, layout.hparams(), layout.shard_record());

	// A symlink stands for the file it names: that file is replaced.
	std::string path = path_arg;
	struct stat st;
	const bool exists = stat(path.c_str(), &st) == 0;
	if (!exists && errno != ENOENT)
		fail(CKPT_E_IO, "cannot stat {}: {}", path, strerror(errno));
	if (exists && !S_ISREG(st.st_mode) && !S_ISBLK(st.st_mode))
		fail(CKPT_E_INVAL, "{} is {}: format takes a regular file (created if missing) or a block device",
		     path, file_kind(st.st_mode));
	if (struct stat lst; exists && lstat(path.c_str(), &lst) == 0 && S_ISLNK(lst.st_mode)) {
		std::unique_ptr<char, decltype(&free)> real(realpath(path.c_str(), nullptr), free);
		if (!real)
			fail(CKPT_E_IO, "cannot resolve {}: {}", path, strerror(errno));
		path = real.get();
	}

	// The existing file or device stays open, locked, until the end: no
	// trainer can open it meanwhile, and none has it open now.
	BackingFile old;
	if (exists) {
		old = BackingFile::open(path, true);
		if (!opts.force)
			if (const std::string sig = old.striped() ? image_on(old) : signature(path); !sig.empty())
				fail(CKPT_E_STATE, "{} holds {}: format would destroy it (--force formats anyway)",
				     path_arg, sig);
	}
	// formatted in place: no rename for a device or the drives of a stripe set
	if (old.block_device || old.striped()) {
		if (old.size < l.dev_bytes)
			fail(CKPT_E_TOO_SMALL, "{} has {} bytes: this layout needs {}", path, old.size, l.dev_bytes);
		write_image(old, placed, l, manifest, incompat);
		return;
	}
	if (opts.size && opts.size < l.dev_bytes)
		fail(CKPT_E_TOO_SMALL, "{}: size {} is too small: this layout needs {} bytes", path, opts.size,
		     l.dev_bytes);
	NewFile file(path, exists ? &st : nullptr);
	file.reserve(std::max(opts.size, l.dev_bytes));
	write_image(BackingFile::open(file.tmp(), true), placed, l, manifest, incompat);
	file.replace();
}

} // namespace ckpt
