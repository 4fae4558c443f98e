// SPDX-License-Identifier: MIT
// ckptctl plan's capacity model against cases computed by hand from
// docs/performance.md ("Capacity model"), and the arguments it refuses.
#include <gtest/gtest.h>

#include "plan.hpp"
#include "fail.hpp"

using namespace ckptctl;

namespace {

Plan run(double params, uint32_t gpus, uint32_t nodes, bool q8 = false)
{
	PlanArgs a;
	a.params = params;
	a.gpus = gpus;
	a.nodes = nodes;
	a.state_8bit = q8;
	return plan_model(a);
}

// the engine's fixed buffers: 4 workers x 3 chunks x (read + write) x
// (4096 + 12 x 65536) B, and 64 MiB of staging
constexpr double engine = 4 * 3 * 2 * (4096 + 786432) + 67108864.0;

} // namespace

// 7e9 params on one GPU, fp32 state: the textbook 16 B/param in GPU memory.
TEST(Plan, OneGpuFp32)
{
	const Plan p = run(7e9, 1, 1);
	EXPECT_DOUBLE_EQ(p.ranks, 1);
	EXPECT_DOUBLE_EQ(p.gpu.gpu, 112e9);	// 2 + 2 + 4 + 4 + 4 B
	EXPECT_DOUBLE_EQ(p.gpu.host, 0);
	EXPECT_DOUBLE_EQ(p.gpu.pcie, 0);
	EXPECT_DOUBLE_EQ(p.gpu.network, 0);
	EXPECT_DOUBLE_EQ(p.gpu.checkpoint, 84e9);
	EXPECT_DOUBLE_EQ(p.offload.gpu, 28e9);
	EXPECT_DOUBLE_EQ(p.offload.host, 112e9);	// 12 B state + 2 + 2 B pinned buffers
	EXPECT_DOUBLE_EQ(p.offload.pcie, 28e9);
	EXPECT_DOUBLE_EQ(p.offload.device_read + p.offload.device_write, 0);
	EXPECT_DOUBLE_EQ(p.ckpt.gpu, 28e9);
	EXPECT_DOUBLE_EQ(p.ckpt.host, 28e9 + engine);
	EXPECT_DOUBLE_EQ(p.ckpt.pcie, 28e9);
	// 12 B record + 4096/65536 B header + 2 B params, each way
	EXPECT_DOUBLE_EQ(p.ckpt.device_read, 98.4375e9);
	EXPECT_DOUBLE_EQ(p.ckpt.device_write, 98.4375e9);
	EXPECT_DOUBLE_EQ(p.ckpt.device_size, 196.875e9);
	EXPECT_DOUBLE_EQ(p.ckpt.checkpoint, 0);
}

// 8 GPUs on each of 4 nodes: 32 ranks of 218.75e6 params.
TEST(Plan, ShardedFp32)
{
	const Plan p = run(7e9, 8, 4);
	EXPECT_DOUBLE_EQ(p.ranks, 32);
	EXPECT_DOUBLE_EQ(p.shard, 218.75e6);
	EXPECT_DOUBLE_EQ(p.gpu.gpu, 28e9 + 2.625e9);
	EXPECT_DOUBLE_EQ(p.offload.host, 3.5e9);
	EXPECT_DOUBLE_EQ(p.offload.pcie, 875e6);
	// reduce-scatter + all-gather, 2 B each, 3/4 of the model leaves a node
	EXPECT_DOUBLE_EQ(p.gpu.network, 21e9);
	EXPECT_DOUBLE_EQ(p.offload.network, 21e9);
	EXPECT_DOUBLE_EQ(p.ckpt.network, 21e9);
	EXPECT_DOUBLE_EQ(p.ckpt.device_write, 3076171875);
	EXPECT_DOUBLE_EQ(p.gpu.checkpoint, 2.625e9);
}

// 8-bit moments: 1 B each plus an fp32 scale per 256 of each.
TEST(Plan, EightBit)
{
	const Plan p = run(1e9, 1, 1, true);
	EXPECT_DOUBLE_EQ(p.gpu.gpu, 4e9 + 6.03125e9);
	EXPECT_DOUBLE_EQ(p.offload.host, 6.03125e9 + 4e9);
	EXPECT_DOUBLE_EQ(p.ckpt.device_read, 8.09375e9);
	EXPECT_DOUBLE_EQ(p.ckpt.device_size, 16.1875e9);
}

TEST(Plan, Json)
{
	const auto j = plan_json(run(7e9, 1, 1));
	EXPECT_EQ(j["params"], 7000000000ULL);
	EXPECT_EQ(j["state"], "fp32");
	EXPECT_EQ(j["gpu_adamw"]["gpu_bytes"], 112000000000ULL);
	EXPECT_EQ(j["host_offload"]["host_bytes"], 112000000000ULL);
	EXPECT_EQ(j["dm_ckpt"]["device_read_bytes_per_step"], 98437500000ULL);
	EXPECT_EQ(j["dm_ckpt"]["host_bytes"], 28000000000ULL + 86081536ULL);
}

TEST(Plan, ParamsParsed)
{
	EXPECT_DOUBLE_EQ(parse_params("7e9"), 7e9);
	EXPECT_DOUBLE_EQ(parse_params("7000000000"), 7e9);
	EXPECT_DOUBLE_EQ(parse_params("1.5e3"), 1500);
	EXPECT_EQ(parse_ranks("--gpus", "8"), 8U);
}

TEST(Plan, HostileArgumentsRefused)
{
	for (const char *bad : {"", "-1", "0", "nan", "NaN", "inf", "-inf", "1e30", "1e999", "abc", "7e9x", " 7e9",
				"1.5", "0x10p", "7e9 "})
		EXPECT_THROW(parse_params(bad), Error) << "'" << bad << "'";
	for (const char *bad : {"", "0", "-3", "65537", "1e30", "nan", "two", "2.5"})
		EXPECT_THROW(parse_ranks("--gpus", bad), Error) << "'" << bad << "'";
	EXPECT_THROW(run(4, 8, 1), Error);	// fewer params than ranks
	EXPECT_THROW(run(std::nan(""), 1, 1), Error);
	EXPECT_THROW(run(1e30, 1, 1), Error);
	EXPECT_THROW(run(1e9, 0, 1), Error);
	try {
		parse_params("1e30");
		FAIL();
	} catch (const Error &e) {
		EXPECT_STREQ(e.what(), "--params: 1e30 is out of range (1 to 1e+14)");
	}
}
