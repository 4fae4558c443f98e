// SPDX-License-Identifier: MIT
// A stripe set: one image over several drives (files or block devices), laid
// out as dm-stripe lays a device over them, named by a small descriptor file
// that the userspace engine opens in place of an image. The kernel target
// serves the same bytes through a dm-stripe table of the same drives
// (stripe_table).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace ckpt {

struct StripeSet {
	uint64_t stripe_bytes = 0;	// a power of two, 4 KiB to 1 GiB
	std::vector<std::string> drives;	// in stripe order; relative to the descriptor's folder
};

constexpr unsigned kMaxStripeDrives = 64;

// The stripe set the regular file open at fd describes, or none when it is
// not a descriptor (it does not start with {"dm-ckpt-stripe-set"). A
// descriptor that says it is one and is wrong in any way is refused
// (CKPT_E_INVAL, naming path). Drive paths come back absolute.
std::optional<StripeSet> read_stripe_set(int fd, const std::string &path);
// Writes the descriptor of set at path, a new path (never replacing a file
// there, CKPT_E_STATE), flushed.
void write_stripe_set(const std::string &path, const StripeSet &set);
// ckpt_stripe_create's work: the descriptor, missing drives made; its report.
std::string create_stripe_set(const std::string &path, uint64_t stripe_bytes, const std::vector<std::string> &drives,
			      uint64_t drive_bytes);
// Drive k of set for a logical byte offset: (drive, offset on it).
inline std::pair<uint64_t, uint64_t> stripe_map(uint64_t off, uint64_t stripe_bytes, uint64_t n)
{
	const uint64_t k = off / stripe_bytes;
	return {k % n, k / n * stripe_bytes + off % stripe_bytes};
}

} // namespace ckpt
