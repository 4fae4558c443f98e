// SPDX-License-Identifier: MIT
#include "block_target.hpp"

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <optional>
#include <utility>

#include <fcntl.h>
#include <linux/fs.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include "error.hpp"
#include "image.hpp"

namespace ckpt {

namespace {
constexpr uint64_t bounce_bytes = 1u << 20;
constexpr uint64_t slab_bytes = 1u << 20;	// gradients copied for a write in flight
constexpr uint32_t n_slabs = 16;
constexpr unsigned max_writes = 64;		// in flight; the ring's entries
constexpr uint64_t batch_bytes = 1u << 20;	// submitted once this much is queued
constexpr unsigned batch_writes = 32;		// or this many writes

bool aligned(const void *p, uint64_t off, uint64_t len, uint32_t block)
{
	return reinterpret_cast<uintptr_t>(p) % CKPT_BLOCK == 0 && off % block == 0 && len % block == 0;
}
} // namespace

BlockTarget::BlockTarget(BackingFile dev) : dev_(std::move(dev)), bounce_(bounce_bytes), ring_(max_writes)
{
	slabs_.resize(n_slabs);
	for (uint32_t i = 0; i < n_slabs; i++) {
		slabs_[i].mem = Buffer(slab_bytes);
		free_slabs_.push_back(n_slabs - 1 - i);
	}
	ios_.resize(max_writes);
	for (unsigned i = 0; i < max_writes; i++)
		free_ios_.push_back(max_writes - 1 - i);
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
			const std::string node = block_node(name);
			const Image img = Image::open(node, false);
			if (memcmp(&img.sb.geo, &status.geo, sizeof(status.geo)) == 0)
				found.push_back(node);
		} catch (const Error &) {
			// not an image: another namespace (or one without a node)
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

std::optional<Image> BlockTarget::image_of(const std::string &path)
{
	struct stat st;
	if (stat(path.c_str(), &st) < 0 || !S_ISBLK(st.st_mode))
		return std::nullopt;
	const auto status = status_page(path);
	if (!status)
		return std::nullopt;
	struct ckpt_regions l;
	uint64_t size = 0;
	const Fd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
	if (ckpt_regions_compute(&status->geo, &l) == 0 && fd && ioctl(fd.get(), BLKGETSIZE64, &size) == 0 &&
	    size > l.image_off)
		return Image::open(BackingFile::open_window(path, l.image_off));
	if (auto backing = backing_of(path))
		return Image::open(*backing, false);
	return std::nullopt;
}

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
	return block_node(slaves[0]);
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

BlockTarget::~BlockTarget()
{
	try {
		drain();	// never leave I/O on our slabs
	} catch (const Error &) {
	}
}

// A command is one synchronous write at offset 0, after every gradient write.
void BlockTarget::command(uint64_t off, const uint8_t *src, uint64_t len)
{
	drain();
	report_error();
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
			refused("command", off, n, w < 0 ? errno : EIO);
		src += n;
		off += n;
		len -= n;
	}
}

void BlockTarget::write(uint64_t off, const void *buf, uint64_t len)
{
	auto *src = static_cast<const uint8_t *>(buf);
	if (off % block_ || len % block_)
		fail(CKPT_E_ALIGN, "write of {} bytes at {}: not {}-byte aligned", len, off, block_);
	if (off < CKPT_BLOCK)
		return command(off, src, len);
	report_error();
	while (len) {
		const uint64_t n = std::min(len, slab_bytes);
		const uint32_t si = slab_for(n);
		Slab &s = slabs_[si];
		uint8_t *dst = s.mem.as() + s.used;
		std::memcpy(dst, src, n);
		while (free_ios_.empty())
			reap(true);
		const uint32_t tag = free_ios_.back();
		free_ios_.pop_back();
		ios_[tag] = {off, n, si};
		ring_.write(dev_.fd.get(), dst, static_cast<unsigned>(n), off, tag);
		s.used += n;
		s.writes++;
		inflight_++;
		queued_++;
		queued_bytes_ += n;
		if (queued_bytes_ >= batch_bytes || queued_ >= batch_writes)
			submit();
		src += n;
		off += n;
		len -= n;
	}
	reap(false);
}

// The slab to copy len bytes into: the current one while it has room, else
// a free one (waiting for writes to complete while none is).
uint32_t BlockTarget::slab_for(uint64_t len)
{
	if (cur_ != ~0u && !slabs_[cur_].writes)
		slabs_[cur_].used = 0;		// all of it written: start again
	if (cur_ != ~0u && slab_bytes - slabs_[cur_].used >= len)
		return cur_;
	cur_ = ~0u;	// full, with writes in flight: the last one frees it
	while (free_slabs_.empty()) {
		submit();
		reap(true);
	}
	cur_ = free_slabs_.back();
	free_slabs_.pop_back();
	return cur_;
}

void BlockTarget::submit()
{
	if (!queued_)
		return;
	ring_.submit();
	queued_ = 0;
	queued_bytes_ = 0;
}

// Takes the completions there are (wait: at least one, submitting first).
void BlockTarget::reap(bool wait)
{
	if (wait)
		submit();
	while (inflight_ > queued_) {
		std::optional<std::pair<uint64_t, int>> c;
		if (wait)
			c = ring_.wait();
		else if (!(c = ring_.peek()))
			return;
		wait = false;
		const auto [tag, res] = *c;
		const Io io = ios_[tag];
		free_ios_.push_back(static_cast<uint32_t>(tag));
		inflight_--;
		if (static_cast<uint64_t>(res) != io.len && !error_) {
			error_ = res < 0 ? -res : EIO;
			error_off_ = io.off;
			error_len_ = io.len;
		}
		Slab &s = slabs_[io.slab];
		if (--s.writes == 0 && io.slab != cur_) {
			s.used = 0;
			free_slabs_.push_back(io.slab);
		}
	}
}

void BlockTarget::drain()
{
	submit();
	while (inflight_)
		reap(true);
}

// The first failed write, once, with what the target says of it; nothing
// is in flight by then (the status page counts every write before it).
void BlockTarget::report_error()
{
	if (!error_)
		return;
	drain();
	const int err = std::exchange(error_, 0);
	refused("write", error_off_, error_len_, err);
}

void BlockTarget::read(uint64_t off, void *buf, uint64_t len)
{
	const ReadPiece piece{off, buf, len};
	read_many({&piece, 1});
}

// Every write before a read is complete when it is issued; the pieces go
// down as one batch of O_DIRECT reads, straight into aligned memory.
void BlockTarget::read_many(std::span<const ReadPiece> pieces)
{
	drain();
	read_pieces(dev_, ring_, 16, pieces, bounce_);
}

} // namespace ckpt
