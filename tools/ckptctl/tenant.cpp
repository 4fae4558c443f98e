// SPDX-License-Identifier: MIT
#include "tenant.hpp"

#include <algorithm>
#include <cerrno>
#include <cstddef>
#include <optional>
#include <cstring>
#include <iostream>
#include <memory>
#include <random>

#include <endian.h>
#include <fcntl.h>
#include <grp.h>
#include <linux/fs.h>
#include <pwd.h>
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

constexpr uint64_t kMiB = 1 << 20;
constexpr uint64_t kTableBytes = kMiB;		// the drive's first MiB: the table
constexpr uint64_t kCopyBytes = kTableBytes / 2;	// copy k at k * kCopyBytes
constexpr uint64_t kBlock = 4096;
constexpr char kMagic[8] = {'C', 'K', 'P', 'T', 'T', 'N', 'T', '1'};
const std::string kPrefix = "ckpt-tenant-";

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

struct Tenant {
	std::string name, uuid;
	uint64_t start = 0, bytes = 0;	// on the drive
	uint32_t uid = 0, gid = 0;
};

struct Table {
	std::string uuid;	// the drive's
	uint64_t sequence = 0;
	std::vector<Tenant> tenants;
};

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
		json j{{"uuid", t.uuid}, {"tenants", json::array()}};
		for (const Tenant &x : t.tenants)
			j["tenants"].push_back({{"name", x.name}, {"uuid", x.uuid}, {"start", x.start}, {"bytes", x.bytes},
						{"uid", x.uid}, {"gid", x.gid}});
		const std::string text = j.dump();
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
		const json j = json::parse(text, nullptr, false);
		Table t;
		t.sequence = le64toh(h.sequence);
		try {
			t.uuid = j.at("uuid").get<std::string>();
			for (const json &x : j.at("tenants"))
				t.tenants.push_back({x.at("name").get<std::string>(), x.at("uuid").get<std::string>(),
						     x.at("start").get<uint64_t>(), x.at("bytes").get<uint64_t>(),
						     x.at("uid").get<uint32_t>(), x.at("gid").get<uint32_t>()});
		} catch (const json::exception &) {
			return std::nullopt;	// checksummed, yet not ours: a copy to ignore
		}
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

// The tenant's dm-linear device, made (if missing) and given to its owner.
std::string activate(const Drive &d, const Tenant &x)
{
	const std::string name = kPrefix + x.name;
	dm::Info i = dm::info(name);
	if (!i.exists) {
		char dev[32];
		snprintf(dev, sizeof(dev), "%u:%u", major(d.rdev()), minor(d.rdev()));
		dm::create(name, {0, x.bytes / 512, "linear", fmt::format("{} {}", dev, x.start / 512)},
			   "CKPT-TENANT-" + x.uuid);
		i = dm::info(name);
	}
	const std::string node = dm::node(name, i);
	if (chown(node.c_str(), x.uid, x.gid) < 0 || chmod(node.c_str(), 0600) < 0)
		fail(CKPT_E_IO, "cannot give {} to uid {} gid {}: {}", node, x.uid, x.gid, strerror(errno));
	return node;
}

void check_tenant_name(const std::string &name)
{
	if (name.empty() || name.size() > 64 ||
	    !std::all_of(name.begin(), name.end(), [](char c) { return isalnum(c) || c == '-' || c == '_'; }))
		fail(CKPT_E_INVAL, "tenant name '{}': 1 to 64 letters, digits, '-' or '_'", name);
}

} // namespace

int cmd_tenant(const TenantArgs &a)
{
	Drive d(a.drive);
	if (a.verb == "init") {
		if (d.read())
			fail(CKPT_E_STATE, "{} has a tenant table already", a.drive);
		if (!a.force && d.any_signature())
			fail(CKPT_E_STATE, "{} is not blank at its start: init would hide what is there (--force)", a.drive);
		d.write(Table{new_uuid(), 0, {}}, 0);
		fmt::print("{}: a tenant table, {} bytes to carve\n", a.drive, d.size() / kMiB * kMiB - kTableBytes);
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
		Tenant x{a.name, new_uuid(), first_fit(t, a.bytes, d.size()), a.bytes, uid, gid};
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
		fmt::print("{}: tenant {} of {} bytes at {} of {}, owned by {}:{} (mode 0600)\n", node, x.name,
			   x.bytes, x.start, a.drive, x.uid, x.gid);
		return 0;
	}
	if (a.verb == "remove") {
		auto it = std::find_if(t.tenants.begin(), t.tenants.end(), [&](const Tenant &x) { return x.name == a.name; });
		if (it == t.tenants.end())
			fail(CKPT_E_STATE, "{} has no tenant '{}'", a.drive, a.name);
		const dm::Info i = dm::info(kPrefix + a.name);
		if (i.exists && i.open_count > 0)
			fail(CKPT_E_STATE, "tenant {} is in use (a job or a dm-ckpt target has it open)", a.name);
		if (i.exists)
			dm::remove(kPrefix + a.name, true);
		// Its data goes before its space: a crash between leaves a tenant of zeros.
		const uint64_t bytes = it->bytes;
		d.zero(it->start, bytes);
		t.tenants.erase(it);
		d.write(t, in_force);
		fmt::print("{}: tenant {} removed, its {} bytes zeroed and free\n", a.drive, a.name, bytes);
		return 0;
	}
	if (a.verb == "activate") {
		for (const Tenant &x : t.tenants)
			fmt::print("{}\n", activate(d, x));
		return 0;
	}
	if (a.verb == "list") {
		json j = json::array();
		for (const Tenant &x : t.tenants)
			j.push_back({{"name", x.name}, {"uuid", x.uuid}, {"start", x.start}, {"bytes", x.bytes},
				     {"uid", x.uid}, {"gid", x.gid}, {"active", dm::info(kPrefix + x.name).exists}});
		if (a.json)
			std::cout << j.dump(2) << "\n";
		else
			for (const json &x : j)
				fmt::print("{:<24} {:>14} bytes at {:>14}  uid {} gid {}{}\n", x["name"].get<std::string>(),
					   x["bytes"].get<uint64_t>(), x["start"].get<uint64_t>(), x["uid"].get<uint32_t>(),
					   x["gid"].get<uint32_t>(), x["active"].get<bool>() ? "" : "  (not active)");
		return 0;
	}
	fail(CKPT_E_INVAL, "tenant: unknown verb '{}' (init, create, remove, list, activate)", a.verb);
}

} // namespace ckptctl
