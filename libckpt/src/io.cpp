// SPDX-License-Identifier: MIT
#include "io.hpp"

#include <cerrno>
#include <cstring>

#include <fcntl.h>
#include <linux/fs.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>

#include "error.hpp"

namespace ckpt {

void Fd::reset()
{
	if (fd_ >= 0)
		::close(fd_);
	fd_ = -1;
}

Buffer::Buffer(size_t bytes)
{
	if (!bytes)
		return;
	size_t len = (bytes + 4095) & ~size_t{4095};
	void *p = mmap(nullptr, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (p == MAP_FAILED)
		fail(CKPT_E_NOMEM, "cannot allocate {} bytes: {}", len, strerror(errno));
	if (len >= (2u << 20))
		madvise(p, len, MADV_HUGEPAGE);
	p_ = p;
	n_ = len;
}

Buffer &Buffer::operator=(Buffer &&o) noexcept
{
	if (this != &o) {
		if (p_)
			munmap(p_, n_);
		p_ = std::exchange(o.p_, nullptr);
		n_ = std::exchange(o.n_, 0);
	}
	return *this;
}

Buffer::~Buffer()
{
	if (p_)
		munmap(p_, n_);
}

BackingFile BackingFile::open(const std::string &path, bool writable)
{
	BackingFile f;
	f.path = path;
	int flags = (writable ? O_RDWR : O_RDONLY) | O_CLOEXEC;
	int fd = ::open(path.c_str(), flags | O_DIRECT);
	if (fd >= 0) {
		f.direct = true;
	} else if (errno == EINVAL) {	// tmpfs and friends have no O_DIRECT
		fd = ::open(path.c_str(), flags);
	}
	if (fd < 0)
		fail(CKPT_E_IO, "cannot open {}: {}", path, strerror(errno));
	f.fd = Fd(fd);
	struct stat st;
	if (fstat(fd, &st) < 0)
		fail(CKPT_E_IO, "cannot stat {}: {}", path, strerror(errno));
	if (S_ISBLK(st.st_mode)) {
		f.block_device = true;
		if (ioctl(fd, BLKGETSIZE64, &f.size) < 0)
			fail(CKPT_E_IO, "cannot get the size of {}: {}", path, strerror(errno));
	} else if (S_ISREG(st.st_mode)) {
		f.size = static_cast<uint64_t>(st.st_size);
	} else {
		fail(CKPT_E_INVAL, "{} is neither a regular file nor a block device", path);
	}
	return f;
}

void BackingFile::pread_all(void *buf, size_t len, uint64_t off) const
{
	auto *p = static_cast<uint8_t *>(buf);
	while (len) {
		ssize_t n = ::pread(fd.get(), p, len, static_cast<off_t>(off));
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0)
			fail(CKPT_E_IO, "read of {} bytes at {} from {} failed: {}", len, off, path,
			     strerror(errno));
		if (n == 0)
			fail(CKPT_E_IO, "read at {} from {}: unexpected end of file", off, path);
		p += n;
		off += static_cast<uint64_t>(n);
		len -= static_cast<size_t>(n);
	}
}

void BackingFile::pwrite_all(const void *buf, size_t len, uint64_t off) const
{
	auto *p = static_cast<const uint8_t *>(buf);
	while (len) {
		ssize_t n = ::pwrite(fd.get(), p, len, static_cast<off_t>(off));
		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0)
			fail(CKPT_E_IO, "write of {} bytes at {} to {} failed: {}", len, off, path,
			     n < 0 ? strerror(errno) : "no progress");
		p += n;
		off += static_cast<uint64_t>(n);
		len -= static_cast<size_t>(n);
	}
}

void BackingFile::pwrite_durable(const void *buf, size_t len, uint64_t off) const
{
	if (direct) {
		iovec iov{const_cast<void *>(buf), len};
		ssize_t n = pwritev2(fd.get(), &iov, 1, static_cast<off_t>(off), RWF_DSYNC);
		if (n == static_cast<ssize_t>(len))
			return;
		if (n < 0 && errno != EOPNOTSUPP && errno != EINVAL)
			fail(CKPT_E_IO, "durable write at {} to {} failed: {}", off, path, strerror(errno));
	}
	pwrite_all(buf, len, off);
	flush();
}

void BackingFile::flush() const
{
	if (fdatasync(fd.get()) < 0)
		fail(CKPT_E_IO, "flush of {} failed: {}", path, strerror(errno));
}

Ring::Ring(unsigned entries)
{
	int ret = io_uring_queue_init(entries, &ring_, 0);
	if (ret < 0)
		fail(CKPT_E_IO, "io_uring_queue_init: {}", strerror(-ret));
}

Ring::~Ring() { io_uring_queue_exit(&ring_); }

io_uring_sqe *Ring::sqe()
{
	io_uring_sqe *s = io_uring_get_sqe(&ring_);
	if (!s) {
		submit();
		s = io_uring_get_sqe(&ring_);
	}
	if (!s)
		fail(CKPT_E_IO, "io_uring submission queue full");
	return s;
}

void Ring::read(int fd, void *buf, unsigned len, uint64_t off, uint64_t tag)
{
	io_uring_sqe *s = sqe();
	io_uring_prep_read(s, fd, buf, len, off);
	io_uring_sqe_set_data64(s, tag);
}

void Ring::write(int fd, const void *buf, unsigned len, uint64_t off, uint64_t tag)
{
	io_uring_sqe *s = sqe();
	io_uring_prep_write(s, fd, buf, len, off);
	io_uring_sqe_set_data64(s, tag);
}

void Ring::submit()
{
	int ret;
	do
		ret = io_uring_submit(&ring_);
	while (ret == -EINTR);
	if (ret < 0)
		fail(CKPT_E_IO, "io_uring_submit: {}", strerror(-ret));
}

std::pair<uint64_t, int> Ring::wait()
{
	io_uring_cqe *cqe;
	int ret;
	do
		ret = io_uring_wait_cqe(&ring_, &cqe);
	while (ret == -EINTR);
	if (ret < 0)
		fail(CKPT_E_IO, "io_uring_wait_cqe: {}", strerror(-ret));
	std::pair<uint64_t, int> r{io_uring_cqe_get_data64(cqe), cqe->res};
	io_uring_cqe_seen(&ring_, cqe);
	return r;
}

} // namespace ckpt
