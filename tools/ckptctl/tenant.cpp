// SPDX-License-Identifier: MIT
#include "tenant.hpp"

#include <algorithm>
#include <filesystem>
#include <map>
#include <cerrno>
#include <cstddef>
#include <optional>
#include <cstring>
#include <iostream>
#include <memory>
#include <random>
#include <sstream>

#include <endian.h>
#include <fcntl.h>
#include <grp.h>
#include <linux/fs.h>
#include <pwd.h>
#include <sys/types.h>
#include <sys/file.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "ckpt_admin.h"
#include "dm.hpp"
#include "fail.hpp"

using nlohmann::json;

namespace ckptctl {

namespace {

constexpr uint64_t kCopyBytes = kTableBytes / 2;	// copy k at k * kCopyBytes
constexpr uint64_t kBlock = 4096;
constexpr char kMagic[8] = {'C', 'K', 'P', 'T', 'T', 'N', 'T', '1'};
const std::string kPrefix = "ckpt-tenant-";
// Not "CKPT-": that prefix names the dm-ckpt targets, which stand for their
// backing devices when ckptctl activate looks for images.
const std::string kUuidPrefix = "CKPTTENANT-";

// A copy's header block: magic, version, sequence, the JSON's length and
// crc32c, then the header's own crc32c (of its first 28 bytes).
struct Header {
	char magic[8];
	uint32_t version;
	uint64_t sequence;
	uint32_t json_len;
	uint32_t json_crc;
	uint32_t header_crc;
} __attribute__((packed));

std::string new_uuid()
{
	std::random_device rd;
	uint8_t u[16];
	for (auto &b : u)
		b = static_cast<uint8_t>(rd());
	u[6] = (u[6] & 0x0f) | 0x40;
	u[8] = (u[8] & 0x3f) | 0x80;
	char s[37];
	ckpt_uuid_string(u, s);
	return s;
}

class Drive {
public:
	explicit Drive(const std::string &path) : path_(path)
	{
		// Not O_EXCL: the tenants' dm-linear devices hold the drive. One
		// ckptctl at a time changes its table (an flock on the node).
		fd_ = ::open(path.c_str(), O_RDWR | O_DIRECT | O_CLOEXEC);
		if (fd_ < 0)
			fail(CKPT_E_IO, "cannot open {} for its tenants: {}", path, strerror(errno));
		if (flock(fd_, LOCK_EX) < 0)
			fail(CKPT_E_IO, "cannot lock {}: {}", path, strerror(errno));
		struct stat st;
		if (fstat(fd_, &st) < 0 || !S_ISBLK(st.st_mode))
			fail(CKPT_E_INVAL, "{} is not a block device: tenants are carved out of a drive", path);
		if (ioctl(fd_, BLKGETSIZE64, &size_) < 0)
			fail(CKPT_E_IO, "cannot get the size of {}: {}", path, strerror(errno));
		rdev_ = st.st_rdev;
	}
	~Drive()
	{
		if (fd_ >= 0)
			::close(fd_);
	}
	Drive(const Drive &) = delete;
	Drive &operator=(const Drive &) = delete;
	uint64_t size() const { return size_; }
	const std::string &path() const { return path_; }
	dev_t rdev() const { return rdev_; }

	// The table in force: the valid copy with the higher sequence.
	std::optional<Table> read() const
	{
		std::optional<Table> best;
		for (int k = 0; k < 2; k++)
			if (auto t = read_copy(k); t && (!best || t->sequence > best->sequence))
				best = std::move(t);
		return best;
	}

	// Writes t (its sequence one past the one in force) over the older copy, flushed.
	void write(Table t, uint64_t in_force) const
	{
		t.sequence = in_force + 1;
		const std::string text = table_json(t);
		if (text.size() > kCopyBytes - kBlock)
			fail(CKPT_E_RANGE, "{}: the tenant table would need {} bytes, at most {}", path_, text.size(),
			     kCopyBytes - kBlock);
		std::unique_ptr<uint8_t, decltype(&free)> buf(aligned(kCopyBytes), free);
		Header h{};
		std::memcpy(h.magic, kMagic, sizeof(kMagic));
		h.version = htole32(1);
		h.sequence = htole64(t.sequence);
		h.json_len = htole32(static_cast<uint32_t>(text.size()));
		h.json_crc = htole32(ckpt_crc32c_update(0, text.data(), text.size()));
		h.header_crc = htole32(ckpt_crc32c_update(0, &h, offsetof(Header, header_crc)));
		std::memcpy(buf.get(), &h, sizeof(h));
		std::memcpy(buf.get() + kBlock, text.data(), text.size());
		const int k = static_cast<int>(t.sequence % 2);	// alternates: the other copy stays
		if (pwrite(fd_, buf.get(), kCopyBytes, k * kCopyBytes) != static_cast<ssize_t>(kCopyBytes) ||
		    fdatasync(fd_) < 0)
			fail(CKPT_E_IO, "cannot write the tenant table of {}: {}", path_, strerror(errno));
	}

	// Zeros over [start, start + bytes) of the drive, guaranteed.
	void zero(uint64_t start, uint64_t bytes) const
	{
		uint64_t range[2] = {start, bytes};
		if (ioctl(fd_, BLKZEROOUT, range) < 0)
			fail(CKPT_E_IO, "cannot zero bytes {}..{} of {}: {}", start, start + bytes, path_,
			     strerror(errno));
	}

	bool any_signature() const
	{
		std::unique_ptr<uint8_t, decltype(&free)> buf(aligned(kTableBytes), free);
		if (pread(fd_, buf.get(), kTableBytes, 0) != static_cast<ssize_t>(kTableBytes))
			fail(CKPT_E_IO, "cannot read {}: {}", path_, strerror(errno));
		return std::any_of(buf.get(), buf.get() + kTableBytes, [](uint8_t b) { return b != 0; });
	}

private:
	static uint8_t *aligned(size_t n)
	{
		void *p = nullptr;
		if (posix_memalign(&p, kBlock, n))
			throw std::bad_alloc();
		std::memset(p, 0, n);
		return static_cast<uint8_t *>(p);
	}

	std::optional<Table> read_copy(int k) const
	{
		std::unique_ptr<uint8_t, decltype(&free)> buf(aligned(kCopyBytes), free);
		if (pread(fd_, buf.get(), kCopyBytes, k * kCopyBytes) != static_cast<ssize_t>(kCopyBytes))
			return std::nullopt;
		Header h;
		std::memcpy(&h, buf.get(), sizeof(h));
		if (std::memcmp(h.magic, kMagic, sizeof(kMagic)) != 0 || le32toh(h.version) != 1 ||
		    le32toh(h.header_crc) != ckpt_crc32c_update(0, &h, offsetof(Header, header_crc)) ||
		    le32toh(h.json_len) > kCopyBytes - kBlock)
			return std::nullopt;
		const std::string text(reinterpret_cast<const char *>(buf.get() + kBlock), le32toh(h.json_len));
		if (ckpt_crc32c_update(0, text.data(), text.size()) != le32toh(h.json_crc))
			return std::nullopt;
		// checksummed, yet not ours or not sound: a copy to ignore
		std::optional<Table> t = parse_table(text, size_);
		if (t)
			t->sequence = le64toh(h.sequence);
		return t;
	}

	std::string path_;
	int fd_ = -1;
	uint64_t size_ = 0;
	dev_t rdev_ = 0;
};

Table table_of(const Drive &d)
{
	auto t = d.read();
	if (!t)
		fail(CKPT_E_STATE, "{} has no tenant table (ckptctl tenant init {})", d.path(), d.path());
	return *t;
}

// The first free extent of bytes (whole MiB) after the table.
uint64_t first_fit(const Table &t, uint64_t bytes, uint64_t drive_bytes)
{
	std::vector<std::pair<uint64_t, uint64_t>> used;
	for (const Tenant &x : t.tenants)
		used.push_back({x.start, x.start + x.bytes});
	std::sort(used.begin(), used.end());
	uint64_t at = kTableBytes;
	for (const auto &[lo, hi] : used) {
		if (lo >= at + bytes)
			return at;
		at = std::max(at, hi);
	}
	if (drive_bytes / kMiB * kMiB >= at + bytes)
		return at;
	fail(CKPT_E_TOO_SMALL, "no {} free bytes in one piece on the drive (ckptctl tenant list shows its tenants)",
	     bytes);
}

std::pair<uint32_t, uint32_t> owner_of(const std::string &spec)
{
	const auto colon = spec.find(':');
	const std::string user = spec.substr(0, colon);
	const struct passwd *pw = getpwnam(user.c_str());
	if (!pw)
		fail(CKPT_E_INVAL, "--owner: no user '{}'", user);
	uint32_t gid = pw->pw_gid;
	if (colon != std::string::npos) {
		const struct group *gr = getgrnam(spec.substr(colon + 1).c_str());
		if (!gr)
			fail(CKPT_E_INVAL, "--owner: no group '{}'", spec.substr(colon + 1));
		gid = gr->gr_gid;
	}
	return {pw->pw_uid, gid};
}

std::string devno(dev_t d)
{
	return fmt::format("{}:{}", major(d), minor(d));
}

// ---- bandwidth shares (blk-cgroup v2)
//
// Each tenant has a cgroup, kCgroupRoot/NAME, whose io.weight on the drive is
// its share under contention and whose io.max (when set) caps it. The weights
// need a proportional controller on the drive: iocost (io.cost.qos), given the
// drive's bandwidth as its model when the table records it (without one, the
// kernel's generic SSD model may think the drive idle while it is saturated,
// and then shares nothing). A job's I/O is charged to the cgroup it runs in
// (ckptctl tenant exec puts it there); the kernel target charges its record
// I/O to the cgroup of the gradient writes that caused it.
const std::string kCgroupFs = "/sys/fs/cgroup";
const std::string kCgroupRoot = kCgroupFs + "/dm-ckpt";

std::string cgroup_of(const std::string &name)
{
	return kCgroupRoot + "/" + name;
}

void write_knob(const std::string &file, const std::string &text)
{
	const int fd = ::open(file.c_str(), O_WRONLY | O_CLOEXEC);
	const bool ok = fd >= 0 && write(fd, text.data(), text.size()) == static_cast<ssize_t>(text.size());
	const int err = errno;
	if (fd >= 0)
		::close(fd);
	if (!ok)
		fail(CKPT_E_IO, "cannot write '{}' to {}: {}", text, file, strerror(err));
}

std::string read_knob(const std::string &file)
{
	std::string text;
	const int fd = ::open(file.c_str(), O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return text;
	char buf[4096];
	for (ssize_t n; (n = read(fd, buf, sizeof(buf))) > 0;)
		text.append(buf, static_cast<size_t>(n));
	::close(fd);
	return text;
}

std::string sysfs_line(const std::string &file)
{
	std::string s = read_knob(file);
	return s.substr(0, s.find('\n'));
}

// The disk a block device ("MAJ:MIN") is, or is a partition of: iocost,
// io.weight, io.max and io.stat take whole disks.
std::string whole_disk(const std::string &dev)
{
	const std::string sys = "/sys/dev/block/" + dev;
	return std::filesystem::exists(sys + "/partition") ? sysfs_line(sys + "/../dev") : dev;
}

// The disk whose I/O the shares control. One that is not blk-mq
// (device-mapper, md) cannot have iocost: refused, saying so.
std::string shares_disk(const Drive &d)
{
	const std::string disk = whole_disk(devno(d.rdev()));
	if (!std::filesystem::exists("/sys/dev/block/" + disk + "/mq"))
		fail(CKPT_E_FEATURE, "{}: the tenants' bandwidth shares need a blk-mq disk for iocost (an NVMe "
		     "namespace, or a partition of one), not a device-mapper or md device", d.path());
	return disk;
}

void need_io_controller()
{
	std::istringstream in(read_knob(kCgroupFs + "/cgroup.controllers"));
	for (std::string c; in >> c;)
		if (c == "io")
			return;
	fail(CKPT_E_FEATURE, "{} is not cgroup2 with the io controller: the tenants' bandwidth shares need it",
	     kCgroupFs);
}

// iocost on the drive, with the drive's bandwidth as its model when known
// (then vrate is held at 100%: the model is the drive).
void drive_shares(const Drive &d, const Table &t)
{
	need_io_controller();
	const std::string dev = shares_disk(d);
	if (t.read_bps && t.write_bps) {
		const auto model = [](const char *rw, uint64_t bps) {
			// a 4 KiB I/O costs its bytes: the model is bandwidth alone
			return fmt::format("{0}bps={1} {0}seqiops={2} {0}randiops={2}", rw, bps,
					   std::max<uint64_t>(1, bps / kBlock));
		};
		write_knob(kCgroupFs + "/io.cost.model",
			   fmt::format("{} ctrl=user model=linear {} {}", dev, model("r", t.read_bps),
				       model("w", t.write_bps)));
		write_knob(kCgroupFs + "/io.cost.qos", dev + " enable=1 ctrl=user min=100.00 max=100.00");
	} else {
		write_knob(kCgroupFs + "/io.cost.model", dev + " ctrl=auto");
		write_knob(kCgroupFs + "/io.cost.qos", dev + " enable=1 ctrl=auto");
	}
}

void tenant_shares(const Drive &d, const Tenant &x)
{
	const std::string cg = cgroup_of(x.name), dev = shares_disk(d);
	if (mkdir(kCgroupRoot.c_str(), 0755) < 0 && errno != EEXIST)
		fail(CKPT_E_IO, "cannot make {}: {}", kCgroupRoot, strerror(errno));
	write_knob(kCgroupFs + "/cgroup.subtree_control", "+io");
	write_knob(kCgroupRoot + "/cgroup.subtree_control", "+io");
	if (mkdir(cg.c_str(), 0755) < 0 && errno != EEXIST)
		fail(CKPT_E_IO, "cannot make {}: {}", cg, strerror(errno));
	write_knob(cg + "/io.weight", fmt::format("{} {}", dev, x.weight));
	const std::string cap = x.max_bps ? std::to_string(x.max_bps) : "max";
	write_knob(cg + "/io.max", fmt::format("{} rbps={} wbps={}", dev, cap, cap));
}

// The tenant's dm-linear device, made (if missing) and given to its owner,
// and its cgroup with its share.
std::string activate(const Drive &d, const Tenant &x)
{
	const std::string name = kPrefix + x.name;
	dm::Info i = dm::info(name);
	if (!i.exists) {
		dm::create(name, {0, x.bytes / 512, "linear", fmt::format("{} {}", devno(d.rdev()), x.start / 512)},
			   kUuidPrefix + x.uuid);
		i = dm::info(name);
	}
	const std::string node = dm::node(name, i);
	if (chown(node.c_str(), x.uid, x.gid) < 0 || chmod(node.c_str(), 0600) < 0)
		fail(CKPT_E_IO, "cannot give {} to uid {} gid {}: {}", node, x.uid, x.gid, strerror(errno));
	tenant_shares(d, x);
	return node;
}

Tenant &find(Table &t, const std::string &name, const std::string &drive)
{
	for (Tenant &x : t.tenants)
		if (x.name == name)
			return x;
	fail(CKPT_E_STATE, "{} has no tenant '{}'", drive, name);
}

std::string model_text(const Table &t)
{
	if (!t.read_bps)
		return "shares by iocost on the kernel's model of the drive";
	return fmt::format("shares by iocost on a drive of {} B/s reads, {} B/s writes", t.read_bps, t.write_bps);
}

std::string share_text(const Tenant &x)
{
	return fmt::format("weight {}{}", x.weight, x.max_bps ? fmt::format(", at most {} B/s each way", x.max_bps) : "");
}

// Runs command in the tenant's cgroup as its owner (never returns).
[[noreturn]] void exec_in(const Drive &d, const Tenant &x, const std::vector<std::string> &command)
{
	if (command.empty())
		fail(CKPT_E_INVAL, "exec DRIVE NAME -- COMMAND [ARGS...]");
	tenant_shares(d, x);	// the cgroup, as the table says
	write_knob(cgroup_of(x.name) + "/cgroup.procs", "0");
	const struct passwd *pw = getpwuid(x.uid);
	if ((pw ? initgroups(pw->pw_name, x.gid) : setgroups(0, nullptr)) < 0 || setgid(x.gid) < 0 ||
	    setuid(x.uid) < 0)
		fail(CKPT_E_IO, "cannot become uid {} gid {}: {}", x.uid, x.gid, strerror(errno));
	std::vector<char *> argv;
	for (const std::string &c : command)
		argv.push_back(const_cast<char *>(c.c_str()));
	argv.push_back(nullptr);
	execvp(argv[0], argv.data());
	fail(CKPT_E_IO, "cannot run {}: {}", command[0], strerror(errno));
}

void check_tenant_name(const std::string &name)
{
	if (!valid_tenant_name(name))
		fail(CKPT_E_INVAL, "tenant name '{}': 1 to 64 letters, digits, '-' or '_'", name);
}

} // namespace

int cmd_tenant(const TenantArgs &a)
{
	if (!a.read_bps != !a.write_bps)
		fail(CKPT_E_INVAL, "--read-bps and --write-bps go together: the drive's model needs both");
	Drive d(a.drive);
	if (a.verb == "init") {
		if (d.read())
			fail(CKPT_E_STATE, "{} has a tenant table already", a.drive);
		if (!a.force && d.any_signature())
			fail(CKPT_E_STATE, "{} is not blank at its start: init would hide what is there (--force)", a.drive);
		const Table t{new_uuid(), 0, a.read_bps, a.write_bps, {}};
		drive_shares(d, t);	// before the table: a drive without shares gets no tenants
		d.write(t, 0);
		fmt::print("{}: a tenant table, {} bytes to carve, {}\n", a.drive,
			   d.size() / kMiB * kMiB - kTableBytes, model_text(t));
		return 0;
	}
	Table t = table_of(d);
	const uint64_t in_force = t.sequence;
	if (a.verb == "create") {
		check_tenant_name(a.name);
		if (std::any_of(t.tenants.begin(), t.tenants.end(), [&](const Tenant &x) { return x.name == a.name; }))
			fail(CKPT_E_STATE, "{} has a tenant '{}' already", a.drive, a.name);
		if (a.bytes == 0 || a.bytes % kMiB)
			fail(CKPT_E_INVAL, "--size: a positive multiple of 1 MiB");
		const auto [uid, gid] = owner_of(a.owner);
		Tenant x{a.name, new_uuid(), first_fit(t, a.bytes, d.size()), a.bytes, uid, gid,
			 a.weight.value_or(kDefaultWeight), a.max_bps.value_or(0)};
		Table with = t;
		with.tenants.push_back(x);
		d.write(with, in_force);
		std::string node;
		try {
			node = activate(d, x);
		} catch (...) {
			d.write(t, in_force + 1);	// the space back: no tenant without its device
			throw;
		}
		fmt::print("{}: tenant {} of {} bytes at {} of {}, owned by {}:{} (mode 0600); {}\n", node, x.name,
			   x.bytes, x.start, a.drive, x.uid, x.gid, share_text(x));
		return 0;
	}
	if (a.verb == "remove") {
		const Tenant gone = find(t, a.name, a.drive);
		const dm::Info i = dm::info(kPrefix + a.name);
		if (i.exists && i.open_count > 0)
			fail(CKPT_E_STATE, "tenant {} is in use (a job or a dm-ckpt target has it open)", a.name);
		if (i.exists)
			dm::remove(kPrefix + a.name, true);
		// Its data goes before its space: a crash between leaves a tenant of zeros.
		d.zero(gone.start, gone.bytes);
		std::erase_if(t.tenants, [&](const Tenant &x) { return x.name == gone.name; });
		d.write(t, in_force);
		// A job still in its cgroup keeps it; the next create of the name takes it over.
		if (rmdir(cgroup_of(a.name).c_str()) < 0 && errno != ENOENT)
			fmt::print(stderr, "ckptctl: {} left: {}\n", cgroup_of(a.name), strerror(errno));
		fmt::print("{}: tenant {} removed, its {} bytes zeroed and free\n", a.drive, a.name, gone.bytes);
		return 0;
	}
	if (a.verb == "activate") {
		drive_shares(d, t);
		for (const Tenant &x : t.tenants)
			fmt::print("{}\n", activate(d, x));
		return 0;
	}
	if (a.verb == "set") {
		if (a.name.empty()) {
			if (a.weight || a.max_bps)
				fail(CKPT_E_INVAL, "set DRIVE takes --read-bps and --write-bps; a tenant's share: set DRIVE NAME");
			t.read_bps = a.read_bps;
			t.write_bps = a.write_bps;
			drive_shares(d, t);
			d.write(t, in_force);
			fmt::print("{}: {}\n", a.drive, model_text(t));
			return 0;
		}
		if (a.read_bps || a.write_bps)
			fail(CKPT_E_INVAL, "--read-bps and --write-bps are the drive's: set DRIVE without a name");
		Tenant &x = find(t, a.name, a.drive);
		if (a.weight)
			x.weight = *a.weight;
		if (a.max_bps)
			x.max_bps = *a.max_bps;
		tenant_shares(d, x);
		d.write(t, in_force);
		fmt::print("{}: tenant {}: {}\n", a.drive, x.name, share_text(x));
		return 0;
	}
	if (a.verb == "exec")
		exec_in(d, find(t, a.name, a.drive), a.command);
	if (a.verb == "list") {
		json j = json::array();
		for (const Tenant &x : t.tenants)
			j.push_back({{"name", x.name}, {"uuid", x.uuid}, {"start", x.start}, {"bytes", x.bytes},
				     {"uid", x.uid}, {"gid", x.gid}, {"weight", x.weight}, {"max_bps", x.max_bps},
				     {"cgroup", cgroup_of(x.name)}, {"active", dm::info(kPrefix + x.name).exists}});
		if (a.json) {
			std::cout << json{{"drive", a.drive}, {"read_bps", t.read_bps}, {"write_bps", t.write_bps},
					  {"tenants", j}}.dump(2)
				  << "\n";
			return 0;
		}
		fmt::print("{}: {}\n", a.drive, model_text(t));
		for (const Tenant &x : t.tenants)
			fmt::print("{:<24} {:>14} bytes at {:>14}  uid {} gid {}  {}{}\n", x.name, x.bytes, x.start, x.uid,
				   x.gid, share_text(x), dm::info(kPrefix + x.name).exists ? "" : "  (not active)");
		return 0;
	}
	fail(CKPT_E_INVAL, "tenant: unknown verb '{}' (init, create, remove, set, list, activate, exec)", a.verb);
}

namespace {

// Whether the device starts with a tenant table's magic (either copy).
bool holds_tenant_table(const std::string &node)
{
	const int fd = ::open(node.c_str(), O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return false;
	bool found = false;
	for (uint64_t k = 0; k < 2 && !found; k++) {
		char magic[sizeof(kMagic)];
		found = pread(fd, magic, sizeof(magic), static_cast<off_t>(k * kCopyBytes)) ==
				static_cast<ssize_t>(sizeof(magic)) &&
			std::memcmp(magic, kMagic, sizeof(kMagic)) == 0;
	}
	::close(fd);
	return found;
}

} // namespace

unsigned activate_tenant_drives(const std::string &only)
{
	std::vector<std::string> drives;
	if (!only.empty()) {
		drives.push_back(only);
	} else {
		std::error_code ec;
		for (const auto &e : std::filesystem::directory_iterator("/sys/class/block", ec)) {
			// not the tenants' devices nor the targets: a table is on a drive
			if (sysfs_line(e.path() / "dm" / "uuid").rfind("CKPT", 0) == 0 || sysfs_line(e.path() / "size") == "0")
				continue;
			drives.push_back("/dev/" + e.path().filename().string());
		}
	}
	unsigned n = 0;
	for (const std::string &node : drives) {
		if (!holds_tenant_table(node))
			continue;
		try {
			Drive d(node);
			const std::optional<Table> t = d.read();
			if (!t)
				continue;
			n++;
			drive_shares(d, *t);
			for (const Tenant &x : t->tenants)
				fmt::print("{}: tenant {} on {}\n", activate(d, x), x.name, node);
		} catch (const Error &e) {
			fmt::print(stderr, "ckptctl: {}: tenants not activated: {}\n", node, e.what());
		}
	}
	return n;
}

std::string tenant_of(const std::string &params)
{
	const std::string dm = "/sys/dev/block/" + params.substr(0, params.find(' ')) + "/dm/";
	const std::string name = sysfs_line(dm + "name");
	if (name.rfind(kPrefix, 0) != 0 || sysfs_line(dm + "uuid").rfind(kUuidPrefix, 0) != 0)
		return "";
	return name.substr(kPrefix.size());
}

std::string tenants_prometheus()
{
	struct Row {
		std::string labels;
		uint64_t quota = 0, weight = kDefaultWeight, rbytes = 0, wbytes = 0, rios = 0, wios = 0;
	};
	std::vector<Row> rows;
	for (const std::string &name : dm::names()) {
		if (name.rfind(kPrefix, 0) != 0 || dm::info(name).uuid.rfind(kUuidPrefix, 0) != 0)
			continue;
		const std::vector<dm::Target> table = dm::table(name);
		if (table.size() != 1 || table[0].type != "linear")
			continue;
		const std::string drive = table[0].params.substr(0, table[0].params.find(' '));
		const std::string dev = whole_disk(drive);	// its knobs' and counts' key
		const std::string tenant = name.substr(kPrefix.size());
		Row r;
		std::error_code ec;
		const std::string kname = std::filesystem::read_symlink("/sys/dev/block/" + drive, ec).filename();
		r.labels = fmt::format("tenant=\"{}\",drive=\"{}\"", tenant, kname.empty() ? drive : "/dev/" + kname);
		r.quota = table[0].length * 512;
		std::istringstream weights(read_knob(cgroup_of(tenant) + "/io.weight"));
		for (std::string key, value; weights >> key >> value;)
			if (key == "default" || key == dev)
				r.weight = std::strtoull(value.c_str(), nullptr, 10);
		// io.stat: a line a device, "MAJ:MIN rbytes=N wbytes=N rios=N wios=N ..."
		const std::map<std::string, uint64_t Row::*> keys = {
			{"rbytes", &Row::rbytes}, {"wbytes", &Row::wbytes}, {"rios", &Row::rios}, {"wios", &Row::wios}};
		std::istringstream stat(read_knob(cgroup_of(tenant) + "/io.stat"));
		for (std::string line; std::getline(stat, line);) {
			std::istringstream in(line);
			std::string d, kv;
			if (!(in >> d) || d != dev)
				continue;
			while (in >> kv)
				if (const auto eq = kv.find('='); keys.count(kv.substr(0, eq)))
					r.*keys.at(kv.substr(0, eq)) = std::strtoull(kv.c_str() + eq + 1, nullptr, 10);
		}
		rows.push_back(r);
	}
	std::string out;
	if (rows.empty())
		return out;	// no tenant: no families (a scrape of targets alone stays as it was)
	const auto family = [&](const char *metric, const char *type, const char *help, uint64_t Row::*field) {
		out += fmt::format("# HELP dm_ckpt_tenant_{0} {1}\n# TYPE dm_ckpt_tenant_{0} {2}\n", metric, help, type);
		for (const Row &r : rows)
			out += fmt::format("dm_ckpt_tenant_{}{{{}}} {}\n", metric, r.labels, r.*field);
	};
	family("quota_bytes", "gauge", "The tenant's size on its drive: its quota.", &Row::quota);
	family("weight", "gauge", "The tenant's io.weight on its drive: its share under contention.", &Row::weight);
	family("read_bytes_total", "counter", "Bytes the tenant's cgroup read from its drive.", &Row::rbytes);
	family("written_bytes_total", "counter", "Bytes the tenant's cgroup wrote to its drive.", &Row::wbytes);
	family("reads_total", "counter", "Reads the tenant's cgroup issued to its drive.", &Row::rios);
	family("writes_total", "counter", "Writes the tenant's cgroup issued to its drive.", &Row::wios);
	return out;
}

} // namespace ckptctl
