// SPDX-License-Identifier: MIT
// /etc/ckpttab: the dm-ckpt devices to assemble at boot, one a line:
//
//   # name  device                                     options
//   ckpt0   UUID=0f3c2a5e-7d41-4b8e-9a10-2c6f1e0d9b77  queue_depth=16,staging_kb=131072
//   ckpt1   /dev/disk/by-id/nvme-SAMSUNG_MZ1L2-1       ro
//
// Fields are separated by blanks; '#' starts a comment line; blank lines
// are skipped. name is the device-mapper name; device is UUID=<image uuid>
// (found by reading the superblock of every block device) or an absolute
// path; options (optional, '-' or 'defaults' for none) is a comma-separated
// list of ro, noauto, queue_depth=N (1..128), staging_kb=K (1..4194304).
// The parse is strict: any other text is an error naming the file and line.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace ckptctl {

struct TabEntry {
	unsigned line = 0;
	std::string name;
	std::string uuid;	// lower-case text form, or empty
	std::string path;	// when not by uuid
	bool read_only = false, noauto = false;
	uint32_t queue_depth = 0, staging_kb = 0;	// 0: the target's default
};

// Parses text (the contents of the file named file, for the messages).
// Throws ckptctl::Error "FILE:LINE: ..." on the first bad line; names and
// uuids must be unique in the file.
std::vector<TabEntry> parse_ckpttab(const std::string &text, const std::string &file);
// Reads and parses a file.
std::vector<TabEntry> read_ckpttab(const std::string &file);

// The canonical (lower-case) form of a uuid "xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx";
// empty if s is not one.
std::string canonical_uuid(const std::string &s);

} // namespace ckptctl
