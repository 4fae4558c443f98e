// SPDX-License-Identifier: MIT
// A dm-ckpt backing image opened and validated: superblock, group table and
// manifest. What the engine runs on and what ckptctl inspects.
#pragma once

#include <algorithm>
#include <string>
#include <vector>

#include "io.hpp"
#include "manifest.hpp"

namespace ckpt {

struct Image {
	// One copy of the group table and manifest as read at open: empty
	// strings when intact, else what is wrong with it.
	struct MetaCopy {
		std::string group_error;
		std::string manifest_error;
		bool ok() const { return group_error.empty() && manifest_error.empty(); }
	};

	BackingFile file;
	struct ckpt_sb sb {};
	bool salvage = false;			// opened to read what a short file still has
	std::string short_warning;		// the file is shorter than its layout (salvage)
	uint32_t sb_copy = 0;			// the superblock copy in use
	std::string sb_warning;			// the other copy is damaged: what and why
	std::vector<uint8_t> group_table;	// one byte per chunk
	Manifest manifest;
	std::vector<MetaCopy> meta;		// one per copy on the device (1, or 2 with META2)
	uint32_t group_copy = 0;		// the copies group_table and manifest came from
	uint32_t manifest_copy = 0;

	// Opens and validates path. The superblock, group table and manifest are
	// taken from the first copy whose checksum matches; a damaged copy is
	// reported in warnings(), not refused. A file shorter than its layout is
	// refused, unless salvage (export, verify: read-only): then reads past its
	// end fail where they happen and warnings() names the missing bytes.
	static Image open(const std::string &path, bool writable, bool salvage = false);
	// The same on a file already open (a virtual device's IMAGE window).
	static Image open(BackingFile file, bool salvage = false);
	// Reads both superblock copies again (the device may have committed since).
	void reload_superblock();
	// Damaged copies of the superblock and metadata, one sentence each.
	std::vector<std::string> warnings() const;
	// Writes the intact copy of the group table and of the manifest over each
	// damaged one, flushed; returns the regions written. Needs writable.
	unsigned repair_meta();
	// fp32 p, m, v of n params at param offset from the records whose
	// identity is id (slot, step, sequence; ckpt_rec_committed or
	// ckpt_rec_next, its chunk field is ignored); data checksums verified.
	// bounce holds at least one record.
	void read_state(const struct ckpt_rec &id, uint64_t offset, uint64_t n, float *p, float *m,
			float *v, Buffer &bounce) const;
	// Throws CKPT_E_RECORD, naming the chunk and its tensors, unless block
	// is the intact record header of identity want (ckpt_rec_check); with
	// data, block holds the whole record and its data checksum must match;
	// with plo and the PLO_CRC feature, so must the chunk's p_lo.
	void check_record(const uint8_t *block, const struct ckpt_rec &want, bool data,
			  const uint8_t *plo = nullptr) const;
	// The error check_record throws for fault f (got: what the record holds).
	[[noreturn]] void fail_record(const uint8_t *block, const struct ckpt_rec &want,
				      enum ckpt_rec_fault f, const struct ckpt_rec &got) const;
	// Compatibility forms naming slot, step and sequence: the records sb
	// commits are ckpt_rec_committed's.
	void read_state(uint32_t slot, uint64_t step, uint64_t sequence, uint64_t offset, uint64_t n,
			float *p, float *m, float *v, Buffer &bounce) const;
	void check_record(const uint8_t *block, uint32_t chunk, uint32_t slot, uint64_t step,
			  uint64_t sequence, bool data, const uint8_t *plo = nullptr) const;
	// Tensor t's step count in the state sb commits (the committed steps that
	// updated it), from its first block's count in the checked record
	// header; sb's committed step on an image without COUNTS.
	uint64_t tensor_count(const struct ckpt_sb &at, const Tensor &t) const;
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
