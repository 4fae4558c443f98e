// SPDX-License-Identifier: MIT
// ckpt-trace: replays a seeded training trace through libckpt. The same seed
// gives the same command stream on any target, so the backing images the
// userspace engine and the kernel target leave behind must be identical.
//
// The trace exercises what a trainer does and a little more: several groups
// (AdamW and Adam-L2, changing lr), fp16 with a loss scale or bf16, tensors
// not aligned to chunks, gradients written in sector pieces in random order
// (partial chunks), PARAM reads between writes, an overflow step now and then,
// an aborted attempt now and then.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include "device.hpp"
#include "error.hpp"
#include "format.hpp"

extern "C" {
#include "ckpt_update.h"
}

namespace {

struct Rng {	// splitmix64: tiny, portable, the same everywhere
	uint64_t s;
	uint64_t next()
	{
		uint64_t z = (s += 0x9e3779b97f4a7c15ull);
		z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
		z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
		return z ^ (z >> 31);
	}
	uint64_t below(uint64_t n) { return next() % n; }
	float uniform() { return static_cast<float>(next() >> 40) / static_cast<float>(1u << 24); }
};

uint32_t bits(float f)
{
	uint32_t u;
	std::memcpy(&u, &f, 4);
	return u;
}

ckpt::Layout trace_layout(uint64_t seed, uint64_t params)
{
	Rng r{seed ^ 0x1a7};
	ckpt::Layout l;
	uint64_t left = params;
	for (int i = 0; left > 0; i++) {
		uint64_t cols = 1 + r.below(300);
		uint64_t rows = std::max<uint64_t>(1, std::min(left, 1 + r.below(params / 4 + 1)) / cols);
		uint32_t group = static_cast<uint32_t>(r.below(3));
		l.add(fmt::format("t{}.w", i), {rows, cols}, group);
		left -= std::min(left, rows * cols);
		if (r.below(2)) {
			l.add(fmt::format("t{}.b", i), {cols}, 1);
			left -= std::min(left, cols);
		}
	}
	return l;
}

std::vector<ckpt::GroupHparams> trace_hparams(uint32_t n_groups, uint64_t step)
{
	std::vector<ckpt::GroupHparams> g(n_groups);
	const double schedule = 0.5 * (1.0 + std::cos(static_cast<double>(step) * 0.05));
	for (uint32_t i = 0; i < n_groups; i++) {
		g[i].lr = (1e-3 + 5e-4 * i) * (0.1 + 0.9 * schedule);
		g[i].beta1 = 0.9 - 0.05 * (i % 2);
		g[i].beta2 = 0.999 - 0.004 * (i % 3);
		g[i].eps = 1e-8;
		g[i].weight_decay = i == 1 ? 0.0 : 0.05;
		g[i].adam_l2 = i == 2;
	}
	return g;
}

} // namespace

int main(int argc, char **argv)
{
	CLI::App app{"ckpt-trace: replay a seeded training trace through a dm-ckpt device."};
	std::string dev, dtype = "bf16";
	uint64_t seed = 1, steps = 200, params = 1u << 20;
	uint32_t chunk_params = 16384;
	bool do_format = false;
	ckpt::EngineOptions engine;
	app.add_option("device", dev, "backing file or device")->required();
	app.add_option("--seed", seed, "trace seed");
	app.add_option("--steps", steps, "steps to commit");
	app.add_flag("--format", do_format, "format the device with the trace's layout first");
	app.add_option("--params", params, "about this many params (with --format)");
	app.add_option("--dtype", dtype, "bf16 or fp16 (with --format)")->check(CLI::IsMember({"bf16", "fp16"}));
	app.add_option("--chunk-params", chunk_params, "params per chunk (with --format)");
	uint32_t piece = 0;
	app.add_option("--piece-bytes", piece,
		       "gradient pieces are multiples of this (default: the device's block size;\n"
		       "give the same on both targets of a comparison)");
	app.add_option("--workers", engine.workers, "engine worker threads (0: one per CPU)");
	app.add_option("--depth", engine.depth, "engine chunks in flight per worker");
	CLI11_PARSE(app, argc, argv);

	try {
		if (do_format) {
			ckpt::FormatOptions opts;
			opts.dtype = ckpt::parse_dtype(dtype);
			opts.chunk_params = chunk_params;
			opts.force = true;	// --format asks for it: the scripts reformat their images
			ckpt::format(dev, trace_layout(seed, params), opts);
		}
		auto d = ckpt::Device::open(dev, engine);
		const auto &tensors = d->manifest().tensors();
		const uint32_t dt = d->geometry().dtype;
		const uint64_t cp = d->layout().chunk_params;
		if (!piece)
			piece = d->block_size();
		if (piece % d->block_size() || CKPT_BLOCK % piece)
			ckpt::fail(CKPT_E_ALIGN, "--piece-bytes {} must be a multiple of the block size {} and divide {}",
				   piece, d->block_size(), CKPT_BLOCK);
		Rng r{seed};

		// The initial masters belong to the format: a device formatted
		// elsewhere (the kernel target's backing device) already has them.
		if (do_format) {
			std::vector<std::vector<float>> init;
			std::vector<std::pair<std::string, std::span<const float>>> spans;
			for (const ckpt::Tensor &t : tensors) {
				init.emplace_back(t.numel);
				for (float &v : init.back())
					v = (r.uniform() - 0.5f) * 0.2f;
				spans.emplace_back(t.name, init.back());
			}
			d->load_params(spans);
		}

		std::vector<uint16_t> grad, readback;
		uint32_t reads_crc = 0;
		const uint64_t first = d->status().committed_step + 1;
		uint64_t last_attempt = 0;
		for (uint64_t step = first; step < first + steps;) {
			// The first attempt at some steps overflows or is aborted; the
			// retry of the same step goes through.
			const bool retry = step == last_attempt;
			const bool overflow_step = step % 23 == 7 && !retry;
			const bool abort_step = step % 31 == 11 && !retry;
			last_attempt = step;
			const float scale = dt == CKPT_DTYPE_FP16 ? 1024.0f : 1.0f;
			const double clip = 0.5 + 0.5 * r.uniform();
			d->begin(trace_hparams(d->geometry().n_groups, step), clip / scale);

			std::vector<size_t> order(tensors.size());
			for (size_t i = 0; i < order.size(); i++)
				order[i] = i;
			for (size_t i = order.size(); i > 1; i--)
				std::swap(order[i - 1], order[r.below(i)]);
			const size_t stop_at = abort_step ? order.size() / 2 : order.size();
			for (size_t k = 0; k < stop_at; k++) {
				const ckpt::Tensor &t = tensors[order[k]];
				grad.assign(t.extent, 0);
				for (uint64_t i = 0; i < t.numel; i++) {
					float g = (r.uniform() - 0.5f) * 2e-2f * scale;
					grad[i] = dt == CKPT_DTYPE_FP16 ? ckpt_f32_to_f16(bits(g)) : ckpt_f32_to_bf16(bits(g));
				}
				if (overflow_step && k == stop_at / 2)
					grad[r.below(t.numel)] = dt == CKPT_DTYPE_FP16 ? 0x7c00 : 0x7f80;
				// Block pieces of the tensor's extent, in random order.
				const uint64_t blocks = t.extent * 2 / piece;
				std::vector<std::pair<uint64_t, uint64_t>> pieces;
				for (uint64_t s = 0; s < blocks;) {
					uint64_t n = std::min(blocks - s, 1 + r.below(2 * cp * 2 / piece));
					pieces.emplace_back(s, n);
					s += n;
				}
				for (size_t i = pieces.size(); i > 1; i--)
					std::swap(pieces[i - 1], pieces[r.below(i)]);
				for (auto [s, n] : pieces)
					d->write_grad_window(t.offset * 2 + s * piece,
							     reinterpret_cast<const uint8_t *>(grad.data()) + s * piece,
							     n * piece);
				// A pipelined read of some tensor: latest applied values.
				const ckpt::Tensor &rt = tensors[r.below(tensors.size())];
				readback.resize(rt.numel);
				d->read_params(rt.name, readback.data(), rt.numel);
				reads_crc = ~ckpt_crc32c_raw(~reads_crc, readback.data(), rt.numel * 2);
			}
			if (abort_step) {
				d->abort();
				fmt::print("step {} aborted\n", step);
				continue;	// the same step again, in full
			}
			std::string blob = fmt::format("trace seed {} step {}", seed, step);
			auto res = d->commit({reinterpret_cast<const uint8_t *>(blob.data()), blob.size()});
			uint32_t params_crc = 0;
			for (const ckpt::Tensor &t : tensors) {
				readback.resize(t.numel);
				d->read_params(t.name, readback.data(), t.numel);
				params_crc = ~ckpt_crc32c_raw(~params_crc, readback.data(), t.numel * 2);
			}
			fmt::print("step {} {} params {:08x} reads {:08x}\n", step,
				   res == ckpt::CommitResult::committed ? "committed" : "overflow", params_crc,
				   reads_crc);
			if (res == ckpt::CommitResult::committed)
				step++;
		}
		fmt::print("committed step {}\n", d->status().committed_step);
	} catch (const ckpt::Error &e) {
		fmt::print(stderr, "ckpt-trace: {}\n", e.what());
		return 1;
	}
	return 0;
}
