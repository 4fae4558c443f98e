// SPDX-License-Identifier: MIT
// ckpt-log-replay: lists and replays a dm-log-writes log
// (Documentation/admin-guide/device-mapper/log-writes.rst), so that a test
// can rebuild the backing device at every point where the kernel target's
// writes were known to be stable: after each flush and each FUA write.
//
// dm-log-writes logs a write only once a later flush covered it (a FUA write
// as soon as it completes), so a prefix of the log that ends at a flush or
// FUA entry is a state the device could have been in after a power cut.
//
// Log layout (little endian): block 0 holds the super (magic, version,
// nr_entries, sectorsize); then each entry is one block holding its header
// (sector, nr_sectors, flags, data_len) and, for a mark, its text; a write's
// nr_sectors data blocks follow it. Sectors and lengths count `sectorsize`
// blocks of the logged device.
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <fmt/format.h>

namespace {

constexpr uint64_t LOG_MAGIC = 0x6a736677736872ull;
constexpr uint64_t LOG_VERSION = 1;
constexpr uint64_t FLUSH = 1 << 0, FUA = 1 << 1, DISCARD = 1 << 2, MARK = 1 << 3, METADATA = 1 << 4;

struct Entry {
	uint64_t index, sector, nr_sectors, flags;
	uint64_t data_pos;	// where its data starts in the log (bytes)
	std::string mark;
};

uint64_t le64(const uint8_t *p)
{
	uint64_t v = 0;
	for (int i = 7; i >= 0; i--)
		v = v << 8 | p[i];
	return v;
}

struct Fd {
	int fd;
	explicit Fd(const std::string &path, int flags)
		: fd(::open(path.c_str(), flags | O_CLOEXEC))
	{
		if (fd < 0)
			throw std::runtime_error(fmt::format("{}: {}", path, std::strerror(errno)));
	}
	~Fd() { ::close(fd); }
	Fd(const Fd &) = delete;
	Fd &operator=(const Fd &) = delete;
	// A regular file or a block device (the log device itself, in the guest).
	uint64_t size(const std::string &path) const
	{
		struct stat st;
		if (fstat(fd, &st) < 0 || !(S_ISREG(st.st_mode) || S_ISBLK(st.st_mode)))
			throw std::runtime_error(fmt::format("{}: not a regular file or block device", path));
		const off_t end = ::lseek(fd, 0, SEEK_END);
		if (end < 0)
			throw std::runtime_error(fmt::format("{}: {}", path, std::strerror(errno)));
		return static_cast<uint64_t>(end);
	}
	void pread_all(void *buf, uint64_t len, uint64_t off, const std::string &what) const
	{
		auto *p = static_cast<uint8_t *>(buf);
		while (len) {
			ssize_t n = ::pread(fd, p, len, static_cast<off_t>(off));
			if (n <= 0)
				throw std::runtime_error(fmt::format("{}: short read at {}", what, off));
			p += n, off += n, len -= n;
		}
	}
	void pwrite_all(const void *buf, uint64_t len, uint64_t off, const std::string &what) const
	{
		auto *p = static_cast<const uint8_t *>(buf);
		while (len) {
			ssize_t n = ::pwrite(fd, p, len, static_cast<off_t>(off));
			if (n <= 0)
				throw std::runtime_error(fmt::format("{}: write at {} failed: {}", what, off,
								     std::strerror(errno)));
			p += n, off += n, len -= n;
		}
	}
};

struct Log {
	uint32_t block = 0;
	std::vector<Entry> entries;
};

// Reads and checks every header of the log: a log is input from outside.
Log read_log(const Fd &f, const std::string &path)
{
	const uint64_t size = f.size(path);
	uint8_t super[32] = {};
	if (size < 512)
		throw std::runtime_error(fmt::format("{}: {} bytes, too short for a dm-log-writes log", path, size));
	f.pread_all(super, sizeof(super), 0, path);
	if (le64(super) != LOG_MAGIC)
		throw std::runtime_error(fmt::format("{}: not a dm-log-writes log (bad magic)", path));
	if (le64(super + 8) != LOG_VERSION)
		throw std::runtime_error(fmt::format("{}: log version {}, this tool reads {}", path, le64(super + 8),
						     LOG_VERSION));
	Log log;
	const uint64_t n = le64(super + 16);
	log.block = static_cast<uint32_t>(super[24] | super[25] << 8 | super[26] << 16 | uint32_t(super[27]) << 24);
	if (log.block < 512 || log.block > 65536 || (log.block & (log.block - 1)))
		throw std::runtime_error(fmt::format("{}: sector size {} is not a power of two in 512..65536", path,
						     log.block));
	std::vector<uint8_t> hdr(log.block);
	uint64_t pos = log.block;
	for (uint64_t i = 0; i < n; i++) {
		if (pos > size || size - pos < log.block)
			throw std::runtime_error(fmt::format("{}: entry {} of {} lies beyond the end", path, i, n));
		f.pread_all(hdr.data(), log.block, pos, path);
		Entry e{i, le64(&hdr[0]), le64(&hdr[8]), le64(&hdr[16]), 0, {}};
		const uint64_t data_len = le64(&hdr[24]);
		if (e.flags & ~(FLUSH | FUA | DISCARD | MARK | METADATA))
			throw std::runtime_error(fmt::format("{}: entry {}: unknown flags {:#x}", path, i, e.flags));
		pos += log.block;
		if (e.flags & MARK) {
			if (data_len > log.block - 32 || e.nr_sectors)
				throw std::runtime_error(fmt::format("{}: entry {}: bad mark", path, i));
			e.mark.assign(reinterpret_cast<const char *>(&hdr[32]), data_len);
			e.mark = e.mark.substr(0, e.mark.find('\0'));
		} else if (data_len) {
			throw std::runtime_error(fmt::format("{}: entry {}: inline data (DAX) is not supported", path, i));
		} else if (!(e.flags & DISCARD)) {
			if (e.nr_sectors > (size - pos) / log.block)
				throw std::runtime_error(fmt::format("{}: entry {}: {} data blocks beyond the end", path, i,
								     e.nr_sectors));
			e.data_pos = pos;
			pos += e.nr_sectors * log.block;
		}
		log.entries.push_back(std::move(e));
	}
	return log;
}

std::string flag_words(uint64_t f, uint64_t nr)
{
	std::string s;
	auto add = [&](const char *w) { s += s.empty() ? w : fmt::format(",{}", w); };
	if (nr && !(f & (DISCARD | MARK)))
		add("write");
	if (f & FLUSH)
		add("flush");
	if (f & FUA)
		add("fua");
	if (f & DISCARD)
		add("discard");
	if (f & METADATA)
		add("metadata");
	if (f & MARK)
		add("mark");
	return s.empty() ? "none" : s;
}

} // namespace

int main(int argc, char **argv)
{
	CLI::App app{"ckpt-log-replay: list or replay a dm-log-writes log onto a copy of the logged device."};
	std::string log_path, dev_path;
	std::optional<uint64_t> from, to;
	bool list = false;
	app.add_option("log", log_path, "the log: the log device or a copy of it")->required();
	app.add_flag("--list", list,
		     "print one line per entry: INDEX FLAGS SECTOR NR_SECTORS [MARK]; a state after a power cut "
		     "ends at an entry with flush or fua");
	app.add_option("--replay", dev_path, "apply entries to this file or block device (a copy of the device before logging)");
	app.add_option("--from", from, "first entry to apply (default 0)");
	app.add_option("--to", to, "apply entries before this one (default: all)");
	CLI11_PARSE(app, argc, argv);

	try {
		const Fd lf(log_path, O_RDONLY);
		const Log log = read_log(lf, log_path);
		if (list) {
			fmt::print("# {} entries, {} B blocks\n", log.entries.size(), log.block);
			for (const Entry &e : log.entries)
				fmt::print("{} {} {} {}{}\n", e.index, flag_words(e.flags, e.nr_sectors), e.sector,
					   e.nr_sectors, e.mark.empty() ? "" : " " + e.mark);
		}
		if (dev_path.empty())
			return 0;
		const uint64_t a = from.value_or(0), b = to.value_or(log.entries.size());
		if (a > b || b > log.entries.size())
			throw std::runtime_error(fmt::format("--from {} --to {}: the log has {} entries", a, b,
							     log.entries.size()));
		const Fd df(dev_path, O_RDWR);
		const uint64_t dev_size = df.size(dev_path);
		std::vector<uint8_t> buf;
		for (uint64_t i = a; i < b; i++) {
			const Entry &e = log.entries[i];
			if (!e.nr_sectors || (e.flags & MARK))
				continue;
			const uint64_t len = e.nr_sectors * log.block;
			if (e.sector > dev_size / log.block || len > dev_size - e.sector * log.block)
				throw std::runtime_error(fmt::format("entry {}: {} bytes at sector {} beyond {} ({} bytes)",
								     i, len, e.sector, dev_path, dev_size));
			buf.assign(len, 0);	// a discard reads back as zeros here
			if (!(e.flags & DISCARD))
				lf.pread_all(buf.data(), len, e.data_pos, log_path);
			df.pwrite_all(buf.data(), len, e.sector * log.block, dev_path);
		}
		if (fsync(df.fd) < 0)
			throw std::runtime_error(fmt::format("{}: fsync: {}", dev_path, std::strerror(errno)));
	} catch (const std::exception &e) {
		fmt::print(stderr, "ckpt-log-replay: {}\n", e.what());
		return 1;
	}
	return 0;
}
