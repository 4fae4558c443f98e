// SPDX-License-Identifier: MIT
#include "block_target.hpp"

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>

#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include "error.hpp"

namespace ckpt {

namespace {
constexpr uint64_t bounce_bytes = 1u << 20;

bool aligned(const void *p, uint64_t off, uint64_t len)
{
	return reinterpret_cast<uintptr_t>(p) % CKPT_BLOCK == 0 && off % CKPT_SECTOR == 0 &&
	       len % CKPT_SECTOR == 0;
}
} // namespace

BlockTarget::BlockTarget(BackingFile dev) : dev_(std::move(dev)), bounce_(bounce_bytes) {}

std::optional<std::string> BlockTarget::backing_of(const std::string &path)
{
	struct stat st;
	if (stat(path.c_str(), &st) < 0 || !S_ISBLK(st.st_mode))
		return std::nullopt;
	namespace fs = std::filesystem;
	const fs::path sys = fmt::format("/sys/dev/block/{}:{}", major(st.st_rdev), minor(st.st_rdev));
	std::error_code ec;
	if (!fs::exists(sys / "dm", ec))
		return std::nullopt;
	std::vector<std::string> slaves;
	for (const auto &e : fs::directory_iterator(sys / "slaves", ec))
		slaves.push_back(e.path().filename().string());
	if (slaves.size() != 1)
		fail(CKPT_E_INVAL, "{} is a device-mapper device with {} backing devices, not a dm-ckpt device",
		     path, slaves.size());
	return "/dev/" + slaves[0];
}

void BlockTarget::refused(const char *what, uint64_t off, uint64_t len, int err)
{
	struct ckpt_status st;
	uint8_t *page = bounce_.as();
	if (::pread(dev_.fd.get(), page, CKPT_BLOCK, 0) == CKPT_BLOCK && ckpt_status_decode(page, &st) == 0) {
		if (st.state == CKPT_STATE_FAILED)
			fail(CKPT_E_FAILED, "{}: the target failed (first backing error: {})", dev_.path,
			     strerror(static_cast<int>(st.first_io_error)));
		if (st.last_error)
			fail(static_cast<int>(st.last_error), "{}: {} of {} bytes at {} refused: {}", dev_.path,
			     what, len, off, ckpt_strerror(static_cast<int>(st.last_error)));
	}
	fail(CKPT_E_IO, "{}: {} of {} bytes at {} failed: {}", dev_.path, what, len, off, strerror(err));
}

void BlockTarget::write(uint64_t off, const void *buf, uint64_t len)
{
	auto *src = static_cast<const uint8_t *>(buf);
	if (off % CKPT_SECTOR || len % CKPT_SECTOR)
		fail(CKPT_E_ALIGN, "write of {} bytes at {}: not {}-byte aligned", len, off, CKPT_SECTOR);
	while (len) {
		const bool direct = aligned(src, off, len);
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
		if (aligned(dst, off, len)) {
			dev_.pread_all(dst, len, off);
			return;
		}
		// Through the bounce buffer, widened to whole sectors.
		const uint64_t lo = off / CKPT_SECTOR * CKPT_SECTOR;
		const uint64_t n = std::min(len, bounce_bytes - (off - lo) - CKPT_SECTOR);
		const uint64_t hi = (off + n + CKPT_SECTOR - 1) / CKPT_SECTOR * CKPT_SECTOR;
		dev_.pread_all(bounce_.as(), hi - lo, lo);
		std::memcpy(dst, bounce_.as() + (off - lo), n);
		dst += n;
		off += n;
		len -= n;
	}
}

} // namespace ckpt
