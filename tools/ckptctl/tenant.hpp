// SPDX-License-Identifier: MIT
// ckptctl tenant: per-job optimizer devices carved out of one drive.
//
// The drive starts with a table of its tenants (kTableBytes, two copies of
// a checksummed header and JSON, the newer valid one in force; a change
// writes the older copy, flushed, so a crash keeps the old table or the
// new); the rest is handed out in extents of whole MiB, first fit. Each
// tenant is a dm-linear device over its extent, /dev/mapper/ckpt-tenant-NAME,
// owned by the job's user (mode 0600: no other job opens it), of its quota's
// size: the job formats it (ckptctl format, OffloadAdamW) and may put the
// kernel target over it. Removing a tenant zeroes its extent (BLKZEROOUT:
// zeros guaranteed, which discard is not) before the table frees it.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "tenant_table.hpp"

namespace ckptctl {

struct TenantArgs {
	std::string verb;	// init, create, remove, set, list, activate, exec
	std::string drive, name, owner;
	uint64_t bytes = 0;	// create: the quota
	std::optional<uint32_t> weight;	// create, set: the tenant's io.weight
	std::optional<uint64_t> max_bps;	// create, set: its io.max (0: none)
	uint64_t read_bps = 0, write_bps = 0;	// init, set DRIVE: the drive's bandwidth
	std::vector<std::string> command;	// exec
	bool force = false;	// init over a drive that holds something
	bool json = false;
};
int cmd_tenant(const TenantArgs &a);

// Makes the tenants' devices and cgroups of every drive with a tenant table
// (ckptctl activate, at boot), or of the one drive given; returns how many
// drives held a table. A drive that cannot be read is skipped.
unsigned activate_tenant_drives(const std::string &only = "");

// The tenant whose device a table line ("MAJ:MIN ...") names, or empty.
std::string tenant_of(const std::string &params);

// Each tenant device's quota and its I/O on the drive (from its cgroup), in
// Prometheus' text format.
std::string tenants_prometheus();

} // namespace ckptctl
