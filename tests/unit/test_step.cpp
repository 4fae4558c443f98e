// SPDX-License-Identifier: GPL-2.0 OR MIT
// Unit tests of the step state machine and the sector coverage bitmaps.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <random>
#include <vector>

#include "ckpt_step.h"
#include "core_test_util.hpp"

namespace {

constexpr uint32_t kInf = 0x7f800000u;
constexpr uint32_t kNegInf = 0xff800000u;
constexpr uint32_t kNaN = 0x7fc00000u;
constexpr uint32_t kSNaN = 0x7f800001u;
constexpr uint32_t kNegNaN = 0xffc00001u;

// The fp32 fields of ckpt_hparams, for "each field" loops.
uint32_t ckpt_hparams::*const kFloatFields[] = {
	&ckpt_hparams::lr,
	&ckpt_hparams::beta1,
	&ckpt_hparams::beta2,
	&ckpt_hparams::eps,
	&ckpt_hparams::weight_decay,
	&ckpt_hparams::one_minus_beta1,
	&ckpt_hparams::one_minus_beta2,
	&ckpt_hparams::step_size,
	&ckpt_hparams::bc2_sqrt,
	&ckpt_hparams::decay,
};

class StepTest : public ::testing::Test {
protected:
	static constexpr uint32_t kChunks = 130; // three bitmap words
	static constexpr uint32_t kGroups = 2;

	std::unique_ptr<ckpt_sb> sb = std::make_unique<ckpt_sb>();
	std::vector<uint64_t> claimed, applied;
	ckpt_step_sm sm{};

	void SetUp() override { init(41, 1); }

	void init(uint64_t committed_step, uint32_t slot)
	{
		sb->geo = test_geometry(kChunks, 11, kGroups, CKPT_DTYPE_BF16, 4096);
		ASSERT_EQ(ckpt_regions_compute(&sb->geo, &sb->regions), 0);
		sb->committed_step = committed_step;
		sb->committed_slot = slot;
		sb->blob_len = 5;
		std::memcpy(sb->blob, "hello", 5);
		size_t words = ckpt_bitmap_words(kChunks);
		ASSERT_EQ(words, 3u);
		// Garbage in the caller's storage: init must clear it.
		claimed.assign(words, ~0ull);
		applied.assign(words, 0x5555555555555555ull);
		ckpt_sm_init(&sm, sb.get(), claimed.data(), applied.data());
	}

	// Group 1 is Adam-L2 with lr 2e-3 (test_hparams(1)).
	std::unique_ptr<ckpt_cmd> begin(uint64_t step)
	{
		return test_cmd(CKPT_OP_BEGIN, step, kGroups, f32(1.0f / 65536));
	}

	std::unique_ptr<ckpt_cmd> commit(uint64_t step) { return test_cmd(CKPT_OP_COMMIT, step); }

	std::unique_ptr<ckpt_cmd> abort_(uint64_t step) { return test_cmd(CKPT_OP_ABORT, step); }

	// All chunks claimed and applied (written), none overflowed.
	void apply_all(bool written = true)
	{
		for (uint32_t c = 0; c < kChunks; c++) {
			ASSERT_EQ(ckpt_sm_claim(&sm, c), 0) << c;
			ckpt_sm_applied(&sm, c, false, written);
		}
	}

	// A snapshot of everything the machine owns, to prove "nothing changed".
	struct Snap {
		ckpt_step_sm sm;
		std::vector<uint64_t> claimed, applied;
		bool operator==(const Snap &o) const
		{
			return std::memcmp(&sm, &o.sm, sizeof(sm)) == 0 && claimed == o.claimed &&
			       applied == o.applied;
		}
	};
	Snap snap() const
	{
		Snap s;
		std::memcpy(&s.sm, &sm, sizeof(sm));
		s.claimed = claimed;
		s.applied = applied;
		return s;
	}
};

} // namespace

TEST_F(StepTest, InitFromSuperblock)
{
	EXPECT_EQ(sm.state, uint32_t(CKPT_STATE_IDLE));
	EXPECT_EQ(sm.n_chunks, kChunks);
	EXPECT_EQ(sm.n_groups, kGroups);
	EXPECT_EQ(sm.committed_step, 41u);
	EXPECT_EQ(sm.committed_slot, 1u);
	EXPECT_EQ(ckpt_sm_src_slot(&sm), 1u);
	EXPECT_EQ(ckpt_sm_dst_slot(&sm), 0u);
	for (auto w : claimed)
		EXPECT_EQ(w, 0u);
	for (auto w : applied)
		EXPECT_EQ(w, 0u);
	for (uint32_t c = 0; c < kChunks; c++)
		EXPECT_EQ(ckpt_sm_read_slot(&sm, c), 1u);
}

TEST_F(StepTest, BeginOpensStep)
{
	auto b = begin(42);
	ASSERT_EQ(ckpt_sm_begin(&sm, b.get()), 0);
	EXPECT_EQ(sm.state, uint32_t(CKPT_STATE_OPEN));
	EXPECT_EQ(sm.open_step, 42u);
	EXPECT_EQ(sm.grad_scale, b->grad_scale);
	EXPECT_EQ(std::memcmp(sm.groups, b->groups, kGroups * sizeof(ckpt_hparams)), 0);
	EXPECT_EQ(sm.chunks_claimed, 0u);
	EXPECT_EQ(sm.chunks_applied, 0u);
	EXPECT_EQ(sm.overflow, 0u);
	EXPECT_EQ(sm.last_result, uint32_t(CKPT_RESULT_NONE));
}

TEST_F(StepTest, BeginWhileOpenRejectedUnchanged)
{
	ASSERT_EQ(ckpt_sm_begin(&sm, begin(42).get()), 0);
	ASSERT_EQ(ckpt_sm_claim(&sm, 3), 0);
	ckpt_sm_applied(&sm, 3, false, true);
	Snap s = snap();
	EXPECT_EQ(ckpt_sm_begin(&sm, begin(42).get()), -CKPT_E_STATE);
	EXPECT_EQ(ckpt_sm_begin(&sm, begin(43).get()), -CKPT_E_STATE);
	EXPECT_TRUE(snap() == s);
	EXPECT_EQ(ckpt_sm_read_slot(&sm, 3), 0u);
}

TEST_F(StepTest, BeginWrongStep)
{
	Snap s = snap();
	for (uint64_t step : {0ull, 40ull, 41ull, 43ull, 1000ull, ~0ull}) {
		EXPECT_EQ(ckpt_sm_begin(&sm, begin(step).get()), -CKPT_E_STEP) << step;
		EXPECT_TRUE(snap() == s);
	}
	// committed = UINT64_MAX: no step can follow (and no wrap to 0).
	init(~0ull, 1);
	EXPECT_EQ(ckpt_sm_begin(&sm, begin(0).get()), -CKPT_E_STEP);
}

TEST_F(StepTest, BeginGroupCount)
{
	Snap s = snap();
	for (uint32_t ng : {0u, 1u, 3u, 64u, 65u, ~0u}) {
		auto b = begin(42);
		b->n_groups = ng;
		EXPECT_EQ(ckpt_sm_begin(&sm, b.get()), -CKPT_E_GROUPS) << ng;
		EXPECT_TRUE(snap() == s);
	}
}

TEST_F(StepTest, BeginHparamsMustBeFinite)
{
	Snap s = snap();
	for (uint32_t g = 0; g < kGroups; g++)
		for (auto field : kFloatFields)
			for (uint32_t bad : {kInf, kNegInf, kNaN, kSNaN, kNegNaN}) {
				auto b = begin(42);
				b->groups[g].*field = bad;
				EXPECT_EQ(ckpt_sm_begin(&sm, b.get()), -CKPT_E_HPARAM)
					<< "group " << g << " bits " << std::hex << bad;
				EXPECT_TRUE(snap() == s);
			}
	// decay = 1 - lr * weight_decay has no range but finiteness.
	for (uint32_t ok : {0u, 0x80000000u, 0x00000001u, 0x7f7fffffu, 0xff7fffffu}) {
		init(41, 1);
		auto b = begin(42);
		b->groups[0].decay = ok;
		EXPECT_EQ(ckpt_sm_begin(&sm, b.get()), 0) << std::hex << ok;
	}
	// Groups beyond n_groups are not looked at.
	init(41, 1);
	auto b = begin(42);
	b->groups[kGroups].lr = kNaN;
	EXPECT_EQ(ckpt_sm_begin(&sm, b.get()), 0);
}

// What torch.optim.AdamW refuses (lr, eps, weight_decay < 0; beta outside
// [0, 1)) and derived values no valid input gives are refused by both targets:
// E_HPARAM, nothing changed.
TEST_F(StepTest, BeginHparamsOutOfRange)
{
	const uint32_t kOne = f32(1.0f), kNegZero = 0x80000000u, kNegTiny = 0x80000001u;
	const uint32_t kAbove1 = f32(1.0000001f);
	struct Case {
		uint32_t ckpt_hparams::*field;
		const char *name;
		std::vector<uint32_t> bad, ok;
	};
	const Case cases[] = {
		{&ckpt_hparams::lr, "lr", {f32(-1e-3f), kNegTiny, f32(-1e30f)}, {0u, kNegZero, f32(10.0f)}},
		{&ckpt_hparams::beta1, "beta1", {f32(-0.1f), kNegTiny, kAbove1, f32(2.0f)},
		 {0u, kNegZero, f32(0.9f), kOne}},
		{&ckpt_hparams::beta2, "beta2", {f32(-0.5f), kAbove1, f32(1e30f)}, {0u, f32(0.999f), kOne}},
		{&ckpt_hparams::eps, "eps", {f32(-1e-8f), kNegTiny}, {0u, kNegZero, f32(1.0f)}},
		{&ckpt_hparams::weight_decay, "weight_decay", {f32(-0.01f), kNegTiny}, {0u, kNegZero, f32(5.0f)}},
		{&ckpt_hparams::one_minus_beta1, "one_minus_beta1", {0u, kNegZero, f32(-0.1f), kAbove1},
		 {0x00000001u, f32(0.1f), kOne}},
		{&ckpt_hparams::one_minus_beta2, "one_minus_beta2", {0u, kNegZero, f32(-0.001f), f32(1.5f)},
		 {f32(1e-8f), kOne}},
		{&ckpt_hparams::step_size, "step_size", {f32(-0.01f), kNegTiny}, {0u, kNegZero, f32(100.0f)}},
		{&ckpt_hparams::bc2_sqrt, "bc2_sqrt", {0u, kNegZero, f32(-0.5f), kAbove1},
		 {0x00000001u, f32(0.0447f), kOne}},
	};
	Snap s = snap();
	for (const Case &c : cases) {
		for (uint32_t bad : c.bad) {
			auto b = begin(42);
			b->groups[1].*c.field = bad;
			EXPECT_EQ(ckpt_sm_begin(&sm, b.get()), -CKPT_E_HPARAM) << c.name << " " << std::hex << bad;
			EXPECT_TRUE(snap() == s) << c.name;
			const char *field = nullptr;
			EXPECT_EQ(ckpt_hparams_check(&b->groups[1], &field), -CKPT_E_HPARAM);
			EXPECT_STREQ(field, c.name);
		}
		for (uint32_t ok : c.ok) {
			init(41, 1);
			auto b = begin(42);
			b->groups[0].*c.field = ok;
			EXPECT_EQ(ckpt_sm_begin(&sm, b.get()), 0) << c.name << " " << std::hex << ok;
		}
		init(41, 1);
	}
}

TEST_F(StepTest, BeginFlags)
{
	Snap s = snap();
	for (uint32_t bit = 1; bit < 32; bit++) {
		auto b = begin(42);
		b->groups[1].flags = CKPT_GROUP_ADAM_L2 | (1u << bit);
		EXPECT_EQ(ckpt_sm_begin(&sm, b.get()), -CKPT_E_HPARAM) << bit;
		EXPECT_TRUE(snap() == s);
	}
}

TEST_F(StepTest, BeginGradScale)
{
	Snap s = snap();
	for (uint32_t bad : {0u, 0x80000000u, f32(-1.0f), f32(-1e-30f), kInf, kNegInf, kNaN, kNegNaN,
			     0x80000001u}) {
		auto b = begin(42);
		b->grad_scale = bad;
		EXPECT_EQ(ckpt_sm_begin(&sm, b.get()), -CKPT_E_HPARAM) << std::hex << bad;
		EXPECT_TRUE(snap() == s);
	}
	for (uint32_t ok : {0x00000001u, f32(1e-30f), f32(1.0f), 0x7f7fffffu}) {
		init(41, 1);
		auto b = begin(42);
		b->grad_scale = ok;
		EXPECT_EQ(ckpt_sm_begin(&sm, b.get()), 0) << std::hex << ok;
	}
}

TEST_F(StepTest, WrongOpcodeForEntryPoint)
{
	auto b = begin(42);
	EXPECT_EQ(ckpt_sm_commit(&sm, b.get()), -CKPT_E_OPCODE);
	EXPECT_EQ(ckpt_sm_abort(&sm, b.get()), -CKPT_E_OPCODE);
	EXPECT_EQ(ckpt_sm_begin(&sm, commit(42).get()), -CKPT_E_OPCODE);
	EXPECT_EQ(sm.state, uint32_t(CKPT_STATE_IDLE));
}

TEST_F(StepTest, Claim)
{
	EXPECT_EQ(ckpt_sm_claim(&sm, 0), -CKPT_E_STATE); // IDLE
	ASSERT_EQ(ckpt_sm_begin(&sm, begin(42).get()), 0);
	Snap s = snap();
	EXPECT_EQ(ckpt_sm_claim(&sm, kChunks), -CKPT_E_RANGE);
	EXPECT_EQ(ckpt_sm_claim(&sm, ~0u), -CKPT_E_RANGE);
	EXPECT_TRUE(snap() == s);
	for (uint32_t c : {0u, 63u, 64u, 127u, 128u, kChunks - 1}) {
		EXPECT_EQ(ckpt_sm_claim(&sm, c), 0) << c;
		Snap s2 = snap();
		EXPECT_EQ(ckpt_sm_claim(&sm, c), -CKPT_E_TWICE) << c;
		EXPECT_TRUE(snap() == s2);
	}
	EXPECT_EQ(sm.chunks_claimed, 6u);
	// Claimed is not applied: reads still see the committed slot.
	EXPECT_EQ(ckpt_sm_read_slot(&sm, 0), 1u);
}

TEST_F(StepTest, AppliedAndReadSlot)
{
	ASSERT_EQ(ckpt_sm_begin(&sm, begin(42).get()), 0);
	ASSERT_EQ(ckpt_sm_claim(&sm, 5), 0);
	ASSERT_EQ(ckpt_sm_claim(&sm, 70), 0);
	ckpt_sm_applied(&sm, 5, false, true);
	EXPECT_EQ(ckpt_sm_read_slot(&sm, 5), 0u);   // latest applied: dst slot
	EXPECT_EQ(ckpt_sm_read_slot(&sm, 70), 1u);  // claimed, not yet written
	EXPECT_EQ(ckpt_sm_read_slot(&sm, 6), 1u);   // untouched
	EXPECT_EQ(ckpt_sm_read_slot(&sm, kChunks), 1u);
	EXPECT_EQ(ckpt_sm_read_slot(&sm, ~0u), 1u);
	EXPECT_EQ(sm.chunks_applied, 1u);
	// Completions that match no claim are ignored.
	Snap s = snap();
	ckpt_sm_applied(&sm, 5, false, true);   // twice
	ckpt_sm_applied(&sm, 6, false, true);   // never claimed
	ckpt_sm_applied(&sm, kChunks, true, true);
	ckpt_sm_applied(&sm, ~0u, true, true);
	EXPECT_TRUE(snap() == s);
	// Not written (skipped because the step already overflowed): counted,
	// but reads keep returning the committed slot.
	ckpt_sm_applied(&sm, 70, true, false);
	EXPECT_EQ(sm.chunks_applied, 2u);
	EXPECT_EQ(sm.overflow, 1u);
	EXPECT_EQ(ckpt_sm_read_slot(&sm, 70), 1u);
	// Once every claim completed, extra completions are ignored.
	Snap s2 = snap();
	ckpt_sm_applied(&sm, 70, false, true);
	EXPECT_TRUE(snap() == s2);
}

TEST_F(StepTest, AppliedIgnoredWhenNotOpen)
{
	Snap s = snap();
	ckpt_sm_applied(&sm, 1, true, true);
	EXPECT_TRUE(snap() == s);
}

TEST_F(StepTest, CommitFullStep)
{
	EXPECT_EQ(ckpt_sm_commit(&sm, commit(42).get()), -CKPT_E_STATE); // IDLE
	ASSERT_EQ(ckpt_sm_begin(&sm, begin(42).get()), 0);
	apply_all();
	for (uint32_t c = 0; c < kChunks; c++)
		ASSERT_EQ(ckpt_sm_read_slot(&sm, c), 0u);
	Snap s = snap();
	EXPECT_EQ(ckpt_sm_commit(&sm, commit(41).get()), -CKPT_E_STEP);
	EXPECT_EQ(ckpt_sm_commit(&sm, commit(43).get()), -CKPT_E_STEP);
	EXPECT_EQ(ckpt_sm_commit(&sm, commit(0).get()), -CKPT_E_STEP);
	EXPECT_TRUE(snap() == s);

	EXPECT_EQ(ckpt_sm_commit(&sm, commit(42).get()), CKPT_RESULT_COMMITTED);
	// Still OPEN until the host wrote the superblock.
	EXPECT_EQ(sm.state, uint32_t(CKPT_STATE_OPEN));
	EXPECT_EQ(sm.committed_step, 41u);
	EXPECT_EQ(ckpt_sm_read_slot(&sm, 0), 0u);
	ckpt_sm_committed(&sm);
	EXPECT_EQ(sm.state, uint32_t(CKPT_STATE_IDLE));
	EXPECT_EQ(sm.committed_step, 42u);
	EXPECT_EQ(sm.committed_slot, 0u);
	EXPECT_EQ(sm.steps_committed, 1u);
	EXPECT_EQ(sm.last_result, uint32_t(CKPT_RESULT_COMMITTED));
	for (uint32_t c = 0; c < kChunks; c++)
		ASSERT_EQ(ckpt_sm_read_slot(&sm, c), 0u);
	// A stray second "committed" changes nothing.
	Snap s2 = snap();
	ckpt_sm_committed(&sm);
	EXPECT_TRUE(snap() == s2);
	// Next step: 43 only, bitmaps cleared.
	EXPECT_EQ(ckpt_sm_begin(&sm, begin(42).get()), -CKPT_E_STEP);
	ASSERT_EQ(ckpt_sm_begin(&sm, begin(43).get()), 0);
	for (auto w : claimed)
		EXPECT_EQ(w, 0u);
	for (auto w : applied)
		EXPECT_EQ(w, 0u);
	EXPECT_EQ(ckpt_sm_src_slot(&sm), 0u);
	EXPECT_EQ(ckpt_sm_dst_slot(&sm), 1u);
	EXPECT_EQ(ckpt_sm_read_slot(&sm, 0), 0u);
}

TEST_F(StepTest, CommitIncompleteKeepsStepOpen)
{
	ASSERT_EQ(ckpt_sm_begin(&sm, begin(42).get()), 0);
	for (uint32_t c = 0; c + 1 < kChunks; c++) {
		ASSERT_EQ(ckpt_sm_claim(&sm, c), 0);
		ckpt_sm_applied(&sm, c, false, true);
	}
	Snap s = snap();
	EXPECT_EQ(ckpt_sm_commit(&sm, commit(42).get()), -CKPT_E_INCOMPLETE);
	EXPECT_TRUE(snap() == s);
	// Claimed but still in flight is not complete either.
	ASSERT_EQ(ckpt_sm_claim(&sm, kChunks - 1), 0);
	EXPECT_EQ(ckpt_sm_commit(&sm, commit(42).get()), -CKPT_E_INCOMPLETE);
	EXPECT_EQ(sm.state, uint32_t(CKPT_STATE_OPEN));
	ckpt_sm_applied(&sm, kChunks - 1, false, true);
	EXPECT_EQ(ckpt_sm_commit(&sm, commit(42).get()), CKPT_RESULT_COMMITTED);
	ckpt_sm_committed(&sm);
	EXPECT_EQ(sm.committed_step, 42u);
}

TEST_F(StepTest, OverflowSkipsStep)
{
	ASSERT_EQ(ckpt_sm_begin(&sm, begin(42).get()), 0);
	for (uint32_t c = 0; c < kChunks; c++) {
		ASSERT_EQ(ckpt_sm_claim(&sm, c), 0);
		// chunk 9 has an inf gradient; the host stops writing after it
		ckpt_sm_applied(&sm, c, c == 9, c < 9);
	}
	EXPECT_EQ(sm.overflow, 1u);
	EXPECT_EQ(ckpt_sm_read_slot(&sm, 3), 0u);
	EXPECT_EQ(ckpt_sm_read_slot(&sm, 9), 1u);
	EXPECT_EQ(ckpt_sm_commit(&sm, commit(42).get()), CKPT_RESULT_OVERFLOW);
	EXPECT_EQ(sm.state, uint32_t(CKPT_STATE_IDLE));
	EXPECT_EQ(sm.committed_step, 41u);
	EXPECT_EQ(sm.committed_slot, 1u);
	EXPECT_EQ(sm.steps_skipped, 1u);
	EXPECT_EQ(sm.steps_committed, 0u);
	EXPECT_EQ(sm.last_result, uint32_t(CKPT_RESULT_OVERFLOW));
	for (uint32_t c = 0; c < kChunks; c++)
		ASSERT_EQ(ckpt_sm_read_slot(&sm, c), 1u);
	// The same step number is retried.
	EXPECT_EQ(ckpt_sm_begin(&sm, begin(43).get()), -CKPT_E_STEP);
	ASSERT_EQ(ckpt_sm_begin(&sm, begin(42).get()), 0);
	EXPECT_EQ(sm.overflow, 0u);
	apply_all();
	EXPECT_EQ(ckpt_sm_commit(&sm, commit(42).get()), CKPT_RESULT_COMMITTED);
	ckpt_sm_committed(&sm);
	EXPECT_EQ(sm.committed_step, 42u);
	EXPECT_EQ(sm.steps_skipped, 1u);
	EXPECT_EQ(sm.steps_committed, 1u);
}

TEST_F(StepTest, Abort)
{
	EXPECT_EQ(ckpt_sm_abort(&sm, abort_(0).get()), -CKPT_E_STATE); // IDLE
	EXPECT_EQ(ckpt_sm_abort(&sm, abort_(42).get()), -CKPT_E_STATE);
	ASSERT_EQ(ckpt_sm_begin(&sm, begin(42).get()), 0);
	ASSERT_EQ(ckpt_sm_claim(&sm, 1), 0);
	ckpt_sm_applied(&sm, 1, false, true);
	Snap s = snap();
	EXPECT_EQ(ckpt_sm_abort(&sm, abort_(41).get()), -CKPT_E_STEP);
	EXPECT_EQ(ckpt_sm_abort(&sm, abort_(43).get()), -CKPT_E_STEP);
	EXPECT_TRUE(snap() == s);
	EXPECT_EQ(ckpt_sm_abort(&sm, abort_(42).get()), 0);
	EXPECT_EQ(sm.state, uint32_t(CKPT_STATE_IDLE));
	EXPECT_EQ(sm.steps_aborted, 1u);
	EXPECT_EQ(sm.last_result, uint32_t(CKPT_RESULT_ABORTED));
	EXPECT_EQ(sm.committed_step, 41u);
	EXPECT_EQ(ckpt_sm_read_slot(&sm, 1), 1u);
	// A late completion after the abort is ignored.
	Snap s2 = snap();
	ckpt_sm_applied(&sm, 2, true, true);
	EXPECT_TRUE(snap() == s2);
	// Step 0 aborts whatever is open; the same step can start over.
	ASSERT_EQ(ckpt_sm_begin(&sm, begin(42).get()), 0);
	EXPECT_EQ(ckpt_sm_claim(&sm, 1), 0); // bitmaps were cleared by BEGIN
	EXPECT_EQ(ckpt_sm_abort(&sm, abort_(0).get()), 0);
	EXPECT_EQ(sm.steps_aborted, 2u);
}

TEST_F(StepTest, FailedMode)
{
	ASSERT_EQ(ckpt_sm_begin(&sm, begin(42).get()), 0);
	ASSERT_EQ(ckpt_sm_claim(&sm, 1), 0);
	ckpt_sm_applied(&sm, 1, false, true);
	ckpt_sm_fail(&sm, -5);
	EXPECT_EQ(sm.state, uint32_t(CKPT_STATE_FAILED));
	EXPECT_EQ(sm.first_io_error, 5u);
	EXPECT_EQ(sm.io_errors, 1u);
	ckpt_sm_fail(&sm, 28);
	EXPECT_EQ(sm.first_io_error, 5u); // the first one sticks
	EXPECT_EQ(sm.io_errors, 2u);
	EXPECT_EQ(sm.committed_step, 41u);
	// Reads serve the committed state.
	EXPECT_EQ(ckpt_sm_read_slot(&sm, 1), 1u);
	Snap s = snap();
	EXPECT_EQ(ckpt_sm_begin(&sm, begin(42).get()), -CKPT_E_FAILED);
	EXPECT_EQ(ckpt_sm_claim(&sm, 2), -CKPT_E_FAILED);
	EXPECT_EQ(ckpt_sm_commit(&sm, commit(42).get()), -CKPT_E_FAILED);
	EXPECT_EQ(ckpt_sm_abort(&sm, abort_(0).get()), -CKPT_E_FAILED);
	ckpt_sm_applied(&sm, 2, false, true);
	ckpt_sm_committed(&sm);
	EXPECT_TRUE(snap() == s);
}

TEST_F(StepTest, FailWithoutErrno)
{
	ckpt_sm_fail(&sm, 0);
	EXPECT_EQ(sm.state, uint32_t(CKPT_STATE_FAILED));
	EXPECT_EQ(sm.first_io_error, 5u); // EIO
	EXPECT_EQ(ckpt_sm_begin(&sm, begin(42).get()), -CKPT_E_FAILED);
}

TEST_F(StepTest, CommitFailedKeepsOldCommit)
{
	ASSERT_EQ(ckpt_sm_begin(&sm, begin(42).get()), 0);
	apply_all();
	ASSERT_EQ(ckpt_sm_commit(&sm, commit(42).get()), CKPT_RESULT_COMMITTED);
	ckpt_sm_commit_failed(&sm, 5);
	EXPECT_EQ(sm.state, uint32_t(CKPT_STATE_FAILED));
	EXPECT_EQ(sm.committed_step, 41u);
	EXPECT_EQ(sm.committed_slot, 1u);
	EXPECT_EQ(sm.steps_committed, 0u);
	EXPECT_EQ(sm.first_io_error, 5u);
	for (uint32_t c = 0; c < kChunks; c++)
		ASSERT_EQ(ckpt_sm_read_slot(&sm, c), 1u);
	EXPECT_EQ(ckpt_sm_begin(&sm, begin(42).get()), -CKPT_E_FAILED);
}

TEST_F(StepTest, RejectedAndStatus)
{
	ckpt_sm_rejected(&sm, -CKPT_E_CRC);
	EXPECT_EQ(sm.last_error, uint32_t(CKPT_E_CRC));
	EXPECT_EQ(sm.last_result, uint32_t(CKPT_RESULT_REJECTED));
	EXPECT_EQ(sm.commands_rejected, 1u);
	ckpt_sm_rejected(&sm, CKPT_E_STEP);
	EXPECT_EQ(sm.last_error, uint32_t(CKPT_E_STEP));
	EXPECT_EQ(sm.commands_rejected, 2u);

	auto st = std::make_unique<ckpt_status>();
	ckpt_sm_status(&sm, sb.get(), st.get());
	EXPECT_EQ(st->state, uint32_t(CKPT_STATE_IDLE));
	EXPECT_EQ(st->last_result, uint32_t(CKPT_RESULT_REJECTED));
	EXPECT_EQ(st->last_error, uint32_t(CKPT_E_STEP));
	EXPECT_EQ(st->commands_rejected, 2u);
	EXPECT_EQ(st->committed_step, 41u);
	EXPECT_EQ(st->committed_slot, 1u);
	EXPECT_EQ(st->open_step, 0u);
	EXPECT_EQ(std::memcmp(&st->geo, &sb->geo, sizeof(sb->geo)), 0);
	EXPECT_EQ(st->blob_len, 5u);
	EXPECT_EQ(std::memcmp(st->blob, "hello", 5), 0);

	// An accepted command clears the rejection from the status.
	ASSERT_EQ(ckpt_sm_begin(&sm, begin(42).get()), 0);
	ASSERT_EQ(ckpt_sm_claim(&sm, 0), 0);
	ckpt_sm_applied(&sm, 0, true, true);
	ckpt_sm_status(&sm, sb.get(), st.get());
	EXPECT_EQ(st->state, uint32_t(CKPT_STATE_OPEN));
	EXPECT_EQ(st->last_result, uint32_t(CKPT_RESULT_NONE));
	EXPECT_EQ(st->last_error, 0u);
	EXPECT_EQ(st->open_step, 42u);
	EXPECT_EQ(st->chunks_done, 1u);
	EXPECT_EQ(st->overflow, 1u);
	EXPECT_EQ(st->commands_rejected, 2u);

	// And it survives the status page encoding.
	std::vector<uint8_t> page(CKPT_BLOCK);
	ckpt_status_encode(st.get(), page.data());
	auto back = std::make_unique<ckpt_status>();
	ASSERT_EQ(ckpt_status_decode(page.data(), back.get()), 0);
	EXPECT_EQ(std::memcmp(back.get(), st.get(), sizeof(ckpt_status)), 0);

	ckpt_sm_status(&sm, nullptr, st.get());
	EXPECT_EQ(st->blob_len, 0u);
	EXPECT_EQ(st->open_step, 42u);
}

TEST_F(StepTest, ManyStepsAlternateSlots)
{
	init(0, 0);
	std::mt19937 rng(5);
	uint64_t committed = 0, skipped = 0, aborted = 0;
	for (int i = 0; i < 40; i++) {
		uint64_t t = committed + 1;
		ASSERT_EQ(ckpt_sm_begin(&sm, begin(t).get()), 0);
		std::vector<uint32_t> order(kChunks);
		for (uint32_t c = 0; c < kChunks; c++)
			order[c] = c;
		std::shuffle(order.begin(), order.end(), rng);
		int kind = int(rng() % 4); // 0,1 commit; 2 overflow; 3 abort
		for (uint32_t c : order) {
			ASSERT_EQ(ckpt_sm_claim(&sm, c), 0);
			ckpt_sm_applied(&sm, c, kind == 2 && c == order[kChunks / 2], true);
			ASSERT_EQ(ckpt_sm_read_slot(&sm, c), uint32_t((committed + 1) & 1));
		}
		if (kind == 3) {
			ASSERT_EQ(ckpt_sm_abort(&sm, abort_(t).get()), 0);
			aborted++;
		} else if (kind == 2) {
			ASSERT_EQ(ckpt_sm_commit(&sm, commit(t).get()), CKPT_RESULT_OVERFLOW);
			skipped++;
		} else {
			ASSERT_EQ(ckpt_sm_commit(&sm, commit(t).get()), CKPT_RESULT_COMMITTED);
			ckpt_sm_committed(&sm);
			committed = t;
		}
		ASSERT_EQ(sm.committed_step, committed);
		// Step t is always written to slot t % 2 (design section 4).
		ASSERT_EQ(sm.committed_slot, uint32_t(committed & 1));
		ASSERT_EQ(sm.state, uint32_t(CKPT_STATE_IDLE));
	}
	EXPECT_EQ(sm.steps_committed, committed);
	EXPECT_EQ(sm.steps_skipped, skipped);
	EXPECT_EQ(sm.steps_aborted, aborted);
}

// ---------------------------------------------------------------- coverage bitmaps

TEST(Cover, RangeChecks)
{
	std::vector<uint64_t> bits(ckpt_bitmap_words(128), 0);
	EXPECT_EQ(ckpt_cover_add(bits.data(), 128, 128, 1), -CKPT_E_RANGE);
	EXPECT_EQ(ckpt_cover_add(bits.data(), 128, 0, 129), -CKPT_E_RANGE);
	EXPECT_EQ(ckpt_cover_add(bits.data(), 128, 100, 29), -CKPT_E_RANGE);
	EXPECT_EQ(ckpt_cover_add(bits.data(), 128, ~0u, 2), -CKPT_E_RANGE); // u32 wrap
	EXPECT_EQ(ckpt_cover_add(bits.data(), 128, 1, ~0u), -CKPT_E_RANGE);
	EXPECT_EQ(ckpt_cover_add(bits.data(), 128, 129, 0), -CKPT_E_RANGE);
	for (auto w : bits)
		EXPECT_EQ(w, 0u);
	EXPECT_EQ(ckpt_cover_add(bits.data(), 128, 128, 0), 0);
	EXPECT_EQ(ckpt_cover_add(bits.data(), 128, 0, 128), 0);
	EXPECT_TRUE(ckpt_cover_full(bits.data(), 128));
}

TEST(Cover, OverlapRejectedUnchanged)
{
	const uint32_t n = 200;
	std::vector<uint64_t> bits(ckpt_bitmap_words(n), 0);
	ASSERT_EQ(ckpt_cover_add(bits.data(), n, 60, 10), 0); // 60..69 across words
	auto before = bits;
	EXPECT_EQ(ckpt_cover_add(bits.data(), n, 0, 61), -CKPT_E_TWICE);
	EXPECT_EQ(ckpt_cover_add(bits.data(), n, 69, 100), -CKPT_E_TWICE);
	EXPECT_EQ(ckpt_cover_add(bits.data(), n, 0, n), -CKPT_E_TWICE);
	EXPECT_EQ(ckpt_cover_add(bits.data(), n, 65, 1), -CKPT_E_TWICE);
	EXPECT_EQ(bits, before);
	EXPECT_EQ(ckpt_cover_add(bits.data(), n, 0, 60), 0);
	EXPECT_EQ(ckpt_cover_add(bits.data(), n, 70, 130), 0);
	EXPECT_TRUE(ckpt_cover_full(bits.data(), n));
}

TEST(Cover, RandomPartitionsMatchReference)
{
	std::mt19937_64 rng(9);
	for (uint32_t n : {1u, 2u, 63u, 64u, 65u, 127u, 128u, 129u, 256u, 1000u, 8192u}) {
		for (int iter = 0; iter < 20; iter++) {
			std::vector<uint64_t> bits(ckpt_bitmap_words(n), 0);
			std::vector<bool> ref(n, false);
			uint32_t covered = 0;
			EXPECT_EQ(ckpt_cover_full(bits.data(), n), false);
			for (int k = 0; k < 400 && covered < n; k++) {
				uint32_t first = uint32_t(rng() % n);
				uint32_t count = uint32_t(rng() % std::min<uint32_t>(n - first, 150) + 1);
				bool overlap = false;
				for (uint32_t i = first; i < first + count; i++)
					overlap |= ref[i];
				auto before = bits;
				int r = ckpt_cover_add(bits.data(), n, first, count);
				if (overlap) {
					ASSERT_EQ(r, -CKPT_E_TWICE);
					ASSERT_EQ(bits, before);
				} else {
					ASSERT_EQ(r, 0);
					for (uint32_t i = first; i < first + count; i++)
						ref[i] = true;
					covered += count;
				}
				for (uint32_t i = 0; i < n; i++)
					ASSERT_EQ(bool((bits[i >> 6] >> (i & 63)) & 1), bool(ref[i]));
				ASSERT_EQ(ckpt_cover_full(bits.data(), n), covered == n);
			}
			// Fill the holes one sector at a time.
			for (uint32_t i = 0; i < n; i++)
				if (!ref[i]) {
					ASSERT_FALSE(ckpt_cover_full(bits.data(), n));
					ASSERT_EQ(ckpt_cover_add(bits.data(), n, i, 1), 0);
				}
			ASSERT_TRUE(ckpt_cover_full(bits.data(), n));
		}
	}
	// Bits beyond n_sectors in the last word do not matter.
	std::vector<uint64_t> bits(1, (1ull << 10) - 1);
	EXPECT_TRUE(ckpt_cover_full(bits.data(), 10));
	bits[0] = ~0ull ^ 1;
	EXPECT_FALSE(ckpt_cover_full(bits.data(), 10));
	EXPECT_TRUE(ckpt_cover_full(bits.data(), 0));
}
