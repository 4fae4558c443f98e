// SPDX-License-Identifier: MIT
// The userspace engine against the raw bandwidth of the same file, in one run.
//
// For each directory given: format a file for one tensor of N params, then
// interleave, round after round, (a) fio on the same file moving the bytes of
// a step (reading the committed slot's records, writing the other slot's
// records and p_lo: three concurrent streams with the engine's block sizes,
// queue depth and O_DIRECT or not, then fsync): the device's own figure;
// (b) the same pass through the engine's I/O code (io_uring, or copies where
// it maps the file) with its buffers, no math; (c) a real step (begin,
// gradient write, commit). Prints medians with min..max of each (the
// machine is shared and noisy) and the engine's
// fraction of the device: fio's fastest of io_uring, psync and mmap, and
// where the engine maps the file (tmpfs), (b) too, which is then copies
// through the mapping, as fast as the memory copies. Above 1 (the step or
// the I/O pass), the reference is wrong, and it says so. On a mapped file
// also the same step with io_uring, on a file of its own. The last line is
// JSON: engine_fraction_of_device_LABEL per directory.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <thread>
#include <vector>

#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

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
void raw_thread(const ckpt::BackingFile &f, const struct ckpt_regions &l, uint32_t n_chunks, uint32_t src,
		uint32_t first, uint32_t stride, std::vector<ckpt::Buffer> &rec, std::vector<ckpt::Buffer> &plo)
{
	const unsigned depth = static_cast<unsigned>(rec.size());
	ckpt::Ring ring(depth * 2 + 2);
	std::vector<uint32_t> chunk_of(depth);
	std::vector<int> pending_writes(depth, 0);
	uint32_t next = first;
	unsigned inflight = 0;
	auto start_read = [&](unsigned s) {
		chunk_of[s] = next;
		next += stride;
		ring.read(f, rec[s].as(), static_cast<unsigned>(l.record_bytes),
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
			ring.write(f, rec[s].as(), static_cast<unsigned>(l.record_bytes),
				   ckpt_record_offset(&l, src ^ 1, chunk_of[s]), s);
			ring.write(f, plo[s].as(), static_cast<unsigned>(l.plo_chunk_bytes),
				   ckpt_plo_offset(&l, src ^ 1, chunk_of[s]), s);
			pending_writes[s] = 2;
			inflight += 2;
		} else if (--pending_writes[s] == 0 && next < n_chunks) {
			start_read(s);
		}
	}
}

// The same parallelism as the engine: one ring and `depth` buffers per worker.
double raw_pass(const ckpt::BackingFile &f, const struct ckpt_regions &l, uint32_t n_chunks, uint32_t src,
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

constexpr unsigned fio_loops = 3;

struct Spread {
	double med, min, max;
};

Spread spread(std::vector<double> v)
{
	std::sort(v.begin(), v.end());
	const size_t n = v.size();
	return {n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2, v.front(), v.back()};
}

// Where fio's three streams go: a file and an offset in it each.
struct FioStreams {
	std::string file[3];
	uint64_t off[3];
};

// The step's three streams in the engine's file: reads of the src slot's
// records, writes of the other slot's records and p_lo.
FioStreams step_streams(const std::string &path, const struct ckpt_regions &l, uint32_t src)
{
	return {{path, path, path},
		{ckpt_record_offset(&l, src, 0), ckpt_record_offset(&l, src ^ 1, 0), ckpt_plo_offset(&l, src ^ 1, 0)}};
}

// fio over the step's I/O: the three streams concurrently, each with the
// engine's block size and its queue depth (workers x chunks in flight),
// fsync at the end as the engine's commit flushes; fio_loops passes in one
// run, so that the first touch of fio's fresh buffers (slow on these VMs)
// weighs little, as the engine's buffers are reused. ioengine: io_uring,
// psync, or mmap (copies to and from the file's mapped pages, as the engine
// does on tmpfs; fio 3.33's mmap engine ignores --offset, so its streams
// get files of their own). Returns the seconds the slowest stream took for
// one pass; throws if fio is missing or fails.
double fio_pass(const FioStreams &at, const struct ckpt_regions &l, uint32_t n_chunks, const char *ioengine,
		bool direct, unsigned qd)
{
	const uint64_t bs[3] = {l.record_bytes, l.record_bytes, l.plo_chunk_bytes};
	const char *const name[3] = {"records-read", "records-write", "plo-write"};
	std::string cmd = fmt::format("fio --output-format=json --ioengine={} --direct={} --end_fsync=1 "
				      "--iodepth={} --loops={}",
				      ioengine, direct ? 1 : 0, qd, fio_loops);
	for (int k = 0; k < 3; k++)
		cmd += fmt::format(" --name={} --filename={} --allow_file_create={} --rw={} --bs={} --offset={} --size={}",
				   name[k], at.file[k], at.off[k] ? 0 : 1, k ? "write" : "read", bs[k], at.off[k],
				   n_chunks * bs[k]);
	cmd += " 2>&1";
	std::unique_ptr<FILE, decltype(&pclose)> pipe(popen(cmd.c_str(), "r"), pclose);
	if (!pipe)
		ckpt::fail(CKPT_E_IO, "cannot run fio: {}", strerror(errno));
	std::string out;
	char buf[4096];
	for (size_t got; (got = fread(buf, 1, sizeof(buf), pipe.get())) > 0;)
		out.append(buf, got);
	const int status = pclose(pipe.release());
	const size_t brace = out.find('{');
	if (status != 0 || brace == std::string::npos)
		ckpt::fail(CKPT_E_IO, "fio failed (is it installed? scripts/deps.sh installs it): {}", out);
	const auto j = nlohmann::json::parse(out.substr(brace));
	double ms = 0;
	uint64_t bytes = 0;
	for (const auto &job : j.at("jobs")) {
		ms = std::max(ms, job.at("job_runtime").get<double>());
		bytes += job.at("read").at("io_bytes").get<uint64_t>() + job.at("write").at("io_bytes").get<uint64_t>();
	}
	const uint64_t want = fio_loops * n_chunks * (2 * l.record_bytes + l.plo_chunk_bytes);
	if (bytes != want || ms <= 0)
		ckpt::fail(CKPT_E_IO, "fio moved {} bytes in {} ms, not the {} of {} steps", bytes, ms, want, fio_loops);
	return ms / 1e3 / fio_loops;
}

} // namespace

int main(int argc, char **argv)
{
	CLI::App app{"engine_bench: the userspace engine against fio on the same file"};
	std::vector<std::string> dirs{"/dev/shm"};
	uint64_t params = 64ull << 20;
	unsigned rounds = 5, workers = 0, depth = ckpt::EngineOptions{}.depth;
	app.add_option("dirs", dirs, "[LABEL=]DIR: directories to put the backing file in (LABEL names it in the JSON)");
	app.add_option("--params", params, "params of the tensor")->check(CLI::Range(1ull << 16, 1ull << 32));
	app.add_option("--rounds", rounds, "interleaved rounds (medians are reported)")->check(CLI::Range(1, 100));
	app.add_option("--workers", workers, "engine worker threads (0: one per CPU)")->check(CLI::Range(0, 64));
	app.add_option("--depth", depth, "chunks in flight per worker")->check(CLI::Range(1, 64));
	CLI11_PARSE(app, argc, argv);

	std::vector<uint16_t> grad(params);
	for (size_t i = 0; i < grad.size(); i++)
		grad[i] = static_cast<uint16_t>(0x3c00 ^ (i * 2654435761u >> 20 & 0x3ff));	// bf16 around 0.01

	nlohmann::json result = nlohmann::json::object();
	for (const std::string &arg : dirs) {
		const size_t eq = arg.find('=');
		const std::string label = eq == std::string::npos ? arg : arg.substr(0, eq);
		const std::string dir = eq == std::string::npos ? arg : arg.substr(eq + 1);
		const std::string path = (std::filesystem::path(dir) / "ckpt-engine-bench.img").string();
		const std::string ring_path = (std::filesystem::path(dir) / "ckpt-engine-bench-ring.img").string();
		ckpt::Layout layout;
		layout.add("w", {params}, 0);
		for (const std::string &p : {path, ring_path}) {
			ckpt::format(p, layout, {.force = true});	// a file left by an interrupted run
			// Preallocate the other slot, so no round times page allocation.
			ckpt::Image img = ckpt::Image::open(p, true);
			const struct ckpt_regions &l = img.sb.regions;
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
		opts.depth = depth;
		auto dev = ckpt::Device::open(path, opts);
		// Where the engine maps the file (tmpfs), the same step with
		// io_uring on a file of its own beside it: what the mapping gains.
		const bool mapped = dev->engine()->image().file.mapped();
		std::unique_ptr<ckpt::Device> ring_dev;
		if (mapped) {
			ckpt::EngineOptions o = opts;
			o.map = false;
			ring_dev = ckpt::Device::open(ring_path, o);
		}
		const struct ckpt_regions l = dev->regions();
		const uint32_t n_chunks = dev->geometry().n_chunks;
		const uint64_t step_bytes = n_chunks * (2 * l.record_bytes + l.plo_chunk_bytes);
		// The engine's own file: a second writable open would be refused.
		const ckpt::BackingFile &raw = dev->engine()->image().file;
		const unsigned threads = workers ? workers : std::clamp(std::thread::hardware_concurrency(), 1u, 4u);
		std::vector<std::vector<ckpt::Buffer>> rec(threads), plo(threads);
		for (unsigned t = 0; t < threads; t++)
			for (unsigned i = 0; i < opts.depth; i++) {
				rec[t].emplace_back(l.record_bytes);
				plo[t].emplace_back(l.plo_chunk_bytes);
			}
		std::vector<ckpt::GroupHparams> groups(1);
		// fio's patterns: the device's figure is the fastest of them
		struct Pattern {
			const char *ioengine;
			bool direct;
			unsigned qd;
			FioStreams at;
			std::vector<double> t;
		};
		std::vector<Pattern> patterns = {{"io_uring", raw.direct, threads * opts.depth, {}, {}},
						 {"psync", raw.direct, 1, {}, {}}};
		std::vector<std::string> scratch;
		if (mapped) {
			FioStreams own;
			for (int k = 0; k < 3; k++) {
				scratch.push_back((std::filesystem::path(dir) / fmt::format("ckpt-engine-bench-fio{}", k)).string());
				own.file[k] = scratch.back();
				own.off[k] = 0;
			}
			patterns.push_back({"mmap", false, 1, own, {}});
		}
		std::vector<double> t_fio, t_raw, t_step, t_ring_step;
		auto timed_step = [&](ckpt::Device &d) {
			auto t0 = clock_type::now();
			d.begin(groups, 1.0);
			d.write_grad("w", grad.data(), grad.size());
			if (d.commit({}) != ckpt::CommitResult::committed)
				ckpt::fail(CKPT_E_INVAL, "benchmark step overflowed");
			return seconds_since(t0);
		};
		for (unsigned r = 0; r < rounds; r++) {
			const uint32_t committed = dev->status().committed_slot;
			t_fio.push_back(1e300);
			for (Pattern &p : patterns) {
				const FioStreams at = p.at.file[0].empty() ? step_streams(path, l, committed) : p.at;
				p.t.push_back(fio_pass(at, l, n_chunks, p.ioengine, p.direct, p.qd));
				t_fio.back() = std::min(t_fio.back(), p.t.back());
			}
			t_raw.push_back(raw_pass(raw, l, n_chunks, committed, rec, plo));
			t_step.push_back(timed_step(*dev));
			if (ring_dev)
				t_ring_step.push_back(timed_step(*ring_dev));
		}
		// GB/s of a step's bytes: median (at the median time), and the range
		const auto gbs = [&](const std::vector<double> &t) {
			const Spread s = spread(t);
			const double b = static_cast<double>(step_bytes) / 1e9;
			return std::make_tuple(b / s.med, b / s.max, b / s.min);
		};
		// The device's bound: fio's fastest pattern; on a mapped file also
		// the engine's copies with no math (fio's mmap engine moves a
		// fraction of what plain copies through one mapping do).
		std::vector<double> t_dev = t_fio;
		if (mapped)
			for (unsigned r = 0; r < rounds; r++)
				t_dev[r] = std::min(t_dev[r], t_raw[r]);
		const auto [fio_med, fio_lo, fio_hi] = gbs(t_dev);
		const auto [raw_med, raw_lo, raw_hi] = gbs(t_raw);
		const auto [eng_med, eng_lo, eng_hi] = gbs(t_step);
		const double frac = eng_med / fio_med;
		fmt::print("{} ({}, {} params, {} B/param moved, {}, {} streams x qd {}, median (min..max) of {} "
			   "interleaved rounds)\n",
			   label, dir, params, static_cast<double>(step_bytes) / params,
			   mapped ? "mapped" : raw.direct ? "O_DIRECT" : "buffered", 3, threads * opts.depth, rounds);
		fmt::print("  device                  {:6.2f} GB/s ({:.2f}..{:.2f})  the fastest of:\n", fio_med, fio_lo,
			   fio_hi);
		for (const Pattern &p : patterns) {
			const auto [med, lo, hi] = gbs(p.t);
			fmt::print("    fio {:<8}            {:6.2f} GB/s ({:.2f}..{:.2f})\n", p.ioengine, med, lo, hi);
		}
		fmt::print("  {}{:6.2f} GB/s ({:.2f}..{:.2f})  {:.2f} of the device\n",
			   mapped ? "  engine's copies, no math" : "engine's I/O, no math   ", raw_med, raw_lo, raw_hi,
			   raw_med / fio_med);
		fmt::print("  engine step             {:6.2f} GB/s ({:.2f}..{:.2f})  {:.2f} of the device  "
			   "{:.1f} Mparams/s\n",
			   eng_med, eng_lo, eng_hi, frac, eng_med * 1e9 / (static_cast<double>(step_bytes) / params) / 1e6);
		if (ring_dev) {
			const auto [ring_med, ring_lo, ring_hi] = gbs(t_ring_step);
			fmt::print("  engine step, io_uring   {:6.2f} GB/s ({:.2f}..{:.2f})  {:.2f} of the device  "
				   "(the file not mapped: the mapped step is {:.2f}x as fast)\n",
				   ring_med, ring_lo, ring_hi, ring_med / fio_med, eng_med / ring_med);
			result["engine_mapped_vs_io_uring_" + label] = std::round(eng_med / ring_med * 1e4) / 1e4;
		}
		if (frac > 1 || (!mapped && raw_med > fio_med))
			fmt::print("  WARNING: the engine {} is faster than the device reference ({:.2f} > 1): the "
				   "reference is wrong here\n",
				   frac > 1 ? "step" : "I/O pass", std::max(frac, raw_med / fio_med));
		result["engine_fraction_of_device_" + label] = std::round(frac * 1e4) / 1e4;
		result["device_gb_s_" + label] = std::round(fio_med * 1e3) / 1e3;
		dev.reset();
		ring_dev.reset();
		std::filesystem::remove(path);
		std::filesystem::remove(ring_path);
		for (const std::string &f : scratch)
			std::filesystem::remove(f);
	}
	fmt::print("{}\n", result.dump());
	return 0;
}
