// SPDX-License-Identifier: MIT
#include "verify.hpp"
#include "progress.hpp"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <functional>

#include "error.hpp"

extern "C" {
#include "ckpt_step.h"
#include "ckpt_update.h"
}

namespace ckpt {

namespace {

// The step and sequence a slot's records should have; why decides on others
// (empty: accepted as well).
struct RecordRule {
	struct ckpt_sb sb;	// the superblock that commits the slot's records
	std::function<std::string(const struct ckpt_rec &)> why;
};

std::string describe(const Manifest &m, uint64_t param)
{
	for (const Tensor &t : m.tensors())
		if (param >= t.offset && param < t.offset + t.extent)
			return param - t.offset < t.numel
				       ? fmt::format("{}[{}]", t.name, param - t.offset)
				       : fmt::format("{} (padding after element {})", t.name, t.numel - 1);
	return fmt::format("param {}", param);
}

SlotCheck check_slot(const Image &img, const RecordRule &rule)
{
	const uint32_t slot = rule.sb.committed_slot;
	const struct ckpt_regions &l = img.sb.regions;
	const uint64_t cp = l.chunk_params;
	SlotCheck out;
	out.slot = slot;
	Buffer rec(l.record_bytes), plo(l.plo_chunk_bytes);
	std::vector<uint16_t> want(cp);
	for (uint32_t c = 0; c < img.sb.geo.n_chunks; c++) {
		progress("check", c, img.sb.geo.n_chunks);
		out.chunks++;
		const uint64_t roff = ckpt_record_offset(&l, slot, c);
		auto damage = [&](uint64_t off, std::string what, std::vector<std::string> tensors) {
			out.damage.push_back({slot, c, off, std::move(what), std::move(tensors)});
		};
		const auto chunk_tensors = tensors_in(img.manifest, c * cp, cp);
		const uint64_t poff = ckpt_plo_offset(&l, slot, c);
		img.file.pread_all(rec.as(), l.record_bytes, roff);
		img.file.pread_all(plo.as(), l.plo_chunk_bytes, poff);
		struct ckpt_rec expect, r;
		ckpt_rec_committed(&rule.sb, c, &expect);
		enum ckpt_rec_fault f = ckpt_rec_check(rec.as(), rec.as() + CKPT_BLOCK, plo.as(), &expect, img.sb.feature_incompat, &r);
		if (f == CKPT_REC_HEADER) {
			int ret = ckpt_rec_decode(rec.as(), &r);
			damage(roff, fmt::format("record header of chunk {}: {}", c, ckpt_strerror(-ret)),
			       chunk_tensors);
			continue;
		}
		if (f == CKPT_REC_PLACE) {
			damage(roff, fmt::format("record header of chunk {} is misplaced: it says chunk {} slot {} "
						 "chunk_shift {}", c, r.chunk, r.slot, r.chunk_shift),
			       chunk_tensors);
			continue;
		}
		if (f == CKPT_REC_STEP) {
			if (std::string why = rule.why(r); !why.empty()) {
				damage(roff, fmt::format("record of chunk {} {}", c, why), chunk_tensors);
				continue;
			}
			expect.step = r.step;	// accepted: check the rest against it
			expect.sequence = r.sequence;
			f = ckpt_rec_check(rec.as(), rec.as() + CKPT_BLOCK, plo.as(), &expect, img.sb.feature_incompat, &r);
		}
		const bool data_ok = f != CKPT_REC_DATA;
		if (!data_ok)
			damage(roff + CKPT_BLOCK, fmt::format("record data of chunk {} (p, m, v): checksum "
							      "mismatch", c), chunk_tensors);
		if (f == CKPT_REC_PLO)
			damage(poff, fmt::format("p_lo of chunk {}: checksum mismatch", c), chunk_tensors);
		// p_lo must be p rounded to nearest even (with BF16M, the bf16 masters
		// themselves). Where the data checksum failed, this also points at a
		// corrupt p.
		if (img.sb.feature_incompat & CKPT_FEATURE_INCOMPAT_BF16M)
			std::memcpy(want.data(), rec.as() + CKPT_BLOCK, cp * 2);
		else
			ckpt_round_params(img.sb.geo.dtype, reinterpret_cast<const uint32_t *>(rec.as() + CKPT_BLOCK),
					  want.data(), cp);
		const uint16_t *have = plo.as<uint16_t>();
		uint64_t first = cp, count = 0;
		std::vector<std::string> names;
		const auto &ts = img.manifest.tensors();
		uint64_t lo = 1, hi = 0;	// the param range of the last tensor named
		for (uint64_t i = 0; i < cp; i++) {
			if (have[i] == want[i])
				continue;
			if (!count++)
				first = i;
			const uint64_t param = c * cp + i;
			if (param >= lo && param < hi)
				continue;
			// tensors are sorted by offset: the last one starting at or before param
			auto it = std::upper_bound(ts.begin(), ts.end(), param,
						   [](uint64_t x, const Tensor &t) { return x < t.offset; });
			if (it == ts.begin())
				continue;
			--it;
			lo = it->offset;
			hi = it->offset + it->extent;
			names.push_back(it->name);
		}
		if (count) {
			std::sort(names.begin(), names.end());
			names.erase(std::unique(names.begin(), names.end()), names.end());
			damage(poff + first * 2,
			       fmt::format("{} of chunk {}: {} params differ from round(p), first {} (p_lo {:#06x}, "
					   "round(p) {:#06x}){}",
					   data_ok ? "p_lo" : "p (or p_lo)", c, count, describe(img.manifest, c * cp + first),
					   have[first], want[first], data_ok ? "" : "; the fp32 p there is corrupt"),
			       names);
		}
	}
	progress("check", img.sb.geo.n_chunks, img.sb.geo.n_chunks);
	return out;
}

bool all_zero(const uint8_t *p, size_t n)
{
	for (size_t i = 0; i < n; i++)
		if (p[i])
			return false;
	return true;
}

} // namespace

std::vector<std::string> tensors_in(const Manifest &m, uint64_t first, uint64_t n)
{
	std::vector<std::string> out;
	for (const Tensor &t : m.tensors())
		if (t.offset < first + n && first < t.offset + t.extent)
			out.push_back(t.name);
	return out;
}

std::array<SuperblockCopy, 2> inspect_superblocks(const BackingFile &f)
{
	std::array<SuperblockCopy, 2> out;
	if (f.size < 2 * CKPT_BLOCK)
		fail(CKPT_E_NO_SB, "{} is not a dm-ckpt image: {} bytes, too small for a superblock", f.path, f.size);
	Buffer block(2 * CKPT_BLOCK);
	f.pread_all(block.as(), 2 * CKPT_BLOCK, 0);
	for (unsigned i = 0; i < 2; i++) {
		SuperblockCopy &c = out[i];
		const uint8_t *b = block.as() + i * CKPT_BLOCK;
		c.index = i;
		c.blank = all_zero(b, CKPT_BLOCK);
		uint32_t magic;
		std::memcpy(&magic, b, 4);
		c.magic = magic == CKPT_SB_MAGIC;
		int ret = ckpt_sb_decode(b, f.size, &c.sb);
		c.valid = ret == 0;
		if (!c.valid && !c.blank)
			c.error = ckpt_strerror(-ret);
	}
	struct ckpt_sb sb;
	int cur = ckpt_sb_pick(block.as(), block.as() + CKPT_BLOCK, f.size, &sb);
	if (cur >= 0)
		out[static_cast<size_t>(cur)].current = true;
	return out;
}

SlotCheck check_committed(const Image &img)
{
	const struct ckpt_sb &sb = img.sb;
	RecordRule rule;
	rule.sb = sb;
	rule.why = [&](const struct ckpt_rec &r) {
		return fmt::format("is at step {} sequence {}, the superblock commits step {} sequence {} "
				   "(a lost or misdirected write)",
				   r.step, r.sequence, sb.committed_step, sb.sequence);
	};
	return check_slot(img, rule);
}

RollbackCheck check_rollback(const Image &img, const std::array<SuperblockCopy, 2> &copies)
{
	const struct ckpt_sb &sb = img.sb;
	RollbackCheck rb;
	rb.slot = sb.committed_slot ^ 1;
	if (sb.committed_step == 0) {
		rb.reason = "the committed step is 0: there is no previous step";
		return rb;
	}
	rb.step = sb.committed_step - 1;
	const SuperblockCopy &older = copies[(sb.sequence + 1) & 1];
	if (!older.valid) {
		rb.reason = older.blank ? fmt::format("the older superblock copy ({}) is blank", older.index)
					: fmt::format("the older superblock copy ({}) is invalid: {}", older.index,
						      older.error);
		return rb;
	}
	const struct ckpt_sb &p = older.sb;
	if (p.sequence + 1 != sb.sequence || p.committed_step != rb.step || p.committed_slot != rb.slot) {
		rb.reason = fmt::format("the older superblock copy commits step {} in slot {} (sequence {}), "
					"not step {} in slot {} (sequence {})",
					p.committed_step, p.committed_slot, p.sequence, rb.step, rb.slot,
					sb.sequence - 1);
		return rb;
	}
	if (std::memcmp(&p.geo, &sb.geo, sizeof(p.geo)) != 0 || p.manifest_crc != sb.manifest_crc ||
	    std::memcmp(p.uuid, sb.uuid, sizeof(p.uuid)) != 0) {
		rb.reason = "the older superblock copy has another geometry, manifest or uuid";
		return rb;
	}
	// Records at the previous step, committed by the previous superblock; or
	// already stamped with the next sequence by an interrupted rollback.
	RecordRule rule;
	rule.sb = p;
	rule.why = [&](const struct ckpt_rec &r) -> std::string {
		if (r.step == rb.step && r.sequence == sb.sequence + 1)
			return {};
		if (r.step > sb.committed_step)
			return fmt::format("was overwritten by step {} (an open, aborted, skipped or crashed step)",
					   r.step);
		return fmt::format("is at step {} sequence {}, not the previous step {} sequence {}", r.step,
				   r.sequence, rb.step, p.sequence);
	};
	rb.records = check_slot(img, rule);
	if (!rb.records.ok()) {
		const Damage &d = rb.records.damage.front();
		rb.reason = fmt::format("slot {} does not hold step {} intact: {}{}", rb.slot, rb.step, d.what,
					rb.records.damage.size() > 1
						? fmt::format(" (and {} more)", rb.records.damage.size() - 1)
						: "");
		return rb;
	}
	rb.prev = p;
	rb.available = true;
	return rb;
}

void rollback(Image &img, const RollbackCheck &rb)
{
	if (!rb.available)
		fail(CKPT_E_STATE, "{}: cannot roll back: {}", img.file.path, rb.reason);
	const struct ckpt_regions &l = img.sb.regions;
	struct ckpt_sb next;
	check_core(ckpt_sb_next(&img.sb, rb.step, rb.slot, rb.prev.blob, rb.prev.blob_len, &next),
		   "rollback superblock");

	// Headers only; the slot is not the committed one, so a crash here
	// changes nothing a reader of the current superblock sees. Each record
	// is re-sealed as one the next superblock commits; its checksums stay.
	Buffer hdr(CKPT_BLOCK);
	for (uint32_t c = 0; c < img.sb.geo.n_chunks; c++) {
		const uint64_t off = ckpt_record_offset(&l, rb.slot, c);
		img.file.pread_all(hdr.as(), CKPT_BLOCK, off);
		struct ckpt_rec r, id;
		check_core(ckpt_rec_decode(hdr.as(), &r), fmt::format("record of chunk {}", c));
		ckpt_rec_next(&img.sb, c, rb.step, &id);
		if (r.sequence == id.sequence)
			continue;
		id.data_crc = r.data_crc;
		id.plo_crc = r.plo_crc;
		ckpt_rec_seal(hdr.as(), nullptr, nullptr, &id, img.sb.feature_incompat);
		img.file.pwrite_all(hdr.as(), CKPT_BLOCK, off);
	}
	// The commit every target makes (flush, then the next copy durable), as
	// the core does it; the ops keep the I/O error's message for the throw.
	struct Host {
		Image &img;
		std::string message;
	} host{img, {}};
	static const struct ckpt_step_ops ops = {
		.lock = nullptr,
		.unlock = nullptr,
		.drain = nullptr,
		.flush = [](void *h) { auto &o = *static_cast<Host *>(h); return o.img.file.commit_flush(o.message); },
		.write_sb =
			[](void *h, const void *block, uint64_t off) {
				auto &o = *static_cast<Host *>(h);
				return o.img.file.commit_write_sb(block, off, o.message);
			},
		.copy = nullptr,
		.dispatch = nullptr,
		.dispatched = nullptr,
		.quiesce = nullptr,
		.failed = nullptr,
		.read =
			[](void *h, void *buf, uint64_t off, uint64_t len) {
				auto &o = *static_cast<Host *>(h);
				return o.img.file.commit_read(buf, off, len, o.message);
			},
		.write = nullptr,	// this is the offline rollback itself
		.alloc = nullptr,
		.free = nullptr,
		.fpu_begin = nullptr,
		.fpu_end = nullptr,
	};
	struct ckpt_sb spare;
	if (ckpt_sb_commit(&ops, &host, &img.sb, &spare, hdr.as(), rb.step, rb.slot, rb.prev.blob,
			   rb.prev.blob_len, nullptr) < 0)
		fail(CKPT_E_IO, "{}: rollback commit: {}", img.file.path,
		     host.message.empty() ? "the superblock does not encode" : host.message);
	img.reload_superblock();
	if (img.sb.sequence != next.sequence || img.sb.committed_step != rb.step)
		fail(CKPT_E_IO, "{}: the rollback superblock did not read back", img.file.path);
}

} // namespace ckpt
