// SPDX-License-Identifier: MIT
#include "block_target.hpp"

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>

#include <fcntl.h>
#include <linux/fs.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include "ckpt_error.hpp"
#include "image.hpp"

namespace ckpt {

namespace {
constexpr uint64_t bounce_bytes = 1u << 20;

bool aligned(const void *p, uint64_t off, uint64_t len, uint32_t block)
{
	return reinterpret_cast<uintptr_t>(p) % CKPT_BLOCK == 0 && off % block == 0 && len % block == 0;
}
} // namespace

BlockTarget::BlockTarget(BackingFile dev) : dev_(std::move(dev)), bounce_(bounce_bytes)
{
	int bs = 0;
	if (ioctl(dev_.fd.get(), BLKSSZGET, &bs) < 0 || bs < static_cast<int>(CKPT_SECTOR) ||
	    bs > static_cast<int>(CKPT_BLOCK) || (bs & (bs - 1)))
		fail(CKPT_E_INVAL, "{}: logical block size {} not supported", dev_.path, bs);
	block_ = static_cast<uint32_t>(bs);
	struct ckpt_status st;
	if (!read_status(st))
		fail(CKPT_E_MAGIC, "{}: no dm-ckpt status page at offset 0: not a dm-ckpt device", dev_.path);
	rejected_seen_ = st.commands_rejected;
}

bool BlockTarget::read_status(struct ckpt_status &st)
{
	return ::pread(dev_.fd.get(), bounce_.as(), CKPT_BLOCK, 0) == CKPT_BLOCK &&
	       ckpt_status_decode(bounce_.as(), &st) == 0;
}

namespace {

// The status page at offset 0 of a block device, if it has one (a control
// read: no side effect; O_DIRECT, so no stale page is cached).
std::optional<struct ckpt_status> status_page(const std::string &path)
{
	const Fd fd(::open(path.c_str(), O_RDONLY | O_DIRECT | O_CLOEXEC));
	const Buffer page(CKPT_BLOCK);
	struct ckpt_status status;
	if (!fd || ::pread(fd.get(), page.as(), CKPT_BLOCK, 0) != CKPT_BLOCK ||
	    ckpt_status_decode(page.as(), &status) != 0)
		return std::nullopt;
	return status;
}

// A dm-ckpt device served over NVMe-oF (ckptctl serve) is a namespace of a
// subsystem whose other namespace is its backing device: the image's
// manifest, step counts and committed state are read there (read-only).
// It is the one sibling disk (same parent in sysfs: the subsystem, or the
// controller without native multipath) whose superblock has the geometry of
// the status page.
std::string served_backing(const std::string &path, const std::filesystem::path &sys,
			   const struct ckpt_status &status)
{
	namespace fs = std::filesystem;
	std::error_code ec;
	const fs::path self = fs::canonical(sys, ec);
	std::vector<std::string> found;
	for (const auto &e : fs::directory_iterator(self.parent_path(), ec)) {
		const std::string name = e.path().filename().string();
		if (e.path() == self || !fs::exists(e.path() / "dev", ec) || !fs::exists(e.path() / "queue", ec))
			continue;	// not a whole disk
		try {
			const Image img = Image::open("/dev/" + name, false);
			if (memcmp(&img.sb.geo, &status.geo, sizeof(status.geo)) == 0)
				found.push_back("/dev/" + name);
		} catch (const Error &) {
			// not an image: another namespace
		}
	}
	if (found.size() != 1)
		fail(CKPT_E_INVAL,
		     "{} answers as a dm-ckpt device but is not a device-mapper device, and {} of the disks beside it "
		     "hold its image (a served dm-ckpt device has its backing device beside it: ckptctl serve "
		     "exports both)",
		     path, found.empty() ? std::string("none") : std::to_string(found.size()));
	return found[0];
}

} // namespace

// A block device is a dm-ckpt device when offset 0 reads as its status page:
// a device-mapper device of this machine (its one slave is the backing
// device), or one served from another (NVMe-oF: the backing device is the
// other namespace of its subsystem). Any other device-mapper device (an LVM
// volume, dm-linear, a dm-log-writes stack) or disk is a plain block device,
// which may itself hold a backing image: its slave is not its content.
std::optional<std::string> BlockTarget::backing_of(const std::string &path)
{
	struct stat st;
	if (stat(path.c_str(), &st) < 0 || !S_ISBLK(st.st_mode))
		return std::nullopt;
	namespace fs = std::filesystem;
	const fs::path sys = fmt::format("/sys/dev/block/{}:{}", major(st.st_rdev), minor(st.st_rdev));
	std::error_code ec;
	const auto status = status_page(path);
	if (!status)
		return std::nullopt;
	if (!fs::exists(sys / "dm", ec))
		return served_backing(path, sys, *status);
	std::vector<std::string> slaves;
	for (const auto &e : fs::directory_iterator(sys / "slaves", ec))
		slaves.push_back(e.path().filename().string());
	if (slaves.size() != 1)
		fail(CKPT_E_INVAL, "{} answers as a dm-ckpt device but has {} backing devices", path,
		     slaves.size());
	return "/dev/" + slaves[0];
}

// The target answers a refused request with -EIO; its status page says why,
// if the refusal is new (the block layer may refuse before the target sees it).
void BlockTarget::refused(const char *what, uint64_t off, uint64_t len, int err)
{
	struct ckpt_status st;
	if (read_status(st)) {
		const bool told = st.commands_rejected != rejected_seen_;
		rejected_seen_ = st.commands_rejected;
		if (st.state == CKPT_STATE_FAILED)
			fail(CKPT_E_FAILED, "{}: the target failed (first backing error: {})", dev_.path,
			     strerror(static_cast<int>(st.first_io_error)));
		if (told && st.last_error)
			fail(static_cast<int>(st.last_error), "{}: {} of {} bytes at {} refused: {}", dev_.path,
			     what, len, off, ckpt_strerror(static_cast<int>(st.last_error)));
	}
	fail(CKPT_E_IO, "{}: {} of {} bytes at {} failed: {}", dev_.path, what, len, off, strerror(err));
}

void BlockTarget::write(uint64_t off, const void *buf, uint64_t len)
{
	auto *src = static_cast<const uint8_t *>(buf);
	if (off % block_ || len % block_)
		fail(CKPT_E_ALIGN, "write of {} bytes at {}: not {}-byte aligned", len, off, block_);
	while (len) {
		const bool direct = aligned(src, off, len, block_);
		const uint64_t n = direct ? len : std::min(len, bounce_bytes);
		if (!direct)
			std::memcpy(bounce_.as(), src, n);
		const void *p = direct ? static_cast<const void *>(src) : bounce_.as();
		ssize_t w = ::pwrite(dev_.fd.get(), p, n, static_cast<off_t>(off));
		if (w < 0 && errno == EINTR)
			continue;
		if (w != static_cast<ssize_t>(n))
			refused(off == 0 ? "command" : "write", off, n, w < 0 ? errno : EIO);
		src += n;
		off += n;
		len -= n;
	}
}

void BlockTarget::read(uint64_t off, void *buf, uint64_t len)
{
	auto *dst = static_cast<uint8_t *>(buf);
	while (len) {
		if (aligned(dst, off, len, block_)) {
			dev_.pread_all(dst, len, off);
			return;
		}
		// Through the bounce buffer, widened to whole blocks.
		const uint64_t lo = off / block_ * block_;
		const uint64_t n = std::min(len, bounce_bytes - (off - lo) - block_);
		const uint64_t hi = (off + n + block_ - 1) / block_ * block_;
		dev_.pread_all(bounce_.as(), hi - lo, lo);
		std::memcpy(dst, bounce_.as() + (off - lo), n);
		dst += n;
		off += n;
		len -= n;
	}
}

} // namespace ckpt
