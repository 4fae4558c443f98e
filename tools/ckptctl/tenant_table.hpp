// SPDX-License-Identifier: MIT
// A drive's tenant table as it is kept in the drive's first MiB (the JSON of
// each copy; tenant.cpp writes and reads the copies), and the checks that
// every table read from a drive passes before anything is done with it: its
// names become cgroup directories, device-mapper names and metric labels, its
// extents device-mapper tables.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace ckptctl {

constexpr uint64_t kMiB = 1 << 20;
constexpr uint64_t kTableBytes = kMiB;	// the drive's first MiB: the table
// io.weight's range and default; the largest bandwidth a table records
constexpr uint32_t kMinWeight = 1, kMaxWeight = 10000, kDefaultWeight = 100;
constexpr uint64_t kMaxBps = uint64_t{1} << 40;

struct Tenant {
	std::string name, uuid;
	uint64_t start = 0, bytes = 0;	// on the drive
	uint32_t uid = 0, gid = 0;
	uint32_t weight = kDefaultWeight;	// its share of the drive under contention
	uint64_t max_bps = 0;	// a cap on its reads and on its writes, or 0
};

struct Table {
	std::string uuid;	// the drive's
	uint64_t sequence = 0;	// kept in the copy's header, not in the JSON
	uint64_t read_bps = 0, write_bps = 0;	// the drive's bandwidth, for iocost's model; 0: the kernel's
	std::vector<Tenant> tenants;
};

// 1 to 64 letters, digits, '-' or '_'.
bool valid_tenant_name(const std::string &name);

std::string table_json(const Table &t);

// The table that text holds, when it is whole and sound for a drive of
// drive_bytes: known keys of the right types (those the shares added may be
// missing), valid and distinct names, uuids as made, weights and bandwidths
// in range, extents of whole MiB after the table, inside the drive and
// apart. Anything else: none (the copy is not used).
std::optional<Table> parse_table(const std::string &text, uint64_t drive_bytes);

} // namespace ckptctl
