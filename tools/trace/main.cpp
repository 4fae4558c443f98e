// SPDX-License-Identifier: MIT
// ckpt-trace: replays a seeded training trace through libckpt. The same seed
// gives the same command stream on any target, so the backing images the
// userspace engine and the kernel target leave behind must be identical, and
// a trace resumed from any committed step goes on as the uninterrupted one.
//
// The trace exercises what a trainer does and a little more: several groups
// (AdamW and Adam-L2, changing lr), fp16 with a loss scale or bf16, tensors
// not aligned to chunks, gradients written in sector pieces in random order
// (partial chunks), PARAM reads between writes, an overflow step now and then,
// an aborted attempt now and then, a tensor skipped every fifth step (written
// whole, with its own bias correction, once it lags behind the step), and with
// --rollback-every a rollback of a committed step now and then (the ROLLBACK
// command; refused a second time and while the redone step is open), after
// which the same step is done again.
#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include "ckpt_admin.h"

namespace {

// A failed libckpt call, with its message.
int check(int ret)
{
	if (ret < 0)
		throw std::runtime_error(ckpt_last_error());
	return ret;
}

struct Tensor {
	std::string name;
	uint64_t numel, offset;
	uint64_t extent;	// params up to the next tensor: numel + padding
};

struct LayoutDeleter {
	void operator()(ckpt_layout_builder *l) const { ckpt_layout_free(l); }
};
struct DeviceDeleter {
	void operator()(ckpt_device *d) const { ckpt_close(d); }
};
using LayoutPtr = std::unique_ptr<ckpt_layout_builder, LayoutDeleter>;
using DevicePtr = std::unique_ptr<ckpt_device, DeviceDeleter>;

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

LayoutPtr trace_layout(uint64_t seed, uint64_t params)
{
	Rng r{seed ^ 0x1a7};
	LayoutPtr l(ckpt_layout_new());
	if (!l)
		throw std::bad_alloc();
	auto add = [&](const std::string &name, std::vector<uint64_t> shape, uint32_t group) {
		check(ckpt_layout_add(l.get(), name.c_str(), shape.data(), static_cast<uint32_t>(shape.size()), group));
	};
	uint64_t left = params;
	for (int i = 0; left > 0; i++) {
		uint64_t cols = 1 + r.below(300);
		uint64_t rows = std::max<uint64_t>(1, std::min(left, 1 + r.below(params / 4 + 1)) / cols);
		uint32_t group = static_cast<uint32_t>(r.below(3));
		add(fmt::format("t{}.w", i), {rows, cols}, group);
		left -= std::min(left, rows * cols);
		if (r.below(2)) {
			add(fmt::format("t{}.b", i), {cols}, 1);
			left -= std::min(left, cols);
		}
	}
	return l;
}

std::vector<ckpt_group_hparams> trace_hparams(uint32_t n_groups, uint64_t step)
{
	std::vector<ckpt_group_hparams> g(n_groups);
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
	std::string dev, dtype = "bf16", state = "fp32";
	uint64_t seed = 1, steps = 200, params = 1u << 20;
	uint32_t chunk_params = 16384;
	bool do_format = false, force = false;
	uint32_t workers = 0, depth = 0;
	app.add_option("device", dev, "backing file or device")->required();
	app.add_option("--seed", seed, "trace seed");
	app.add_option("--steps", steps, "steps to commit");
	app.add_flag("--format", do_format,
		     "format the device with the trace's layout first (a device holding\n"
		     "a dm-ckpt image or another signature only with --force)");
	app.add_flag("--force", force, "with --format: format over an existing image or signature")
		->needs("--format");
	app.add_option("--params", params, "about this many params (with --format)");
	app.add_option("--dtype", dtype, "bf16 or fp16 (with --format)")->check(CLI::IsMember({"bf16", "fp16"}));
	app.add_option("--chunk-params", chunk_params, "params per chunk (with --format)");
	app.add_option("--state", state,
		       "optimizer state: fp32, 8bit, or 8bit-bf16 (8-bit moments and\n"
		       "bf16 masters; dtype bf16) (with --format)")
		->check(CLI::IsMember({"fp32", "8bit", "8bit-bf16"}));
	uint32_t piece = 0;
	app.add_option("--piece-bytes", piece,
		       "gradient pieces are multiples of this (default: the device's block size;\n"
		       "give the same on both targets of a comparison)");
	app.add_option("--workers", workers, "engine worker threads (0: one per CPU)");
	app.add_option("--depth", depth, "engine chunks in flight per worker");
	uint64_t rollback_every = 0;
	app.add_option("--rollback-every", rollback_every,
		       "roll back every step that is a multiple of this once committed, then do it again\n"
		       "(0: never; give the same on both targets of a comparison)");
	CLI11_PARSE(app, argc, argv);

	try {
		if (do_format) {
			const int code = check(ckpt_dtype_parse(dtype.c_str()));
			const uint32_t flags = (state == "8bit"	     ? CKPT_FORMAT_STATE_8BIT
						: state == "8bit-bf16" ? CKPT_FORMAT_STATE_8BIT | CKPT_FORMAT_MASTER_BF16
								       : 0) |
					       (force ? 0 : CKPT_FORMAT_KEEP);
			check(ckpt_format_opts(dev.c_str(), trace_layout(seed, params).get(), code, chunk_params, 0,
					       flags));
		}
		DevicePtr d([&] {
			ckpt_device *h = nullptr;
			check(ckpt_open_engine(dev.c_str(), workers, depth, &h));
			return h;
		}());
		struct ckpt_info info;
		check(ckpt_info(d.get(), &info));
		std::vector<Tensor> tensors;
		for (uint32_t i = 0; i < info.n_tensors; i++) {
			struct ckpt_tensor_info ti;
			check(ckpt_tensor(d.get(), i, &ti));
			tensors.push_back({ti.name, ti.numel, ti.offset, 0});
		}
		for (size_t i = 0; i < tensors.size(); i++)
			tensors[i].extent = (i + 1 < tensors.size() ? tensors[i + 1].offset : info.n_params) - tensors[i].offset;
		const uint32_t dt = info.dtype;
		const uint64_t cp = info.chunk_params;
		const uint32_t bs = static_cast<uint32_t>(check(ckpt_block_size(d.get())));
		const uint32_t block = static_cast<uint32_t>(ckpt_abi_constant("CKPT_BLOCK"));
		if (!piece)
			piece = bs;
		if (piece % bs || block % piece)
			throw std::runtime_error(fmt::format("--piece-bytes {} must be a multiple of the block size {} "
							     "and divide {}", piece, bs, block));
		Rng r{seed};	// the initial masters; each step draws from its own stream

		// The initial masters belong to the format: a device formatted
		// elsewhere (the kernel target's backing device) already has them.
		if (do_format) {
			std::vector<std::vector<float>> init;
			std::vector<const char *> names;
			std::vector<const float *> values;
			std::vector<uint64_t> ns;
			for (const Tensor &t : tensors) {
				init.emplace_back(t.numel);
				for (float &v : init.back())
					v = (r.uniform() - 0.5f) * 0.2f;
				names.push_back(t.name.c_str());
				values.push_back(init.back().data());
				ns.push_back(t.numel);
			}
			check(ckpt_load_params_multi(d.get(), static_cast<uint32_t>(tensors.size()), names.data(),
						     values.data(), ns.data()));
		}

		std::vector<uint16_t> grad, readback;
		std::vector<float> gf;
		check(ckpt_info(d.get(), &info));
		const uint64_t first = info.committed_step + 1;
		uint64_t last_attempt = 0, rolled_back = 0;
		// A refusal the trace expects: printed, so both targets must agree.
		auto refused = [&](int ret, int want, const char *what) {
			if (ret != -want)
				throw std::runtime_error(fmt::format("{}: expected {}, got {}: {}", what,
								     ckpt_err_name(want), ckpt_err_name(ret),
								     ret < 0 ? ckpt_last_error() : "accepted"));
			fmt::print("{} refused: {}\n", what, ckpt_err_name(want));
		};
		for (uint64_t step = first; step < first + steps;) {
			// The first attempt at some steps overflows or is aborted; the
			// retry of the same step goes through.
			const bool retry = step == last_attempt;
			const bool overflow_step = step % 23 == 7 && !retry;
			const bool abort_step = step % 31 == 11 && !retry;
			last_attempt = step;
			// Each attempt at a step draws from a stream of its own, so a
			// trace resumed from any committed step (after a crash) goes on
			// exactly as the uninterrupted one.
			r = Rng{Rng{seed ^ (step * 0xd1b54a32d192ed03ull)}.next()};
			uint32_t reads_crc = 0;
			const float scale = dt == CKPT_DTYPE_FP16 ? 1024.0f : 1.0f;
			const double clip = 0.5 + 0.5 * r.uniform();
			const auto hp = trace_hparams(info.n_groups, step);
			check(ckpt_begin(d.get(), hp.data(), info.n_groups, clip / scale));
			uint64_t to = 0;
			if (step == rolled_back && !retry)
				refused(ckpt_rollback(d.get(), &to), CKPT_E_STATE, "rollback with a step open");

			std::vector<size_t> order(tensors.size());
			for (size_t i = 0; i < order.size(); i++)
				order[i] = i;
			for (size_t i = order.size(); i > 1; i--)
				std::swap(order[i - 1], order[r.below(i)]);
			const size_t stop_at = abort_step ? order.size() / 2 : order.size();
			for (size_t k = 0; k < stop_at; k++) {
				const Tensor &t = tensors[order[k]];
				grad.assign(t.extent, 0);
				gf.resize(t.numel);
				for (float &g : gf)
					g = (r.uniform() - 0.5f) * 2e-2f * scale;
				check(ckpt_to_lowp(dt, gf.data(), grad.data(), t.numel));
				if (overflow_step && k == stop_at / 2)
					grad[r.below(t.numel)] = dt == CKPT_DTYPE_FP16 ? 0x7c00 : 0x7f80;
				// Some steps skip a tensor (no gradient, as torch's frozen or
				// unused params); a tensor skipped before lags behind the step
				// and is written whole, with its own bias correction.
				const bool skip = step % 5 == 3 && order[k] == step % tensors.size();
				const int skipped = skip ? ckpt_skip(d.get(), t.name.c_str()) : -CKPT_E_FEATURE;
				if (skipped != -CKPT_E_FEATURE) {	// an image with block counts
					check(skipped);
					continue;
				}
				uint64_t count = 0;
				check(ckpt_tensor_step(d.get(), t.name.c_str(), &count));
				if (count + 1 != step) {
					check(ckpt_write_grad(d.get(), t.name.c_str(), grad.data(), t.numel));
					continue;
				}
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
					check(ckpt_write_grad_window(d.get(), t.offset * 2 + s * piece,
								     reinterpret_cast<const uint8_t *>(grad.data()) + s * piece,
								     n * piece));
				// A pipelined read of some tensor: latest applied values.
				const Tensor &rt = tensors[r.below(tensors.size())];
				readback.resize(rt.numel);
				check(ckpt_read_params(d.get(), rt.name.c_str(), readback.data(), rt.numel));
				reads_crc = ckpt_crc32c_update(reads_crc, readback.data(), rt.numel * 2);
			}
			if (abort_step) {
				check(ckpt_abort(d.get()));
				fmt::print("step {} aborted\n", step);
				continue;	// the same step again, in full
			}
			std::string blob = fmt::format("trace seed {} step {}", seed, step);
			const int res = check(ckpt_commit(d.get(), blob.data(), blob.size()));
			uint32_t params_crc = 0;
			for (const Tensor &t : tensors) {
				readback.resize(t.numel);
				check(ckpt_read_params(d.get(), t.name.c_str(), readback.data(), t.numel));
				params_crc = ckpt_crc32c_update(params_crc, readback.data(), t.numel * 2);
			}
			// The device's gradient sum, bit for bit (a NaN's payload is
			// whichever operand the adds kept: not compared).
			double sumsq = 0;
			std::string sum = "none";
			if (check(ckpt_last_grad_sumsq(d.get(), &sumsq)))
				sum = std::isnan(sumsq) ? "nan" : fmt::format("{:016x}", std::bit_cast<uint64_t>(sumsq));
			fmt::print("step {} {} params {:08x} reads {:08x} grad_sumsq {}\n", step,
				   ckpt_result_name(static_cast<uint32_t>(res)), params_crc, reads_crc, sum);
			if (res != CKPT_RESULT_COMMITTED)
				continue;
			if (rollback_every && step % rollback_every == 0 && step != rolled_back) {
				uint64_t to = 0;
				check(ckpt_rollback(d.get(), &to));
				fmt::print("step {} rolled back to {}\n", step, to);
				refused(ckpt_rollback(d.get(), &to), CKPT_E_ROLLBACK, "a second rollback");
				rolled_back = step;
				last_attempt = 0;	// the redo is a first attempt
				continue;
			}
			step++;
		}
		check(ckpt_info(d.get(), &info));
		fmt::print("committed step {}\n", info.committed_step);
	} catch (const std::exception &e) {
		fmt::print(stderr, "ckpt-trace: {}\n", e.what());
		return 1;
	}
	return 0;
}
