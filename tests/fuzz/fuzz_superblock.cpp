// SPDX-License-Identifier: MIT
// The core's on-disk decoders (ckpt_codec.c): both superblock copies
// (decode, pick, check_other), the group table check, the record header
// (decode, check) and the status page, as a reader meets them on a device.
//
// Input: a flags byte, the device size (8 bytes, little endian; 0: 2^64-1),
// then superblock copy 0, copy 1, a record header and a status page (4 KiB
// each, zero-padded), then group table bytes (repeated to n_chunks). Flag 1
// seals the superblock copies, 2 the record header, 4 the status page with
// their right checksums first, so that mutations reach the checks behind
// the crc.
#include "fuzz_util.hpp"

extern "C" {
#include "ckpt_codec.h"
}

namespace {

constexpr uint32_t sb_crc_off = 8, rec_crc_off = 4, st_crc_off = 8;

void seal(uint8_t *block, size_t len, size_t crc_off)
{
	std::memset(block + crc_off, 0, 4);
	const uint32_t crc = ckpt_crc32c(block, len);
	std::memcpy(block + crc_off, &crc, 4);
}

// What a valid superblock must satisfy, whatever the bytes were.
void check_sb(const ckpt_sb &sb, uint64_t dev_bytes)
{
	FUZZ_ASSERT(ckpt_geometry_check(&sb.geo) == 0);
	FUZZ_ASSERT(sb.committed_slot <= 1);
	FUZZ_ASSERT(sb.blob_len <= CKPT_BLOB_MAX);
	FUZZ_ASSERT(sb.manifest_len <= sb.geo.manifest_bytes);
	FUZZ_ASSERT(sb.regions.dev_bytes <= dev_bytes);
	ckpt_regions l;
	FUZZ_ASSERT(ckpt_regions_compute_features(&sb.geo, sb.feature_incompat, &l) == 0);
	FUZZ_ASSERT(l.dev_bytes <= sb.regions.dev_bytes);
	FUZZ_ASSERT(l.rec_off[1] + sb.geo.n_chunks * l.record_bytes <= sb.regions.dev_bytes);

	// What was read can be written back and reads the same.
	static uint8_t block[CKPT_BLOCK];
	static ckpt_sb again, next;
	FUZZ_ASSERT(ckpt_sb_encode(&sb, block) == 0);
	FUZZ_ASSERT(ckpt_sb_decode(block, dev_bytes, &again) == 0);
	FUZZ_ASSERT(std::memcmp(&again.regions, &sb.regions, sizeof(sb.regions)) == 0);
	FUZZ_ASSERT(again.sequence == sb.sequence && again.committed_step == sb.committed_step &&
		    again.blob_len == sb.blob_len &&
		    std::memcmp(again.blob, sb.blob, CKPT_BLOB_MAX) == 0);
	// and its next commit too
	FUZZ_ASSERT(ckpt_sb_next(&sb, sb.committed_step + 1, sb.committed_slot ^ 1, sb.blob,
				 sb.blob_len, &next) == 0);
	FUZZ_ASSERT(ckpt_sb_encode(&next, block) == 0);
}

} // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	size_t pos = 0;
	const std::vector<uint8_t> head = fuzz::take(data, size, pos, 9);
	uint64_t dev_bytes;
	std::memcpy(&dev_bytes, head.data() + 1, 8);
	if (!dev_bytes)
		dev_bytes = ~0ULL;
	std::vector<uint8_t> b0 = fuzz::take(data, size, pos, CKPT_BLOCK);
	std::vector<uint8_t> b1 = fuzz::take(data, size, pos, CKPT_BLOCK);
	std::vector<uint8_t> rec = fuzz::take(data, size, pos, CKPT_BLOCK);
	std::vector<uint8_t> stb = fuzz::take(data, size, pos, CKPT_BLOCK);
	const uint8_t *table_src = pos < size ? data + pos : nullptr;
	const size_t table_len = pos < size ? size - pos : 0;
	if (head[0] & 1) {
		seal(b0.data(), CKPT_BLOCK, sb_crc_off);
		seal(b1.data(), CKPT_BLOCK, sb_crc_off);
	}
	if (head[0] & 2)
		seal(rec.data(), sizeof(ckpt_rec_disk), rec_crc_off);
	if (head[0] & 4)
		seal(stb.data(), CKPT_BLOCK, st_crc_off);

	static ckpt_sb sb, scratch;
	for (const auto *b : {&b0, &b1})
		if (ckpt_sb_decode(b->data(), dev_bytes, &sb) == 0)
			check_sb(sb, dev_bytes);

	const int cur = ckpt_sb_pick(b0.data(), b1.data(), dev_bytes, &sb);
	FUZZ_ASSERT(cur <= 1);
	if (cur >= 0) {
		check_sb(sb, dev_bytes);
		FUZZ_ASSERT((sb.sequence & 1) == static_cast<uint64_t>(cur));
		const std::vector<uint8_t> &other = cur ? b0 : b1;
		const int r = ckpt_sb_check_other(other.data(), cur ^ 1, dev_bytes, &sb, &scratch);
		FUZZ_ASSERT(r <= 0);

		// The group table, n_chunks bytes (bounded: 2^24 chunks is 16 MiB).
		if (sb.geo.n_chunks <= (1u << 16)) {
			std::vector<uint8_t> table(sb.geo.n_chunks, 0);
			for (size_t i = 0; table_len && i < table.size(); i++)
				table[i] = table_src[i % table_len];
			const int g = ckpt_group_table_check(&sb, table.data());
			FUZZ_ASSERT(g == 0 || g == -CKPT_E_CRC || g == -CKPT_E_LAYOUT);
			if (g == 0)
				for (uint8_t v : table)
					FUZZ_ASSERT(v < sb.geo.n_groups);
		}

		// The record of chunk 0 this superblock commits.
		ckpt_rec want, got;
		ckpt_rec_committed(&sb, 0, &want);
		if (sb.geo.chunk_shift <= 14) {
			static std::vector<uint8_t> zeros(12u << 14, 0);
			const enum ckpt_rec_fault f = ckpt_rec_check(rec.data(), zeros.data(), zeros.data(),
								     &want, sb.feature_incompat, &got);
			FUZZ_ASSERT(f >= CKPT_REC_OK && f <= CKPT_REC_PLO);
			if (f == CKPT_REC_OK)
				FUZZ_ASSERT(got.chunk == 0 && got.slot == sb.committed_slot &&
					    got.step == sb.committed_step && got.sequence == sb.sequence);
		}
	}

	// The header on its own, and checked against the identity it carries.
	ckpt_rec r, got;
	if (ckpt_rec_decode(rec.data(), &r) == 0) {
		FUZZ_ASSERT(r.slot <= 1 && r.chunk < CKPT_MAX_CHUNKS);
		FUZZ_ASSERT(r.chunk_shift >= CKPT_MIN_CHUNK_SHIFT && r.chunk_shift <= CKPT_MAX_CHUNK_SHIFT);
		const enum ckpt_rec_fault f = ckpt_rec_check(rec.data(), nullptr, nullptr, &r, 0, &got);
		FUZZ_ASSERT(f == CKPT_REC_OK);
		static uint8_t block[CKPT_BLOCK];
		ckpt_rec_encode(&r, block);
		FUZZ_ASSERT(ckpt_rec_decode(block, &got) == 0);
		FUZZ_ASSERT(got.chunk == r.chunk && got.slot == r.slot && got.chunk_shift == r.chunk_shift &&
			    got.data_crc == r.data_crc && got.plo_crc == r.plo_crc && got.step == r.step &&
			    got.sequence == r.sequence);
	}

	static ckpt_status st;
	if (ckpt_status_decode(stb.data(), &st) == 0) {
		FUZZ_ASSERT(st.blob_len <= CKPT_BLOB_MAX && st.committed_slot <= 1);
		static uint8_t block[CKPT_BLOCK];
		static ckpt_status again;
		ckpt_status_encode(&st, block);
		FUZZ_ASSERT(ckpt_status_decode(block, &again) == 0);
		FUZZ_ASSERT(again.committed_step == st.committed_step && again.blob_len == st.blob_len);
	}
	return 0;
}
