// SPDX-License-Identifier: MIT
// ckptctl plan: the capacity model, term for term as docs/performance.md
// ("Capacity model") writes it.
#include "plan.hpp"

#include <cerrno>
#include <cmath>
#include <cstdlib>

#include <fmt/format.h>

#include "fail.hpp"

namespace ckptctl {

namespace {

// Bytes per param of each thing the model counts.
constexpr double lo = 2;		// an fp16/bf16 param or gradient
constexpr double master = 4;		// the fp32 master param
constexpr double master_bf16 = 2;	// a bf16 master (stochastic rounding)
constexpr double moments_fp32 = 8;	// exp_avg and exp_avg_sq, fp32
// 8-bit moments: one byte each plus one fp32 scale per block of 256 of each
constexpr double quant_block = 256;
constexpr double moments_8bit = 2 + 2 * 4 / quant_block;
// a dm-ckpt state record: a 4 KiB header per chunk of 65536 params (the
// default chunk size)
constexpr double record_header = 4096.0 / 65536;
// the userspace engine's own buffers, whatever the model: at most 4 workers x
// 3 chunks in flight, each read and written (header + 12 B/param), and the
// default 64 MiB for partially written chunks
constexpr double engine_buffers = 4 * 3 * 2 * (4096 + 12 * 65536.0) + (64 << 20);

constexpr double max_params = 1e14;
constexpr double max_ranks_per_axis = 65536;

// A whole number from lo to hi given to option opt.
double whole_number(const std::string &opt, const std::string &text, double min, double max)
{
	const char *s = text.c_str();
	char *end = nullptr;
	errno = 0;
	const double v = std::strtod(s, &end);
	if (text.empty() || end == s || *end != '\0' || std::isspace(static_cast<unsigned char>(text[0])))
		fail(CKPT_E_INVAL, "{}: '{}' is not a number", opt, text);
	if (!std::isfinite(v))
		fail(CKPT_E_INVAL, "{}: {} is not a finite number", opt, text);
	if (errno == ERANGE || v < min || v > max)
		fail(CKPT_E_INVAL, "{}: {} is out of range ({:g} to {:g})", opt, text, min, max);
	if (v != std::floor(v))
		fail(CKPT_E_INVAL, "{}: {} is not a whole number", opt, text);
	return v;
}

} // namespace

double parse_params(const std::string &text) { return whole_number("--params", text, 1, max_params); }

uint32_t parse_ranks(const std::string &opt, const std::string &text)
{
	return static_cast<uint32_t>(whole_number(opt, text, 1, max_ranks_per_axis));
}

Plan plan_model(const PlanArgs &a)
{
	if (!std::isfinite(a.params) || a.params < 1 || a.params > max_params || a.params != std::floor(a.params))
		fail(CKPT_E_INVAL, "--params: {} is not a whole number from 1 to {:g}", a.params, max_params);
	if (a.gpus < 1 || a.gpus > max_ranks_per_axis || a.nodes < 1 || a.nodes > max_ranks_per_axis)
		fail(CKPT_E_INVAL, "--gpus and --nodes must be from 1 to {:g}", max_ranks_per_axis);
	if (a.master_bf16 && !a.state_8bit)
		fail(CKPT_E_INVAL, "--master bf16 needs --state 8bit (the one combination the format has)");
	Plan p;
	p.args = a;
	p.ranks = double(a.gpus) * a.nodes;
	if (p.ranks > a.params)
		fail(CKPT_E_INVAL, "{:g} ranks for {:g} params: at least one param per rank", p.ranks, a.params);
	const double P = a.params, S = P / p.ranks, M = a.nodes;
	p.shard = S;
	const double state = (a.master_bf16 ? master_bf16 : master) +
			     (a.state_8bit ? moments_8bit : moments_fp32);
	// Every case keeps the low-precision params and gradients of the whole
	// model on each GPU (ZeRO stage 1) and exchanges them with a
	// hierarchical reduce-scatter of gradients and all-gather of params:
	// each node sends (M-1)/M of the model's low-precision bytes twice.
	const double network = 2 * lo * P * (M - 1) / M;

	// mixed-precision AdamW on the GPU, state sharded over the ranks
	p.gpu.gpu = 2 * lo * P + state * S;
	p.gpu.network = network;
	p.gpu.checkpoint = state * S;
	p.gpu.device_size = state * S;

	// host offload: the rank's shard of state in host memory, its gradients
	// down and its new params up over PCIe through pinned buffers
	p.offload.gpu = 2 * lo * P;
	p.offload.host = state * S + 2 * lo * S;
	p.offload.pcie = 2 * lo * S;
	p.offload.network = network;
	p.offload.checkpoint = state * S;
	p.offload.device_size = state * S;

	// dm-ckpt: the same GPU and PCIe side as host offload; the state is on
	// the device, every step reads the committed slot's records and writes
	// the other slot's and the new low-precision params, which the trainer
	// reads back; every step is a checkpoint
	p.ckpt.gpu = 2 * lo * P;
	p.ckpt.host = 2 * lo * S + engine_buffers;
	p.ckpt.pcie = 2 * lo * S;
	p.ckpt.network = network;
	p.ckpt.device_read = (state + record_header + lo) * S;
	p.ckpt.device_write = (state + record_header + lo) * S;
	p.ckpt.device_size = 2 * (state + record_header + lo) * S;
	return p;
}

namespace {

uint64_t whole(double bytes) { return static_cast<uint64_t>(std::llround(bytes)); }

nlohmann::json case_json(const PlanCase &c)
{
	return {{"gpu_bytes", whole(c.gpu)},
		{"host_bytes", whole(c.host)},
		{"pcie_bytes_per_step", whole(c.pcie)},
		{"network_bytes_per_step_per_node", whole(c.network)},
		{"device_read_bytes_per_step", whole(c.device_read)},
		{"device_write_bytes_per_step", whole(c.device_write)},
		{"device_bytes", whole(c.device_size)},
		{"checkpoint_bytes", whole(c.checkpoint)}};
}

// Decimal units, as disks and links are sold: 28.0 GB.
std::string bytes(double b)
{
	if (b < 1)
		return "0";
	static const char *unit[] = {"B", "kB", "MB", "GB", "TB", "PB", "EB"};
	int u = 0;
	while (b >= 999.95 && u < 6) {
		b /= 1000;
		u++;
	}
	return u == 0 ? fmt::format("{:.0f} B", b) : fmt::format("{:.1f} {}", b, unit[u]);
}

} // namespace

nlohmann::json plan_json(const Plan &p)
{
	return {{"params", whole(p.args.params)},
		{"gpus_per_node", p.args.gpus},
		{"nodes", p.args.nodes},
		{"ranks", whole(p.ranks)},
		{"params_per_rank", whole(p.shard)},
		{"state", p.args.state_8bit ? "8bit" : "fp32"},
		{"master", p.args.master_bf16 ? "bf16" : "fp32"},
		{"gpu_adamw", case_json(p.gpu)},
		{"host_offload", case_json(p.offload)},
		{"dm_ckpt", case_json(p.ckpt)}};
}

std::string plan_text(const Plan &p)
{
	std::string out = fmt::format("{:.0f} params, {} node{} x {} GPU{} = {:.0f} rank{} of {:.0f} params; {} optimizer state\n"
				      "(model: docs/performance.md, \"Capacity model\"; activations not counted)\n\n",
				      p.args.params, p.args.nodes, p.args.nodes == 1 ? "" : "s", p.args.gpus,
				      p.args.gpus == 1 ? "" : "s", p.ranks, p.ranks == 1 ? "" : "s", p.shard,
				      p.args.master_bf16 ? "bf16 masters, 8-bit moments" :
				      p.args.state_8bit ? "8-bit moments" : "fp32");
	out += fmt::format("{:<34}{:>12}{:>14}{:>12}\n", "", "GPU AdamW", "host offload", "dm-ckpt");
	const auto row = [&](const char *what, double PlanCase::*f) {
		out += fmt::format("{:<34}{:>12}{:>14}{:>12}\n", what, bytes(p.gpu.*f), bytes(p.offload.*f),
				   bytes(p.ckpt.*f));
	};
	row("GPU memory per rank", &PlanCase::gpu);
	row("host memory per rank", &PlanCase::host);
	row("PCIe per rank per step", &PlanCase::pcie);
	row("network per node per step", &PlanCase::network);
	row("device reads per rank per step", &PlanCase::device_read);
	row("device writes per rank per step", &PlanCase::device_write);
	row("device capacity per rank", &PlanCase::device_size);
	row("checkpoint writes per rank", &PlanCase::checkpoint);
	out += "\n(dm-ckpt: every step is a checkpoint, so it writes none besides)\n";
	return out;
}

} // namespace ckptctl
