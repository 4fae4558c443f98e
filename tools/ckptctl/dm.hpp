// SPDX-License-Identifier: MIT
// The device-mapper side of ckptctl (libdevmapper): create, remove, status
// and messages of dm-ckpt targets. Every dm_task is owned by an RAII Task;
// every task that changes a device carries a udev cookie and is followed by
// dm_udev_wait(), which also creates or removes the /dev/mapper node when no
// udev is running (a busybox initramfs).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace ckptctl::dm {

struct Info {
	bool exists = false;
	bool suspended = false;
	bool live_table = false;
	int32_t open_count = 0;
	uint32_t major = 0, minor = 0;
	uint32_t target_count = 0;
	std::string name, uuid;
};

struct Target {
	uint64_t start = 0, length = 0;	// sectors
	std::string type;		// "ckpt"
	std::string params;
};

// Checks a device name: 1..127 bytes, no '/', not "." or "..".
void check_name(const std::string &name);

Info info(const std::string &name);
// The device whose device-mapper uuid is uuid (exists false when none).
Info info_by_uuid(const std::string &uuid);
// The names of all device-mapper devices.
std::vector<std::string> names();
// The live table (STATUSTYPE_TABLE) or status (STATUSTYPE_INFO) lines.
std::vector<Target> table(const std::string &name);
std::vector<Target> status(const std::string &name);
// Creates and resumes a device with one target line, with a device-mapper
// uuid unless empty, read-only if asked; returns its node path.
std::string create(const std::string &name, const Target &t, const std::string &uuid = "",
		   bool read_only = false);
void remove(const std::string &name, bool retry);
// Sends a message to sector 0 of the device; returns the target's answer.
std::string message(const std::string &name, const std::string &text);
// The node of a device: /dev/mapper/NAME, else /dev/dm-MINOR, whichever exists.
std::string node(const std::string &name, const Info &i);

} // namespace ckptctl::dm
