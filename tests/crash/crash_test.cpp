// SPDX-License-Identifier: MIT
// The userspace crash enumerator: a multi-step training trace on the engine,
// its backing I/O recorded (crash_model.hpp), then every crash state that
// respects flush ordering and the torn ones rebuilt as images, opened and
// checked against the trace's state after each commit. See README.md.
//
// usage: crash_test fp16|bf16 small|wide    (parameters from CKPT_CRASH_*)
#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include <fcntl.h>
#include <unistd.h>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "ckpt_admin.h"
#include "crash_model.hpp"
#include "device.hpp"
#include "format.hpp"

namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;
using Bytes = std::vector<uint8_t>;

uint64_t env(const char *name, uint64_t def)
{
	const char *v = getenv(name);
	if (!v || !*v)
		return def;
	char *end = nullptr;
	const unsigned long long n = strtoull(v, &end, 0);
	if (*end) {
		fmt::print(stderr, "{}={}: not a number\n", name, v);
		exit(2);
	}
	return n;
}

struct Params {
	uint64_t steps = env("CKPT_CRASH_STEPS", 6);		// committed steps of the trace
	uint64_t seed = env("CKPT_CRASH_SEED", 1);
	uint64_t resume_every = env("CKPT_CRASH_RESUME_EVERY", 8);	// 0: never
	crash::EnumerateOptions enumerate{
		.exhaustive_max = static_cast<unsigned>(env("CKPT_CRASH_EXHAUSTIVE", 8)),
		.samples = static_cast<unsigned>(env("CKPT_CRASH_SAMPLES", 16)),
		.torn_every_sector = env("CKPT_CRASH_TORN_ALL", 0) != 0,
		.seed = env("CKPT_CRASH_SEED", 1),
	};
};

// ---------------------------------------------------------------- the trace

// One BEGIN .. COMMIT/ABORT of the trace: the gradient window's bytes, written
// in `pieces` (byte offset, length) in that order.
struct Attempt {
	enum Kind { commit, overflow, abort } kind;
	std::vector<ckpt::GroupHparams> groups;
	double grad_scale;
	Bytes grad;
	std::vector<std::pair<uint64_t, uint64_t>> pieces;	// all but tensor b
	bool skip_b = false;	// b has no gradient: skipped (else written whole)
	Bytes blob;
};

// What leads from one commit to the next: the initial masters (unit 0), or
// attempts ending in a committed step.
struct Unit {
	std::vector<std::vector<float>> masters;	// per tensor, unit 0 only
	std::vector<Attempt> attempts;
};

struct Trace {
	uint32_t dtype;
	std::vector<ckpt::Tensor> tensors;	// as the device places them
	uint64_t window_bytes = 0;
	uint32_t n_groups = 0;
	std::vector<Unit> units;
};

ckpt::Layout model(const std::string &name, uint32_t &chunk_params)
{
	ckpt::Layout l;
	if (name == "small") {		// 3 chunks; a and b share chunk 0
		chunk_params = 4096;
		l.add("a", {1000}, 0);
		l.add("b", {30, 100}, 0);
		l.add("c", {2500}, 1);
		l.add("d", {64}, 1);
	} else if (name == "wide") {	// 9 chunks in 3 groups
		chunk_params = 2048;
		l.add("a", {3000}, 0);
		l.add("b", {50, 100}, 0);
		l.add("c", {4096}, 1);
		l.add("d", {2048, 2}, 2);
	} else {
		fmt::print(stderr, "model {}: small or wide\n", name);
		exit(2);
	}
	return l;
}

Bytes lowp(uint32_t dtype, const std::vector<float> &f)
{
	Bytes out(f.size() * 2);
	if (ckpt_to_lowp(dtype, f.data(), reinterpret_cast<uint16_t *>(out.data()), f.size()) < 0)
		throw std::runtime_error(ckpt_last_error());
	return out;
}

// Steps 1..p.steps; step t%5 == 2 first overflows (the fp16 loss scale
// halves, as GradScaler does), step t%5 == 4 is first aborted halfway, step
// t%5 == 3 skips tensor b (which shares a chunk with a).
Trace make_trace(uint32_t dtype, const std::vector<ckpt::Tensor> &tensors, uint64_t window_bytes,
		 uint32_t n_groups, const Params &p)
{
	Trace tr{dtype, tensors, window_bytes, n_groups, {}};
	std::mt19937_64 rng(p.seed);
	std::normal_distribution<float> normal(0.0f, 1.0f);

	Unit init;
	for (const ckpt::Tensor &t : tensors) {
		std::vector<float> v(t.numel);
		for (float &x : v)
			x = 0.1f * normal(rng);
		init.masters.push_back(std::move(v));
	}
	tr.units.push_back(std::move(init));

	double loss_scale = dtype == CKPT_DTYPE_FP16 ? 1024.0 : 1.0;
	auto attempt = [&](uint64_t t, Attempt::Kind kind) {
		Attempt a;
		a.kind = kind;
		for (uint32_t g = 0; g < n_groups; g++) {
			ckpt::GroupHparams h;
			h.lr = 1e-3 * (1.0 + 0.25 * g) / (1.0 + 0.1 * static_cast<double>(t));
			h.weight_decay = g == 1 ? 0.0 : 0.01;
			h.adam_l2 = g == 2;
			a.groups.push_back(h);
		}
		a.grad_scale = 1.0 / loss_scale;
		std::vector<float> g(window_bytes / 2, 0.0f);
		for (const ckpt::Tensor &ten : tensors)
			for (uint64_t i = 0; i < ten.numel; i++)
				g[ten.offset + i] = static_cast<float>(normal(rng) * loss_scale);
		a.grad = lowp(dtype, g);
		if (kind == Attempt::overflow) {	// one inf gradient in tensor b
			const uint16_t inf = dtype == CKPT_DTYPE_FP16 ? 0x7c00 : 0x7f80;
			std::memcpy(&a.grad[(tensors[1].offset + 7) * 2], &inf, 2);
		}
		// Tensor b goes through write_grad or skip (it lags behind the step
		// once skipped: its updates carry their own bias correction), the
		// rest of the window in random pieces around it.
		const uint64_t bo = tensors[1].offset * 2, be = bo + tensors[1].extent * 2;
		for (uint64_t off = 0; off < window_bytes;) {
			const uint64_t n = std::min<uint64_t>(window_bytes - off, (1 + rng() % 24) * CKPT_SECTOR);
			if (off < bo)
				a.pieces.emplace_back(off, std::min(off + n, bo) - off);
			if (off + n > be)
				a.pieces.emplace_back(std::max(off, be), off + n - std::max(off, be));
			off += n;
		}
		a.skip_b = t % 5 == 3 && kind == Attempt::commit;
		std::shuffle(a.pieces.begin(), a.pieces.end(), rng);
		if (kind == Attempt::abort)
			a.pieces.resize(a.pieces.size() / 2);
		// The trainer blob: its loss scale and data position; one step fills it.
		std::string blob = fmt::format("step={} loss_scale={} seed={}", t, loss_scale, p.seed);
		if (t % 5 == 3)
			blob.resize(CKPT_BLOB_MAX, static_cast<char>('A' + t % 26));
		a.blob.assign(blob.begin(), blob.end());
		if (kind == Attempt::overflow)
			loss_scale /= 2;
		return a;
	};
	for (uint64_t t = 1; t <= p.steps; t++) {
		Unit u;
		if (t % 5 == 2)
			u.attempts.push_back(attempt(t, Attempt::overflow));
		if (t % 5 == 4)
			u.attempts.push_back(attempt(t, Attempt::abort));
		u.attempts.push_back(attempt(t, Attempt::commit));
		tr.units.push_back(std::move(u));
	}
	return tr;
}

void check(bool ok, const std::string &what)
{
	if (!ok)
		throw std::runtime_error(what);
}

// Runs unit u of the trace on d, as a trainer drives the device.
void run_unit(ckpt::Device &d, const Trace &tr, size_t u)
{
	const Unit &unit = tr.units[u];
	if (u == 0) {
		std::vector<std::pair<std::string, std::span<const float>>> values;
		for (size_t i = 0; i < tr.tensors.size(); i++)
			values.emplace_back(tr.tensors[i].name, std::span<const float>(unit.masters[i]));
		d.load_params(values);
		return;
	}
	for (const Attempt &a : unit.attempts) {
		d.begin(a.groups, a.grad_scale);
		const ckpt::Tensor &b = tr.tensors[1];
		if (a.skip_b)
			d.skip(b.name);
		else
			d.write_grad(b.name, reinterpret_cast<const uint16_t *>(a.grad.data() + b.offset * 2), b.numel);
		for (auto [off, len] : a.pieces)
			d.write_grad_window(off, a.grad.data() + off, len);
		if (a.kind == Attempt::abort) {
			d.abort();
			continue;
		}
		const ckpt::CommitResult r = d.commit(a.blob);
		const auto want = a.kind == Attempt::overflow ? ckpt::CommitResult::overflow
							       : ckpt::CommitResult::committed;
		check(r == want, fmt::format("unit {}: commit gave result {}, not {}", u, static_cast<uint32_t>(r),
					     static_cast<uint32_t>(want)));
	}
}

// ---------------------------------------------------------------- the reference

struct TensorState {
	std::vector<float> p, m, v;
	std::vector<uint16_t> lowp;
};

struct Ref {
	uint64_t step = 0;
	uint64_t sequence = 0;
	uint32_t slot = 0;
	Bytes blob;
	std::vector<TensorState> tensors;
	Bytes image;		// the backing file right after the commit
};

Bytes read_file(const std::string &path)
{
	ckpt::Fd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
	check(bool(fd), fmt::format("cannot open {}: {}", path, strerror(errno)));
	Bytes b(static_cast<size_t>(lseek(fd.get(), 0, SEEK_END)));
	check(pread(fd.get(), b.data(), b.size(), 0) == static_cast<ssize_t>(b.size()), "short read of " + path);
	return b;
}

// A new file each time: the engine that had the last one open may hold its
// lock a moment longer (its rings are torn down asynchronously).
void write_file(const std::string &path, const Bytes &b)
{
	::unlink(path.c_str());
	ckpt::Fd fd(::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644));
	check(bool(fd), fmt::format("cannot create {}: {}", path, strerror(errno)));
	check(pwrite(fd.get(), b.data(), b.size(), 0) == static_cast<ssize_t>(b.size()), "short write of " + path);
}

Ref capture(ckpt::Device &d, const Trace &tr, const std::string &path)
{
	Ref r;
	const struct ckpt_sb &sb = d.engine()->superblock();
	r.step = sb.committed_step;
	r.sequence = sb.sequence;
	r.slot = sb.committed_slot;
	r.blob.assign(sb.blob, sb.blob + sb.blob_len);
	for (const ckpt::Tensor &t : tr.tensors) {
		TensorState s{std::vector<float>(t.numel), std::vector<float>(t.numel), std::vector<float>(t.numel),
			      std::vector<uint16_t>(t.numel)};
		d.read_state(t.name, s.p.data(), s.m.data(), s.v.data(), t.numel);
		d.read_params(t.name, s.lowp.data(), t.numel);
		r.tensors.push_back(std::move(s));
	}
	r.image = read_file(path);
	return r;
}

// ---------------------------------------------------------------- the checks

// The committed slot's p_lo and records, bytes [off, off + len) of the image.
std::vector<std::pair<uint64_t, uint64_t>> slot_regions(const struct ckpt_regions &l, uint32_t n_chunks,
							 uint32_t slot)
{
	return {{ckpt_plo_offset(&l, slot, 0), n_chunks * l.plo_chunk_bytes},
		{ckpt_record_offset(&l, slot, 0), n_chunks * l.record_bytes}};
}

class Checker {
public:
	Checker(const Trace &tr, const std::vector<Ref> &refs, const struct ckpt_regions &l, uint32_t n_chunks)
		: tr_(tr), refs_(refs), layout_(l), n_chunks_(n_chunks)
	{
	}

	// Empty when the image at path holds refs[r] intact, else what is lost.
	// degraded_ok: a superblock write was in flight, torn: the damaged copy
	// it left is reported, so verify says "degraded".
	std::vector<std::string> check(const std::string &path, const Bytes &img, size_t r, bool degraded_ok)
	{
		std::vector<std::string> bad;
		const Ref &ref = refs_[r];
		auto expect = [&](bool ok, std::string what) {
			if (!ok)
				bad.push_back(std::move(what));
		};

		char *out = nullptr;
		if (ckpt_verify(path.c_str(), 0, &out) < 0) {
			bad.push_back(fmt::format("ckpt_verify failed: {}", ckpt_last_error()));
			return bad;
		}
		const json v = json::parse(out);
		ckpt_free(out);
		const json &rep = v["report"];
		const std::string status = rep.value("status", "");
		const bool sb_damaged = v["extra"].value("superblock_damaged", false);
		const bool meta_damaged = v["extra"].value("meta_damaged", true);
		expect(status == "ok" || (status == "degraded" && degraded_ok && sb_damaged && !meta_damaged),
		       fmt::format("verify: status {} (superblock damaged {}, metadata damaged {}): {}", status,
				   sb_damaged, meta_damaged, rep.dump()));
		expect(rep.value("committed_step", ~0ull) == ref.step && rep.value("sequence", ~0ull) == ref.sequence,
		       fmt::format("verify: committed step {} sequence {}, want step {} sequence {} (commit {})",
				   rep.value("committed_step", ~0ull), rep.value("sequence", ~0ull), ref.step,
				   ref.sequence, r));
		if (!bad.empty())
			return bad;

		// The committed slot byte for byte as the reference left it.
		for (auto [off, len] : slot_regions(layout_, n_chunks_, ref.slot))
			expect(std::equal(img.begin() + off, img.begin() + off + len, ref.image.begin() + off),
			       fmt::format("committed slot {}: bytes [{}, {}) differ from commit {}", ref.slot, off,
					   off + len, r));

		// As a trainer resuming sees it: the public C API.
		ckpt_device *d = nullptr;
		if (ckpt_open_engine(path.c_str(), 1, 1, &d) < 0) {
			bad.push_back(fmt::format("ckpt_open: {}", ckpt_last_error()));
			return bad;
		}
		const int warnings = ckpt_warning(d, 0, nullptr);
		expect(warnings == 0 || (degraded_ok && warnings == 1),
		       fmt::format("open: {} warnings", warnings));
		struct ckpt_info info {};
		expect(ckpt_info(d, &info) == 0 && info.committed_step == ref.step && info.state == CKPT_STATE_IDLE,
		       fmt::format("open: committed step {} state {}, want {} idle", info.committed_step,
				   ckpt_state_name(info.state), ref.step));
		for (size_t i = 0; i < tr_.tensors.size(); i++) {
			const ckpt::Tensor &t = tr_.tensors[i];
			const TensorState &want = ref.tensors[i];
			TensorState got{std::vector<float>(t.numel), std::vector<float>(t.numel),
					std::vector<float>(t.numel), std::vector<uint16_t>(t.numel)};
			if (ckpt_read_state(d, t.name.c_str(), got.p.data(), got.m.data(), got.v.data(), t.numel) < 0 ||
			    ckpt_read_params(d, t.name.c_str(), got.lowp.data(), t.numel) < 0) {
				bad.push_back(fmt::format("tensor {}: {}", t.name, ckpt_last_error()));
				continue;
			}
			auto same = [](const auto &a, const auto &b) {
				return std::memcmp(a.data(), b.data(), a.size() * sizeof(a[0])) == 0;
			};
			expect(same(got.p, want.p), fmt::format("tensor {}: params differ from commit {}", t.name, r));
			expect(same(got.m, want.m), fmt::format("tensor {}: exp_avg differs from commit {}", t.name, r));
			expect(same(got.v, want.v),
			       fmt::format("tensor {}: exp_avg_sq differs from commit {}", t.name, r));
			expect(same(got.lowp, want.lowp),
			       fmt::format("tensor {}: low-precision params differ from commit {}", t.name, r));
		}
		Bytes blob(CKPT_BLOB_MAX);
		const int n = ckpt_blob(d, blob.data(), blob.size());
		blob.resize(static_cast<size_t>(std::max(n, 0)));
		expect(blob == ref.blob, fmt::format("trainer blob of {} bytes differs from commit {}'s ({} bytes)", n,
						     r, ref.blob.size()));
		ckpt_close(d);
		return bad;
	}

	// Training goes on from the crash as it did without it: the next unit
	// of the trace gives the reference's next commit, bit for bit.
	std::vector<std::string> resume(const std::string &path, size_t r)
	{
		if (r + 1 >= refs_.size())
			return {};
		try {
			ckpt::EngineOptions o;
			o.workers = 1;
			std::unique_ptr<ckpt::Device> d = ckpt::Device::open(path, o);
			run_unit(*d, tr_, r);
			d.reset();
			return check(path, read_file(path), r + 1, false);
		} catch (const std::exception &e) {
			return {fmt::format("resuming at commit {}: {}", r, e.what())};
		}
	}

private:
	const Trace &tr_;
	const std::vector<Ref> &refs_;
	struct ckpt_regions layout_;
	uint32_t n_chunks_;
};

size_t count_sb_writes(const std::vector<crash::Event> &ev)
{
	return static_cast<size_t>(std::count_if(ev.begin(), ev.end(), crash::is_superblock_write));
}

int run(const std::string &dtype_name, const std::string &model_name)
{
	const Params p;
	if (p.enumerate.exhaustive_max > 24) {
		fmt::print(stderr, "CKPT_CRASH_EXHAUSTIVE={}: at most 24 (2^24 subsets per crash point)\n",
			   p.enumerate.exhaustive_max);
		return 2;
	}
	const int dtype = ckpt_dtype_parse(dtype_name.c_str());
	if (dtype < 0) {
		fmt::print(stderr, "dtype {}: fp16 or bf16\n", dtype_name);
		return 2;
	}
	const char *base = getenv("CKPT_CRASH_DIR");
	const fs::path dir = fs::path(base && *base ? base : fs::temp_directory_path().string()) /
			     fmt::format("ckpt-crash-{}-{}-{}", dtype_name, model_name, getpid());
	fs::create_directories(dir);
	const std::string path = (dir / "trace.img").string();
	// The crash images are checked where rebuilding them costs no disk
	// writeback: tmpfs unless told otherwise (the trace itself runs on dir,
	// with O_DIRECT where it has it, as a trainer's device would).
	const char *state_base = getenv("CKPT_CRASH_STATE_DIR");
	const fs::path state_dir = state_base && *state_base ? fs::path(state_base)
					: fs::is_directory("/dev/shm") ? fs::path("/dev/shm") : dir;
	const std::string state_path = (state_dir / fmt::format("ckpt-crash-state-{}.img", getpid())).string();

	// The trace, recorded, with the reference state after every commit.
	uint32_t chunk_params = 0;
	const ckpt::Layout layout = model(model_name, chunk_params);
	ckpt::FormatOptions fo;
	fo.dtype = static_cast<uint32_t>(dtype);
	fo.chunk_params = chunk_params;
	ckpt::format(path, layout, fo);
	const Bytes initial = read_file(path);

	crash::Recorder rec;
	std::vector<Ref> refs;
	Trace tr;
	struct ckpt_regions l;
	uint32_t n_chunks;
	{
		ckpt::EngineOptions o;
		o.observer = &rec;
		std::unique_ptr<ckpt::Device> d = ckpt::Device::open(path, o);
		l = d->regions();
		n_chunks = d->geometry().n_chunks;
		tr = make_trace(static_cast<uint32_t>(dtype), d->manifest().tensors(), l.window_bytes,
				d->geometry().n_groups, p);
		refs.push_back(capture(*d, tr, path));
		for (size_t u = 0; u < tr.units.size(); u++) {
			run_unit(*d, tr, u);
			refs.push_back(capture(*d, tr, path));
			check(count_sb_writes(rec.events()) == u + 1,
			      fmt::format("unit {} made {} superblock writes in all, not {}", u,
					  count_sb_writes(rec.events()), u + 1));
		}
	}
	const std::vector<crash::Event> ev = rec.events();
	{
		// The recording is complete: replayed, it gives the file the run left.
		crash::ImageBuilder b(initial, ev);
		check(b.final_image() == read_file(path), "the recorded writes, replayed, do not give the traced image: "
							   "a write escaped the recording");
	}
	size_t writes = 0, flushes = 0, durable = 0;
	for (const crash::Event &e : ev)
		(e.kind == crash::Event::flush ? flushes : e.kind == crash::Event::durable_write ? durable : writes)++;

	const std::vector<crash::CrashState> states = crash::enumerate(ev, p.enumerate);
	crash::ImageBuilder builder(initial, ev);
	Checker checker(tr, refs, l, n_chunks);
	size_t checked = 0, torn = 0, resumed = 0, lost = 0;
	std::vector<size_t> per_commit(refs.size());
	for (size_t i = 0; i < states.size(); i++) {
		const crash::CrashState &s = states[i];
		const Bytes img = builder.build(s);
		const size_t r = crash::commits_in(ev, s, img);
		const bool sb_torn = s.torn.len && crash::is_superblock_write(ev[s.point]);
		write_file(state_path, img);
		std::vector<std::string> bad = checker.check(state_path, img, r, sb_torn);
		checked++;
		torn += s.torn.len != 0;
		per_commit[r]++;
		if (bad.empty() && p.resume_every && i % p.resume_every == 0) {
			bad = checker.resume(state_path, r);
			resumed++;
		}
		if (bad.empty())
			continue;
		lost++;
		const std::string keep = (dir / fmt::format("lost-{}.img", i)).string();
		write_file(keep, img);
		fmt::print(stderr, "LOST: {} {}: state {}: {}\n  expected commit {} (step {}); image kept as {}\n",
			   dtype_name, model_name, i, s.describe(ev), r, refs[r].step, keep);
		for (const std::string &b : bad)
			fmt::print(stderr, "  - {}\n", b);
		if (lost >= 20) {
			fmt::print(stderr, "stopping after {} lost states\n", lost);
			break;
		}
	}
	fmt::print("crash {} {}: {} steps, {} commits; recorded {} writes, {} durable writes, {} flushes\n",
		   dtype_name, model_name, p.steps, refs.size() - 1, writes, durable, flushes);
	fmt::print("crash {} {}: {} crash states checked ({} torn), {} resumed; opened at commit:", dtype_name,
		   model_name, checked, torn, resumed);
	for (size_t r = 0; r < per_commit.size(); r++)
		fmt::print(" {}:{}", r, per_commit[r]);
	fmt::print("\ncrash {} {}: {} lost or corrupted\n", dtype_name, model_name, lost);
	fs::remove(state_path);
	if (lost)
		return 1;
	fs::remove_all(dir);
	return 0;
}

} // namespace

int main(int argc, char **argv)
{
	if (argc != 3) {
		fmt::print(stderr, "usage: {} fp16|bf16 small|wide\n", argv[0]);
		return 2;
	}
	try {
		return run(argv[1], argv[2]);
	} catch (const std::exception &e) {
		fmt::print(stderr, "crash_test: {}\n", e.what());
		return 1;
	}
}
