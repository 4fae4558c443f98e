// SPDX-License-Identifier: MIT
#include "io.hpp"

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <csetjmp>
#include <csignal>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <random>
#include <sstream>
#include <vector>

#include <fcntl.h>
#include <linux/fs.h>
#include <linux/magic.h>
#include <sys/file.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/sysmacros.h>
#include <sys/uio.h>
#include <unistd.h>
#if defined(__x86_64__)
#include <emmintrin.h>
#endif

#include <fmt/format.h>

#include "error.hpp"
#include "stripe.hpp"
#include "ckpt_codec.h"

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

const char *file_kind(mode_t m)
{
	switch (m & S_IFMT) {
	case S_IFREG:
		return "a regular file";
	case S_IFBLK:
		return "a block device";
	case S_IFCHR:
		return "a character device";
	case S_IFIFO:
		return "a FIFO";
	case S_IFDIR:
		return "a directory";
	case S_IFSOCK:
		return "a socket";
	default:
		return "not a regular file";
	}
}

TempFile::TempFile(const std::string &path, const char *tag, int flags)
{
	std::random_device rd;
	for (int tries = 0;; tries++) {
		const std::string tmp = fmt::format("{}.{}-{:08x}", path, tag, rd());
		int fd = ::open(tmp.c_str(), flags | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
		if (fd >= 0) {
			fd_ = Fd(fd);
			tmp_ = tmp;
			return;
		}
		if (errno != EEXIST || tries == 100)
			fail(CKPT_E_IO, "cannot create {} (as {}): {}", path, tmp, strerror(errno));
	}
}

TempFile::~TempFile()
{
	if (!tmp_.empty())
		::unlink(tmp_.c_str());
}

// The directory holding path, flushed: a rename or link into it then
// survives a crash.
static void flush_dir_of(const std::string &path)
{
	const size_t slash = path.rfind('/');
	const std::string dir = slash == std::string::npos ? "." : path.substr(0, slash + 1);
	Fd d(::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
	if (!d || fsync(d.get()) < 0)
		fail(CKPT_E_IO, "flush of directory {} failed: {}", dir, strerror(errno));
}

void TempFile::rename_over(const std::string &target, bool sync_dir)
{
	if (::rename(tmp_.c_str(), target.c_str()) < 0)
		fail(CKPT_E_IO, "cannot rename {} to {}: {}", tmp_, target, strerror(errno));
	tmp_.clear();
	if (sync_dir)
		flush_dir_of(target);
}

void TempFile::link_new(const std::string &target, bool sync_dir)
{
	rename_new(tmp_, target, false);
	tmp_.clear();
	if (sync_dir)
		flush_dir_of(target);
}

void rename_new(const std::string &from, const std::string &to, bool sync_dir)
{
	int ret = ::renameat2(AT_FDCWD, from.c_str(), AT_FDCWD, to.c_str(), RENAME_NOREPLACE);
	if (ret < 0 && (errno == EINVAL || errno == ENOSYS)) {
		// No RENAME_NOREPLACE on this file system: link(2) never replaces either.
		ret = ::link(from.c_str(), to.c_str());
		if (ret == 0)
			::unlink(from.c_str());
	}
	if (ret < 0 && errno == EEXIST)
		fail(CKPT_E_STATE, "{} appeared while it was being created (another process created it): it is "
				   "left as it is", to);
	if (ret < 0)
		fail(CKPT_E_IO, "cannot put {} in place as {}: {}", from, to, strerror(errno));
	if (sync_dir)
		flush_dir_of(to);
}

namespace {

// open(2) that does not block on a FIFO, then the type check; -errno when
// open itself fails, so that callers can retry without O_DIRECT.
int open_checked(const std::string &path, int flags, bool block_ok, struct stat &st)
{
	int fd = ::open(path.c_str(), flags | O_NONBLOCK | O_CLOEXEC);
	if (fd < 0)
		return -errno;
	Fd guard(fd);
	if (fstat(fd, &st) < 0)
		fail(CKPT_E_IO, "cannot stat {}: {}", path, strerror(errno));
	if (!S_ISREG(st.st_mode) && !(block_ok && S_ISBLK(st.st_mode)))
		fail(CKPT_E_INVAL, "{} is {}, not a regular file{}", path, file_kind(st.st_mode),
		     block_ok ? " or block device" : "");
	int fl = fcntl(fd, F_GETFL);
	if (fl < 0 || fcntl(fd, F_SETFL, fl & ~O_NONBLOCK) < 0)
		fail(CKPT_E_IO, "cannot clear O_NONBLOCK on {}: {}", path, strerror(errno));
	return guard.release();
}

// The live process holding a lock on st's file, from /proc/locks ("1: FLOCK
// ADVISORY  WRITE 22703 fe:00:10953371 0 EOF"), or "" when it names none (a
// holder in another pid namespace, or one that died, shows as pid 0).
std::string lock_holder(const struct stat &st)
{
	std::ifstream in("/proc/locks");
	for (std::string line; std::getline(in, line);) {
		std::istringstream w(line);
		std::string id, type, adv, mode, file;
		long pid = 0;
		if (!(w >> id >> type >> adv >> mode >> pid >> file) || type == "->")
			continue;	// "->" marks a waiter, not a holder
		unsigned maj, min;
		unsigned long long ino;
		if (sscanf(file.c_str(), "%x:%x:%llu", &maj, &min, &ino) != 3 || ino != st.st_ino ||
		    maj != major(st.st_dev) || min != minor(st.st_dev) || pid <= 0)
			continue;
		if (pid == getpid())
			return "this process (another open of the same image)";
		std::string comm;
		std::ifstream proc(fmt::format("/proc/{}/comm", pid));
		if (!proc)
			continue;	// gone: its lock is on its way out
		std::getline(proc, comm);
		return fmt::format("process {} ({})", pid, comm);
	}
	return {};
}

// The writer's lock on a regular file: "" once taken, else who holds it. A
// process that died holding it may keep it for a moment: the lock goes with
// the last reference to the open file, and io_uring requests in flight hold
// references until the kernel has torn the ring down. So when no live
// process holds it, try again for a while before calling the file busy.
std::string take_lock(int fd, const std::string &path, const struct stat &st)
{
	for (int tries = 0;; tries++) {
		if (flock(fd, LOCK_EX | LOCK_NB) == 0)
			return {};
		if (errno != EWOULDBLOCK)
			fail(CKPT_E_IO, "cannot lock {}: {}", path, strerror(errno));
		const std::string who = lock_holder(st);
		if (!who.empty() || tries == 200)
			return who.empty() ? "another process" : who;
		usleep(10000);
	}
}

void lock(int fd, const std::string &path, const struct stat &st)
{
	if (const std::string who = take_lock(fd, path, st); !who.empty())
		fail(CKPT_E_STATE, "{} is in use: {} has it open for writing (a trainer or a ckptctl command); one "
				   "writer at a time (info, verify and export only read, they still work)", path, who);
}

} // namespace

Fd open_file(const std::string &path, int flags, bool block_ok, struct stat &st)
{
	int fd = open_checked(path, flags, block_ok, st);
	if (fd < 0)
		fail(CKPT_E_IO, "cannot open {}: {}", path, strerror(-fd));
	return Fd(fd);
}

std::string block_node(const std::string &kname)
{
	std::ifstream in("/sys/class/block/" + kname + "/dev");
	unsigned maj = 0, min = 0;
	char colon = 0;
	if (kname.empty() || kname.find('/') != std::string::npos || !(in >> maj >> colon >> min) || colon != ':')
		fail(CKPT_E_STATE, "no block device {} in /sys/class/block", kname);
	const dev_t dev = makedev(maj, min);
	const auto is_dev = [dev](const std::string &node) {
		struct stat st;
		return ::stat(node.c_str(), &st) == 0 && S_ISBLK(st.st_mode) && st.st_rdev == dev;
	};
	if (is_dev("/dev/" + kname))
		return "/dev/" + kname;
	std::vector<std::string> nodes;
	std::error_code ec;
	for (const auto &e : std::filesystem::directory_iterator("/dev", ec))
		if (is_dev(e.path().string()))
			nodes.push_back(e.path().string());
	if (nodes.empty()) {
		if (const std::string node = fmt::format("/dev/block/{}:{}", maj, min); is_dev(node))
			return node;
		fail(CKPT_E_STATE, "no node in /dev is block device {} ({}:{}){}", kname, maj, min,
		     ::access(("/dev/" + kname).c_str(), F_OK) == 0 ? fmt::format(": /dev/{} is another device", kname)
								  : std::string());
	}
	std::sort(nodes.begin(), nodes.end());
	return nodes[0];
}

bool has_image_magic(int fd)
{
	uint8_t m[4];
	for (uint64_t copy = 0; copy < 2; copy++)
		if (::pread(fd, m, 4, static_cast<off_t>(copy * CKPT_BLOCK)) == 4 &&
		    (m[0] | m[1] << 8 | m[2] << 16 | static_cast<uint32_t>(m[3]) << 24) == CKPT_SB_MAGIC)
			return true;
	return false;
}

Fd claim_output(const std::string &path, bool force)
{
	struct stat st;
	if (stat(path.c_str(), &st) == 0 && !S_ISREG(st.st_mode))	// the words for it; open checks again
		fail(CKPT_E_INVAL, "{} is {}: the output must be a new path or a regular file{}", path,
		     file_kind(st.st_mode), S_ISDIR(st.st_mode) ? " (give a file name in the directory)" : "");
	const int fd = open_checked(path, O_RDONLY, false, st);
	if (fd == -ENOENT)
		return {};
	if (fd < 0)
		fail(CKPT_E_IO, "cannot open {} to see what the output would replace: {}", path, strerror(-fd));
	Fd f(fd);
	if (const std::string who = take_lock(fd, path, st); !who.empty())
		fail(CKPT_E_STATE, "{} is in use: {} has it open for writing; an output never replaces a file a "
				   "trainer has open", path, who);
	if (read_stripe_set(fd, path))
		fail(CKPT_E_STATE, "{} names a stripe set (the drives of a dm-ckpt image): an output never replaces "
				   "it", path);
	if (!force && has_image_magic(fd))
		fail(CKPT_E_STATE, "{} holds a dm-ckpt image: the output would replace it and the state in it "
				   "(forced, it does: ckptctl export --force, CKPT_EXPORT_FORCE, force=True)", path);
	return f;
}

namespace {

// One file or block device of a backing file: fd, its size, whether O_DIRECT.
struct Opened {
	Fd fd;
	uint64_t size = 0;
	bool direct = false, block = false;
	struct stat st {};
};

// direct: try O_DIRECT first (else buffered only).
Opened open_one(const std::string &path, bool writable, bool direct = true)
{
	Opened o;
	// O_EXCL without O_CREAT claims a block device (and Linux ignores it
	// on anything else): it fails while another writer, a kernel target
	// or a mount holds the device.
	int flags = writable ? O_RDWR | O_EXCL : O_RDONLY;
	int fd = direct ? open_checked(path, flags | O_DIRECT, true, o.st) : -EINVAL;
	if (fd >= 0)
		o.direct = true;
	else if (fd == -EINVAL)	// tmpfs and friends have no O_DIRECT
		fd = open_checked(path, flags, true, o.st);
	if (fd == -EBUSY)
		fail(CKPT_E_STATE, "{} is in use: another writer, a kernel target (dm-ckpt) or a mount holds it",
		     path);
	if (fd < 0)
		fail(CKPT_E_IO, "cannot open {}: {}", path, strerror(-fd));
	o.fd = Fd(fd);
	if (S_ISBLK(o.st.st_mode)) {
		o.block = true;
		if (ioctl(fd, BLKGETSIZE64, &o.size) < 0)
			fail(CKPT_E_IO, "cannot get the size of {}: {}", path, strerror(errno));
	} else {
		o.size = static_cast<uint64_t>(o.st.st_size);
	}
	return o;
}

// The stripe set a regular file at path describes (read buffered: a short
// read through O_DIRECT fails), or none.
std::optional<StripeSet> stripe_set_at(const std::string &path)
{
	struct stat st;
	const int fd = open_checked(path, O_RDONLY, true, st);
	if (fd < 0)
		return std::nullopt;	// the open that follows says why
	Fd guard(fd);
	return S_ISREG(st.st_mode) ? read_stripe_set(fd, path) : std::nullopt;
}

} // namespace

BackingFile BackingFile::open(const std::string &path, bool writable)
{
	BackingFile f;
	f.path = path;
	const std::optional<StripeSet> set = stripe_set_at(path);
	if (!set) {
		Opened o = open_one(path, writable);
		f.fd = std::move(o.fd);
		if (writable && !o.block)
			lock(f.fd.get(), path, o.st);
		f.direct = o.direct;
		f.block_device = o.block;
		f.size = o.size;
		return f;
	}
	// A stripe set: its drives, each opened (and locked) as a backing file.
	f.stripe_bytes = set->stripe_bytes;
	f.direct = true;
	uint64_t per = UINT64_MAX;
	std::vector<std::pair<dev_t, ino_t>> seen;
	for (const std::string &d : set->drives) {
		if (stripe_set_at(d))
			fail(CKPT_E_INVAL, "stripe set {}: drive {} is a stripe set itself", path, d);
		Opened m = open_one(d, writable);
		const std::pair<dev_t, ino_t> id = m.block ? std::pair<dev_t, ino_t>{m.st.st_rdev, 0}
							    : std::pair<dev_t, ino_t>{m.st.st_dev, m.st.st_ino};
		if (std::find(seen.begin(), seen.end(), id) != seen.end())
			fail(CKPT_E_INVAL, "stripe set {}: drive {} is named twice", path, d);
		seen.push_back(id);
		if (writable && !m.block)
			lock(m.fd.get(), d, m.st);
		f.direct = f.direct && m.direct;
		per = std::min(per, m.size / f.stripe_bytes * f.stripe_bytes);
		f.drives.push_back({std::move(m.fd), d});
	}
	// One way for every drive: an I/O the set does not align for O_DIRECT
	// (direct false) must not reach a drive opened O_DIRECT.
	if (!f.direct)
		for (Drive &d : f.drives) {
			d.fd.reset();	// its lock goes with it; taken again below
			Opened m = open_one(d.path, writable, false);
			if (writable && !m.block)
				lock(m.fd.get(), d.path, m.st);
			d.fd = std::move(m.fd);
		}
	f.size = per * f.drives.size();
	return f;
}

BackingFile BackingFile::open_window(const std::string &path, uint64_t base)
{
	BackingFile f;
	f.path = path;
	Opened o = open_one(path, false);
	if (!o.block || o.size <= base)
		fail(CKPT_E_INVAL, "{} has no IMAGE window at byte {} ({} bytes)", path, base, o.size);
	f.fd = std::move(o.fd);
	f.direct = o.direct;
	f.block_device = true;
	f.base = base;
	f.size = o.size - base;
	return f;
}

// ------------------------------------------------------------ mapped files

namespace {

// A copy from or to a mapped file faults with SIGBUS where the file has no
// page any more (truncated by another process). The copy of this thread,
// if one is under way, is where the handler jumps to; any other SIGBUS is
// handled as before the handler was installed. Initial-exec: the handler
// reads it without a call that could allocate (libckpt may be dlopen()ed).
[[gnu::tls_model("initial-exec")]] thread_local sigjmp_buf *bus_jump;
struct sigaction bus_before;

void on_bus(int sig, siginfo_t *info, void *ctx)
{
	if (sigjmp_buf *jump = bus_jump) {
		bus_jump = nullptr;
		siglongjmp(*jump, 1);
	}
	if (bus_before.sa_flags & SA_SIGINFO) {
		bus_before.sa_sigaction(sig, info, ctx);
	} else if (bus_before.sa_handler != SIG_DFL && bus_before.sa_handler != SIG_IGN) {
		bus_before.sa_handler(sig);
	} else {
		// the default: a fault's instruction faults again on return,
		// a signal sent is raised again (SA_NODEFER: not blocked here)
		signal(SIGBUS, SIG_DFL);
		if (info->si_code <= 0)
			raise(sig);
	}
}

// Installed whenever a file is mapped and the handler in place is not this
// one: a library loaded since may have put its own there, which is then the
// one chained to.
void catch_bus()
{
	static std::mutex mu;
	std::lock_guard lk(mu);
	struct sigaction now {};
	if (sigaction(SIGBUS, nullptr, &now) == 0 && (now.sa_flags & SA_SIGINFO) && now.sa_sigaction == on_bus)
		return;
	struct sigaction sa {};
	sa.sa_sigaction = on_bus;
	sa.sa_flags = SA_SIGINFO | SA_NODEFER | SA_ONSTACK;
	sigemptyset(&sa.sa_mask);
	bus_before = now;
	if (sigaction(SIGBUS, &sa, nullptr) < 0)
		fail(CKPT_E_IO, "cannot catch SIGBUS: {}", strerror(errno));
}

} // namespace

Buffer Buffer::map_shared(int fd, size_t bytes)
{
	catch_bus();
	void *p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	if (p == MAP_FAILED)
		fail(CKPT_E_IO, "cannot map {} bytes: {}", bytes, strerror(errno));
	Buffer b;
	b.p_ = p;
	b.n_ = bytes;
	return b;
}

bool BackingFile::map()
{
	struct statfs fs;
	if (mapped())
		return true;
	if (striped() || block_device || base || !size || fstatfs(fd.get(), &fs) < 0 || fs.f_type != TMPFS_MAGIC ||
	    (fcntl(fd.get(), F_GETFL) & O_ACCMODE) != O_RDWR)
		return false;
	try {
		mapping = Buffer::map_shared(fd.get(), static_cast<size_t>(size));
	} catch (const Error &) {
		return false;	// no address space for it: the I/O stays io_uring's
	}
	return true;
}

namespace {

// A write into the mapped file: the pages are next read a step later, long
// out of cache, so on x86-64 the copy streams past the cache (no read for
// ownership of each line, no eviction of the record the worker works on).
void copy_out(uint8_t *dst, const uint8_t *src, size_t len)
{
#if defined(__x86_64__)
	constexpr size_t line = 64;
	if (!(reinterpret_cast<uintptr_t>(dst) % line) && !(reinterpret_cast<uintptr_t>(src) % 16)) {
		const size_t whole = len / line * line;
		for (size_t i = 0; i < whole; i += line)
			for (size_t k = 0; k < line; k += 16)
				_mm_stream_si128(reinterpret_cast<__m128i *>(dst + i + k),
						 _mm_load_si128(reinterpret_cast<const __m128i *>(src + i + k)));
		_mm_sfence();	// ordered before whatever this thread stores next
		std::memcpy(dst + whole, src + whole, len - whole);
		return;
	}
#endif
	std::memcpy(dst, src, len);
}

} // namespace

int BackingFile::copy_mapped(void *buf, size_t len, uint64_t off, bool write) const noexcept
{
	if (off >= size)
		return 0;
	len = static_cast<size_t>(std::min<uint64_t>(len, size - off));
	uint8_t *at = mapping.as() + off;
	sigjmp_buf jump;
	if (sigsetjmp(jump, 0))
		return -EIO;
	bus_jump = &jump;
	// the handler must see the jump set before the copy's first access
	std::atomic_signal_fence(std::memory_order_seq_cst);
	if (write)
		copy_out(at, static_cast<const uint8_t *>(buf), len);
	else
		std::memcpy(buf, at, len);
	std::atomic_signal_fence(std::memory_order_seq_cst);
	bus_jump = nullptr;
	return static_cast<int>(len);
}

void BackingFile::forsake() noexcept
{
	fd.reset();
	for (Drive &d : drives)
		d.fd.reset();
}

// The fault the observer injects into an I/O of this file (IoObserver::fault).
IoObserver::Fault BackingFile::fault(IoObserver::Op op, uint64_t off, size_t len) const
{
	const IoObserver::Fault f = observer ? observer->fault(op, off, len) : IoObserver::Fault::none;
	if (f == IoObserver::Fault::before)
		injected(op, off, len);
	return f;
}

void BackingFile::injected(IoObserver::Op op, uint64_t off, size_t len) const
{
	static const char *const names[] = {"read", "write", "flush"};
	fail(CKPT_E_IO, "{} of {} bytes at {} of {} failed: {} (injected)", names[static_cast<int>(op)], len,
	     off, path, strerror(EIO));
}

void BackingFile::pread_all(void *buf, size_t len, uint64_t off) const
{
	const IoObserver::Fault f = fault(IoObserver::Op::read, off, len);
	const uint64_t start = off;
	const size_t total = len;
	if (start + len > size && striped())
		fail(CKPT_E_IO, "read at {} from {}: past the end of the stripe set ({} bytes)", start, path, size);
	extents(start, total, [&](int fd, uint64_t at, uint64_t from, uint64_t n) {
		auto *p = static_cast<uint8_t *>(buf) + from;
		while (n) {
			ssize_t r = ::pread(fd, p, n, static_cast<off_t>(at));
			if (r < 0 && errno == EINTR)
				continue;
			if (r < 0)
				fail(CKPT_E_IO, "read of {} bytes at {} from {} failed: {}", n, start + from, path,
				     strerror(errno));
			if (r == 0)
				fail(CKPT_E_IO, "read at {} from {}: unexpected end of file", start + from, path);
			p += r;
			at += static_cast<uint64_t>(r);
			from += static_cast<uint64_t>(r);
			n -= static_cast<uint64_t>(r);
		}
	});
	if (f == IoObserver::Fault::after)
		injected(IoObserver::Op::read, start, total);
}

void BackingFile::write_at(const void *buf, size_t len, uint64_t off) const
{
	if (off + len > size && striped())
		fail(CKPT_E_IO, "write at {} to {}: past the end of the stripe set ({} bytes)", off, path, size);
	extents(off, len, [&](int fd, uint64_t at, uint64_t from, uint64_t n) {
		auto *p = static_cast<const uint8_t *>(buf) + from;
		while (n) {
			ssize_t w = ::pwrite(fd, p, n, static_cast<off_t>(at));
			if (w < 0 && errno == EINTR)
				continue;
			if (w <= 0)
				fail(CKPT_E_IO, "write of {} bytes at {} to {} failed: {}", n, off + from, path,
				     w < 0 ? strerror(errno) : "no progress");
			p += w;
			at += static_cast<uint64_t>(w);
			from += static_cast<uint64_t>(w);
			n -= static_cast<uint64_t>(w);
		}
	});
}

void BackingFile::sync() const
{
	if (!striped() && fdatasync(fd.get()) < 0)
		fail(CKPT_E_IO, "flush of {} failed: {}", path, strerror(errno));
	for (const Drive &d : drives)
		if (fdatasync(d.fd.get()) < 0)
			fail(CKPT_E_IO, "flush of {} (drive {} of {}) failed: {}", d.path,
			     &d - drives.data(), path, strerror(errno));
}

void BackingFile::pwrite_all(const void *buf, size_t len, uint64_t off) const
{
	const IoObserver::Fault f = fault(IoObserver::Op::write, off, len);
	write_at(buf, len, off);
	if (observer)
		observer->written(off, buf, len, false);
	if (f == IoObserver::Fault::after)
		injected(IoObserver::Op::write, off, len);
}

void BackingFile::pwrite_durable(const void *buf, size_t len, uint64_t off) const
{
	if (!direct) {
		pwrite_all(buf, len, off);
		flush();
		return;
	}
	const IoObserver::Fault f = fault(IoObserver::Op::write, off, len);
	// FUA on the drive that holds it (a stripe set's superblock block lies on
	// one drive: stripes are whole blocks)
	int fd_at = -1;
	uint64_t at = 0;
	unsigned pieces = 0;
	extents(off, len, [&](int d, uint64_t a, uint64_t, uint64_t) { fd_at = d, at = a, pieces++; });
	iovec iov{const_cast<void *>(buf), len};
	const ssize_t n = pieces == 1 ? pwritev2(fd_at, &iov, 1, static_cast<off_t>(at), RWF_DSYNC) : 0;
	if (n == static_cast<ssize_t>(len)) {
		if (observer)
			observer->written(off, buf, len, true);
	} else if (n >= 0 || errno == EOPNOTSUPP || errno == EINVAL) {
		// No RWF_DSYNC (qemu-user), a short write, or a range over several
		// drives: a write and a flush, still the one I/O the fault above
		// was drawn for.
		write_at(buf, len, off);
		if (observer)
			observer->written(off, buf, len, false);
		sync();
		if (observer)
			observer->flushed();
	} else {
		fail(CKPT_E_IO, "durable write at {} to {} failed: {}", off, path, strerror(errno));
	}
	if (f == IoObserver::Fault::after)
		injected(IoObserver::Op::write, off, len);
}

void BackingFile::flush() const
{
	const IoObserver::Fault f = fault(IoObserver::Op::flush, 0, 0);
	sync();
	if (observer)
		observer->flushed();
	if (f == IoObserver::Fault::after)
		injected(IoObserver::Op::flush, 0, 0);
}

int BackingFile::commit_flush(std::string &message) const noexcept
{
	try {
		flush();
	} catch (const std::exception &e) {
		message = e.what();
		return -EIO;
	}
	return 0;
}

int BackingFile::commit_write_sb(const void *block, uint64_t off, std::string &message) const noexcept
{
	try {
		pwrite_durable(block, CKPT_BLOCK, off);
	} catch (const std::exception &e) {
		message = e.what();
		return -EIO;
	}
	return 0;
}

int BackingFile::commit_read(void *buf, uint64_t off, uint64_t len, std::string &message) const noexcept
{
	try {
		pread_all(buf, len, off);
	} catch (const std::exception &e) {
		message = e.what();
		return -EIO;
	}
	return 0;
}

int BackingFile::commit_write(const void *buf, uint64_t off, uint64_t len, std::string &message) const noexcept
{
	try {
		pwrite_all(buf, len, off);
	} catch (const std::exception &e) {
		message = e.what();
		return -EIO;
	}
	return 0;
}

Ring::Ring(unsigned entries, Mode mode)
{
	if (mode == Mode::Sync) {
		sync_ = true;
		return;
	}
	int ret = io_uring_queue_init(entries, &ring_, 0);
	if (ret == -ENOSYS || ret == -EPERM) {
		sync_ = true;
		// once per process: the engine works, only without overlapped I/O
		static std::once_flag told;
		std::call_once(told, [ret] {
			fmt::print(stderr, "libckpt: io_uring is not available ({}); the engine reads and writes "
					   "with pread/pwrite, one at a time\n", strerror(-ret));
		});
	} else if (ret < 0)
		fail(CKPT_E_IO, "io_uring_queue_init: {}", strerror(-ret));
}

Ring::~Ring()
{
	if (!sync_)
		io_uring_queue_exit(&ring_);
}

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

// The fallback's read or write, done at once: its completion queued.
template <typename Io, typename Buf>
void Ring::now(Io io, int fd, Buf buf, unsigned len, uint64_t off, uint64_t tag)
{
	ssize_t r;
	do
		r = io(fd, buf, len, static_cast<off_t>(off));
	while (r < 0 && errno == EINTR);
	done_.emplace_back(tag, r < 0 ? -errno : static_cast<int>(r));
}

void Ring::read(int fd, void *buf, unsigned len, uint64_t off, uint64_t tag)
{
	if (sync_)
		return now(::pread, fd, buf, len, off, tag);
	io_uring_sqe *s = sqe();
	io_uring_prep_read(s, fd, buf, len, off);
	io_uring_sqe_set_data64(s, tag);
}

void Ring::write(int fd, const void *buf, unsigned len, uint64_t off, uint64_t tag)
{
	if (sync_)
		return now(::pwrite, fd, buf, len, off, tag);
	io_uring_sqe *s = sqe();
	io_uring_prep_write(s, fd, buf, len, off);
	io_uring_sqe_set_data64(s, tag);
}

template <typename Buf>
void Ring::split(const BackingFile &f, Buf buf, unsigned len, uint64_t off, uint64_t tag, bool write)
{
	if (f.mapped()) {	// done now: its completion queued
		done_.emplace_back(tag, f.copy_mapped(const_cast<void *>(static_cast<const void *>(buf)), len,
						      off, write));
		return;
	}
	unsigned pieces = 0;
	f.extents(off, len, [&](int, uint64_t, uint64_t, uint64_t) { pieces++; });
	if (pieces == 1) {	// no split: the caller's tag on the one submission
		f.extents(off, len, [&](int fd, uint64_t at, uint64_t, uint64_t) {
			if (write)
				Ring::write(fd, buf, len, at, tag);
			else
				Ring::read(fd, const_cast<void *>(static_cast<const void *>(buf)), len, at, tag);
		});
		return;
	}
	uint32_t index;
	if (!free_splits_.empty()) {
		index = free_splits_.back();
		free_splits_.pop_back();
	} else {
		index = static_cast<uint32_t>(splits_.size());
		splits_.push_back({});
	}
	splits_[index] = {tag, pieces, 0};
	f.extents(off, len, [&](int fd, uint64_t at, uint64_t from, uint64_t n) {
		auto *p = reinterpret_cast<uint8_t *>(const_cast<void *>(static_cast<const void *>(buf))) + from;
		if (write)
			Ring::write(fd, p, static_cast<unsigned>(n), at, kPiece | index);
		else
			Ring::read(fd, p, static_cast<unsigned>(n), at, kPiece | index);
	});
	if (sync_) {	// the pieces are done: their one completion, in their place
		std::optional<std::pair<uint64_t, int>> r;
		for (unsigned i = 0; i < pieces; i++) {
			const auto [data, res] = done_.back();
			done_.pop_back();
			if (auto c = complete(data, res))
				r = c;
		}
		done_.push_back(*r);
	}
}

void Ring::read(const BackingFile &f, void *buf, unsigned len, uint64_t off, uint64_t tag)
{
	split(f, buf, len, off, tag, false);
}

void Ring::write(const BackingFile &f, const void *buf, unsigned len, uint64_t off, uint64_t tag)
{
	split(f, buf, len, off, tag, true);
}

std::optional<std::pair<uint64_t, int>> Ring::complete(uint64_t data, int res)
{
	if (!(data & kPiece))
		return std::pair<uint64_t, int>{data, res};
	const auto index = static_cast<uint32_t>(data & ~kPiece);
	Split &s = splits_[index];
	if (s.result >= 0)
		s.result = res < 0 ? res : s.result + res;
	if (--s.left)
		return std::nullopt;
	free_splits_.push_back(index);
	return std::pair<uint64_t, int>{s.tag, s.result};
}

void Ring::submit()
{
	if (sync_)
		return;
	int ret;
	do
		ret = io_uring_submit(&ring_);
	while (ret == -EINTR);
	if (ret < 0)
		fail(CKPT_E_IO, "io_uring_submit: {}", strerror(-ret));
}

std::pair<uint64_t, int> Ring::wait()
{
	if (sync_ || !done_.empty()) {
		if (done_.empty())
			fail(CKPT_E_IO, "waiting for an I/O completion with none in flight");
		std::pair<uint64_t, int> r = done_.front();
		done_.pop_front();
		return r;
	}
	for (;;) {
		io_uring_cqe *cqe;
		int ret;
		do
			ret = io_uring_wait_cqe(&ring_, &cqe);
		while (ret == -EINTR);
		if (ret < 0)
			fail(CKPT_E_IO, "io_uring_wait_cqe: {}", strerror(-ret));
		const uint64_t data = io_uring_cqe_get_data64(cqe);
		const int res = cqe->res;
		io_uring_cqe_seen(&ring_, cqe);
		if (auto r = complete(data, res))
			return *r;
	}
}

std::optional<std::pair<uint64_t, int>> Ring::peek()
{
	if (sync_ || !done_.empty()) {
		if (done_.empty())
			return std::nullopt;
		std::pair<uint64_t, int> r = done_.front();
		done_.pop_front();
		return r;
	}
	io_uring_cqe *cqe;
	while (io_uring_peek_cqe(&ring_, &cqe) == 0) {
		const uint64_t data = io_uring_cqe_get_data64(cqe);
		const int res = cqe->res;
		io_uring_cqe_seen(&ring_, cqe);
		if (auto r = complete(data, res))
			return r;
	}
	return std::nullopt;
}

void read_pieces(const BackingFile &f, Ring &ring, unsigned depth, std::span<const ReadPiece> pieces,
		 Buffer &bounce)
{
	constexpr uint64_t block = 4096, max_io = 8u << 20;
	// Each read; a bounced one at bounce offset `at`, its piece copied out after.
	struct Io {
		uint64_t off, len;
		uint8_t *dst;
		uint64_t at, skip, copy;	// bounced: bounce offset, bytes skipped, bytes copied
		bool bounced;
	};
	std::vector<Io> ios;
	uint64_t bounce_bytes = 0;
	for (const ReadPiece &p : pieces) {
		auto *dst = static_cast<uint8_t *>(p.dst);
		uint64_t off = p.off, len = p.len;
		const bool aligned = off % block == 0 && reinterpret_cast<uintptr_t>(dst) % block == 0;
		const uint64_t body = !f.direct ? len : aligned ? len / block * block : 0;
		for (uint64_t done = 0; done < body;) {
			const uint64_t n = std::min(body - done, max_io);
			ios.push_back({off + done, n, dst + done, 0, 0, 0, false});
			done += n;
		}
		off += body;
		dst += body;
		len -= body;
		if (!len)
			continue;
		const uint64_t lo = off / block * block, hi = (off + len + block - 1) / block * block;
		ios.push_back({lo, hi - lo, dst, bounce_bytes, off - lo, len, true});
		bounce_bytes += hi - lo;
	}
	if (bounce.size() < bounce_bytes)
		bounce = Buffer(bounce_bytes);

	std::string error;
	size_t next = 0;
	unsigned inflight = 0;
	depth = std::max(1u, depth);
	while (next < ios.size() || inflight) {
		for (; next < ios.size() && inflight < depth && error.empty(); next++, inflight++) {
			const Io &io = ios[next];
			ring.read(f, io.bounced ? bounce.as() + io.at : io.dst, static_cast<unsigned>(io.len), io.off,
				  next);
		}
		if (!inflight)
			break;
		ring.submit();
		const auto [tag, res] = ring.wait();
		inflight--;
		const Io &io = ios[tag];
		uint8_t *buf = io.bounced ? bounce.as() + io.at : io.dst;
		if (res < 0) {
			if (error.empty())
				error = fmt::format("read of {} bytes at {} from {} failed: {}", io.len, io.off, f.path,
						    strerror(-res));
		} else if (static_cast<uint64_t>(res) < io.len && error.empty()) {
			try {		// short: the rest at once
				f.pread_all(buf + res, io.len - res, io.off + res);
			} catch (const Error &e) {
				error = e.what();
			}
		}
	}
	if (!error.empty())
		throw Error(CKPT_E_IO, error);
	for (const Io &io : ios)
		if (io.bounced)
			std::memcpy(io.dst, bounce.as() + io.at + io.skip, io.copy);
}

} // namespace ckpt
