// SPDX-License-Identifier: MIT
// ckptctl activate / deactivate: assemble the devices of /etc/ckpttab. A
// backing device is found by the uuid in its superblock, read from every
// block device in /sys/class/block, never by its kernel name (which changes
// between boots); the target gets the device-mapper uuid CKPT-<image uuid>,
// which makes activation idempotent and one image one target.
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <optional>

#include <sys/stat.h>
#include <sys/sysmacros.h>

#include <fmt/format.h>

#include "ckpttab.hpp"
#include "commands.hpp"
#include "fail.hpp"
#include "tenant.hpp"

namespace fs = std::filesystem;

namespace ckptctl {

namespace {

std::string read_line(const fs::path &p)
{
	std::ifstream in(p);
	std::string s;
	std::getline(in, s);
	return s;
}

// The uuid of the image on a block device, or empty when it holds none.
std::string image_uuid(const std::string &path)
{
	uint8_t u[16];
	if (ckpt_image_uuid(path.c_str(), u) != 0)
		return "";
	char text[37];
	ckpt_uuid_string(u, text);
	return text;
}

struct BlockDev {
	std::string path, uuid;
	bool has_holders = false;
};

// Every block device holding a dm-ckpt image: its /dev node, image uuid, and
// whether something (a device-mapper device) is stacked on it. Devices
// of size 0 (empty drives) and dm-ckpt targets (which stand for their
// backing device) are skipped.
std::vector<BlockDev> scan()
{
	std::vector<BlockDev> out;
	std::error_code ec;
	for (const fs::directory_entry &d : fs::directory_iterator("/sys/class/block", ec)) {
		const std::string kname = d.path().filename();
		if (read_line(d.path() / "size") == "0")
			continue;
		unsigned maj = 0, min = 0;
		if (sscanf(read_line(d.path() / "dev").c_str(), "%u:%u", &maj, &min) != 2)
			continue;
		const std::string node = "/dev/" + kname;
		struct stat st;
		if (stat(node.c_str(), &st) != 0 || !S_ISBLK(st.st_mode) || major(st.st_rdev) != maj ||
		    minor(st.st_rdev) != min)
			continue;
		if (fs::exists(d.path() / "dm")) {
			if (read_line(d.path() / "dm" / "uuid").rfind("CKPT-", 0) == 0)
				continue;
			char *backing = nullptr;
			const int is_ckpt = ckpt_backing_of(node.c_str(), &backing);
			ckpt_free(backing);
			if (is_ckpt != 0)
				continue;
		}
		BlockDev b{node, image_uuid(node), false};
		if (b.uuid.empty())
			continue;
		std::error_code hec;
		const fs::directory_iterator holders(d.path() / "holders", hec);
		b.has_holders = !hec && holders != fs::directory_iterator();
		out.push_back(b);
	}
	if (ec)
		fail(CKPT_E_IO, "cannot list /sys/class/block: {}", ec.message());
	return out;
}

// The block device that holds image uuid: the only one, or the only one
// nothing is stacked on (a volume over a disk that holds the same bytes).
std::string find_backing(const std::vector<BlockDev> &devs, const std::string &uuid)
{
	std::vector<const BlockDev *> all, free;
	for (const BlockDev &b : devs)
		if (b.uuid == uuid) {
			all.push_back(&b);
			if (!b.has_holders)
				free.push_back(&b);
		}
	if (all.size() == 1)
		return all[0]->path;
	if (free.size() == 1)
		return free[0]->path;
	if (all.empty())
		fail(CKPT_E_NAME, "no block device holds the image {} ({} block devices hold dm-ckpt images)", uuid,
		     devs.size());
	std::string names;
	for (const BlockDev *b : all)
		names += (names.empty() ? "" : ", ") + b->path;
	fail(CKPT_E_STATE, "the image {} is on {} block devices ({}): copies; list the one to use by path", uuid,
	     all.size(), names);
}

// Activates one entry; returns false (after printing why) when it failed.
bool activate(const TabEntry &e, const std::string &file, bool read_only,
	      std::optional<std::vector<BlockDev>> &devs, const std::string &device)
{
	try {
		std::string backing = device.empty() ? e.path : device;
		std::string uuid = e.uuid;
		if (uuid.empty()) {
			uuid = image_uuid(backing);
			if (uuid.empty())
				fail(CKPT_E_INVAL, "{} holds no valid dm-ckpt image (ckptctl info {} says why)", backing,
				     backing);
		}
		// true when the image is active under this entry's name
		const auto active = [&](const dm::Info &i) {
			if (i.exists && i.name == e.name)
				fmt::print("{}: already active ({}, image {})\n", e.name, dm::node(e.name, i), uuid);
			return i.exists && i.name == e.name;
		};
		const dm::Info by_uuid = dm::info_by_uuid(dm_uuid(uuid));
		if (active(by_uuid))
			return true;
		if (by_uuid.exists)
			fail(CKPT_E_STATE, "the image {} is active as {}, not as {}", uuid, by_uuid.name, e.name);
		const dm::Info by_name = dm::info(e.name);
		if (by_name.exists)
			fail(CKPT_E_STATE, "a device-mapper device named {} exists already (uuid {}), not for the image {}",
			     e.name, by_name.uuid.empty() ? "none" : by_name.uuid, uuid);
		if (backing.empty()) {
			if (!devs)
				devs = scan();
			backing = find_backing(*devs, uuid);
		}
		CreateArgs ca;
		ca.name = e.name;
		ca.device = backing;
		ca.queue_depth = e.queue_depth;
		ca.staging_kb = e.staging_kb;
		ca.read_only = e.read_only || read_only;
		ca.image_uuid = uuid;
		Created c;
		try {
			c = create_target(ca);
		} catch (const Error &) {
			// another activation (a unit udev started) may have won the race
			if (active(dm::info_by_uuid(dm_uuid(uuid))))
				return true;
			throw;
		}
		fmt::print("{}: created {} on {}{}, image {}, committed step {}\n", e.name, c.node, backing,
			   ca.read_only ? " (read-only)" : "", uuid, c.step);
		return true;
	} catch (const Error &x) {
		fmt::print(stderr, "ckptctl: {}:{}: {}: {}\n", file, e.line, e.name, x.what());
		return false;
	}
}

bool deactivate(const std::string &name, const std::string &uuid)
{
	try {
		const dm::Info i = uuid.empty() ? dm::info(name) : dm::info_by_uuid(dm_uuid(uuid));
		const std::string what = uuid.empty() ? name : name + " (image " + uuid + ")";
		if (!i.exists) {
			fmt::print("{}: not active\n", what);
			return true;
		}
		if (!uuid.empty() && !name.empty() && i.name != name)
			fail(CKPT_E_STATE, "the image {} is active as {}, not as {}: left alone", uuid, i.name, name);
		const auto tt = dm::table(i.name);
		if (tt.size() != 1 || tt[0].type != "ckpt")
			fail(CKPT_E_INVAL, "{} is not a dm-ckpt device: left alone", i.name);
		dm::remove(i.name, false);
		fmt::print("{}: removed\n", i.name);
		return true;
	} catch (const Error &x) {
		fmt::print(stderr, "ckptctl: {}{}: {}\n", name, uuid.empty() ? "" : " (image " + uuid + ")", x.what());
		return false;
	}
}

} // namespace

int cmd_activate(const ActivateArgs &a)
{
	std::string want_uuid, device;
	if (!a.uuid.empty())
		want_uuid = canonical_uuid(a.uuid);	// checked by the command line
	// The whole file is parsed before anything is done: a bad line changes nothing.
	const std::vector<TabEntry> tab = read_ckpttab(a.ckpttab);
	// Tenants first: their devices hold images (and a drive with a table
	// holds none itself; udev then asks for each new tenant device).
	if (a.all)
		activate_tenant_drives();
	if (!a.device.empty()) {
		device = a.device;
		want_uuid = image_uuid(device);
		if (want_uuid.empty()) {	// not an image: nothing to do (udev asks for every device)
			if (!activate_tenant_drives(device))
				fmt::print("{}: holds no dm-ckpt image\n", device);
			return exit_ok;
		}
	}
	std::optional<std::vector<BlockDev>> devs;
	unsigned selected = 0, failed = 0;
	for (const TabEntry &e : tab) {
		if (a.all && e.noauto)
			continue;
		if (!a.all) {
			std::error_code ec;
			const bool match = !e.uuid.empty() ? e.uuid == want_uuid
					   : !device.empty() ? fs::equivalent(e.path, device, ec)
							     : image_uuid(e.path) == want_uuid;
			if (!match)
				continue;
		}
		selected++;
		if (!activate(e, a.ckpttab, a.read_only, devs, device))
			failed++;
	}
	if (!selected && !a.all && device.empty())
		fail(CKPT_E_NAME, "{} lists no image {}", a.ckpttab, want_uuid);
	if (!selected)
		fmt::print("{}: nothing to activate{}\n", a.ckpttab,
			   device.empty() ? "" : fmt::format(" on {} (image {})", device, want_uuid));
	return failed ? exit_error : exit_ok;
}

int cmd_deactivate(const ActivateArgs &a)
{
	if (!a.name.empty())
		return deactivate(a.name, "") ? exit_ok : exit_error;
	if (!a.uuid.empty())
		return deactivate("", canonical_uuid(a.uuid)) ? exit_ok : exit_error;
	unsigned failed = 0;
	for (const TabEntry &e : read_ckpttab(a.ckpttab)) {
		std::string uuid = e.uuid;
		if (uuid.empty()) {	// by path: the target of that name, if it is a target of an image
			const dm::Info i = dm::info(e.name);
			if (i.exists && i.uuid.rfind("CKPT-", 0) == 0)
				uuid = i.uuid.substr(5);
		}
		if (!deactivate(e.name, uuid))
			failed++;
	}
	return failed ? exit_error : exit_ok;
}

} // namespace ckptctl
