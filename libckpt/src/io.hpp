// SPDX-License-Identifier: MIT
// RAII around file descriptors, aligned buffers and io_uring.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include <liburing.h>
#include <sys/stat.h>

namespace ckpt {

class Fd {
public:
	Fd() = default;
	explicit Fd(int fd) : fd_(fd) {}
	Fd(Fd &&o) noexcept : fd_(std::exchange(o.fd_, -1)) {}
	Fd &operator=(Fd &&o) noexcept
	{
		if (this != &o) {
			reset();
			fd_ = std::exchange(o.fd_, -1);
		}
		return *this;
	}
	Fd(const Fd &) = delete;
	Fd &operator=(const Fd &) = delete;
	~Fd() { reset(); }
	int get() const { return fd_; }
	explicit operator bool() const { return fd_ >= 0; }
	void reset();
	int release() { return std::exchange(fd_, -1); }

private:
	int fd_ = -1;
};

// Page-aligned, zeroed memory for O_DIRECT I/O, allocated once and reused.
// Large buffers ask for huge pages: first touch of 4 KiB pages is slow here.
class Buffer {
public:
	Buffer() = default;
	explicit Buffer(size_t bytes);
	Buffer(Buffer &&o) noexcept
		: p_(std::exchange(o.p_, nullptr)), n_(std::exchange(o.n_, 0)) {}
	Buffer &operator=(Buffer &&o) noexcept;
	Buffer(const Buffer &) = delete;
	Buffer &operator=(const Buffer &) = delete;
	~Buffer();
	// A file's first bytes mapped shared, read and write, in place of memory
	// of its own (BackingFile::map).
	static Buffer map_shared(int fd, size_t bytes);
	template <typename T = uint8_t> T *as() const { return static_cast<T *>(p_); }
	size_t size() const { return n_; }

private:
	void *p_ = nullptr;
	size_t n_ = 0;
};

// Opens an existing file to read (flags O_RDONLY) or write, refusing anything
// but a regular file (or, with block_ok, a block device) with an error naming
// what it is. The type is checked before anything can block: opened for
// reading, a FIFO waits for a writer forever. Fills st.
Fd open_file(const std::string &path, int flags, bool block_ok, struct stat &st);

// A new file under a fresh name beside path (path.TAG-XXXXXXXX, O_EXCL: never
// another file), removed when this goes away unless rename_over() put it in
// place. An owner that throws, even from its constructor, leaves nothing.
class TempFile {
public:
	TempFile(const std::string &path, const char *tag, int flags);
	TempFile(const TempFile &) = delete;
	TempFile &operator=(const TempFile &) = delete;
	~TempFile();
	const std::string &path() const { return tmp_; }
	int fd() const { return fd_.get(); }
	void close() { fd_.reset(); }
	// Renames it over target (whose directory is flushed when sync_dir).
	void rename_over(const std::string &target, bool sync_dir);
	// Puts it in place at target with rename_new(): if a file appeared
	// there meanwhile, this stays a temporary file (removed as ever).
	void link_new(const std::string &target, bool sync_dir);

private:
	std::string tmp_;
	Fd fd_;
};

// "a FIFO", "a directory", ...: what a file of mode m is, for messages.
const char *file_kind(mode_t m);

// Renames from to `to`, which must not exist: a file there, even one that
// appeared meanwhile (another process creating the same path), is never
// replaced: CKPT_E_STATE, and from stays. renameat2(RENAME_NOREPLACE), or
// link and unlink where the file system has no such rename. The directory
// is flushed when sync_dir.
void rename_new(const std::string &from, const std::string &to, bool sync_dir);

// The node in /dev of the block device sysfs names kname (a slave of a
// device-mapper device, a sibling namespace): /dev/KNAME when that node is
// this device, else another node of its numbers. /dev/KNAME may be another
// device or none (nodes made by name, udev rules, a guest naming NVMe
// namespaces by nsid while the kernel names them in the order their scans
// finish), so the name alone never says which device a path opens.
// CKPT_E_STATE when /dev has no node of it.
std::string block_node(const std::string &kname);

// Whether the file open at fd has a dm-ckpt superblock magic in either copy.
bool has_image_magic(int fd);

// The one rule for an output that a rename puts in place of what is at path
// (an export): path is new, or an existing regular file that this claims,
// open and locked as a writer locks it, so that no trainer opens it before
// the rename; the Fd is empty for a new path. Refused: anything but a
// regular file (the rename would put a file in place of a device node or
// FIFO); a file a writer holds, even when forced (a trainer would go on
// committing into the unlinked inode); a dm-ckpt image unless forced (its
// state would be gone).
Fd claim_output(const std::string &path, bool force);

// Sees the writes and flushes made on a backing file, each once it has
// completed: what a crash-consistency test (tests/crash) needs to rebuild the
// device as a crash could have left it. A write is durable by itself only
// when `durable` (FUA, RWF_DSYNC); any other becomes durable with the next
// flushed(). The engine's workers call written() concurrently, so an
// implementation locks; none of it may throw.
//
// fault() injects I/O errors (tests): BackingFile asks it before each of
// its own reads, writes and flushes (the commit's, a rollback's, not the
// workers' io_uring I/O), which then fail with EIO: `before` without doing
// the I/O, `after` once it is done (a write the device kept, whose
// completion reports an error).
class IoObserver {
public:
	enum class Op { read, write, flush };
	enum class Fault { none, before, after };
	virtual ~IoObserver() = default;
	virtual void written(uint64_t off, const void *buf, size_t len, bool durable) noexcept = 0;
	virtual void flushed() noexcept = 0;
	virtual Fault fault(Op, uint64_t /* off */, size_t /* len */) noexcept { return Fault::none; }
};

// An open backing file or block device. Uses O_DIRECT where the file system
// supports it; otherwise buffered I/O made durable by fdatasync.
//
// A writable open is exclusive, for as long as the fd lives: a regular file
// takes an flock (per open file description, so two opens in one process
// exclude each other too), a block device is opened O_EXCL (which also fails
// while a kernel target or a mount holds it). A second writer gets an error
// naming the holder where /proc/locks tells it. Readers take no lock: info,
// verify and export work while a trainer runs.
//
// A stripe set (stripe.hpp: a descriptor file naming drives) opens as one
// backing file over its drives: byte off at drive k % n, offset
// k / n * stripe_bytes + off % stripe_bytes, k = off / stripe_bytes, which is
// how dm-stripe lays a device over the same drives. Each drive is opened,
// locked and checked as a lone backing file would be; its size is the
// drives' common size, in whole stripes, times their count.
struct BackingFile {
	Fd fd;			// the file or device; none for a stripe set (drives)
	uint64_t size = 0;
	bool direct = false;	// a stripe set: every drive
	bool block_device = false;
	std::string path;
	IoObserver *observer = nullptr;	// told of every write and flush through this file
	struct Drive {
		Fd fd;
		std::string path;
	};
	std::vector<Drive> drives;	// a stripe set's, in stripe order
	uint64_t stripe_bytes = 0;
	uint64_t base = 0;	// a window's (open_window): where its offset 0 lies in fd

	static BackingFile open(const std::string &path, bool writable);
	// The image a dm-ckpt virtual device shows in its IMAGE window, from
	// byte base of the block device at path to its end: read-only.
	static BackingFile open_window(const std::string &path, uint64_t base);
	bool striped() const { return !drives.empty(); }
	// A file on tmpfs opened to write is mapped (map()), and a Ring's I/O
	// of it is a copy to or from its pages, done at once by the calling
	// thread: tmpfs I/O is a copy by the kernel anyway, and through the
	// mapping it takes no system call, no io_uring worker thread and no
	// inode lock (the engine's workers queued on it), on the cores the
	// trainer's backward needs. Nothing else changes: the pages are the
	// page cache's, so pread, pwrite and fdatasync see the same bytes.
	// Returns whether the file is mapped now.
	bool map();
	bool mapped() const { return mapping.as() != nullptr; }
	// A copy of len bytes at off of a mapped file, from buf (write) or to
	// it: the bytes copied (fewer at the end of the file), or -EIO where
	// the file shrank beneath the mapping (another process truncated it:
	// the page's SIGBUS is caught and answered as an I/O error).
	int copy_mapped(void *buf, size_t len, uint64_t off, bool write) const noexcept;
	Buffer mapping;
	// fn(fd, offset there, offset into the I/O, length) for each piece of
	// [off, off + len) on the drive that holds it (the file: one piece).
	template <typename F> void extents(uint64_t off, uint64_t len, F &&fn) const
	{
		if (!striped())
			return fn(fd.get(), base + off, uint64_t{0}, len);
		for (uint64_t done = 0; done < len;) {
			const uint64_t k = (off + done) / stripe_bytes, in = (off + done) % stripe_bytes;
			const uint64_t n = std::min(len - done, stripe_bytes - in);
			fn(drives[k % drives.size()].fd.get(), k / drives.size() * stripe_bytes + in, done, n);
			done += n;
		}
	}
	// Closes every descriptor (Target::forsake: a child forked from the opener).
	void forsake() noexcept;
	void pread_all(void *buf, size_t len, uint64_t off) const;
	void pwrite_all(const void *buf, size_t len, uint64_t off) const;
	// Forced to stable media on return (FUA where O_DIRECT, else write + fdatasync).
	void pwrite_durable(const void *buf, size_t len, uint64_t off) const;
	void flush() const;

	// The two I/Os of the core's commit (ckpt_step_ops flush and write_sb,
	// the block CKPT_BLOCK bytes): they never throw through the C core, an
	// I/O error is -EIO with its message kept in message for the throw that
	// follows.
	int commit_flush(std::string &message) const noexcept;
	int commit_write_sb(const void *block, uint64_t off, std::string &message) const noexcept;
	// The core's reads and plain writes (ckpt_step_ops read and write: the
	// commit's read-back of its superblock, which through O_DIRECT reads the
	// device, else the page cache, where it can only confirm the write; a
	// rollback's records): 0 or -EIO with message set.
	int commit_read(void *buf, uint64_t off, uint64_t len, std::string &message) const noexcept;
	int commit_write(const void *buf, uint64_t off, uint64_t len, std::string &message) const noexcept;

private:
	IoObserver::Fault fault(IoObserver::Op op, uint64_t off, size_t len) const;
	void write_at(const void *buf, size_t len, uint64_t off) const;	// no fault, no observer
	void sync() const;
	[[noreturn]] void injected(IoObserver::Op op, uint64_t off, size_t len) const;
};

// One io_uring instance; not shared between threads. Where io_uring cannot
// be had (io_uring_setup fails with ENOSYS or EPERM: a seccomp profile such
// as a container's default one, kernel.io_uring_disabled, qemu-user), each
// read and write is done at once with pread/pwrite and completes in order:
// the same results, without the overlap (stderr says so, once per process).
// An I/O of a mapped BackingFile is a copy done at once too.
class Ring {
public:
	enum class Mode { Auto, Sync };
	explicit Ring(unsigned entries, Mode mode = Mode::Auto);
	Ring(const Ring &) = delete;
	Ring &operator=(const Ring &) = delete;
	~Ring();
	void read(int fd, void *buf, unsigned len, uint64_t off, uint64_t tag);
	void write(int fd, const void *buf, unsigned len, uint64_t off, uint64_t tag);
	// An I/O of a backing file: on a stripe set, one submission per drive
	// piece, and one completion (wait, peek) once all are done: the bytes
	// done (a short piece makes the whole short) or the first error.
	void read(const BackingFile &f, void *buf, unsigned len, uint64_t off, uint64_t tag);
	void write(const BackingFile &f, const void *buf, unsigned len, uint64_t off, uint64_t tag);
	void submit();
	// Waits for one completion; returns its tag and result (bytes or -errno).
	std::pair<uint64_t, int> wait();
	// A completion if one is there, without waiting.
	std::optional<std::pair<uint64_t, int>> peek();
	bool sync() const { return sync_; }

private:
	// A striped I/O in flight: its caller's tag, pieces left, bytes done or
	// the first error. A piece's user data is kPiece | its index here.
	struct Split {
		uint64_t tag;
		unsigned left;
		int result;
	};
	static constexpr uint64_t kPiece = uint64_t{1} << 63;
	template <typename Buf> void split(const BackingFile &f, Buf buf, unsigned len, uint64_t off, uint64_t tag,
					   bool write);
	// A completion as the caller sees it: a piece's counted into its I/O,
	// nothing until the I/O's last.
	std::optional<std::pair<uint64_t, int>> complete(uint64_t data, int res);
	io_uring_sqe *sqe();
	template <typename Io, typename Buf>
	void now(Io io, int fd, Buf buf, unsigned len, uint64_t off, uint64_t tag);
	io_uring ring_{};
	bool sync_ = false;
	std::deque<std::pair<uint64_t, int>> done_;	// sync, mapped: completed, not yet waited for
	std::vector<Split> splits_;
	std::vector<uint32_t> free_splits_;
};

// One piece of a batched read: len bytes at off of a file into dst.
struct ReadPiece {
	uint64_t off;
	void *dst;
	uint64_t len;
};

// Reads every piece of f, at most `depth` reads in flight on ring (which
// has none of its own in flight), each of at most 8 MiB. A piece whose file
// offset and memory are 4 KiB aligned is read straight into dst; with
// O_DIRECT, what is not (a tensor's tail, an odd caller buffer) goes through
// bounce (grown as needed) widened to whole 4 KiB blocks, and is copied.
// Throws on the first error, after every read in flight has completed.
void read_pieces(const BackingFile &f, Ring &ring, unsigned depth, std::span<const ReadPiece> pieces,
		 Buffer &bounce);

} // namespace ckpt
