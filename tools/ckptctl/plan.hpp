// SPDX-License-Identifier: MIT
// ckptctl plan: the capacity model of docs/performance.md ("Capacity
// model"): memory per rank and bytes moved per step for mixed-precision AdamW
// with its state in GPU memory, offloaded to host memory, and on a dm-ckpt
// device. Pure arithmetic, no device touched.
#pragma once

#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

namespace ckptctl {

struct PlanArgs {
	double params = 0;	// the model's params (a whole number)
	uint32_t gpus = 1;	// GPUs (ranks) per node
	uint32_t nodes = 1;
	bool state_8bit = false;	// moments as blockwise 8-bit values
	bool master_bf16 = false;	// bf16 masters (needs state_8bit)
};

// One way to keep the optimizer state: bytes per rank (memory, per step).
struct PlanCase {
	double gpu = 0;		// GPU memory per rank
	double host = 0;	// host memory per rank
	double pcie = 0;	// host <-> GPU bytes per rank per step
	double network = 0;	// bytes out of each node per step
	double device_read = 0;	// backing device bytes per rank per step
	double device_write = 0;
	double device_size = 0;	// backing device capacity per rank
	double checkpoint = 0;	// bytes written per rank to save the state once
};

struct Plan {
	PlanArgs args;
	double ranks = 1, shard = 0;	// ranks = gpus x nodes; shard = params / ranks
	PlanCase gpu, offload, ckpt;
};

// Checks the arguments (throws ckptctl::Error naming the bad one) and
// computes the plan.
Plan plan_model(const PlanArgs &a);
// --params as given on the command line: a whole number of params, finite,
// from 1 to 1e14 ("7e9", "7000000000"); throws ckptctl::Error otherwise.
double parse_params(const std::string &text);
// --gpus or --nodes (opt): a whole number from 1 to 65536.
uint32_t parse_ranks(const std::string &opt, const std::string &text);
nlohmann::json plan_json(const Plan &p);
std::string plan_text(const Plan &p);

} // namespace ckptctl
