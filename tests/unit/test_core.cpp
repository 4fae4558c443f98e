// SPDX-License-Identifier: MIT
// The protocol rules the core owns and both targets call: record identity
// and sealing, the next superblock, status counters and line, hyperparameter
// fields, the gradient-write plan and command execution.
#include <gtest/gtest.h>

#include <cstddef>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
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
	ckpt_counters k{};
	k.state = uint32_t(rng() % CKPT_STATE_MAX);
	k.committed_step = pick();
	k.open_step = pick();
	*n_chunks = uint32_t(pick()) | 1;
	k.chunks_done = pick() % (uint64_t(*n_chunks) + 1);
	k.overflow = uint32_t(pick());
	k.last_result = uint32_t(rng() % CKPT_RESULT_MAX);
	k.last_error = uint32_t(pick());
	k.first_io_error = uint32_t(pick());
	k.steps_committed = pick();
	k.steps_skipped = pick();
	k.steps_aborted = pick();
	k.commands_rejected = pick();
	k.grad_bytes = pick();
	k.param_bytes = pick();
	k.io_errors = pick();
	return k;
}

} // namespace

TEST(CoreStatus, CountersFromTheStepMachine)
{
	ckpt_sb sb = small_sb();
	sb.committed_step = 6;
	sb.committed_slot = 1;
	std::vector<uint64_t> claimed(1), applied(1);
	ckpt_step_sm sm;
	ckpt_sm_init(&sm, &sb, claimed.data(), applied.data());
	ckpt_cmd begin{};
	begin.opcode = CKPT_OP_BEGIN;
	begin.step = 7;
	begin.n_groups = 2;
	begin.grad_scale = f32(1.0f);
	begin.groups[0] = test_hparams(0);
	begin.groups[1] = test_hparams(1);
	ASSERT_EQ(ckpt_sm_begin(&sm, &begin), 0);
	ASSERT_EQ(ckpt_sm_claim(&sm, 2), 0);
	ckpt_sm_applied(&sm, 2, true, false);
	ckpt_sm_rejected(&sm, CKPT_E_TWICE);
	ckpt_counters k;
	ckpt_sm_counters(&sm, 111, 222, &k);
	EXPECT_EQ(k.state, uint32_t(CKPT_STATE_OPEN));
	EXPECT_EQ(k.committed_step, 6u);
	EXPECT_EQ(k.open_step, 7u);
	EXPECT_EQ(k.chunks_done, 1u);
	EXPECT_EQ(k.overflow, 1u);
	EXPECT_EQ(k.last_result, uint32_t(CKPT_RESULT_REJECTED));
	EXPECT_EQ(k.last_error, uint32_t(CKPT_E_TWICE));
	EXPECT_EQ(k.commands_rejected, 1u);
	EXPECT_EQ(k.grad_bytes, 111u);
	EXPECT_EQ(k.param_bytes, 222u);
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
