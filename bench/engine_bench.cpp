// SPDX-License-Identifier: MIT
// The userspace engine against the raw bandwidth of the same file, in one run.
//
// For each directory given: format a file for one tensor of N params, then
// alternate (a) a raw pass that moves exactly the bytes of a step (read every
// state record of the committed slot, write every record and p_lo of the
// other) through io_uring with the same buffers and queue depth, no math, and
// (b) a real step (begin, gradient write, commit). Prints both and their
// ratio; the best of several rounds, as the machine is shared and noisy.
#include <algorithm>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <thread>
#include <vector>

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include "device.hpp"
#include "format.hpp"
#include "io.hpp"

namespace {

using clock_type = std::chrono::steady_clock;

double seconds_since(clock_type::time_point t0)
{
	return std::chrono::duration<double>(clock_type::now() - t0).count();
}

// One step's I/O with no compute: read the records of one slot, write records and p_lo of the other.
// src is the committed slot: the pass never writes it, so the engine's state stays valid.
// One thread of it takes chunks first, first + stride, ...
void raw_thread(const ckpt::BackingFile &f, const struct ckpt_layout &l, uint32_t n_chunks, uint32_t src,
		uint32_t first, uint32_t stride, std::vector<ckpt::Buffer> &rec, std::vector<ckpt::Buffer> &plo)
{
	const unsigned depth = static_cast<unsigned>(rec.size());
	ckpt::Ring ring(depth * 2 + 2);
	const int fd = f.fd.get();
	std::vector<uint32_t> chunk_of(depth);
	std::vector<int> pending_writes(depth, 0);
	uint32_t next = first;
	unsigned inflight = 0;
	auto start_read = [&](unsigned s) {
		chunk_of[s] = next;
		next += stride;
		ring.read(fd, rec[s].as(), static_cast<unsigned>(l.record_bytes),
			  ckpt_record_offset(&l, src, chunk_of[s]), s);
		inflight++;
	};
	for (unsigned s = 0; s < depth && next < n_chunks; s++)
		start_read(s);
	while (inflight) {
		ring.submit();
		auto [tag, res] = ring.wait();
		const unsigned s = static_cast<unsigned>(tag);
		inflight--;
		if (res < 0)
			ckpt::fail(CKPT_E_IO, "raw pass: {}", strerror(-res));
		if (pending_writes[s] == 0) {	// the read is done: write back
			ring.write(fd, rec[s].as(), static_cast<unsigned>(l.record_bytes),
				   ckpt_record_offset(&l, src ^ 1, chunk_of[s]), s);
			ring.write(fd, plo[s].as(), static_cast<unsigned>(l.plo_chunk_bytes),
				   ckpt_plo_offset(&l, src ^ 1, chunk_of[s]), s);
			pending_writes[s] = 2;
			inflight += 2;
		} else if (--pending_writes[s] == 0 && next < n_chunks) {
			start_read(s);
		}
	}
}

// The same parallelism as the engine: one ring and `depth` buffers per worker.
double raw_pass(const ckpt::BackingFile &f, const struct ckpt_layout &l, uint32_t n_chunks, uint32_t src,
		std::vector<std::vector<ckpt::Buffer>> &rec, std::vector<std::vector<ckpt::Buffer>> &plo)
{
	const uint32_t n = static_cast<uint32_t>(rec.size());
	auto t0 = clock_type::now();
	std::vector<std::thread> threads;
	for (uint32_t t = 0; t < n; t++)
		threads.emplace_back([&, t] { raw_thread(f, l, n_chunks, src, t, n, rec[t], plo[t]); });
	for (std::thread &t : threads)
		t.join();
	f.flush();
	return seconds_since(t0);
}

} // namespace

int main(int argc, char **argv)
{
	CLI::App app{"engine_bench: the userspace engine against raw file bandwidth"};
	std::vector<std::string> dirs{"/dev/shm"};
	uint64_t params = 64ull << 20;
	unsigned rounds = 3, workers = 0;
	app.add_option("dirs", dirs, "directories to put the backing file in");
	app.add_option("--params", params, "params of the tensor");
	app.add_option("--rounds", rounds, "rounds (best is reported)");
	app.add_option("--workers", workers, "engine worker threads (0: one per CPU)");
	CLI11_PARSE(app, argc, argv);

	std::vector<uint16_t> grad(params);
	for (size_t i = 0; i < grad.size(); i++)
		grad[i] = static_cast<uint16_t>(0x3c00 ^ (i * 2654435761u >> 20 & 0x3ff));	// bf16 around 0.01

	for (const std::string &dir : dirs) {
		std::string path = (std::filesystem::path(dir) / "ckpt-engine-bench.img").string();
		ckpt::Layout layout;
		layout.add("w", {params}, 0);
		ckpt::format(path, layout, {.force = true});	// a file left by an interrupted run
		{
			// Preallocate the other slot, so no round times page allocation.
			ckpt::Image img = ckpt::Image::open(path, true);
			const struct ckpt_layout &l = img.sb.layout;
			ckpt::Buffer zero(8u << 20);
			auto fill = [&](uint64_t off, uint64_t len) {
				for (uint64_t end = off + len; off < end; off += zero.size())
					img.file.pwrite_all(zero.as(), std::min<uint64_t>(zero.size(), end - off), off);
			};
			fill(l.plo_off[1], l.window_bytes);
			fill(l.rec_off[1], img.sb.geo.n_chunks * l.record_bytes);
			img.file.flush();
		}
		ckpt::EngineOptions opts;
		opts.workers = workers;
		auto dev = ckpt::Device::open(path, opts);
		const struct ckpt_layout l = dev->layout();
		const uint32_t n_chunks = dev->geometry().n_chunks;
		const uint64_t step_bytes = n_chunks * (2 * l.record_bytes + l.plo_chunk_bytes);
		// The engine's own fd: a second writable open would be refused.
		const ckpt::BackingFile &raw = dev->engine()->image().file;
		const unsigned threads = workers ? workers : std::clamp(std::thread::hardware_concurrency(), 1u, 4u);
		std::vector<std::vector<ckpt::Buffer>> rec(threads), plo(threads);
		for (unsigned t = 0; t < threads; t++)
			for (unsigned i = 0; i < opts.depth; i++) {
				rec[t].emplace_back(l.record_bytes);
				plo[t].emplace_back(l.plo_chunk_bytes);
			}
		std::vector<ckpt::GroupHparams> groups(1);
		double best_raw = 1e30, best_step = 1e30;
		for (unsigned r = 0; r < rounds; r++) {
			best_raw = std::min(best_raw, raw_pass(raw, l, n_chunks, dev->status().committed_slot, rec, plo));
			auto t0 = clock_type::now();
			dev->begin(groups, 1.0);
			dev->write_grad("w", grad.data(), grad.size());
			if (dev->commit({}) != ckpt::CommitResult::committed)
				ckpt::fail(CKPT_E_INVAL, "benchmark step overflowed");
			best_step = std::min(best_step, seconds_since(t0));
		}
		const double raw_bw = static_cast<double>(step_bytes) / best_raw;
		const double eng_bw = static_cast<double>(step_bytes) / best_step;
		fmt::print("engine on {:<10} {:>8.1f} Mparams/s  {:>6.2f} GB/s moved   raw read+write {:>6.2f} GB/s"
			   "   ratio {:.2f} of raw  ({}, {} params, {})\n",
			   dir, static_cast<double>(params) / best_step / 1e6, eng_bw / 1e9, raw_bw / 1e9,
			   eng_bw / raw_bw, raw.direct ? "O_DIRECT" : "buffered", params,
			   fmt::format("{} rounds", rounds));
		dev.reset();
		std::filesystem::remove(path);
	}
	return 0;
}
