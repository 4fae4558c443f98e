// SPDX-License-Identifier: MIT
// The protocol rules the core owns and both targets call: record identity
// and sealing, the next superblock, status counters and line, hyperparameter
// fields, the gradient-write plan and command execution.
#include <gtest/gtest.h>

#include <cerrno>
#include <cstddef>
#include <cstdio>
#include <algorithm>
#include <cstring>
#include <functional>
#include <iterator>
#include <map>
#include <cstdlib>
#include <utility>
#include <memory>
#include <string>
#include <string_view>
#include <random>
#include <vector>

#include "core_test_util.hpp"
#include "status_test_util.hpp"

extern "C" {
#include "ckpt_step.h"
}

namespace {

// A valid superblock of a small image (8 chunks of 2048 params, 2 groups).
ckpt_sb small_sb(uint32_t incompat = CKPT_FEATURE_INCOMPAT_DEFAULT)
{
	ckpt_geometry g = test_geometry(8, CKPT_MIN_CHUNK_SHIFT, 2, CKPT_DTYPE_BF16, CKPT_BLOCK);
	ckpt_regions l{};
	EXPECT_EQ(ckpt_regions_compute_features(&g, incompat, &l), 0);
	const uint8_t uuid[16] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16};
	ckpt_sb sb;
	ckpt_sb_first(&sb, uuid, &g, &l, incompat, 10, 0x1234, 0x5678);
	return sb;
}

// small_sb() as the sequence-th superblock, after step t was committed into slot.
ckpt_sb committed_sb(uint64_t sequence, uint64_t t, uint32_t slot)
{
	ckpt_sb sb = small_sb();
	sb.sequence = sequence;
	sb.committed_step = t;
	sb.committed_slot = slot;
	return sb;
}

} // namespace

// ---------------------------------------------------------------- records

TEST(CoreRecord, IdentityOfCommittedAndNext)
{
	ckpt_sb sb = committed_sb(41, 17, 1);
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
		// With COUNTS the block counts follow the header and are kept; the
		// rest of the header block is zero.
		const size_t counts = (incompat & CKPT_FEATURE_INCOMPAT_COUNTS) ?
			8 << (sb.geo.chunk_shift - CKPT_BLOCK_SHIFT) : 0;
		if (counts)
			for (uint32_t b = 0; b < counts / 8; b++)
				ckpt_rec_set_count(rec.data(), b, 7 + b);
		ckpt_rec_seal(rec.data(), rec.data() + CKPT_BLOCK, plo.data(), &id, incompat);
		for (uint32_t b = 0; b < counts / 8; b++)
			ASSERT_EQ(ckpt_rec_count(rec.data(), b), 7u + b) << "block count " << b;
		for (size_t i = sizeof(ckpt_rec_disk) + counts; i < CKPT_BLOCK; i++)
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
	ASSERT_EQ(ckpt_sb_decode(block.data(), sb.regions.dev_bytes, &back), 0);
	EXPECT_EQ(back.sequence, 1u);
}

TEST(CoreSuperblock, NextOfAKnownSuperblock)
{
	ckpt_sb cur = committed_sb(9, 4, 1);
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

// ---------------------------------------------------------------- status

namespace {

// The dm INFO line as kmod/dm-ckpt-target.c printed it before the core did.
std::string kernel_line(const ckpt_counters &k, uint32_t n_chunks)
{
	char buf[CKPT_STATUS_LINE_MAX];
	snprintf(buf, sizeof(buf), "%s %llu %llu %llu/%u %u %s %u %u %llu %llu %llu %llu %llu %llu %llu",
		 ckpt_state_name(k.state), (unsigned long long)k.committed_step,
		 (unsigned long long)k.open_step, (unsigned long long)k.chunks_done, n_chunks, k.overflow,
		 ckpt_result_name(k.last_result), k.last_error, k.first_io_error,
		 (unsigned long long)k.steps_committed, (unsigned long long)k.steps_skipped,
		 (unsigned long long)k.steps_aborted, (unsigned long long)k.commands_rejected,
		 (unsigned long long)k.grad_bytes, (unsigned long long)k.param_bytes,
		 (unsigned long long)k.io_errors);
	return buf;
}

ckpt_counters random_counters(std::mt19937_64 &rng, uint32_t *n_chunks)
{
	auto pick = [&]() -> uint64_t {
		switch (rng() % 4) {
		case 0: return 0;
		case 1: return rng() % 10;
		case 2: return ~0ull - rng() % 3;
		default: return rng();
		}
	};
	// Each field by its kind: a valid name, a fraction of n_chunks, any number.
	*n_chunks = uint32_t(pick()) | 1;
	auto value = [&](std::string_view kind) -> uint64_t {
		if (kind == "STATE")
			return rng() % CKPT_STATE_MAX;
		if (kind == "RESULT")
			return rng() % CKPT_RESULT_MAX;
		if (kind == "FRACTION")
			return pick() % (uint64_t(*n_chunks) + 1);
		return pick();
	};
	ckpt_counters k{};
#define CKPT_TEST_RANDOM(f, kind) k.f = decltype(k.f)(value(#kind));
	CKPT_STATUS_FIELDS(CKPT_TEST_RANDOM)
#undef CKPT_TEST_RANDOM
	return k;
}

} // namespace

TEST(CoreStatus, CountersFromTheStepMachine)
{
	ckpt_sb sb = committed_sb(1, 6, 1);
	std::vector<uint64_t> claimed(1), applied(1);
	ckpt_step_sm sm;
	ckpt_sm_init(&sm, &sb, claimed.data(), applied.data());
	ASSERT_EQ(ckpt_sm_begin(&sm, test_cmd(CKPT_OP_BEGIN, 7, 2).get()), 0);
	ASSERT_EQ(ckpt_sm_claim(&sm, 2), 0);
	ckpt_sm_applied(&sm, 2, true, false);
	ckpt_sm_rejected(&sm, CKPT_E_TWICE);
	ckpt_counters k;
	ckpt_sm_counters(&sm, 111, 222, &k);
	const ckpt_counters want = {.state = CKPT_STATE_OPEN, .committed_step = 6, .open_step = 7,
		.chunks_done = 1, .overflow = 1, .last_result = CKPT_RESULT_REJECTED,
		.last_error = CKPT_E_TWICE, .first_io_error = 0, .steps_committed = 0,
		.steps_skipped = 0, .steps_aborted = 0, .commands_rejected = 1, .grad_bytes = 111,
		.param_bytes = 222, .io_errors = 0, .committed_slot = 1};
	expect_counters(k, want);
	EXPECT_EQ(k.committed_slot, 1u);
	char line[CKPT_STATUS_LINE_MAX];
	ASSERT_GT(ckpt_status_line(&k, 8, line, sizeof(line)), 0);
	EXPECT_STREQ(line, "open 6 7 1/8 1 rejected 16 0 0 0 0 1 111 222 0");
	// Outside an open step the step's counters read 0; the status page agrees.
	ckpt_cmd abort{};
	abort.opcode = CKPT_OP_ABORT;
	ASSERT_EQ(ckpt_sm_abort(&sm, &abort), 0);
	ckpt_sm_counters(&sm, 0, 0, &k);
	EXPECT_EQ(k.open_step, 0u);
	EXPECT_EQ(k.chunks_done, 0u);
	EXPECT_EQ(k.overflow, 0u);
	auto st = std::make_unique<ckpt_status>();
	ckpt_sm_status(&sm, &sb, st.get());
	EXPECT_EQ(st->steps_aborted, 1u);
	EXPECT_EQ(st->committed_slot, 1u);
	EXPECT_EQ(st->geo.n_chunks, 8u);
}

TEST(CoreStatus, LineIsTheKernelsAndParsesBack)
{
	std::mt19937_64 rng(11);
	for (int i = 0; i < 2000; i++) {
		uint32_t n;
		const ckpt_counters k = random_counters(rng, &n);
		char line[CKPT_STATUS_LINE_MAX];
		const int len = ckpt_status_line(&k, n, line, sizeof(line));
		ASSERT_GT(len, 0);
		ASSERT_EQ(std::string(line), kernel_line(k, n));
		ckpt_counters back;
		uint32_t n_back = 0;
		std::memset(&back, 0x5a, sizeof(back));
		ASSERT_EQ(ckpt_status_line_parse(line, uint32_t(len), &back, &n_back), 0) << line;
		EXPECT_EQ(n_back, n);
		ckpt_counters want = k;
		want.committed_slot = 0;
		ASSERT_EQ(std::memcmp(&back, &want, sizeof(want)), 0) << line;
		// One trailing newline is fine (dmsetup prints one).
		std::string nl = std::string(line) + "\n";
		ASSERT_EQ(ckpt_status_line_parse(nl.c_str(), uint32_t(nl.size()), &back, &n_back), 0);
	}
}

TEST(CoreStatus, LineDoesNotOverrun)
{
	std::mt19937_64 rng(12);
	uint32_t n;
	const ckpt_counters k = random_counters(rng, &n);
	char full[CKPT_STATUS_LINE_MAX];
	const int len = ckpt_status_line(&k, n, full, sizeof(full));
	ASSERT_GT(len, 0);
	for (uint32_t size = 0; size <= uint32_t(len) + 1; size++) {
		std::vector<char> buf(size + 8, '#');
		const int r = ckpt_status_line(&k, n, buf.data(), size);
		if (size > uint32_t(len)) {
			EXPECT_EQ(r, len);
			EXPECT_STREQ(buf.data(), full);
		} else {
			EXPECT_EQ(r, -CKPT_E_INVAL) << size;
			if (size) {
				EXPECT_EQ(buf[0], '\0');
			}
		}
		for (size_t i = size; i < buf.size(); i++)
			ASSERT_EQ(buf[i], '#') << "wrote past " << size;
	}
}

TEST(CoreStatus, HostileLinesAreRefusedUnchanged)
{
	const std::string good = "idle 3 0 0/8 0 committed 0 0 3 0 0 0 4096 8192 0";
	ckpt_counters k;
	uint32_t n = 77;
	ASSERT_EQ(ckpt_status_line_parse(good.c_str(), uint32_t(good.size()), &k, &n), 0);
	EXPECT_EQ(n, 8u);
	EXPECT_EQ(k.grad_bytes, 4096u);
	const char *bad[] = {
		"",
		"\n",
		" idle 3 0 0/8 0 committed 0 0 3 0 0 0 4096 8192 0",
		"idle 3 0 0/8 0 committed 0 0 3 0 0 0 4096 8192 0 ",
		"idle  3 0 0/8 0 committed 0 0 3 0 0 0 4096 8192 0",
		"idle 3 0 0/8 0 committed 0 0 3 0 0 0 4096 8192",
		"idle 3 0 0/8 0 committed 0 0 3 0 0 0 4096 8192 0 0",
		"idle 3 0 0/8 0 committed 0 0 3 0 0 0 4096 8192 0\n\n",
		"idle\t3 0 0/8 0 committed 0 0 3 0 0 0 4096 8192 0",
		"IDLE 3 0 0/8 0 committed 0 0 3 0 0 0 4096 8192 0",
		"idler 3 0 0/8 0 committed 0 0 3 0 0 0 4096 8192 0",
		"unknown 3 0 0/8 0 committed 0 0 3 0 0 0 4096 8192 0",
		"idle 3 0 0/8 0 commit 0 0 3 0 0 0 4096 8192 0",
		"idle 3 0 0/8 0 committedx 0 0 3 0 0 0 4096 8192 0",
		"idle -3 0 0/8 0 committed 0 0 3 0 0 0 4096 8192 0",
		"idle +3 0 0/8 0 committed 0 0 3 0 0 0 4096 8192 0",
		"idle 03 0 0/8 0 committed 0 0 3 0 0 0 4096 8192 0",
		"idle 3x 0 0/8 0 committed 0 0 3 0 0 0 4096 8192 0",
		"idle 0x3 0 0/8 0 committed 0 0 3 0 0 0 4096 8192 0",
		"idle 18446744073709551616 0 0/8 0 committed 0 0 3 0 0 0 4096 8192 0",
		"idle 3 0 0/8 4294967296 committed 0 0 3 0 0 0 4096 8192 0",
		"idle 3 0 0/4294967296 0 committed 0 0 3 0 0 0 4096 8192 0",
		"idle 3 0 9/8 0 committed 0 0 3 0 0 0 4096 8192 0",
		"idle 3 0 0 0 committed 0 0 3 0 0 0 4096 8192 0",
		"idle 3 0 0/ 0 committed 0 0 3 0 0 0 4096 8192 0",
		"idle 3 0 /8 0 committed 0 0 3 0 0 0 4096 8192 0",
		"idle 3 0 0//8 0 committed 0 0 3 0 0 0 4096 8192 0",
		"idle 3 0 0/8/8 0 committed 0 0 3 0 0 0 4096 8192 0",
		"idle 3 0 0/8 0 0 0 0 3 0 0 0 4096 8192 0",
		"idle 3 0 0/8 0 committed 0 0 3 0 0 0 4096 8192 0\r",
	};
	for (const char *s : bad) {
		ckpt_counters before;
		std::memset(&before, 0x33, sizeof(before));
		ckpt_counters got = before;
		uint32_t n_got = 99;
		EXPECT_EQ(ckpt_status_line_parse(s, uint32_t(std::strlen(s)), &got, &n_got), -CKPT_E_INVAL)
			<< "'" << s << "'";
		EXPECT_EQ(std::memcmp(&got, &before, sizeof(got)), 0) << s;
		EXPECT_EQ(n_got, 99u) << s;
	}
	// len bounds the read: a line cut short is refused, bytes past len never read.
	EXPECT_EQ(ckpt_status_line_parse(good.c_str(), uint32_t(good.size() - 2), &k, &n), -CKPT_E_INVAL);
	std::string more = good + " 5";
	EXPECT_EQ(ckpt_status_line_parse(more.c_str(), uint32_t(good.size()), &k, &n), 0);
	EXPECT_EQ(ckpt_status_line_parse(nullptr, 10, &k, &n), -CKPT_E_INVAL);
	// Random bytes never crash and are (nearly always) refused.
	std::mt19937_64 rng(13);
	for (int i = 0; i < 20000; i++) {
		std::string s = good;
		for (int j = 0, m = 1 + int(rng() % 4); j < m; j++)
			s[rng() % s.size()] = char(rng());
		ckpt_status_line_parse(s.data(), uint32_t(s.size()), &k, &n);
	}
}

// The parser says which field went wrong, so a caller's message can name it.
TEST(CoreStatus, LineParseNamesTheBadField)
{
	struct Case {
		const char *line;
		uint32_t field;
	} cases[] = {
		{"", 0},
		{"opened 3 4 2/8 1 overflow 16 5 3 1 2 7 4096 8192 9", 0},
		{"open", 1},
		{"open -3 4 2/8 1 overflow 16 5 3 1 2 7 4096 8192 9", 1},
		{"open 3 4 9/8 1 overflow 16 5 3 1 2 7 4096 8192 9", 3},
		{"open 3 4 2/8 4294967296 overflow 16 5 3 1 2 7 4096 8192 9", 4},
		{"open 3 4 2/8 1 committedx 16 5 3 1 2 7 4096 8192 9", 5},
		{"open 3 4 2/8 1 overflow 16 5 3 1 2 7 4096 x 9", 13},
		{"open 3 4 2/8 1 overflow 16 5 3 1 2 7 4096 8192", 14},
		{"open 3 4 2/8 1 overflow 16 5 3 1 2 7 4096 8192 9x", 14},
		{"open 3 4 2/8 1 overflow 16 5 3 1 2 7 4096 8192 9 10", CKPT_STATUS_N},
	};
	EXPECT_EQ(CKPT_STATUS_N, 15u);
	for (const auto &c : cases) {
		ckpt_counters k;
		uint32_t n = 0, field = 1000;
		EXPECT_EQ(ckpt_status_line_parse_at(c.line, uint32_t(std::strlen(c.line)), &k, &n, &field),
			  -CKPT_E_INVAL) << c.line;
		EXPECT_EQ(field, c.field) << c.line;
	}
	ckpt_counters k;
	uint32_t n = 0, field = 1000;
	const char *good = "open 3 4 2/8 1 overflow 16 5 3 1 2 7 4096 8192 9";
	EXPECT_EQ(ckpt_status_line_parse_at(good, uint32_t(std::strlen(good)), &k, &n, &field), 0);
	EXPECT_EQ(field, 1000u) << "untouched on success";
	EXPECT_EQ(ckpt_status_line_parse_at(good, uint32_t(std::strlen(good)), &k, &n, nullptr), 0);
}

// ---------------------------------------------------------------- hparams

TEST(CoreHparams, FieldOrderAndBytesAreTheList)
{
	// struct ckpt_hparams is the CKPT_HPARAMS list, 4 bytes apart.
	const char *names[] = {
#define NAME(f, range) #f,
		CKPT_HPARAMS(NAME)
#undef NAME
	};
	ASSERT_EQ(sizeof(names) / sizeof(names[0]), size_t(CKPT_HPARAMS_N));
	EXPECT_EQ(CKPT_HPARAMS_N, 11);
	EXPECT_EQ(offsetof(ckpt_hparams, lr), 0u);
	EXPECT_EQ(offsetof(ckpt_hparams, flags), 40u);
	EXPECT_EQ(offsetof(ckpt_hparams_disk, reserved), 44u);
	// Each field alone out of range is reported by its name, in list order.
	for (int i = 0; i < CKPT_HPARAMS_N; i++) {
		ckpt_hparams h = test_hparams(0);
		uint32_t *w = reinterpret_cast<uint32_t *>(&h);
		w[i] = 0x7fc00000u;	// NaN: bad for every float field
		if (i == CKPT_HPARAMS_N - 1)
			w[i] = 0x80;	// unknown flag
		const char *field = nullptr;
		EXPECT_EQ(ckpt_hparams_check(&h, &field), -CKPT_E_HPARAM) << names[i];
		EXPECT_STREQ(field, names[i]);
		// With every later field bad too, the first one is named.
		for (int j = i + 1; j < CKPT_HPARAMS_N; j++)
			w[j] = 0xff800000u;
		field = nullptr;
		EXPECT_EQ(ckpt_hparams_check(&h, &field), -CKPT_E_HPARAM);
		EXPECT_STREQ(field, names[i]);
	}
	ckpt_hparams ok = test_hparams(1);
	const char *field = "untouched";
	EXPECT_EQ(ckpt_hparams_check(&ok, &field), 0);
	EXPECT_STREQ(field, "untouched");
}

TEST(CoreHparams, CommandCarriesFieldsInListOrder)
{
	ckpt_cmd cmd{};
	cmd.opcode = CKPT_OP_BEGIN;
	cmd.step = 1;
	cmd.n_groups = 1;
	cmd.grad_scale = f32(1.0f);
	uint32_t *w = reinterpret_cast<uint32_t *>(&cmd.groups[0]);
	for (int i = 0; i < CKPT_HPARAMS_N; i++)
		w[i] = 0x01010101u * uint32_t(i + 1);
	std::vector<uint8_t> buf(CKPT_BLOCK);
	const int len = ckpt_cmd_encode(&cmd, buf.data());
	ASSERT_EQ(len, int(sizeof(ckpt_cmd_disk) + sizeof(ckpt_hparams_disk)));
	const uint8_t *hp = buf.data() + sizeof(ckpt_cmd_disk);
	for (int i = 0; i < CKPT_HPARAMS_N; i++) {
		uint32_t le = uint32_t(hp[4 * i]) | uint32_t(hp[4 * i + 1]) << 8 |
			      uint32_t(hp[4 * i + 2]) << 16 | uint32_t(hp[4 * i + 3]) << 24;
		EXPECT_EQ(le, w[i]) << i;
	}
	for (int i = 4 * CKPT_HPARAMS_N; i < int(sizeof(ckpt_hparams_disk)); i++)
		EXPECT_EQ(hp[i], 0) << "reserved byte " << i;
	auto back = std::make_unique<ckpt_cmd>();
	ASSERT_EQ(ckpt_cmd_decode(buf.data(), uint32_t(len), back.get()), 0);
	EXPECT_EQ(std::memcmp(&back->groups[0], &cmd.groups[0], sizeof(ckpt_hparams)), 0);
}

TEST(CoreHparams, FromWords)
{
	uint32_t words[CKPT_HPARAMS_N + 1];
	for (int i = 0; i <= CKPT_HPARAMS_N; i++)
		words[i] = uint32_t(100 + i);
	ckpt_hparams h;
	ASSERT_EQ(ckpt_hparams_from_words(&h, words, CKPT_HPARAMS_N), 0);
	EXPECT_EQ(h.lr, 100u);
	EXPECT_EQ(h.bc2_sqrt, 108u);
	EXPECT_EQ(h.flags, 110u);
	ASSERT_EQ(ckpt_hparams_from_words(&h, words, CKPT_HPARAMS_N - 1), 0);
	EXPECT_EQ(h.decay, 109u);
	EXPECT_EQ(h.flags, 0u);
	const ckpt_hparams before = h;
	EXPECT_EQ(ckpt_hparams_from_words(&h, words, CKPT_HPARAMS_N + 1), -CKPT_E_INVAL);
	EXPECT_EQ(ckpt_hparams_from_words(&h, words, CKPT_HPARAMS_N - 2), -CKPT_E_INVAL);
	EXPECT_EQ(ckpt_hparams_from_words(&h, words, 0), -CKPT_E_INVAL);
	EXPECT_EQ(ckpt_hparams_from_words(&h, nullptr, CKPT_HPARAMS_N), -CKPT_E_INVAL);
	EXPECT_EQ(std::memcmp(&h, &before, sizeof(h)), 0);
}

// ---------------------------------------------------------------- step protocol

namespace {

// A host that records what the core asks of it.
struct FakeHost {
	int locked = 0, max_locked = 0;
	int drains = 0, flushes = 0;
	int flush_ret = 0, write_ret = 0;
	bool lose_sb = false;	// superblock writes succeed but do not read back
	std::vector<std::pair<uint64_t, std::vector<uint8_t>>> sb_writes;
	std::vector<std::pair<uint32_t, std::vector<uint8_t>>> dispatched;	// chunk, grads
	int batches = 0;
	bool op_under_lock = false;
	// quiesce(slot) and failed(errno) calls, in order
	std::vector<uint32_t> quiesced;
	std::vector<int> failed;
	// A bitmap the lock ops watch: was any set bit cleared while locked?
	const uint64_t *watch = nullptr;
	size_t watch_words = 0;
	uint64_t watch_bits = 0;
	bool cleared_under_lock = false;
	// rollback_ops: the disk's records (offset -> bytes, zeros elsewhere),
	// the older superblock copy blank, reads failing, no memory; memory
	// still out
	std::map<uint64_t, std::vector<uint8_t>> disk;
	size_t record_writes = 0;
	bool blank_older = false;
	int rollback_io = 0;
	bool no_memory = false;
	int allocated = 0;
	int fpu = 0, fpu_calls = 0;		// fpu_begin nesting, and how many
	bool fpu_under_lock = false;

	uint64_t watched() const
	{
		uint64_t n = 0;
		for (size_t i = 0; i < watch_words; i++)
			n += uint64_t(__builtin_popcountll(watch[i]));
		return n;
	}
	void check_unlocked()
	{
		if (locked)
			op_under_lock = true;
	}
};

struct Src {
	const uint8_t *p;
};

FakeHost &host_of(void *h) { return *static_cast<FakeHost *>(h); }

const ckpt_step_ops fake_ops = {
	.lock =
		[](void *h) {
			FakeHost &f = host_of(h);
			f.locked++;
			f.max_locked = std::max(f.max_locked, f.locked);
			f.watch_bits = f.watched();
		},
	.unlock =
		[](void *h) {
			FakeHost &f = host_of(h);
			if (f.watch_bits && !f.watched())
				f.cleared_under_lock = true;
			f.locked--;
		},
	.drain = [](void *h) { host_of(h).check_unlocked(); host_of(h).drains++; },
	.flush = [](void *h) { host_of(h).check_unlocked(); host_of(h).flushes++; return host_of(h).flush_ret; },
	.write_sb =
		[](void *h, const void *block, uint64_t off) {
			FakeHost &f = host_of(h);
			f.check_unlocked();
			if (f.write_ret)
				return f.write_ret;
			auto *b = static_cast<const uint8_t *>(block);
			f.sb_writes.push_back({off, std::vector<uint8_t>(b, b + CKPT_BLOCK)});
			return 0;
		},
	.copy =
		[](void *h, void *src, void *dst, uint64_t n) {
			host_of(h).check_unlocked();
			auto *s = static_cast<Src *>(src);
			std::memcpy(dst, s->p, n);
			s->p += n;
		},
	.dispatch =
		[](void *h, void *src, uint32_t chunk, const void *grad) {
			FakeHost &f = host_of(h);
			f.check_unlocked();
			const uint64_t cb = 2u << CKPT_MIN_CHUNK_SHIFT;
			auto *s = static_cast<Src *>(src);
			const uint8_t *g = static_cast<const uint8_t *>(grad);
			if (!g) {
				g = s->p;
				s->p += cb;
			}
			f.dispatched.push_back({chunk, std::vector<uint8_t>(g, g + cb)});
			return 0;
		},
	.dispatched = [](void *h, void *) { host_of(h).check_unlocked(); host_of(h).batches++; return 0; },
	.quiesce = [](void *h, uint32_t slot) { host_of(h).check_unlocked(); host_of(h).quiesced.push_back(slot); },
	.failed = [](void *h, int err) { host_of(h).check_unlocked(); host_of(h).failed.push_back(err); },
	.read =
		[](void *h, void *block, uint64_t off, uint64_t len) {
			FakeHost &f = host_of(h);
			f.check_unlocked();
			std::memset(block, 0, len);
			if (!f.lose_sb && !f.sb_writes.empty() && f.sb_writes.back().first == off)
				std::memcpy(block, f.sb_writes.back().second.data(), CKPT_BLOCK);
			return 0;
		},
	.write = nullptr,	// rollback_ops() has write, alloc and free
	.alloc = nullptr,
	.free = nullptr,
	.fpu_begin =
		[](void *h) {
			FakeHost &f = host_of(h);
			f.fpu_under_lock |= f.locked != 0;
			f.fpu++;
			f.fpu_calls++;
		},
	.fpu_end = [](void *h) { host_of(h).fpu--; },
};

// fake_ops with what a rollback needs: a disk whose superblock copies are
// the last ones written there, and whose other blocks are host.disk's.
ckpt_step_ops rollback_ops()
{
	ckpt_step_ops ops = fake_ops;
	ops.read = [](void *h, void *buf, uint64_t off, uint64_t len) {
		FakeHost &f = host_of(h);
		f.check_unlocked();
		if (f.rollback_io)
			return f.rollback_io;
		auto *b = static_cast<uint8_t *>(buf);
		std::memset(b, 0, len);
		if (off < 2 * CKPT_BLOCK) {
			const bool older = f.sb_writes.empty() || f.sb_writes.back().first != off;
			for (auto w = f.sb_writes.rbegin(); w != f.sb_writes.rend(); ++w)
				if (w->first == off && !(older && f.blank_older)) {
					std::memcpy(b, w->second.data(), CKPT_BLOCK);
					break;
				}
		} else if (auto d = f.disk.find(off); d != f.disk.end()) {
			std::memcpy(b, d->second.data(), std::min<uint64_t>(len, d->second.size()));
		}
		return 0;
	};
	ops.write = [](void *h, const void *buf, uint64_t off, uint64_t len) {
		FakeHost &f = host_of(h);
		f.check_unlocked();
		auto &d = f.disk[off];
		d.resize(std::max<uint64_t>(d.size(), len));
		std::memcpy(d.data(), buf, len);
		f.record_writes++;
		return 0;
	};
	ops.alloc = [](void *h, uint64_t bytes) -> void * {
		FakeHost &f = host_of(h);
		if (f.no_memory)
			return nullptr;
		f.allocated++;
		return std::malloc(bytes);
	};
	ops.free = [](void *h, void *p) {
		host_of(h).allocated--;
		std::free(p);
	};
	return ops;
}

// A step protocol over small_sb() with its memory, as a host would allocate it.
struct Proto {
	FakeHost host;
	ckpt_sb sb = small_sb();
	std::unique_ptr<ckpt_sb> spare = std::make_unique<ckpt_sb>();
	std::unique_ptr<ckpt_cmd> cmd = std::make_unique<ckpt_cmd>();
	std::vector<uint64_t> claimed, applied, cover;
	std::vector<ckpt_stage_buf> stages;
	std::vector<std::vector<uint8_t>> grads;
	std::vector<uint32_t> stage_of;
	std::vector<uint8_t> block = std::vector<uint8_t>(CKPT_BLOCK);
	std::vector<uint8_t> modes;
	std::vector<uint64_t> sumsq;
	ckpt_step cs{};
	uint64_t cb;

	explicit Proto(uint64_t staging)
	{
		cb = sb.regions.plo_chunk_bytes;
		const uint32_t n = sb.geo.n_chunks;
		const uint32_t n_stages = ckpt_stage_count(staging, cb, n);
		const uint64_t words = ckpt_bitmap_words(cb / CKPT_SECTOR);
		claimed.assign(ckpt_bitmap_words(n), 0);
		applied.assign(ckpt_bitmap_words(n), 0);
		cover.assign(n_stages * words, 0);
		stages.resize(n_stages);
		grads.assign(n_stages, std::vector<uint8_t>(cb));
		for (uint32_t i = 0; i < n_stages; i++) {
			stages[i].cover = cover.data() + i * words;
			stages[i].grad = grads[i].data();
		}
		stage_of.resize(n);
		sumsq.assign(n, 0);
		modes.assign(ckpt_step_blocks(&sb.regions), 0);
		const ckpt_step_mem mem = {
			.claimed = claimed.data(), .applied = applied.data(), .modes = modes.data(),
			.stages = stages.data(),
			.n_stages = n_stages, .stage_of = stage_of.data(), .spare = spare.get(),
			.block = block.data(), .cmd = cmd.get(), .sumsq = sumsq.data(),
		};
		ckpt_step_init(&cs, &fake_ops, &host, &sb, &mem);
	}

	int command(uint32_t op, uint64_t step, const char *blob = "")
	{
		const auto c = test_cmd(op, step, 2);
		if (op == CKPT_OP_COMMIT) {
			c->blob_len = uint32_t(std::strlen(blob));
			std::memcpy(c->blob, blob, c->blob_len);
		}
		std::vector<uint8_t> buf(CKPT_BLOCK);
		const int len = ckpt_cmd_encode(c.get(), buf.data());
		EXPECT_GT(len, 0);
		return ckpt_step_command(&cs, buf.data(), uint32_t(len));
	}

	int grad(uint64_t off, const std::vector<uint8_t> &g)
	{
		Src src{g.data()};
		return ckpt_step_grad_write(&cs, off, g.size(), &src);
	}

	// Everything a refused call must leave as it was.
	std::vector<uint8_t> snapshot() const
	{
		std::vector<uint8_t> s;
		auto add = [&](const void *p, size_t n) {
			auto *b = static_cast<const uint8_t *>(p);
			s.insert(s.end(), b, b + n);
		};
		ckpt_step_sm sm = cs.sm;
		sm.last_error = 0;	// the refusal is recorded, nothing else
		sm.last_result = 0;
		sm.commands_rejected = 0;
		add(&sm, sizeof(sm));
		add(&cs.grad_bytes, sizeof(cs.grad_bytes));
		add(&cs.free_stages, sizeof(cs.free_stages));
		add(claimed.data(), claimed.size() * 8);
		add(applied.data(), applied.size() * 8);
		add(cover.data(), cover.size() * 8);
		for (const auto &g : grads)
			add(g.data(), g.size());
		for (const auto &st : stages)
			add(&st.chunk, sizeof(st.chunk));
		add(stage_of.data(), stage_of.size() * 4);
		add(&sb, sizeof(sb));
		return s;
	}

	// Complete every dispatched chunk, as the host's updates would.
	void apply_all()
	{
		for (auto &d : host.dispatched)
			ckpt_sm_applied(&cs.sm, d.first, false, true);
	}
};

std::vector<uint8_t> pattern(size_t n, uint8_t seed)
{
	std::vector<uint8_t> v(n);
	for (size_t i = 0; i < n; i++)
		v[i] = uint8_t(seed + i * 7);
	return v;
}

} // namespace

uint64_t f64_bits(double d)
{
	uint64_t u;
	std::memcpy(&u, &d, 8);
	return u;
}

// COMMIT adds the chunks' gradient sums in chunk order, outside the sm lock
// and between the host's fpu ops, and reports them with the step it ended
// (committed or skipped); a refused COMMIT reports nothing.
TEST(CoreProtocol, CommitReportsTheGradientSumInChunkOrder)
{
	Proto p(CKPT_STAGING_DEFAULT);
	const uint32_t n = p.sb.geo.n_chunks;
	ASSERT_GE(n, 3u);
	for (uint64_t step = 1; step <= 2; step++) {
		ASSERT_EQ(p.command(CKPT_OP_BEGIN, step), 0);
		p.host.dispatched.clear();
		ASSERT_EQ(p.grad(0, pattern(n * p.cb, uint8_t(step))), 0);
		// 2^53 first, then ones: in chunk order each 1 rounds away
		// (2^53 + 1 is a tie to even); any other order keeps them.
		for (uint32_t c = 0; c < n; c++)
			ckpt_step_sumsq(&p.cs, c, f64_bits(c ? 1.0 : 0x1p53));
		p.apply_all();
		const int fpu_calls = p.host.fpu_calls;
		EXPECT_EQ(p.command(CKPT_OP_COMMIT, step + 1), -CKPT_E_STEP);
		EXPECT_EQ(p.cs.sm.grad_sumsq_step, step - 1) << "a refused COMMIT reports nothing";
		ASSERT_EQ(p.command(CKPT_OP_COMMIT, step), CKPT_RESULT_COMMITTED);
		EXPECT_EQ(p.host.fpu_calls, fpu_calls + 2) << "one sum per COMMIT";
		EXPECT_EQ(p.host.fpu, 0);
		EXPECT_FALSE(p.host.fpu_under_lock);
		EXPECT_EQ(p.cs.sm.grad_sumsq, f64_bits(0x1p53));
		EXPECT_EQ(p.cs.sm.grad_sumsq_step, step);
		ckpt_status st;
		ckpt_sm_status(&p.cs.sm, &p.sb, &st);
		std::vector<uint8_t> page(CKPT_BLOCK);
		ckpt_status_encode(&st, page.data());
		ckpt_status got;
		ASSERT_EQ(ckpt_status_decode(page.data(), &got), 0);
		EXPECT_EQ(got.grad_sumsq, f64_bits(0x1p53));
		EXPECT_EQ(got.grad_sumsq_step, step);
	}
}

TEST(CoreProtocol, StageCountRule)
{
	EXPECT_EQ(ckpt_stage_count(CKPT_STAGING_DEFAULT, 4096, 100000), 16384u);
	EXPECT_EQ(ckpt_stage_count(CKPT_STAGING_DEFAULT, 4096, 100), 100u);
	EXPECT_EQ(ckpt_stage_count(0, 4096, 100), 2u);
	EXPECT_EQ(ckpt_stage_count(1 << 20, 8 << 20, 100), 2u);
	EXPECT_EQ(ckpt_stage_count(CKPT_STAGING_DEFAULT, 4096, 1), 2u);
	EXPECT_EQ(ckpt_stage_count(~0ull, 4096, 1u << 24), 1u << 24);
	EXPECT_EQ(CKPT_STAGING_DEFAULT, 64ull << 20);
}

TEST(CoreProtocol, WholeAndStagedChunksThenCommit)
{
	Proto p(CKPT_STAGING_DEFAULT);
	const uint64_t cb = p.cb;
	ASSERT_EQ(p.command(CKPT_OP_BEGIN, 1), 0);
	EXPECT_EQ(p.host.drains, 1);
	// Chunk 0 whole plus the first half of chunk 1: one dispatch, one stage.
	auto g1 = pattern(cb + cb / 2, 1);
	ASSERT_EQ(p.grad(0, g1), 0);
	ASSERT_EQ(p.host.dispatched.size(), 1u);
	EXPECT_EQ(p.host.dispatched[0].first, 0u);
	EXPECT_EQ(std::vector<uint8_t>(g1.begin(), g1.begin() + cb), p.host.dispatched[0].second);
	EXPECT_EQ(ckpt_step_stages_used(&p.cs), 1u);
	// The rest of chunk 1 and all of chunks 2..7.
	auto g2 = pattern(cb / 2 + 6 * cb, 2);
	ASSERT_EQ(p.grad(cb + cb / 2, g2), 0);
	ASSERT_EQ(p.host.dispatched.size(), 8u);
	EXPECT_EQ(p.host.dispatched[1].first, 1u);
	std::vector<uint8_t> chunk1(g1.begin() + cb, g1.end());
	chunk1.insert(chunk1.end(), g2.begin(), g2.begin() + cb / 2);
	EXPECT_EQ(p.host.dispatched[1].second, chunk1);
	EXPECT_EQ(ckpt_step_stages_used(&p.cs), 0u) << "a complete stage is released";
	EXPECT_EQ(p.host.batches, 2);
	EXPECT_FALSE(p.host.op_under_lock);
	EXPECT_EQ(p.host.locked, 0);
	EXPECT_EQ(p.cs.grad_bytes, g1.size() + g2.size());
	// COMMIT before the updates completed: refused, the step stays open.
	EXPECT_EQ(p.command(CKPT_OP_COMMIT, 1), -CKPT_E_INCOMPLETE);
	p.apply_all();
	const ckpt_sb before = p.sb;
	ASSERT_EQ(p.command(CKPT_OP_COMMIT, 1, "blob"), CKPT_RESULT_COMMITTED);
	EXPECT_EQ(p.host.flushes, 1);
	ASSERT_EQ(p.host.sb_writes.size(), 1u);
	EXPECT_EQ(p.host.sb_writes[0].first, ckpt_sb_next_offset(&before));
	ckpt_sb want;
	ASSERT_EQ(ckpt_sb_next(&before, 1, 1, "blob", 4, &want), 0);
	std::vector<uint8_t> enc(CKPT_BLOCK);
	ASSERT_EQ(ckpt_sb_encode(&want, enc.data()), 0);
	EXPECT_EQ(p.host.sb_writes[0].second, enc);
	EXPECT_EQ(std::memcmp(&p.sb, &want, sizeof(want)), 0) << "the host's superblock is the new one";
	EXPECT_EQ(p.cs.sm.committed_step, 1u);
	EXPECT_EQ(p.cs.sm.committed_slot, 1u);
	EXPECT_EQ(p.cs.sm.state, uint32_t(CKPT_STATE_IDLE));
	EXPECT_EQ(p.cs.sm.last_result, uint32_t(CKPT_RESULT_COMMITTED));
	EXPECT_FALSE(p.host.op_under_lock);
}

// BEGIN clears the per-chunk bitmaps (2 MiB each with 2^24 chunks) with the
// sm lock released, then waits for the PARAM reads of the slot it rewrites.
TEST(CoreProtocol, BeginClearsBitmapsUnlockedThenQuiesces)
{
	Proto p(CKPT_STAGING_DEFAULT);
	ASSERT_EQ(p.command(CKPT_OP_BEGIN, 1), 0);
	ASSERT_EQ(p.host.quiesced, std::vector<uint32_t>{1u}) << "the slot step 1 writes";
	ASSERT_EQ(p.grad(0, pattern(3 * p.cb, 5)), 0);
	p.apply_all();
	ASSERT_EQ(p.command(CKPT_OP_ABORT, 1), 0);
	p.host.watch = p.claimed.data();
	p.host.watch_words = p.claimed.size();
	ASSERT_EQ(p.host.watched(), 3u);
	ASSERT_EQ(p.command(CKPT_OP_BEGIN, 1), 0);
	EXPECT_EQ(p.host.watched(), 0u) << "a new step starts with no chunk claimed";
	EXPECT_FALSE(p.host.cleared_under_lock) << "the bitmaps are cleared outside the sm lock";
	EXPECT_EQ(p.host.locked, 0);
	EXPECT_FALSE(p.host.op_under_lock);
	EXPECT_EQ(p.host.quiesced, (std::vector<uint32_t>{1u, 1u}));
	// A refused BEGIN neither clears nor quiesces.
	ASSERT_EQ(p.grad(0, pattern(p.cb, 6)), 0);
	const auto before = p.snapshot();
	EXPECT_EQ(p.command(CKPT_OP_BEGIN, 2), -CKPT_E_STATE);
	EXPECT_EQ(p.snapshot(), before);
	EXPECT_EQ(p.host.quiesced.size(), 2u);
}

// A failed superblock write: the host's failed hook gets the errno, unlocked.
TEST(CoreProtocol, CommitWriteFailureCallsFailedHook)
{
	Proto p(CKPT_STAGING_DEFAULT);
	ASSERT_EQ(p.command(CKPT_OP_BEGIN, 1), 0);
	ASSERT_EQ(p.grad(0, pattern(p.sb.geo.n_chunks * p.cb, 7)), 0);
	p.apply_all();
	p.host.write_ret = -EROFS;
	ckpt_cmd c{};
	c.opcode = CKPT_OP_COMMIT;
	c.step = 1;
	int io = 0;
	EXPECT_EQ(ckpt_step_exec(&p.cs, &c, &io), -CKPT_E_IO);
	EXPECT_EQ(io, -EROFS);
	EXPECT_EQ(p.host.failed, std::vector<int>{-EROFS});
	EXPECT_FALSE(p.host.op_under_lock);
	EXPECT_EQ(p.cs.sm.state, uint32_t(CKPT_STATE_FAILED));
	EXPECT_EQ(p.cs.sm.first_io_error, uint32_t(EROFS));
}

// A superblock write the device acknowledged but lost (it reads back as
// something else): the commit fails as if the write had, nothing commits.
TEST(CoreProtocol, CommitFailsWhenTheSuperblockDoesNotReadBack)
{
	Proto p(CKPT_STAGING_DEFAULT);
	ASSERT_EQ(p.command(CKPT_OP_BEGIN, 1), 0);
	ASSERT_EQ(p.grad(0, pattern(p.sb.geo.n_chunks * p.cb, 7)), 0);
	p.apply_all();
	p.host.lose_sb = true;
	const ckpt_sb before = p.sb;
	ckpt_cmd c{};
	c.opcode = CKPT_OP_COMMIT;
	c.step = 1;
	int io = 0;
	EXPECT_EQ(ckpt_step_exec(&p.cs, &c, &io), -CKPT_E_IO);
	EXPECT_EQ(io, -EIO);
	EXPECT_EQ(p.host.failed, std::vector<int>{-EIO});
	EXPECT_EQ(p.host.sb_writes.size(), 1u);
	EXPECT_EQ(p.sb.sequence, before.sequence);
	EXPECT_EQ(p.sb.committed_step, before.committed_step);
	EXPECT_EQ(p.cs.sm.state, uint32_t(CKPT_STATE_FAILED));
	EXPECT_EQ(p.cs.sm.committed_step, before.committed_step);
	EXPECT_EQ(p.command(CKPT_OP_BEGIN, 1), -CKPT_E_FAILED);
}

// The errno a host returns for each core error: one column of CKPT_ERRORS.
TEST(CoreErrors, Errno)
{
	EXPECT_EQ(ckpt_err_errno(-CKPT_E_IO), EIO);
	EXPECT_EQ(ckpt_err_errno(CKPT_E_FAILED), EIO);
	EXPECT_EQ(ckpt_err_errno(-CKPT_E_NOMEM), ENOMEM);
	EXPECT_EQ(ckpt_err_errno(-CKPT_E_NOSPC), ENOSPC);
	EXPECT_EQ(ckpt_err_errno(-CKPT_E_READONLY), EROFS);
	EXPECT_EQ(ckpt_err_errno(-CKPT_E_STEP), EINVAL);
	EXPECT_EQ(ckpt_err_errno(-CKPT_E_TWICE), EINVAL);
	EXPECT_EQ(ckpt_err_errno(CKPT_OK), 0);
	EXPECT_EQ(ckpt_err_errno(-1000), EINVAL) << "unknown codes are EINVAL";
	EXPECT_EQ(ckpt_err_errno(CKPT_E_MAX), EINVAL);
}

TEST(CoreProtocol, RefusedWritesChangeNothing)
{
	Proto p(0);	// 2 stages
	const uint64_t cb = p.cb;
	auto half = pattern(cb / 2, 3);
	// No open step.
	auto before = p.snapshot();
	EXPECT_EQ(p.grad(0, half), -CKPT_E_STATE);
	EXPECT_EQ(p.snapshot(), before);
	EXPECT_EQ(p.cs.sm.last_error, uint32_t(CKPT_E_STATE));
	EXPECT_EQ(p.cs.sm.last_result, uint32_t(CKPT_RESULT_REJECTED));
	ASSERT_EQ(p.command(CKPT_OP_BEGIN, 1), 0);
	ASSERT_EQ(p.grad(0, pattern(cb, 4)), 0);		// chunk 0 whole
	ASSERT_EQ(p.grad(cb, half), 0);			// chunk 1 staged
	ASSERT_EQ(p.grad(2 * cb + cb / 2, half), 0);	// chunk 2 staged: both stages used
	const uint64_t rejected = p.cs.sm.commands_rejected;
	struct Case {
		uint64_t off, len;
		int err;
	} cases[] = {
		{0, cb, -CKPT_E_TWICE},				// claimed chunk
		{cb / 2 + cb / 2 + 0, cb, -CKPT_E_TWICE},	// whole chunk 1 over its stage
		{cb, CKPT_SECTOR, -CKPT_E_TWICE},		// a staged sector again
		{cb + cb / 2 - CKPT_SECTOR, 2 * CKPT_SECTOR, -CKPT_E_TWICE},	// overlaps by one sector
		{3 * cb, cb / 2, -CKPT_E_NOSPC},		// no free stage
		// valid pieces first, the bad one last: still nothing changes
		{cb + cb / 2, cb / 2 + cb + cb / 2 + CKPT_SECTOR, -CKPT_E_TWICE},
		{4 * cb, 2 * cb + cb / 2, -CKPT_E_NOSPC},
		{7 * cb, 2 * cb, -CKPT_E_RANGE},
		{CKPT_SECTOR / 2, CKPT_SECTOR, -CKPT_E_RANGE},
	};
	for (const Case &c : cases) {
		before = p.snapshot();
		const size_t dispatched = p.host.dispatched.size();
		auto g = pattern(c.len, 9);
		EXPECT_EQ(p.grad(c.off, g), c.err) << c.off << "+" << c.len;
		EXPECT_EQ(p.snapshot(), before) << c.off << "+" << c.len;
		EXPECT_EQ(p.host.dispatched.size(), dispatched);
		EXPECT_EQ(p.cs.sm.last_error, uint32_t(-c.err));
	}
	EXPECT_EQ(p.cs.sm.commands_rejected, rejected + std::size(cases));
	// The device failed: E_FAILED, unchanged.
	ckpt_sm_fail(&p.cs.sm, -28);
	before = p.snapshot();
	EXPECT_EQ(p.grad(5 * cb, pattern(cb, 5)), -CKPT_E_FAILED);
	EXPECT_EQ(p.snapshot(), before);
	EXPECT_EQ(p.host.locked, 0);
}

TEST(CoreProtocol, AbortAndOverflowReleaseStages)
{
	Proto p(CKPT_STAGING_DEFAULT);
	const uint64_t cb = p.cb;
	ASSERT_EQ(p.command(CKPT_OP_BEGIN, 1), 0);
	ASSERT_EQ(p.grad(cb, pattern(cb / 2, 1)), 0);
	EXPECT_EQ(ckpt_step_stages_used(&p.cs), 1u);
	ASSERT_EQ(p.command(CKPT_OP_ABORT, 0), 0);
	EXPECT_EQ(ckpt_step_stages_used(&p.cs), 0u);
	EXPECT_EQ(p.stage_of[1], CKPT_STAGE_FREE);
	// The same sectors can be written in the next step.
	ASSERT_EQ(p.command(CKPT_OP_BEGIN, 1), 0);
	ASSERT_EQ(p.grad(cb, pattern(cb / 2, 1)), 0);
	ASSERT_EQ(p.grad(0, pattern(cb, 1)), 0);
	for (auto &d : p.host.dispatched)
		ckpt_sm_applied(&p.cs.sm, d.first, d.first == 0, false);
	p.host.dispatched.clear();
	ASSERT_EQ(p.grad(2 * cb, pattern(6 * cb, 1)), 0);
	ASSERT_EQ(p.grad(cb + cb / 2, pattern(cb / 2, 1)), 0);
	p.apply_all();
	EXPECT_EQ(p.command(CKPT_OP_COMMIT, 1), CKPT_RESULT_OVERFLOW);
	EXPECT_EQ(p.host.sb_writes.size(), 0u);
	EXPECT_EQ(p.cs.sm.committed_step, 0u);
	EXPECT_EQ(ckpt_step_stages_used(&p.cs), 0u);
	// Unknown opcodes and garbage are refused and recorded.
	std::vector<uint8_t> junk(100, 0x42);
	EXPECT_EQ(ckpt_step_command(&p.cs, junk.data(), 100), -CKPT_E_MAGIC);
	EXPECT_EQ(p.cs.sm.last_error, uint32_t(CKPT_E_MAGIC));
	EXPECT_EQ(p.host.locked, 0);
}

TEST(CoreProtocol, SuperblockWriteFailureKeepsTheErrno)
{
	for (int which : {0, 1}) {
		Proto p(CKPT_STAGING_DEFAULT);
		ASSERT_EQ(p.command(CKPT_OP_BEGIN, 1), 0);
		ASSERT_EQ(p.grad(0, pattern(8 * p.cb, 1)), 0);
		p.apply_all();
		if (which)
			p.host.write_ret = -28;	// ENOSPC
		else
			p.host.flush_ret = -28;
		const ckpt_sb before = p.sb;
		auto cmd = std::make_unique<ckpt_cmd>();
		cmd->opcode = CKPT_OP_COMMIT;
		cmd->step = 1;
		int io = 0;
		EXPECT_EQ(ckpt_step_exec(&p.cs, cmd.get(), &io), -CKPT_E_IO);
		EXPECT_EQ(io, -28);
		EXPECT_EQ(p.cs.sm.state, uint32_t(CKPT_STATE_FAILED));
		EXPECT_EQ(p.cs.sm.first_io_error, 28u);
		EXPECT_EQ(p.cs.sm.committed_step, 0u);
		EXPECT_EQ(p.cs.sm.commands_rejected, 0u) << "an I/O failure is not a refusal";
		EXPECT_EQ(std::memcmp(&p.sb, &before, sizeof(before)), 0) << "the old commit stands";
		EXPECT_EQ(p.command(CKPT_OP_BEGIN, 1), -CKPT_E_FAILED);
	}
}

// ---------------------------------------------------------------- routing

namespace {

struct Routed {
	int ret;
	struct ckpt_route r;
};

Routed route(const ckpt_regions &l, uint64_t off, uint64_t len, uint32_t flags = 0)
{
	Routed x{};
	std::memset(&x.r, 0xaa, sizeof(x.r));	// every field is written
	x.ret = ckpt_route(&l, off, len, flags, &x.r);
	return x;
}

constexpr uint32_t W = CKPT_ROUTE_WRITE;

#define EXPECT_ROUTE(x, want_ret, want_window, want_off, want_len)		\
	do {								\
		const Routed &x_ = (x);					\
		EXPECT_EQ(x_.ret, (want_ret));				\
		EXPECT_EQ(x_.r.window, uint32_t(want_window));		\
		EXPECT_EQ(x_.r.off, uint64_t(want_off));		\
		EXPECT_EQ(x_.r.len, uint64_t(want_len));		\
	} while (0)

} // namespace

TEST(CoreRoute, ReadsAreCutAtWindowsAndChunks)
{
	const ckpt_regions l = small_sb().regions;
	const uint64_t cb = l.plo_chunk_bytes, win = l.window_bytes;
	ASSERT_EQ(l.grad_off, uint64_t(CKPT_BLOCK));
	ASSERT_EQ(l.param_off, l.grad_off + win);
	ASSERT_EQ(l.image_off, l.param_off + win);
	ASSERT_EQ(l.virt_bytes, l.image_off + l.dev_bytes);

	EXPECT_ROUTE(route(l, 0, 512), 0, CKPT_WIN_CTRL, 0, 512);
	EXPECT_ROUTE(route(l, 0, 3 * CKPT_BLOCK), 0, CKPT_WIN_CTRL, 0, CKPT_BLOCK);
	EXPECT_ROUTE(route(l, 100, 10), 0, CKPT_WIN_CTRL, 100, 10);	// reads need no alignment
	EXPECT_ROUTE(route(l, CKPT_BLOCK - 1, 2), 0, CKPT_WIN_CTRL, CKPT_BLOCK - 1, 1);
	EXPECT_ROUTE(route(l, l.grad_off, l.virt_bytes - l.grad_off), 0, CKPT_WIN_GRAD, 0, win);
	EXPECT_ROUTE(route(l, l.image_off - 512, 1024), 0, CKPT_WIN_PARAM, win - 512, 512);
	EXPECT_ROUTE(route(l, l.image_off + 100, l.dev_bytes - 100), 0, CKPT_WIN_IMAGE, 100, l.dev_bytes - 100);
	EXPECT_ROUTE(route(l, l.virt_bytes - 1, 1), 0, CKPT_WIN_IMAGE, l.dev_bytes - 1, 1);
	EXPECT_ROUTE(route(l, l.grad_off + 512, 1024), 0, CKPT_WIN_GRAD, 512, 1024);
	EXPECT_ROUTE(route(l, l.param_off - 1, 2), 0, CKPT_WIN_GRAD, win - 1, 1);

	Routed x = route(l, l.param_off + 3 * cb + 1000, 2 * cb);
	EXPECT_ROUTE(x, 0, CKPT_WIN_PARAM, 3 * cb + 1000, cb - 1000);
	EXPECT_EQ(x.r.chunk, 3u);
	EXPECT_EQ(x.r.in, 1000u);
	x = route(l, l.param_off + cb - 512, 1024);
	EXPECT_ROUTE(x, 0, CKPT_WIN_PARAM, cb - 512, 512);	// cut at the chunk boundary
	EXPECT_EQ(x.r.chunk, 0u);
	x = route(l, l.param_off + cb, 512);
	EXPECT_EQ(x.r.chunk, 1u);
	EXPECT_EQ(x.r.in, 0u);
	x = route(l, l.image_off - 1, 1);
	EXPECT_ROUTE(x, 0, CKPT_WIN_PARAM, win - 1, 1);
	EXPECT_EQ(x.r.chunk, l.n_params / l.chunk_params - 1);
	EXPECT_EQ(x.r.in, cb - 1);

	// A read of the whole device in the host's loop: the status page, the
	// GRAD window, each chunk, then the image, contiguous.
	std::vector<std::pair<uint32_t, uint64_t>> pieces;
	for (uint64_t off = 0, len = l.virt_bytes; len;) {
		x = route(l, off, len);
		ASSERT_EQ(x.ret, 0);
		ASSERT_GT(x.r.len, 0u);
		pieces.push_back({x.r.window, x.r.len});
		off += x.r.len;
		len -= x.r.len;
	}
	ASSERT_EQ(pieces.size(), 3 + l.n_params / l.chunk_params);
	EXPECT_EQ(pieces[0], std::make_pair(uint32_t(CKPT_WIN_CTRL), uint64_t(CKPT_BLOCK)));
	EXPECT_EQ(pieces[1], std::make_pair(uint32_t(CKPT_WIN_GRAD), win));
	for (size_t i = 2; i + 1 < pieces.size(); i++)
		EXPECT_EQ(pieces[i], std::make_pair(uint32_t(CKPT_WIN_PARAM), cb));
	EXPECT_EQ(pieces.back(), std::make_pair(uint32_t(CKPT_WIN_IMAGE), l.dev_bytes));
}

TEST(CoreRoute, WritesAreWholeOrRefused)
{
	const ckpt_regions l = small_sb().regions;
	const uint64_t win = l.window_bytes;

	// The control block: one command at offset 0, at most a block.
	EXPECT_ROUTE(route(l, 0, 512, W), 0, CKPT_WIN_CTRL, 0, 512);
	EXPECT_ROUTE(route(l, 0, CKPT_BLOCK, W), 0, CKPT_WIN_CTRL, 0, CKPT_BLOCK);
	EXPECT_ROUTE(route(l, 0, CKPT_BLOCK + 512, W), -CKPT_E_RANGE, CKPT_WIN_CTRL, 0, 0);
	EXPECT_ROUTE(route(l, 512, 512, W), -CKPT_E_RANGE, CKPT_WIN_CTRL, 512, 0);
	EXPECT_ROUTE(route(l, CKPT_BLOCK - 512, 1024, W), -CKPT_E_RANGE, CKPT_WIN_CTRL,
		     CKPT_BLOCK - 512, 0);

	// The GRAD window: anything inside it, nothing into the PARAM window.
	EXPECT_ROUTE(route(l, l.grad_off, win, W), 0, CKPT_WIN_GRAD, 0, win);
	EXPECT_ROUTE(route(l, l.grad_off + 512, 1024, W), 0, CKPT_WIN_GRAD, 512, 1024);
	EXPECT_ROUTE(route(l, l.param_off - 512, 512, W), 0, CKPT_WIN_GRAD, win - 512, 512);
	EXPECT_ROUTE(route(l, l.param_off - 512, 1024, W), -CKPT_E_RANGE, CKPT_WIN_GRAD,
		     win - 512, 0);
	EXPECT_ROUTE(route(l, l.grad_off, win + 512, W), -CKPT_E_RANGE, CKPT_WIN_GRAD, 0, 0);

	// The PARAM and IMAGE windows are read-only.
	EXPECT_ROUTE(route(l, l.param_off, 512, W), -CKPT_E_READONLY, CKPT_WIN_PARAM, 0, 0);
	EXPECT_ROUTE(route(l, l.image_off - 512, 512, W), -CKPT_E_READONLY, CKPT_WIN_PARAM,
		     win - 512, 0);
	EXPECT_ROUTE(route(l, l.image_off, 512, W), -CKPT_E_READONLY, CKPT_WIN_IMAGE, 0, 0);
	EXPECT_ROUTE(route(l, l.virt_bytes - 512, 512, W), -CKPT_E_READONLY, CKPT_WIN_IMAGE,
		     l.dev_bytes - 512, 0);
	EXPECT_ROUTE(route(l, l.image_off - 512, 1024, W), -CKPT_E_READONLY, CKPT_WIN_PARAM, win - 512, 0);

	// A read-only device refuses every write, reads as before.
	const uint32_t ro = W | CKPT_ROUTE_READ_ONLY;
	EXPECT_EQ(route(l, 0, 512, ro).ret, -CKPT_E_READONLY);
	EXPECT_EQ(route(l, l.grad_off, 512, ro).ret, -CKPT_E_READONLY);
	EXPECT_EQ(route(l, l.param_off, 512, ro).ret, -CKPT_E_READONLY);
	EXPECT_ROUTE(route(l, 0, 512, CKPT_ROUTE_READ_ONLY), 0, CKPT_WIN_CTRL, 0, 512);
	EXPECT_ROUTE(route(l, l.grad_off, 512, CKPT_ROUTE_READ_ONLY), 0, CKPT_WIN_GRAD, 0, 512);
}

TEST(CoreRoute, UnalignedBeyondAndOverflow)
{
	const ckpt_regions l = small_sb().regions;
	const uint64_t end = l.virt_bytes, max = ~0ull;

	// Writes are sector aligned; alignment is checked first, as the engine did.
	EXPECT_ROUTE(route(l, l.grad_off + 1, 512, W), -CKPT_E_ALIGN, CKPT_WIN_GRAD, 1, 0);
	EXPECT_ROUTE(route(l, l.grad_off, 100, W), -CKPT_E_ALIGN, CKPT_WIN_GRAD, 0, 0);
	EXPECT_EQ(route(l, 1, 512, W).ret, -CKPT_E_ALIGN);
	EXPECT_EQ(route(l, end + 1, 512, W).ret, -CKPT_E_ALIGN);
	EXPECT_EQ(route(l, l.grad_off + 1, 100).ret, 0) << "a read may be unaligned";

	// Beyond the end: refused with no window, reads and writes alike.
	for (uint32_t f : {0u, W}) {
		EXPECT_ROUTE(route(l, end, 512, f), -CKPT_E_RANGE, CKPT_WIN_NONE, 0, 0);
		EXPECT_ROUTE(route(l, end - 512, 1024, f), -CKPT_E_RANGE, CKPT_WIN_NONE, 0, 0);
		EXPECT_ROUTE(route(l, l.grad_off, end, f), -CKPT_E_RANGE, CKPT_WIN_NONE, 0, 0);
		EXPECT_ROUTE(route(l, end + 4096, 512, f), -CKPT_E_RANGE, CKPT_WIN_NONE, 0, 0);
		// off + len wraps past 2^64: must not look small.
		EXPECT_EQ(route(l, l.grad_off, 0 - l.grad_off + 512, f).ret, -CKPT_E_RANGE) << "wraps to 512";
		EXPECT_EQ(route(l, 4096, 0 - 4096ull, f).ret, -CKPT_E_RANGE) << "off + len == 2^64";
		EXPECT_EQ(route(l, 0 - 512ull, 512, f).ret, -CKPT_E_RANGE);
		EXPECT_EQ(route(l, 0 - 512ull, 1024, f).ret, -CKPT_E_RANGE) << "wraps to 512";
		EXPECT_EQ(route(l, 512, max - 511, f).ret, -CKPT_E_RANGE) << "wraps to 0";
	}
	EXPECT_EQ(route(l, end - 1, max).ret, -CKPT_E_RANGE);
	EXPECT_EQ(route(l, 1, max).ret, -CKPT_E_RANGE);
	EXPECT_EQ(route(l, max, 1).ret, -CKPT_E_RANGE);

	// An empty access does nothing, wherever it is.
	for (uint32_t f : {0u, W})
		for (uint64_t off : {uint64_t(0), uint64_t(3), l.param_off, end, max})
			EXPECT_ROUTE(route(l, off, 0, f), 0, CKPT_WIN_NONE, 0, 0);
}

TEST(CoreRoute, LargestGeometry)
{
	// 2^24 chunks of 2^22 params: 2^47-byte windows, chunk numbers near 2^24.
	ckpt_geometry g{};
	g.n_chunks = 1u << 24;
	g.chunk_shift = CKPT_MAX_CHUNK_SHIFT;
	g.n_groups = 1;
	g.dtype = CKPT_DTYPE_FP16;
	g.optimizer = CKPT_OPT_ADAM;
	g.manifest_bytes = CKPT_BLOCK;
	ckpt_regions l{};
	// block counts do not fit the header of chunks this large: no COUNTS
	EXPECT_EQ(ckpt_regions_compute_features(&g, CKPT_FEATURE_INCOMPAT_DEFAULT, &l), -CKPT_E_FEATURE);
	ASSERT_EQ(ckpt_regions_compute_features(&g, CKPT_FEATURE_INCOMPAT_DEFAULT & ~CKPT_FEATURE_INCOMPAT_COUNTS,
					       &l), 0);
	const uint64_t cb = l.plo_chunk_bytes;
	Routed x = route(l, l.virt_bytes - 4096, 3 * cb);
	EXPECT_EQ(x.ret, -CKPT_E_RANGE);
	x = route(l, l.image_off - cb + 4096, cb - 4096);
	EXPECT_ROUTE(x, 0, CKPT_WIN_PARAM, l.window_bytes - cb + 4096, cb - 4096);
	EXPECT_EQ(x.r.chunk, (1u << 24) - 1);
	EXPECT_EQ(x.r.in, 4096u);
	x = route(l, l.param_off - cb, 2 * cb, W);
	EXPECT_EQ(x.ret, -CKPT_E_RANGE);
	EXPECT_EQ(x.r.window, uint32_t(CKPT_WIN_GRAD));
	EXPECT_ROUTE(route(l, l.param_off - cb, cb, W), 0, CKPT_WIN_GRAD, l.window_bytes - cb, cb);
}

// The host's routing counts a refused write as a refused request, with
// why; a refused read changes nothing; an accepted access nothing either.
TEST(CoreRoute, StepRouteRecordsRefusedWritesOnly)
{
	Proto p(CKPT_STAGING_DEFAULT);
	const ckpt_regions &l = p.sb.regions;
	struct ckpt_route r;
	EXPECT_EQ(ckpt_step_route(&p.cs, 0, 512, W, &r), 0);
	EXPECT_EQ(ckpt_step_route(&p.cs, l.virt_bytes, 512, 0, &r), -CKPT_E_RANGE);
	EXPECT_EQ(ckpt_step_route(&p.cs, l.param_off, 512, 0, &r), 0);
	EXPECT_EQ(p.cs.sm.commands_rejected, 0u);
	EXPECT_EQ(p.cs.sm.last_result, uint32_t(CKPT_RESULT_NONE));

	const auto before = p.snapshot();
	EXPECT_EQ(ckpt_step_route(&p.cs, l.param_off, 512, W, &r), -CKPT_E_READONLY);
	EXPECT_EQ(p.cs.sm.commands_rejected, 1u);
	EXPECT_EQ(p.cs.sm.last_error, uint32_t(CKPT_E_READONLY));
	EXPECT_EQ(p.cs.sm.last_result, uint32_t(CKPT_RESULT_REJECTED));
	EXPECT_EQ(ckpt_step_route(&p.cs, l.grad_off + 1, 512, W, &r), -CKPT_E_ALIGN);
	EXPECT_EQ(ckpt_step_route(&p.cs, 0, 512, W | CKPT_ROUTE_READ_ONLY, &r), -CKPT_E_READONLY);
	EXPECT_EQ(p.cs.sm.commands_rejected, 3u);
	EXPECT_EQ(p.snapshot(), before) << "nothing but the refusal is recorded";
	EXPECT_EQ(p.host.locked, 0);
	EXPECT_EQ(p.host.max_locked, 1);
}

// ---------------------------------------------------------------- loading state

TEST(CoreLoad, Preconditions)
{
	Proto p(CKPT_STAGING_DEFAULT);
	const auto fresh = p.snapshot();
	EXPECT_EQ(ckpt_step_load_check(&p.cs, 0, 0), 0);
	EXPECT_EQ(ckpt_step_load_check(&p.cs, CKPT_STEP_MAX, CKPT_BLOB_MAX), 0);
	EXPECT_EQ(ckpt_step_load_check(&p.cs, CKPT_STEP_MAX + 1, 0), -CKPT_E_STEP);
	EXPECT_EQ(ckpt_step_load_check(&p.cs, ~0ull, 0), -CKPT_E_STEP);
	EXPECT_EQ(ckpt_step_load_check(&p.cs, 1, CKPT_BLOB_MAX + 1), -CKPT_E_BLOB);
	EXPECT_EQ(ckpt_step_load_check(&p.cs, 1, 1ull << 32), -CKPT_E_BLOB) << "not cut to 32 bits";
	EXPECT_EQ(p.snapshot(), fresh);
	EXPECT_EQ(p.cs.sm.commands_rejected, 0u) << "a refused load is not a refused request";
	EXPECT_EQ(p.host.locked, 0);

	// An open step: E_STATE before the step and blob checks.
	ASSERT_EQ(p.command(CKPT_OP_BEGIN, 1), 0);
	EXPECT_EQ(ckpt_step_load_check(&p.cs, 0, 0), -CKPT_E_STATE);
	EXPECT_EQ(ckpt_step_load_check(&p.cs, ~0ull, ~0ull), -CKPT_E_STATE);
	// A committed step: only before the first step.
	ASSERT_EQ(p.grad(0, pattern(8 * p.cb, 1)), 0);
	p.apply_all();
	ASSERT_EQ(p.command(CKPT_OP_COMMIT, 1), CKPT_RESULT_COMMITTED);
	EXPECT_EQ(ckpt_step_load_check(&p.cs, 0, 0), -CKPT_E_STATE);
	// A failed device says so first.
	ckpt_sm_fail(&p.cs.sm, -5);
	EXPECT_EQ(ckpt_step_load_check(&p.cs, ~0ull, ~0ull), -CKPT_E_FAILED);

	// Spans: inside the image's params.
	const uint64_t n = p.sb.regions.n_params;
	EXPECT_EQ(ckpt_step_load_span(&p.cs, 0, n), 0);
	EXPECT_EQ(ckpt_step_load_span(&p.cs, n - 1, 1), 0);
	EXPECT_EQ(ckpt_step_load_span(&p.cs, 5, 0), 0);
	EXPECT_EQ(ckpt_step_load_span(&p.cs, 1, n), -CKPT_E_RANGE);
	EXPECT_EQ(ckpt_step_load_span(&p.cs, n, 0), -CKPT_E_RANGE);
	EXPECT_EQ(ckpt_step_load_span(&p.cs, 1, ~0ull), -CKPT_E_RANGE) << "offset + n wraps";
	EXPECT_EQ(ckpt_step_load_span(&p.cs, ~0ull, 1), -CKPT_E_RANGE);
}

// ---------------------------------------------------------------- rollback

// The rollback rule: only an IDLE device, only to the step the older
// superblock copy commits (step - 1, the other slot, sequence - 1, the same
// image), only over records that still hold it; its commit is the previous
// step again with its blob, and then nothing is left to go back to.
TEST(CoreRollback, OnlyOneStepBackOverIntactRecords)
{
	Proto p(CKPT_STAGING_DEFAULT);
	EXPECT_EQ(ckpt_step_rollback_check(&p.cs, nullptr, 0), -CKPT_E_ROLLBACK) << "step 0";
	ASSERT_EQ(p.command(CKPT_OP_BEGIN, 1), 0);
	ASSERT_EQ(p.grad(0, pattern(8 * p.cb, 1)), 0);
	p.apply_all();
	ASSERT_EQ(p.command(CKPT_OP_COMMIT, 1, "one"), CKPT_RESULT_COMMITTED);
	const ckpt_sb one = p.sb;
	ASSERT_EQ(p.command(CKPT_OP_BEGIN, 2), 0);
	EXPECT_EQ(ckpt_step_rollback_check(&p.cs, &one, 0), -CKPT_E_STATE) << "a step is open";
	ASSERT_EQ(p.grad(0, pattern(8 * p.cb, 2)), 0);
	p.apply_all();
	ASSERT_EQ(p.command(CKPT_OP_COMMIT, 2, "two"), CKPT_RESULT_COMMITTED);
	const ckpt_sb two = p.sb;

	EXPECT_EQ(ckpt_step_rollback_check(&p.cs, &one, 0), 0);
	EXPECT_EQ(ckpt_step_rollback_check(&p.cs, nullptr, 0), -CKPT_E_ROLLBACK) << "no valid older copy";
	for (auto bad : std::vector<std::function<void(ckpt_sb &)>>{
		     [](ckpt_sb &b) { b.committed_step--; }, [](ckpt_sb &b) { b.committed_slot ^= 1; },
		     [](ckpt_sb &b) { b.sequence--; }, [](ckpt_sb &b) { b.uuid[0] ^= 1; },
		     [](ckpt_sb &b) { b.manifest_crc ^= 1; }, [](ckpt_sb &b) { b.geo.n_groups++; }}) {
		ckpt_sb b = one;
		bad(b);
		EXPECT_EQ(ckpt_step_rollback_check(&p.cs, &b, 0), -CKPT_E_ROLLBACK);
	}

	// A record of step 1 in its slot: re-stamped for the next sequence, then
	// already right (an interrupted rollback); overwritten or damaged: refused.
	const ckpt_regions &l = p.sb.regions;
	std::vector<uint8_t> rec(l.record_bytes), plo(l.plo_chunk_bytes, 0x5a);
	for (size_t i = CKPT_BLOCK; i < rec.size(); i++)
		rec[i] = uint8_t(i * 7);
	ckpt_rec id;
	ckpt_rec_committed(&one, 3, &id);
	ckpt_rec_seal(rec.data(), rec.data() + CKPT_BLOCK, plo.data(), &id, p.sb.feature_incompat);
	const std::vector<uint8_t> sealed = rec;
	EXPECT_EQ(ckpt_step_rollback_rec(&p.cs, &one, 3, rec.data(), rec.data() + CKPT_BLOCK, plo.data()), 1);
	ckpt_rec got, want;
	ckpt_rec_next(&two, 3, 1, &want);
	EXPECT_EQ(ckpt_rec_check(rec.data(), rec.data() + CKPT_BLOCK, plo.data(), &want, p.sb.feature_incompat,
				 &got),
		  CKPT_REC_OK);
	EXPECT_EQ(ckpt_step_rollback_rec(&p.cs, &one, 3, rec.data(), rec.data() + CKPT_BLOCK, plo.data()), 0);
	EXPECT_EQ(ckpt_step_rollback_rec(&p.cs, &one, 4, rec.data(), rec.data() + CKPT_BLOCK, plo.data()),
		  -CKPT_E_ROLLBACK) << "another chunk's record";
	rec = sealed;
	rec[CKPT_BLOCK + 5] ^= 1;
	EXPECT_EQ(ckpt_step_rollback_rec(&p.cs, &one, 3, rec.data(), rec.data() + CKPT_BLOCK, plo.data()),
		  -CKPT_E_ROLLBACK) << "damaged data";
	rec = sealed;
	ckpt_rec_next(&two, 3, 3, &id);	// a step 3 wrote there
	ckpt_rec_seal(rec.data(), rec.data() + CKPT_BLOCK, plo.data(), &id, p.sb.feature_incompat);
	EXPECT_EQ(ckpt_step_rollback_rec(&p.cs, &one, 3, rec.data(), rec.data() + CKPT_BLOCK, plo.data()),
		  -CKPT_E_ROLLBACK) << "overwritten";

	const size_t writes = p.host.sb_writes.size();
	ASSERT_EQ(ckpt_step_rollback_commit(&p.cs, &one), 0);
	EXPECT_EQ(p.host.sb_writes.size(), writes + 1);
	EXPECT_EQ(p.sb.committed_step, 1u);
	EXPECT_EQ(p.sb.committed_slot, one.committed_slot);
	EXPECT_EQ(p.sb.sequence, two.sequence + 1);
	EXPECT_EQ(p.sb.blob_len, 3u);
	EXPECT_EQ(std::memcmp(p.sb.blob, "one", 3), 0);
	EXPECT_EQ(p.cs.sm.committed_step, 1u);
	EXPECT_EQ(p.cs.sm.committed_slot, one.committed_slot);
	// The older copy now commits step 2: never two steps back.
	EXPECT_EQ(ckpt_step_rollback_check(&p.cs, &two, 0), -CKPT_E_ROLLBACK);
	// The next step is step 2 again.
	EXPECT_EQ(p.command(CKPT_OP_BEGIN, 2), 0);
	ASSERT_EQ(p.command(CKPT_OP_ABORT, 2), 0);
	ckpt_sm_fail(&p.cs.sm, -5);
	EXPECT_EQ(ckpt_step_rollback_check(&p.cs, &one, 0), -CKPT_E_FAILED);
}

// The ROLLBACK command is the core's whole rollback (ckpt_step_rollback)
// over the host's read, write and memory ops; a host without write and
// alloc refuses it as an unknown command (an older target). It reads the
// older superblock copy and every record of its slot, re-stamps each header,
// commits. Refusals are recorded, say where and why (cs.rollback), and
// change nothing else; an I/O error is passed on, not recorded, and does not
// fail the device; a rollback keeps the counters and leaves the machine IDLE
// at the previous step; every allocation is freed.
TEST(CoreRollback, CommandIsTheCoresRollback)
{
	Proto p(CKPT_STAGING_DEFAULT);
	for (uint64_t t : {1, 2}) {
		ASSERT_EQ(p.command(CKPT_OP_BEGIN, t), 0);
		ASSERT_EQ(p.grad(0, pattern(8 * p.cb, uint8_t(t))), 0);
		p.apply_all();
		p.host.dispatched.clear();
		ASSERT_EQ(p.command(CKPT_OP_COMMIT, t, t == 1 ? "one" : "two"), CKPT_RESULT_COMMITTED);
	}
	const ckpt_sb one = [&] {
		ckpt_sb b;
		EXPECT_EQ(ckpt_sb_decode(p.host.sb_writes[p.host.sb_writes.size() - 2].second.data(),
					 p.sb.regions.dev_bytes, &b), 0);
		return b;
	}();
	const ckpt_sb two = p.sb;
	ASSERT_EQ(one.committed_step, 1u);
	// step 1's records in its slot, as its updates sealed them
	const ckpt_regions &l = p.sb.regions;
	const uint32_t n_chunks = p.sb.geo.n_chunks;
	const auto record_of = [&](uint32_t ch) {
		std::vector<uint8_t> rec(l.record_bytes), plo(l.plo_chunk_bytes, uint8_t(ch));
		for (size_t i = CKPT_BLOCK; i < rec.size(); i++)
			rec[i] = uint8_t(i * 7 + ch);
		ckpt_rec id;
		ckpt_rec_committed(&one, ch, &id);
		ckpt_rec_seal(rec.data(), rec.data() + CKPT_BLOCK, plo.data(), &id, p.sb.feature_incompat);
		p.host.disk[ckpt_record_offset(&l, one.committed_slot, ch)] = rec;
		p.host.disk[ckpt_plo_offset(&l, one.committed_slot, ch)] = plo;
	};
	for (uint32_t ch = 0; ch < n_chunks; ch++)
		record_of(ch);

	auto refused = [&](uint64_t step, int err, const char *why) {
		const auto before = p.snapshot();
		const uint64_t rejected = p.cs.sm.commands_rejected;
		EXPECT_EQ(p.command(CKPT_OP_ROLLBACK, step), -err) << why;
		EXPECT_EQ(p.cs.sm.commands_rejected, rejected + 1) << why;
		EXPECT_EQ(p.cs.sm.last_error, uint32_t(err)) << why;
		EXPECT_EQ(p.cs.sm.last_result, uint32_t(CKPT_RESULT_REJECTED)) << why;
		EXPECT_EQ(p.snapshot(), before) << why;
	};
	refused(0, CKPT_E_OPCODE, "a host without write and alloc: an older target");

	const ckpt_step_ops ops = rollback_ops();
	p.cs.ops = &ops;
	const size_t writes = p.host.sb_writes.size();
	refused(1, CKPT_E_STEP, "step 1 is not the committed step");
	EXPECT_EQ(p.cs.rollback.part, CKPT_ROLLBACK_MACHINE);
	refused(3, CKPT_E_STEP, "nor is step 3");
	ASSERT_EQ(p.command(CKPT_OP_BEGIN, 3), 0);
	refused(2, CKPT_E_STATE, "a step is open");
	ASSERT_EQ(p.command(CKPT_OP_ABORT, 3), 0);
	p.host.blank_older = true;
	refused(0, CKPT_E_ROLLBACK, "no valid older copy");
	EXPECT_EQ(p.cs.rollback.part, CKPT_ROLLBACK_OLDER);
	EXPECT_EQ(p.cs.rollback.older_index, (two.sequence + 1) & 1);
	EXPECT_NE(p.cs.rollback.older, 0);
	p.host.blank_older = false;
	p.host.no_memory = true;
	refused(0, CKPT_E_NOMEM, "no memory");
	EXPECT_EQ(p.cs.rollback.part, CKPT_ROLLBACK_NOMEM);
	p.host.no_memory = false;

	// A damaged record, and one a later step overwrote: refused, saying which.
	const uint64_t off5 = ckpt_record_offset(&l, one.committed_slot, 5);
	p.host.disk[off5][CKPT_BLOCK + 9] ^= 1;
	refused(0, CKPT_E_ROLLBACK, "a damaged record");
	EXPECT_EQ(p.cs.rollback.part, CKPT_ROLLBACK_RECORD);
	EXPECT_EQ(p.cs.rollback.chunk, 5u);
	EXPECT_EQ(p.cs.rollback.slot, one.committed_slot);
	EXPECT_EQ(p.cs.rollback.rec, CKPT_REC_DATA);
	record_of(5);
	{
		ckpt_rec id;
		ckpt_rec_next(&two, 5, 3, &id);	// a step 3 began after step 2 and wrote there
		std::vector<uint8_t> &rec = p.host.disk[off5];
		ckpt_rec_seal(rec.data(), rec.data() + CKPT_BLOCK, p.host.disk[ckpt_plo_offset(&l, one.committed_slot, 5)].data(),
			      &id, p.sb.feature_incompat);
	}
	refused(0, CKPT_E_ROLLBACK, "an overwritten record");
	EXPECT_EQ(p.cs.rollback.chunk, 5u);
	EXPECT_TRUE(p.cs.rollback.got_valid);
	EXPECT_EQ(p.cs.rollback.got.step, 3u);
	record_of(5);
	// Chunks before 5 were re-stamped by the refused rollbacks: that is
	// what an interrupted rollback leaves, and the next one takes it.
	EXPECT_EQ(p.host.record_writes, 5u) << "re-stamped once";

	// An I/O error: passed on with the host's errno, not a refusal, not a failure.
	p.host.rollback_io = -EIO;
	{
		const auto before = p.snapshot();
		const uint64_t rejected = p.cs.sm.commands_rejected;
		auto c = test_cmd(CKPT_OP_ROLLBACK, 2, 2);
		int io = 0;
		EXPECT_EQ(ckpt_step_exec(&p.cs, c.get(), &io), -CKPT_E_IO);
		EXPECT_EQ(io, -EIO);
		EXPECT_EQ(p.cs.rollback.part, CKPT_ROLLBACK_OLDER);
		EXPECT_EQ(p.cs.rollback.io_errno, -EIO);
		EXPECT_EQ(p.cs.sm.commands_rejected, rejected);
		EXPECT_EQ(p.cs.sm.state, uint32_t(CKPT_STATE_IDLE));
		EXPECT_EQ(p.snapshot(), before);
	}
	p.host.rollback_io = 0;
	EXPECT_EQ(p.host.sb_writes.size(), writes) << "no refusal wrote a superblock";

	const uint64_t rejected = p.cs.sm.commands_rejected, aborted = p.cs.sm.steps_aborted;
	p.host.record_writes = 0;
	ASSERT_EQ(p.command(CKPT_OP_ROLLBACK, 2), 0);
	EXPECT_EQ(p.cs.rollback.part, CKPT_ROLLBACK_OK);
	EXPECT_EQ(p.host.record_writes, n_chunks - 5) << "chunks 0-4 were re-stamped already";
	EXPECT_EQ(p.host.sb_writes.size(), writes + 1);
	EXPECT_EQ(p.sb.committed_step, 1u);
	EXPECT_EQ(p.sb.sequence, two.sequence + 1);
	EXPECT_EQ(p.sb.blob_len, 3u);
	EXPECT_EQ(std::memcmp(p.sb.blob, "one", 3), 0);
	for (uint32_t ch = 0; ch < n_chunks; ch++) {
		const std::vector<uint8_t> &rec = p.host.disk[ckpt_record_offset(&l, one.committed_slot, ch)];
		ckpt_rec want, got;
		ckpt_rec_committed(&p.sb, ch, &want);
		EXPECT_EQ(ckpt_rec_check(rec.data(), rec.data() + CKPT_BLOCK,
					 p.host.disk[ckpt_plo_offset(&l, one.committed_slot, ch)].data(), &want,
					 p.sb.feature_incompat, &got),
			  CKPT_REC_OK)
			<< "chunk " << ch << " is the new superblock's";
	}
	EXPECT_EQ(p.cs.sm.state, uint32_t(CKPT_STATE_IDLE));
	EXPECT_EQ(p.cs.sm.committed_step, 1u);
	EXPECT_EQ(p.cs.sm.committed_slot, one.committed_slot);
	EXPECT_EQ(p.cs.sm.last_result, uint32_t(CKPT_RESULT_NONE));
	EXPECT_EQ(p.cs.sm.last_error, 0u);
	EXPECT_EQ(p.cs.sm.steps_committed, 2u) << "counters kept";
	EXPECT_EQ(p.cs.sm.steps_aborted, aborted);
	EXPECT_EQ(p.cs.sm.commands_rejected, rejected);
	// Never two steps back: the older copy now commits step 2.
	refused(0, CKPT_E_ROLLBACK, "a second rollback");
	EXPECT_EQ(p.cs.rollback.part, CKPT_ROLLBACK_OLDER);
	EXPECT_EQ(p.cs.rollback.older, 0);
	EXPECT_EQ(p.cs.rollback.older_step, 2u);
	// The next step is step 2 again, in step 1's slot's other one.
	EXPECT_EQ(p.command(CKPT_OP_BEGIN, 2), 0);
	EXPECT_EQ(p.host.quiesced.back(), one.committed_slot ^ 1);
	EXPECT_EQ(p.host.locked, 0);
	EXPECT_FALSE(p.host.op_under_lock);
	EXPECT_EQ(p.host.allocated, 0) << "every allocation freed";
}

// A rollback's commit that fails before its superblock write (the flush)
// changes nothing and fails nothing: the rollback can be run again. One that
// fails once the write is issued (the write, a write that does not read
// back) leaves the device naming either step as committed: the machine
// fails as a failed COMMIT does (ops->failed, once), so no step writes the
// slot the device may now name as committed. A load's commit takes the
// same path.
TEST(CoreRollback, CommitFailureAfterTheSuperblockWriteFails)
{
	enum What { flush, write, lost, load };
	for (What what : {flush, write, lost, load}) {
		Proto p(CKPT_STAGING_DEFAULT);
		const ckpt_sb zero = p.sb;
		for (uint64_t t : {1, 2}) {
			if (what == load)
				break;
			ASSERT_EQ(p.command(CKPT_OP_BEGIN, t), 0);
			ASSERT_EQ(p.grad(0, pattern(8 * p.cb, uint8_t(t))), 0);
			p.apply_all();
			p.host.dispatched.clear();
			ASSERT_EQ(p.command(CKPT_OP_COMMIT, t), CKPT_RESULT_COMMITTED);
		}
		ckpt_sb one{};
		if (what != load) {
			ASSERT_EQ(ckpt_sb_decode(p.host.sb_writes[0].second.data(), p.sb.regions.dev_bytes, &one), 0);
		}
		const ckpt_sb two = p.sb;
		const uint32_t slot = p.cs.sm.committed_slot;
		p.host.flush_ret = what == flush ? -EIO : 0;
		p.host.write_ret = what == write || what == load ? -EIO : 0;
		p.host.lose_sb = what == lost;
		if (what != load) {
			ASSERT_EQ(ckpt_step_rollback_check(&p.cs, &one, 0), 0);
		}
		const auto before = p.snapshot();
		const int ret = what == load ? ckpt_step_load_commit(&p.cs, 7, "", 0)
					     : ckpt_step_rollback_commit(&p.cs, &one);
		EXPECT_EQ(ret, -EIO) << what;
		EXPECT_EQ(std::memcmp(&p.sb, what == load ? &zero : &two, sizeof(p.sb)), 0) << what;
		EXPECT_EQ(p.host.locked, 0);
		EXPECT_FALSE(p.host.op_under_lock);
		if (what == flush) {
			EXPECT_EQ(p.snapshot(), before);
			EXPECT_TRUE(p.host.failed.empty());
			p.host.flush_ret = 0;
			EXPECT_EQ(ckpt_step_rollback_check(&p.cs, &one, 0), 0) << "repeatable";
			ASSERT_EQ(ckpt_step_rollback_commit(&p.cs, &one), 0);
			EXPECT_EQ(p.cs.sm.committed_step, 1u);
			continue;
		}
		EXPECT_EQ(p.cs.sm.state, uint32_t(CKPT_STATE_FAILED)) << what;
		EXPECT_EQ(p.cs.sm.first_io_error, uint32_t(EIO)) << what;
		EXPECT_EQ(p.host.failed, std::vector<int>{-EIO}) << what;
		EXPECT_EQ(p.cs.sm.committed_slot, what == load ? zero.committed_slot : slot) << what;
		const size_t dispatched = p.host.dispatched.size(), quiesced = p.host.quiesced.size();
		EXPECT_EQ(p.command(CKPT_OP_BEGIN, what == load ? 1 : 3), -CKPT_E_FAILED) << what;
		EXPECT_EQ(p.grad(0, pattern(p.cb, 9)), -CKPT_E_FAILED) << what;
		EXPECT_EQ(p.host.dispatched.size(), dispatched) << what;
		EXPECT_EQ(p.host.quiesced.size(), quiesced) << "no step opens: " << what;
		if (what != load) {
			EXPECT_EQ(ckpt_step_rollback_check(&p.cs, &one, 0), -CKPT_E_FAILED) << what;
		}
		EXPECT_EQ(ckpt_step_load_check(&p.cs, 7, 0), -CKPT_E_FAILED) << what;
		// a second failed commit tells the host nothing new
		p.host.write_ret = -EIO;
		p.host.lose_sb = false;
		EXPECT_EQ(ckpt_step_write_sb(&p.cs, 9, 0, "", 0), -EIO);
		EXPECT_EQ(p.host.failed.size(), 1u) << what;
	}
}

// A load commits like a step (the other slot, flush, then the superblock)
// and the machine starts over from it, counters too.
TEST(CoreLoad, CommitThenRestart)
{
	Proto p(CKPT_STAGING_DEFAULT);
	ASSERT_EQ(p.command(CKPT_OP_BEGIN, 1), 0);
	ASSERT_EQ(p.grad(0, pattern(p.cb / 2, 1)), 0);
	ASSERT_EQ(p.command(CKPT_OP_ABORT, 1), 0);
	ASSERT_EQ(p.command(CKPT_OP_ABORT, 1), -CKPT_E_STATE);
	ASSERT_EQ(p.cs.sm.steps_aborted, 1u);
	ASSERT_EQ(ckpt_step_load_check(&p.cs, 42, 3), 0);

	// A commit that failed before its superblock write changes nothing.
	p.host.flush_ret = -28;
	const auto before = p.snapshot();
	EXPECT_EQ(ckpt_step_load_commit(&p.cs, 42, "abc", 3), -28);
	EXPECT_EQ(p.snapshot(), before);
	EXPECT_EQ(p.cs.sm.state, uint32_t(CKPT_STATE_IDLE));
	EXPECT_TRUE(p.host.failed.empty());
	p.host.flush_ret = 0;

	const ckpt_sb old = p.sb;
	ASSERT_EQ(ckpt_step_load_commit(&p.cs, 42, "abc", 3), 0);
	ckpt_sb want;
	ASSERT_EQ(ckpt_sb_next(&old, 42, old.committed_slot ^ 1, "abc", 3, &want), 0);
	EXPECT_EQ(std::memcmp(&p.sb, &want, sizeof(want)), 0);
	ASSERT_EQ(p.host.sb_writes.size(), 1u);
	EXPECT_EQ(p.host.sb_writes[0].first, ckpt_sb_next_offset(&old));
	EXPECT_EQ(p.host.flushes, 2) << "flushed before each superblock write";
	EXPECT_EQ(p.cs.sm.committed_step, 42u);
	EXPECT_EQ(p.cs.sm.committed_slot, old.committed_slot ^ 1);
	EXPECT_EQ(p.cs.sm.state, uint32_t(CKPT_STATE_IDLE));
	EXPECT_EQ(p.cs.sm.steps_aborted, 0u) << "the machine starts over";
	EXPECT_EQ(p.cs.sm.commands_rejected, 0u);
	EXPECT_EQ(ckpt_step_stages_used(&p.cs), 0u);
	EXPECT_FALSE(p.host.op_under_lock);
	EXPECT_EQ(p.host.locked, 0);
	// The next step is 43.
	EXPECT_EQ(p.command(CKPT_OP_BEGIN, 1), -CKPT_E_STEP);
	EXPECT_EQ(p.command(CKPT_OP_BEGIN, 43), 0);
}
