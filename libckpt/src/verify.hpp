// SPDX-License-Identifier: MIT
// Offline integrity checks of a backing image (ckptctl verify / restore) and
// the one-step rollback. Reads the backing device directly; nothing may be
// serving it while rollback() writes.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "image.hpp"

namespace ckpt {

// One superblock copy as found on the device, decoded on its own.
struct SuperblockCopy {
	unsigned index = 0;		// 0: at offset 0, 1: at 4 KiB
	bool blank = false;		// all zero: never written (or wiped by format)
	bool magic = false;		// has the superblock magic
	bool valid = false;		// decodes and validates
	std::string error;		// why not, when !valid && !blank
	bool current = false;		// the copy the device uses
	struct ckpt_sb sb {};		// when valid
};

std::array<SuperblockCopy, 2> inspect_superblocks(const BackingFile &f);

// A damaged record or p_lo range, with what it holds.
struct Damage {
	uint32_t slot = 0;
	uint32_t chunk = 0;
	uint64_t offset = 0;		// byte offset on the backing device
	std::string what;
	std::vector<std::string> tensors;	// tensors whose params it holds
};

struct SlotCheck {
	uint32_t slot = 0;
	uint64_t chunks = 0;		// records checked
	std::vector<Damage> damage;
	bool ok() const { return damage.empty(); }
};

// The committed slot: every record header (chunk, slot, step and sequence of
// the superblock), every data checksum, and p_lo == round-to-nearest-even(p).
SlotCheck check_committed(const Image &img);

// Whether the other slot still holds the previous step, fully readable: the
// older superblock copy is that step's commit (sequence - 1, step - 1, the
// other slot), and every record of the other slot is at that step and
// sequence with intact data and p_lo.
struct RollbackCheck {
	bool available = false;
	std::string reason;		// why not
	uint64_t step = 0;		// the previous step
	uint32_t slot = 0;		// the slot that holds it
	struct ckpt_sb prev {};		// its superblock (trainer blob), when available
	SlotCheck records;
};

RollbackCheck check_rollback(const Image &img, const std::array<SuperblockCopy, 2> &copies);

// Makes the previous step the committed one: the other slot's record headers
// are stamped with the new superblock's sequence (data untouched), flushed,
// then a superblock (sequence + 1, committed_step - 1, the other slot, the
// previous step's blob) is written with FUA over the older copy. A crash in
// between leaves the current commit in place and the rollback repeatable.
// img must be open writable; rb must come from check_rollback on it.
void rollback(Image &img, const RollbackCheck &rb);

// Names of the tensors owning params [first, first + n).
std::vector<std::string> tensors_in(const Manifest &m, uint64_t first, uint64_t n);

} // namespace ckpt
