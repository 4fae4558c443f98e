// SPDX-License-Identifier: MIT
// Shared by the tests of the status counters (the core's struct ckpt_counters,
// the C ABI's struct ckpt_device_status): both hold CKPT_STATUS_FIELDS.
#pragma once

#include <cstdint>

#include <gtest/gtest.h>

#include "ckpt_abi.h"

// Every CKPT_STATUS_FIELDS member of got equals want's; a failure names it.
template <typename Got, typename Want> void expect_counters(const Got &got, const Want &want)
{
#define CKPT_TEST_EXPECT_FIELD(f, kind) EXPECT_EQ(uint64_t(got.f), uint64_t(want.f)) << #f;
	CKPT_STATUS_FIELDS(CKPT_TEST_EXPECT_FIELD)
#undef CKPT_TEST_EXPECT_FIELD
}
