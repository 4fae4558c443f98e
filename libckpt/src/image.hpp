// SPDX-License-Identifier: MIT
// A dm-ckpt backing image opened and validated: superblock, group table and
// manifest. What the engine runs on and what ckptctl inspects.
#pragma once

#include <algorithm>
#include <string>
#include <vector>

#include "io.hpp"
#include "layout.hpp"

namespace ckpt {

struct Image {
	BackingFile file;
	struct ckpt_sb sb {};
	std::vector<uint8_t> group_table;	// one byte per chunk
	Manifest manifest;

	static Image open(const std::string &path, bool writable);
	// Reads both superblock copies again (the device may have committed since).
	void reload_superblock();
	// fp32 p, m, v of n params at param offset from the records of slot,
	// whose headers must say step and sequence; data checksums verified.
	// bounce holds at least one record.
	void read_state(uint32_t slot, uint64_t step, uint64_t sequence, uint64_t offset, uint64_t n,
			float *p, float *m, float *v, Buffer &bounce) const;
	// Throws CKPT_E_RECORD, naming the chunk and its tensors, unless block
	// is the intact record header of chunk in slot at step and sequence
	// (ckpt_rec_check); with data, block holds the whole record and its
	// data checksum must match; with plo and the PLO_CRC feature, so must
	// the chunk's p_lo.
	void check_record(const uint8_t *block, uint32_t chunk, uint32_t slot, uint64_t step,
			  uint64_t sequence, bool data, const uint8_t *plo = nullptr) const;
	// The names of the tensors with params in chunk, quoted, for messages.
	std::string tensors_of_chunk(uint32_t chunk) const;
};

// A range [off, off + len) cut at multiples of `unit`: f(index, offset in unit, length).
template <typename F> void for_each_piece(uint64_t off, uint64_t len, uint64_t unit, F &&f)
{
	while (len) {
		uint64_t c = off / unit;
		uint64_t in = off - c * unit;
		uint64_t n = std::min(len, unit - in);
		f(static_cast<uint32_t>(c), in, n);
		off += n;
		len -= n;
	}
}

} // namespace ckpt
