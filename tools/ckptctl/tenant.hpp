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
#include <string>
#include <vector>

namespace ckptctl {

struct TenantArgs {
	std::string verb;	// init, create, remove, list, activate
	std::string drive, name, owner;
	uint64_t bytes = 0;	// create: the quota
	bool force = false;	// init over a drive that holds something
	bool json = false;
};
int cmd_tenant(const TenantArgs &a);

} // namespace ckptctl
