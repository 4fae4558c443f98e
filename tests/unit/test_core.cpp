// SPDX-License-Identifier: MIT
// The protocol rules the core owns and both targets call: record identity
// and sealing, the next superblock, status counters and line, hyperparameter
// fields, the gradient-write plan and command execution.
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <vector>

#include "core_test_util.hpp"

extern "C" {
#include "ckpt_step.h"
}

namespace {

// A valid superblock of a small image (8 chunks of 2048 params, 2 groups).
ckpt_sb small_sb(uint32_t incompat = CKPT_FEATURE_INCOMPAT_DEFAULT)
{
	ckpt_geometry g{};
	g.n_chunks = 8;
	g.chunk_shift = CKPT_MIN_CHUNK_SHIFT;
	g.n_groups = 2;
	g.dtype = CKPT_DTYPE_BF16;
	g.optimizer = CKPT_OPT_ADAM;
	g.manifest_bytes = CKPT_BLOCK;
	ckpt_layout l{};
	EXPECT_EQ(ckpt_layout_compute_features(&g, incompat, &l), 0);
	const uint8_t uuid[16] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16};
	ckpt_sb sb;
	ckpt_sb_first(&sb, uuid, &g, &l, incompat, 10, 0x1234, 0x5678);
	return sb;
}

} // namespace

// ---------------------------------------------------------------- records

TEST(CoreRecord, IdentityOfCommittedAndNext)
{
	ckpt_sb sb = small_sb();
	sb.sequence = 41;
	sb.committed_step = 17;
	sb.committed_slot = 1;
	ckpt_rec id;
	std::memset(&id, 0xaa, sizeof(id));
	ckpt_rec_committed(&sb, 5, &id);
	EXPECT_EQ(id.chunk, 5u);
	EXPECT_EQ(id.slot, 1u);
	EXPECT_EQ(id.chunk_shift, CKPT_MIN_CHUNK_SHIFT);
	EXPECT_EQ(id.step, 17u);
	EXPECT_EQ(id.sequence, 41u);
	EXPECT_EQ(id.data_crc, 0u);
	EXPECT_EQ(id.plo_crc, 0u);
	ckpt_rec_next(&sb, 6, 18, &id);
	EXPECT_EQ(id.chunk, 6u);
	EXPECT_EQ(id.slot, 0u);
	EXPECT_EQ(id.step, 18u);
	EXPECT_EQ(id.sequence, 42u);
}

TEST(CoreRecord, SealThenCheckRoundTrip)
{
	for (uint32_t incompat : {0u, unsigned(CKPT_FEATURE_INCOMPAT_DEFAULT)}) {
		ckpt_sb sb = small_sb(incompat);
		const size_t cp = size_t(1) << sb.geo.chunk_shift;
		std::mt19937 rng(incompat + 1);
		std::vector<uint8_t> rec(CKPT_BLOCK + 12 * cp, 0xcc), plo(2 * cp);
		for (size_t i = CKPT_BLOCK; i < rec.size(); i++)
			rec[i] = uint8_t(rng());
		for (auto &x : plo)
			x = uint8_t(rng());
		ckpt_rec id, got;
		ckpt_rec_next(&sb, 3, 1, &id);
		ckpt_rec_seal(rec.data(), rec.data() + CKPT_BLOCK, plo.data(), &id, incompat);
		for (size_t i = sizeof(ckpt_rec_disk); i < CKPT_BLOCK; i++)
			ASSERT_EQ(rec[i], 0) << "header block not zeroed at " << i;
		EXPECT_EQ(ckpt_rec_check(rec.data(), rec.data() + CKPT_BLOCK, plo.data(), &id, incompat, &got),
			  CKPT_REC_OK);
		EXPECT_EQ(got.data_crc, ckpt_crc32c(rec.data() + CKPT_BLOCK, 12 * cp));
		EXPECT_EQ(got.plo_crc, incompat ? ckpt_plo_crc(plo.data(), sb.geo.chunk_shift) : 0u);
		// After the commit, the same record is the committed one.
		ckpt_sb next;
		ASSERT_EQ(ckpt_sb_next(&sb, 1, sb.committed_slot ^ 1, nullptr, 0, &next), 0);
		ckpt_rec want;
		ckpt_rec_committed(&next, 3, &want);
		EXPECT_EQ(ckpt_rec_check(rec.data(), rec.data() + CKPT_BLOCK, plo.data(), &want, incompat, &got),
			  CKPT_REC_OK);
		// ... but not the committed record of the superblock before it.
		ckpt_rec_committed(&sb, 3, &want);
		EXPECT_EQ(ckpt_rec_check(rec.data(), nullptr, nullptr, &want, incompat, &got), CKPT_REC_PLACE);
		// A flipped data bit is caught.
		rec[CKPT_BLOCK + 100] ^= 4;
		ckpt_rec_committed(&next, 3, &want);
		EXPECT_EQ(ckpt_rec_check(rec.data(), rec.data() + CKPT_BLOCK, plo.data(), &want, incompat, &got),
			  CKPT_REC_DATA);
	}
}

TEST(CoreRecord, ResealWithoutDataKeepsTheChecksums)
{
	ckpt_sb sb = small_sb();
	std::vector<uint8_t> a(CKPT_BLOCK), b(CKPT_BLOCK);
	ckpt_rec id;
	ckpt_rec_next(&sb, 2, 1, &id);
	id.data_crc = 0xdeadbeef;
	id.plo_crc = 0x01020304;
	ckpt_rec_seal(a.data(), nullptr, nullptr, &id, CKPT_FEATURE_INCOMPAT_PLO_CRC);
	ckpt_rec got;
	ASSERT_EQ(ckpt_rec_decode(a.data(), &got), 0);
	EXPECT_EQ(got.data_crc, 0xdeadbeefu);
	EXPECT_EQ(got.plo_crc, 0x01020304u);
	// Without PLO_CRC the field is zero whatever id says.
	ckpt_rec_seal(b.data(), nullptr, nullptr, &id, 0);
	ASSERT_EQ(ckpt_rec_decode(b.data(), &got), 0);
	EXPECT_EQ(got.plo_crc, 0u);
	// The same identity and checksums give the same bytes as the encoder.
	ckpt_rec r = id;
	std::vector<uint8_t> c(CKPT_BLOCK, 0x55);
	ckpt_rec_encode(&r, c.data());
	EXPECT_EQ(a, c);
}

// ---------------------------------------------------------------- superblock

TEST(CoreSuperblock, FirstIsCopyOneAtStepZero)
{
	ckpt_sb sb = small_sb();
	EXPECT_EQ(sb.sequence, 1u);
	EXPECT_EQ(ckpt_sb_offset(&sb), CKPT_BLOCK);
	EXPECT_EQ(sb.committed_step, 0u);
	EXPECT_EQ(sb.committed_slot, 0u);
	EXPECT_EQ(sb.blob_len, 0u);
	EXPECT_EQ(sb.feature_incompat, CKPT_FEATURE_INCOMPAT_DEFAULT);
	EXPECT_EQ(sb.manifest_len, 10u);
	EXPECT_EQ(sb.manifest_crc, 0x1234u);
	EXPECT_EQ(sb.group_crc, 0x5678u);
	// It encodes and decodes back.
	std::vector<uint8_t> block(CKPT_BLOCK);
	ASSERT_EQ(ckpt_sb_encode(&sb, block.data()), 0);
	ckpt_sb back;
	ASSERT_EQ(ckpt_sb_decode(block.data(), sb.layout.dev_bytes, &back), 0);
	EXPECT_EQ(back.sequence, 1u);
}

TEST(CoreSuperblock, NextOfAKnownSuperblock)
{
	ckpt_sb cur = small_sb();
	cur.sequence = 9;
	cur.committed_step = 4;
	cur.committed_slot = 1;
	cur.blob_len = 5;
	std::memcpy(cur.blob, "hello", 5);
	std::memset(cur.blob + 5, 0x77, 20);	// garbage past blob_len must not survive
	const uint8_t blob[3] = {'a', 'b', 'c'};
	ckpt_sb next;
	std::memset(&next, 0xee, sizeof(next));
	ASSERT_EQ(ckpt_sb_next(&cur, 5, 0, blob, 3, &next), 0);
	EXPECT_EQ(next.sequence, 10u);
	EXPECT_EQ(next.committed_step, 5u);
	EXPECT_EQ(next.committed_slot, 0u);
	EXPECT_EQ(next.blob_len, 3u);
	EXPECT_EQ(std::memcmp(next.blob, "abc", 3), 0);
	for (size_t i = 3; i < CKPT_BLOB_MAX; i++)
		ASSERT_EQ(next.blob[i], 0) << i;
	EXPECT_EQ(ckpt_sb_next_offset(&cur), ckpt_sb_offset(&next));
	// Everything else is cur's.
	ckpt_sb expect = cur;
	expect.sequence = 10;
	expect.committed_step = 5;
	expect.committed_slot = 0;
	expect.blob_len = 3;
	std::memset(expect.blob, 0, sizeof(expect.blob));
	std::memcpy(expect.blob, "abc", 3);
	EXPECT_EQ(std::memcmp(&expect, &next, sizeof(next)), 0);
	// In place, with the blob taken from cur itself.
	ckpt_sb same = cur;
	ASSERT_EQ(ckpt_sb_next(&same, 5, 0, same.blob, 5, &same), 0);
	EXPECT_EQ(same.sequence, 10u);
	EXPECT_EQ(std::memcmp(same.blob, "hello", 5), 0);
	EXPECT_EQ(same.blob[5], 0);
}

TEST(CoreSuperblock, NextRefusesBadInputUnchanged)
{
	ckpt_sb cur = small_sb(), next = small_sb();
	next.sequence = 1234;
	const ckpt_sb before = next;
	std::vector<uint8_t> big(CKPT_BLOB_MAX + 1);
	EXPECT_EQ(ckpt_sb_next(&cur, 1, 1, big.data(), CKPT_BLOB_MAX + 1, &next), -CKPT_E_BLOB);
	EXPECT_EQ(ckpt_sb_next(&cur, 1, 2, nullptr, 0, &next), -CKPT_E_INVAL);
	EXPECT_EQ(ckpt_sb_next(&cur, 1, 1, nullptr, 4, &next), -CKPT_E_INVAL);
	EXPECT_EQ(std::memcmp(&before, &next, sizeof(next)), 0);
}
