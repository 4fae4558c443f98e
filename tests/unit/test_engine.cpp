// SPDX-License-Identifier: MIT
// The userspace engine at the byte level of the virtual device: what the
// kernel target must answer the same way.
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <mutex>
#include <random>
#include <span>
#include <vector>

#include <csignal>
#include <fcntl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <linux/magic.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include "device.hpp"
#include "format.hpp"
#include "io.hpp"
#include "admin.hpp"

extern "C" {
#include "ckpt_update.h"
}

namespace {

namespace fs = std::filesystem;

// A file's whole contents, to compare images byte for byte.
std::string whole_file(const std::string &path)
{
	std::ifstream f(path, std::ios::binary);
	return std::string(std::istreambuf_iterator<char>(f), {});
}

class EngineTest : public ::testing::Test {
protected:
	void SetUp() override
	{
		dir_ = fs::temp_directory_path() / fmt::format("ckpt-engine-{}-{}", getpid(), counter_++);
		fs::create_directories(dir_);
		path_ = (dir_ / "dev.img").string();
		ckpt::Layout l;
		l.add("a", {5000}, 0);	// shares chunk 1 with b
		l.add("b", {3000}, 0);
		l.add("c", {1000}, 1);	// a chunk of its own
		ckpt::FormatOptions o;
		o.chunk_params = 4096;
		ckpt::format(path_, l, o);
	}
	void TearDown() override { fs::remove_all(dir_); }

	std::unique_ptr<ckpt::Device> open(uint64_t staging = 64u << 20)
	{
		ckpt::EngineOptions o;
		o.staging_bytes = staging;
		return ckpt::Device::open(path_, o);
	}

	static int code_of(const std::function<void()> &f)
	{
		try {
			f();
		} catch (const ckpt::Error &e) {
			return e.code();
		}
		return 0;
	}

	static std::vector<ckpt::GroupHparams> groups() { return std::vector<ckpt::GroupHparams>(2); }

	// The same random params a[5000], b[3000], c[1000] loaded into every
	// device; returns a
	template <class Rng>
	static std::vector<float> load_alike(std::initializer_list<ckpt::Device *> devs, Rng &rng,
					     std::normal_distribution<float> &nd)
	{
		std::vector<float> a(5000), b(3000), c(1000);
		for (auto *t : {&a, &b, &c})
			for (float &x : *t)
				x = nd(rng) * 0.02f;
		for (ckpt::Device *d : devs)
			d->load_params({{"a", a}, {"b", b}, {"c", c}});
		return a;
	}

	// One committed step of the same random bf16 gradients on every device
	// (their layouts alike)
	template <class Rng>
	static void step_alike(std::initializer_list<ckpt::Device *> devs, Rng &rng,
			       std::normal_distribution<float> &nd)
	{
		const struct ckpt_regions &l = (*devs.begin())->regions();
		std::vector<uint16_t> g(l.n_params);
		for (uint16_t &x : g)
			x = ckpt_f32_to_bf16(std::bit_cast<uint32_t>(nd(rng) * 1e-3f));
		for (ckpt::Device *d : devs) {
			d->begin(groups(), 1.0);
			d->write_grad_window(0, g.data(), l.window_bytes);
			ASSERT_EQ(d->commit({}), ckpt::CommitResult::committed);
		}
	}

	// A step of g over the whole window that overflows: open with the
	// overflow seen, skipped at commit, committed_step still `committed`.
	static struct ckpt_status skipped_step(ckpt::Device &d, std::span<const ckpt::GroupHparams> gs,
					       double grad_scale, const std::vector<uint16_t> &g,
					       uint64_t committed)
	{
		d.begin(gs, grad_scale);
		d.write_grad_window(0, g.data(), d.regions().window_bytes);
		EXPECT_EQ(d.status().overflow, 1u);
		EXPECT_EQ(d.commit({}), ckpt::CommitResult::overflow);
		const struct ckpt_status st = d.status();
		EXPECT_EQ(st.committed_step, committed);
		return st;
	}

	// XOR mask into the byte at off of the closed image.
	void flip(uint64_t off, uint8_t mask = 0x01)
	{
		std::fstream f(path_, std::ios::in | std::ios::out | std::ios::binary);
		f.seekg(static_cast<std::streamoff>(off));
		char b = 0;
		f.get(b);
		f.seekp(static_cast<std::streamoff>(off));
		f.put(static_cast<char>(b ^ static_cast<char>(mask)));
	}

	std::vector<char> file_bytes(uint64_t off, uint64_t n)
	{
		std::ifstream f(path_, std::ios::binary);
		f.seekg(static_cast<std::streamoff>(off));
		std::vector<char> out(n);
		f.read(out.data(), static_cast<std::streamsize>(n));
		return out;
	}

	static std::string message_of(const std::function<void()> &f)
	{
		try {
			f();
		} catch (const ckpt::Error &e) {
			return e.what();
		}
		return {};
	}

	// One committed step of gradient 1.0 everywhere.
	static void step(ckpt::Device &d)
	{
		const struct ckpt_regions &l = d.regions();
		std::vector<uint16_t> g(l.n_params, 0x3f80);
		d.begin(groups(), 1.0);
		d.write_grad_window(0, g.data(), l.window_bytes);
		ASSERT_EQ(d.commit({}), ckpt::CommitResult::committed);
	}

	// The masters loaded, three steps, then one with b skipped (a rank's
	// block): what the tests of one way of doing the I/O against another run.
	static void masters_steps_and_a_skip(ckpt::Device &d);

	fs::path dir_;
	std::string path_;
	static inline int counter_ = 0;
};

TEST_F(EngineTest, RegionsOfTheVirtualDevice)
{
	auto d = open();
	ckpt::Engine &e = *d->engine();
	const struct ckpt_regions &l = d->regions();
	EXPECT_EQ(l.grad_off, CKPT_BLOCK);
	EXPECT_EQ(l.param_off, l.grad_off + l.window_bytes);

	std::vector<uint8_t> buf(2 * CKPT_BLOCK, 0xaa);
	e.read(l.grad_off, buf.data(), buf.size());	// GRAD reads are zeros
	for (uint8_t b : buf)
		ASSERT_EQ(b, 0);

	struct ckpt_status st;
	e.read(0, buf.data(), CKPT_BLOCK);
	ASSERT_EQ(ckpt_status_decode(buf.data(), &st), 0);
	EXPECT_EQ(st.state, CKPT_STATE_IDLE);
	EXPECT_EQ(st.geo.n_chunks, 4u);
	EXPECT_EQ(st.geo.n_groups, 2u);

	EXPECT_EQ(code_of([&] { e.write(l.param_off, buf.data(), CKPT_SECTOR); }), CKPT_E_READONLY);
	// The IMAGE window: the backing image's bytes, read-only.
	EXPECT_EQ(l.image_off, l.param_off + l.window_bytes);
	EXPECT_EQ(l.virt_bytes, l.image_off + l.dev_bytes);
	{
		std::ifstream f(path_, std::ios::binary);
		const std::vector<uint8_t> file((std::istreambuf_iterator<char>(f)), {});
		std::vector<uint8_t> image(l.dev_bytes);
		e.read(l.image_off, image.data(), image.size());
		ASSERT_GE(file.size(), image.size());
		EXPECT_TRUE(std::equal(image.begin(), image.end(), file.begin()));
		e.read(l.image_off - 3, buf.data(), 10);	// across its start, unaligned
		EXPECT_TRUE(std::equal(buf.begin() + 3, buf.begin() + 10, file.begin()));
	}
	EXPECT_EQ(code_of([&] { e.write(l.image_off, buf.data(), CKPT_SECTOR); }), CKPT_E_READONLY);
	EXPECT_EQ(code_of([&] { e.write(l.virt_bytes - CKPT_SECTOR, buf.data(), CKPT_SECTOR); }), CKPT_E_READONLY);
	EXPECT_EQ(code_of([&] { e.write(l.grad_off + 1, buf.data(), CKPT_SECTOR); }), CKPT_E_ALIGN);
	EXPECT_EQ(code_of([&] { e.write(l.grad_off, buf.data(), 100); }), CKPT_E_ALIGN);
	EXPECT_EQ(code_of([&] { e.write(l.virt_bytes, buf.data(), CKPT_SECTOR); }), CKPT_E_RANGE);
	EXPECT_EQ(code_of([&] { e.read(l.virt_bytes - 2, buf.data(), 4); }), CKPT_E_RANGE);
	EXPECT_EQ(code_of([&] { e.write(CKPT_SECTOR, buf.data(), CKPT_SECTOR); }), CKPT_E_RANGE);
	// A gradient write that spills into PARAM is refused whole.
	EXPECT_EQ(code_of([&] { e.write(l.param_off - CKPT_SECTOR, buf.data(), 2 * CKPT_SECTOR); }),
		  CKPT_E_RANGE);
	EXPECT_EQ(code_of([&] { e.write(l.grad_off, buf.data(), CKPT_SECTOR); }), CKPT_E_STATE);
}

TEST_F(EngineTest, GarbageCommandIsRefusedAndTold)
{
	auto d = open();
	std::vector<uint8_t> junk(CKPT_SECTOR, 0x5a);
	EXPECT_EQ(code_of([&] { d->engine()->write(0, junk.data(), junk.size()); }), CKPT_E_MAGIC);
	struct ckpt_status st = d->status();
	EXPECT_EQ(st.last_result, CKPT_RESULT_REJECTED);
	EXPECT_EQ(st.last_error, CKPT_E_MAGIC);
	EXPECT_EQ(st.commands_rejected, 1u);
	EXPECT_EQ(st.state, CKPT_STATE_IDLE);
	EXPECT_EQ(st.committed_step, 0u);
}

TEST_F(EngineTest, PartialChunksStageUntilComplete)
{
	auto d = open();
	const struct ckpt_regions &l = d->regions();
	d->begin(groups(), 1.0);
	std::vector<uint16_t> g(l.n_params, 0x3c00);
	// The first half of chunk 0: staged, nothing applied yet.
	d->write_grad_window(0, g.data(), l.plo_chunk_bytes / 2);
	EXPECT_EQ(d->status().chunks_done, 0u);
	// The same sectors again: refused, the staging keeps the first write.
	EXPECT_EQ(code_of([&] { d->write_grad_window(0, g.data(), CKPT_SECTOR); }), CKPT_E_TWICE);
	EXPECT_EQ(d->status().last_error, CKPT_E_TWICE);
	// The second half completes the chunk, which is applied.
	d->write_grad_window(l.plo_chunk_bytes / 2, g.data(), l.plo_chunk_bytes / 2);
	EXPECT_EQ(d->status().chunks_done, 1u);
	// A whole chunk written twice.
	EXPECT_EQ(code_of([&] { d->write_grad_window(0, g.data(), l.plo_chunk_bytes); }), CKPT_E_TWICE);
	// Commit before the rest: refused, the step stays open.
	EXPECT_EQ(code_of([&] { d->commit({}); }), CKPT_E_INCOMPLETE);
	EXPECT_EQ(d->status().state, CKPT_STATE_OPEN);
	d->write_grad_window(l.plo_chunk_bytes, g.data(), l.window_bytes - l.plo_chunk_bytes);
	EXPECT_EQ(d->commit({}), ckpt::CommitResult::committed);
	EXPECT_EQ(d->status().committed_step, 1u);
}

TEST_F(EngineTest, StagingIsBounded)
{
	auto d = open(0);	// the minimum: two partial chunks at a time
	const struct ckpt_regions &l = d->regions();
	std::vector<uint16_t> g(l.n_params, 0x3c00);
	d->begin(groups(), 1.0);
	d->write_grad_window(0, g.data(), CKPT_SECTOR);
	d->write_grad_window(l.plo_chunk_bytes, g.data(), CKPT_SECTOR);
	EXPECT_EQ(code_of([&] { d->write_grad_window(2 * l.plo_chunk_bytes, g.data(), CKPT_SECTOR); }),
		  CKPT_E_NOSPC);
	// A write touching a free and a full staging refuses whole: the first
	// chunk's sector stays unwritten.
	EXPECT_EQ(code_of([&] { d->write_grad_window(l.plo_chunk_bytes - CKPT_SECTOR, g.data(), 2 * CKPT_SECTOR + l.plo_chunk_bytes * 2); }),
		  CKPT_E_TWICE);
	d->abort();
	EXPECT_EQ(d->status().state, CKPT_STATE_IDLE);
	// Abort released the staging.
	d->begin(groups(), 1.0);
	d->write_grad_window(2 * l.plo_chunk_bytes, g.data(), CKPT_SECTOR);
}

TEST_F(EngineTest, OverflowSkipsTheStep)
{
	auto d = open();
	const struct ckpt_regions &l = d->regions();
	std::vector<uint16_t> g(l.n_params, 0x3c00);
	d->begin(groups(), 1.0);
	d->write_grad_window(0, g.data(), l.window_bytes);
	ASSERT_EQ(d->commit({}), ckpt::CommitResult::committed);
	std::vector<uint16_t> before(5000), after(5000);
	d->read_params("a", before.data(), before.size());

	g[4097] = 0x7f80;	// +Inf in bf16, in chunk 1
	struct ckpt_status st = skipped_step(*d, groups(), 1.0, g, 1);
	EXPECT_EQ(st.steps_skipped, 1u);
	EXPECT_EQ(st.state, CKPT_STATE_IDLE);
	d->read_params("a", after.data(), after.size());
	EXPECT_EQ(before, after);
	// A finite grad_scale that overflows a finite gradient counts too.
	g[4097] = 0x7f00;	// 1.7e38
	d->begin(groups(), 4.0);
	d->write_grad_window(0, g.data(), l.window_bytes);
	EXPECT_EQ(d->commit({}), ckpt::CommitResult::overflow);
}

TEST_F(EngineTest, CommitIsDurableAcrossReopen)
{
	std::vector<uint16_t> p1(3000);
	{
		auto d = open();
		const struct ckpt_regions &l = d->regions();
		std::vector<uint16_t> g(l.n_params, 0xbc00);
		d->begin(groups(), 1.0);
		d->write_grad_window(0, g.data(), l.window_bytes);
		const uint8_t blob[] = {1, 2, 3};
		ASSERT_EQ(d->commit(blob), ckpt::CommitResult::committed);
		d->read_params("b", p1.data(), p1.size());
		d->begin(groups(), 1.0);	// left open: must leave no trace
		d->write_grad_window(0, g.data(), l.window_bytes / 2);
	}
	auto d = open();
	struct ckpt_status st = d->status();
	EXPECT_EQ(st.committed_step, 1u);
	EXPECT_EQ(st.state, CKPT_STATE_IDLE);
	ASSERT_EQ(st.blob_len, 3u);
	EXPECT_EQ(st.blob[2], 3);
	std::vector<uint16_t> p2(3000);
	d->read_params("b", p2.data(), p2.size());
	EXPECT_EQ(p1, p2);
}

TEST_F(EngineTest, CorruptStateRecordFailsTheDevice)
{
	{
		const struct ckpt_regions l = ckpt::Image::open(path_, false).sb.regions;
		std::fstream f(path_, std::ios::in | std::ios::out | std::ios::binary);
		f.seekp(static_cast<std::streamoff>(ckpt_record_offset(&l, 0, 2) + 16));
		f.put('\xff');	// the step field of chunk 2's record, committed slot
	}
	auto d = open();
	const struct ckpt_regions &l = d->regions();
	std::vector<uint16_t> g(l.n_params, 0x3c00);
	d->begin(groups(), 1.0);
	// The write is taken; its update fails behind it, and the commit says why.
	EXPECT_EQ(code_of([&] { d->write_grad_window(0, g.data(), l.window_bytes); }), 0);
	struct ckpt_status st = d->status();
	EXPECT_EQ(st.state, CKPT_STATE_FAILED);
	EXPECT_EQ(code_of([&] { d->commit({}); }), CKPT_E_RECORD);
	EXPECT_EQ(code_of([&] { d->commit({}); }), CKPT_E_FAILED);
	EXPECT_EQ(st.committed_step, 0u);
}

// A failed update reports the errno of the failed I/O (here EFBIG: the
// record slot the step writes lies beyond RLIMIT_FSIZE), not a constant EIO.
TEST_F(EngineTest, FailedWriteKeepsItsErrno)
{
	auto d = open();
	const struct ckpt_regions &l = d->regions();
	ASSERT_EQ(truncate(path_.c_str(), static_cast<off_t>(l.rec_off[1])), 0);
	struct rlimit old_lim;
	ASSERT_EQ(getrlimit(RLIMIT_FSIZE, &old_lim), 0);
	struct rlimit lim = old_lim;
	lim.rlim_cur = l.rec_off[1];
	auto old_sig = signal(SIGXFSZ, SIG_IGN);
	ASSERT_EQ(setrlimit(RLIMIT_FSIZE, &lim), 0);
	std::vector<uint16_t> g(l.n_params, 0x3c00);
	d->begin(groups(), 1.0);
	// One chunk: taken, and its update fails behind it. (A write of several
	// chunks may hear of the failure itself, when chunk 0 fails before the
	// write claims the next.)
	d->write_grad_window(0, g.data(), l.plo_chunk_bytes);
	const struct ckpt_status st = d->status();		// waits for the update
	const int code = code_of([&] { d->commit({}); });	// which the commit reports
	setrlimit(RLIMIT_FSIZE, &old_lim);
	signal(SIGXFSZ, old_sig);
	EXPECT_EQ(code, CKPT_E_IO);
	EXPECT_EQ(st.state, CKPT_STATE_FAILED);
	EXPECT_EQ(st.first_io_error, static_cast<uint32_t>(EFBIG));
	EXPECT_EQ(st.commands_rejected, 0u) << "an I/O failure is not a refused command";
}

// A write after an update failed is the first to hear of it: the failure
// (its code and words), once, and nothing of the write is taken; then the
// failed machine refuses as failed.
TEST_F(EngineTest, WriteAfterAFailedUpdateReportsIt)
{
	{
		const struct ckpt_regions l = ckpt::Image::open(path_, false).sb.regions;
		std::fstream f(path_, std::ios::in | std::ios::out | std::ios::binary);
		f.seekp(static_cast<std::streamoff>(ckpt_record_offset(&l, 0, 0) + 16));
		f.put('\xff');	// the step field of chunk 0's record, committed slot
	}
	auto d = open();
	const struct ckpt_regions &l = d->regions();
	std::vector<uint16_t> g(l.n_params, 0x3c00);
	d->begin(groups(), 1.0);
	d->write_grad_window(0, g.data(), l.plo_chunk_bytes);	// chunk 0: fails behind the write
	const uint64_t grad_bytes = d->status().grad_bytes;
	const std::string what = message_of([&] { d->write_grad_window(l.plo_chunk_bytes, g.data(), l.plo_chunk_bytes); });
	EXPECT_NE(what.find("chunk 0"), std::string::npos) << what;
	EXPECT_EQ(d->status().grad_bytes, grad_bytes) << "the write that reported the failure was not taken";
	EXPECT_EQ(code_of([&] { d->write_grad_window(l.plo_chunk_bytes, g.data(), l.plo_chunk_bytes); }),
		  CKPT_E_FAILED);
	EXPECT_EQ(code_of([&] { d->commit({}); }), CKPT_E_FAILED);
	EXPECT_EQ(d->status().committed_step, 0u);
}

// The params each tensor should read back: its fp32 masters, rounded.
std::vector<uint16_t> rounded_params(ckpt::Device &d, const ckpt::Tensor &t)
{
	std::vector<float> p(t.numel), m(t.numel), v(t.numel);
	d.read_state(t.name, p.data(), m.data(), v.data(), t.numel);
	std::vector<uint16_t> out(t.numel);
	ckpt_round_params(d.geometry().dtype, reinterpret_cast<const uint32_t *>(p.data()), out.data(), t.numel);
	return out;
}

// A step's read-back: every tensor in one batch, straight into 4 KiB aligned
// memory or, skewed, through the bounce buffer; each chunk from the slot
// with its latest params (mid-step: the updated chunk of c, the committed
// ones of a and b); nothing written outside each tensor's span; the bytes
// counted are the params asked for. read_state gives the committed state
// while a step is open, so c's expected params are read once the step that
// updated it has committed.
TEST_F(EngineTest, ReadParamsMultiReadsEveryTensorInOneBatch)
{
	auto d = open();
	const auto &ts = d->manifest().tensors();
	std::vector<std::vector<float>> init;
	std::vector<std::pair<std::string, std::span<const float>>> vals;
	std::mt19937 rng(7);
	std::normal_distribution<float> nd(0.0f, 0.02f);
	for (const ckpt::Tensor &t : ts) {
		init.emplace_back(t.numel);
		for (float &x : init.back())
			x = nd(rng);
	}
	for (size_t i = 0; i < ts.size(); i++)
		vals.emplace_back(ts[i].name, init[i]);
	d->load_params(vals);
	step(*d);
	std::vector<std::vector<uint16_t>> want;
	for (const ckpt::Tensor &t : ts)
		want.push_back(rounded_params(*d, t));
	d->begin(groups(), 1.0);
	const ckpt::Tensor &c = d->manifest().find("c");
	std::vector<uint16_t> g(d->regions().n_params, 0x3f80);
	d->write_grad_window(c.offset * 2, g.data(), c.extent * 2);	// its own chunk: updated now
	std::vector<std::vector<uint16_t>> got_c;
	for (uint64_t skew : {0, 1, 3}) {
		std::vector<uint64_t> at;
		uint64_t words = skew;
		for (const ckpt::Tensor &t : ts) {
			at.push_back(words);
			words += (t.numel + 2047) / 2048 * 2048 + skew;
		}
		ckpt::Buffer mem((words + 2048) * 2);
		auto *w = mem.as<uint16_t>();
		std::fill(w, w + words + 2048, 0xdead);
		std::vector<ckpt::ParamsOut> outs;
		for (size_t i = 0; i < ts.size(); i++)
			outs.push_back({ts[i].name, w + at[i], ts[i].numel});
		const uint64_t before = d->traffic().param_bytes;
		d->read_params_multi(outs);
		uint64_t bytes = 0;
		for (size_t i = 0; i < ts.size(); i++) {
			if (ts[i].name == "c")
				got_c.emplace_back(w + at[i], w + at[i] + ts[i].numel);
			else
				EXPECT_TRUE(std::equal(want[i].begin(), want[i].end(), w + at[i]))
					<< ts[i].name << " skew " << skew;
			EXPECT_EQ(w[at[i] + ts[i].numel], 0xdead) << ts[i].name << ": written past its end";
			if (at[i]) {
				EXPECT_EQ(w[at[i] - 1], 0xdead) << ts[i].name << ": written before its start";
			}
			bytes += ts[i].numel * 2;
		}
		EXPECT_EQ(d->traffic().param_bytes - before, bytes);
	}
	// the rest of the window, around c; then c's committed params are the
	// ones its update gave mid-step
	d->write_grad_window(0, g.data(), c.offset * 2);
	const uint64_t end = (c.offset + c.extent) * 2;
	d->write_grad_window(end, g.data(), d->regions().window_bytes - end);
	ASSERT_EQ(d->commit({}), ckpt::CommitResult::committed);
	const std::vector<uint16_t> want_c = rounded_params(*d, c);
	for (const auto &got : got_c)
		EXPECT_EQ(got, want_c);
}

// A step asks the status page once, after COMMIT (committed or skipped):
// BEGIN takes the step after the committed one the client last saw, COMMIT
// the step it opened. Before, a step read it three times.
TEST_F(EngineTest, AStepReadsTheStatusPageOnce)
{
	auto d = open();
	step(*d);
	const ckpt::Traffic t0 = d->traffic();
	step(*d);
	const ckpt::Traffic t1 = d->traffic();
	EXPECT_EQ(t1.status_reads - t0.status_reads, 1u);
	EXPECT_EQ(t1.commands - t0.commands, 2u);
	EXPECT_EQ(t1.grad_bytes - t0.grad_bytes, d->regions().window_bytes);
	EXPECT_EQ(t1.param_bytes - t0.param_bytes, 0u);
	const uint64_t control = t1.control_bytes - t0.control_bytes;
	EXPECT_GT(control, CKPT_BLOCK + 2 * CKPT_SECTOR - 1);
	EXPECT_LE(control, 3u * CKPT_BLOCK);
	EXPECT_EQ(d->status().committed_step, 2u);
}

// A device that moved under the client's last view (here the engine rolled
// back behind the Device's back, as a rollback message does to the kernel
// target) refuses the stale BEGIN, changing nothing; the client asks it and
// opens the right step.
TEST_F(EngineTest, BeginAfterTheDeviceMovedOpensTheRightStep)
{
	auto d = open();
	step(*d);
	step(*d);
	ASSERT_EQ(d->engine()->rollback(), 1u);
	step(*d);
	EXPECT_EQ(d->status().committed_step, 2u);
}

// Writes return before their updates; the order the workers take them in
// does not show: one worker with one queued chunk and the default pool give
// the same PARAM reads mid-step and byte-identical images after the commit.
TEST_F(EngineTest, AsyncUpdatesGiveTheSameBytesInAnyOrder)
{
	const std::string other = (dir_ / "serial.img").string();
	fs::copy_file(path_, other);
	auto run = [](const std::string &path, ckpt::EngineOptions o) {
		auto d = ckpt::Device::open(path, o);
		const struct ckpt_regions &l = d->regions();
		std::vector<uint16_t> g(l.n_params);
		for (uint64_t i = 0; i < g.size(); i++)
			g[i] = static_cast<uint16_t>(0x3c00 + i % 977);	// bf16 of assorted magnitudes
		std::vector<uint16_t> mid(l.n_params);
		for (int step = 0; step < 3; step++) {
			d->begin(groups(), 1.0);
			// back to front, in sector-sized pieces and whole chunks
			const uint64_t cb = l.plo_chunk_bytes;
			for (uint64_t end = l.window_bytes; end;) {
				const uint64_t n = (end / cb) % 2 ? std::min<uint64_t>(end, cb) : CKPT_SECTOR;
				end -= n;
				d->write_grad_window(end, reinterpret_cast<const uint8_t *>(g.data()) + end, n);
			}
			d->read_params("a", mid.data(), 5000);
			EXPECT_EQ(d->commit({}), ckpt::CommitResult::committed);
		}
		// The gradient sum COMMIT reports: the chunks' sums in chunk order,
		// whichever order the updates ran in.
		std::vector<uint64_t> chunk_sums(l.n_params / l.chunk_params);
		for (uint64_t c = 0; c < chunk_sums.size(); c++)
			chunk_sums[c] = ckpt_grad_sumsq(CKPT_DTYPE_BF16, g.data() + c * l.chunk_params,
							l.chunk_params, 0);
		EXPECT_EQ(d->grad_sumsq(), ckpt_sum_f64(chunk_sums.data(), chunk_sums.size()));
		EXPECT_EQ(d->status().grad_sumsq_step, 3u);
		return std::make_pair(mid, *d->grad_sumsq());
	};
	ckpt::EngineOptions serial;
	serial.workers = 1;
	serial.depth = 1;
	serial.queue_chunks = 1;
	const auto a = run(path_, {});
	const auto b = run(other, serial);
	EXPECT_EQ(a, b);
	EXPECT_TRUE(whole_file(path_) == whole_file(other)) << "the images differ";
}

// Bit rot in committed state must not become new committed state with a
// fresh checksum: the step reads the record, checks its data crc and fails.
TEST_F(EngineTest, FlippedDataBitFailsTheStep)
{
	{
		auto d = open();
		step(*d);
	}
	const ckpt::Image img = ckpt::Image::open(path_, false);
	const struct ckpt_regions l = img.sb.regions;
	const uint32_t slot = img.sb.committed_slot;
	const uint64_t rec0 = ckpt_record_offset(&l, slot, 0);
	flip(rec0 + CKPT_BLOCK + 2, 0x40);	// an exponent bit of p[0]
	const std::vector<char> before = file_bytes(l.plo_off[0], l.dev_bytes - l.plo_off[0]);

	auto d = open();
	std::vector<uint16_t> g(l.n_params, 0x3f80);
	d->begin(groups(), 1.0);
	// A worker's failure is reported by the next write or command: by the
	// write itself where chunk 0 failed before its last chunk was queued
	// (a slow machine), else by the commit.
	const std::string what = message_of([&] {
		d->write_grad_window(0, g.data(), l.window_bytes);
		d->commit({});
	});
	EXPECT_NE(what.find("chunk 0"), std::string::npos) << what;
	EXPECT_NE(what.find("data checksum"), std::string::npos) << what;
	struct ckpt_status st = d->status();
	EXPECT_EQ(st.state, CKPT_STATE_FAILED);
	EXPECT_EQ(st.committed_step, 1u);
	EXPECT_EQ(code_of([&] { d->commit({}); }), CKPT_E_FAILED);
	d.reset();
	// The committed slot is untouched: the damage is still there to see.
	const uint64_t from = ckpt_record_offset(&l, slot, 0) - l.plo_off[0];
	const std::vector<char> after = file_bytes(l.plo_off[0], l.dev_bytes - l.plo_off[0]);
	EXPECT_TRUE(std::equal(before.begin() + static_cast<long>(from),
			       before.begin() + static_cast<long>(from + l.record_bytes * img.sb.geo.n_chunks),
			       after.begin() + static_cast<long>(from)));
	const ckpt::Image again = ckpt::Image::open(path_, false);
	EXPECT_EQ(again.sb.committed_step, 1u);
	EXPECT_EQ(again.sb.sequence, img.sb.sequence);
}

// A flipped bit in committed p_lo must not come back into a resumed model.
TEST_F(EngineTest, FlippedPloBitFailsReadParams)
{
	{
		auto d = open();
		step(*d);
	}
	const ckpt::Image img = ckpt::Image::open(path_, false);
	const struct ckpt_regions l = img.sb.regions;
	const ckpt::Tensor &c = img.manifest.find("c");
	flip(ckpt_plo_offset(&l, img.sb.committed_slot, 0) + c.offset * 2 + 10, 0x02);

	auto d = open();
	std::vector<uint16_t> out(c.numel);
	EXPECT_EQ(code_of([&] { d->read_params("c", out.data(), out.size()); }), CKPT_E_RECORD);
	const std::string what = message_of([&] { d->read_params("c", out.data(), out.size()); });
	EXPECT_NE(what.find("chunk 3"), std::string::npos) << what;
	EXPECT_NE(what.find("'c'"), std::string::npos) << what;
	EXPECT_NE(what.find("p_lo checksum"), std::string::npos) << what;
	// Other chunks read fine.
	std::vector<uint16_t> a(5000);
	d->read_params("a", a.data(), a.size());
}

// Images formatted before the p_lo checksum keep opening and working, without
// the check.
TEST_F(EngineTest, ImageWithoutPloCrcKeepsWorking)
{
	const ckpt::Image img0 = ckpt::Image::open(path_, false);
	struct ckpt_sb sb = img0.sb;
	sb.feature_incompat &= ~CKPT_FEATURE_INCOMPAT_PLO_CRC;
	{
		std::vector<uint8_t> block(CKPT_BLOCK);
		ASSERT_EQ(ckpt_sb_encode(&sb, block.data()), 0);
		std::fstream f(path_, std::ios::in | std::ios::out | std::ios::binary);
		f.seekp(static_cast<std::streamoff>((sb.sequence & 1) * CKPT_BLOCK));
		f.write(reinterpret_cast<const char *>(block.data()), CKPT_BLOCK);
	}
	{
		auto d = open();
		step(*d);
	}
	const ckpt::Image img = ckpt::Image::open(path_, false);
	EXPECT_EQ(img.sb.feature_incompat & CKPT_FEATURE_INCOMPAT_PLO_CRC, 0u);
	const ckpt::Tensor &c = img.manifest.find("c");
	flip(ckpt_plo_offset(&img.sb.regions, img.sb.committed_slot, 0) + c.offset * 2 + 10, 0x02);
	auto d = open();
	std::vector<uint16_t> out(c.numel);
	d->read_params("c", out.data(), out.size());	// not checked: no checksum
	step(*d);
}

// eps = 0 with a zero gradient gives 0/0: the step is skipped like an
// overflow, the masters stay as they were (not NaN).
TEST_F(EngineTest, EpsZeroWithZeroGradientIsSkipped)
{
	auto d = open();	// step 0: p, m, v all zero
	const struct ckpt_regions &l = d->regions();
	auto gs = groups();
	gs[1].eps = 0;		// group 1: tensor c
	std::vector<uint16_t> g(l.n_params, 0x3f80);
	const ckpt::Tensor &c = d->manifest().find("c");
	std::fill(g.begin() + static_cast<long>(c.offset), g.end(), 0);
	const struct ckpt_status st = skipped_step(*d, gs, 1.0, g, 0);
	EXPECT_EQ(st.steps_skipped, 1u);
	std::vector<float> p(1000, 1.0f), m(1000, 1.0f), v(1000, 1.0f);
	d->read_state("c", p.data(), m.data(), v.data(), 1000);
	std::vector<uint16_t> plo(1000, 1);
	d->read_params("c", plo.data(), plo.size());
	for (size_t i = 0; i < 1000; i++) {
		ASSERT_EQ(p[i], 0.0f) << i;	// not NaN
		ASSERT_EQ(m[i], 0.0f) << i;
		ASSERT_EQ(v[i], 0.0f) << i;
		ASSERT_EQ(plo[i], 0u) << i;
	}
	// The same step with eps > 0 commits.
	d->begin(groups(), 1.0);
	d->write_grad_window(0, g.data(), l.window_bytes);
	EXPECT_EQ(d->commit({}), ckpt::CommitResult::committed);
}

// What torch.optim.AdamW refuses, the client refuses first, naming the group
// and the field; nothing reaches the device.
TEST_F(EngineTest, BeginRefusesWhatTorchRefuses)
{
	auto d = open();
	struct Bad {
		const char *field;
		std::function<void(ckpt::GroupHparams &)> set;
	};
	const Bad cases[] = {
		{"lr", [](auto &g) { g.lr = -1e-3; }},
		{"eps", [](auto &g) { g.eps = -1e-8; }},
		{"beta1", [](auto &g) { g.beta1 = 1.0; }},
		{"beta1", [](auto &g) { g.beta1 = -0.1; }},
		{"beta2", [](auto &g) { g.beta2 = 1.5; }},
		{"weight_decay", [](auto &g) { g.weight_decay = -0.01; }},
	};
	for (const Bad &b : cases) {
		auto gs = groups();
		b.set(gs[1]);
		const std::string what = message_of([&] { d->begin(gs, 1.0); });
		EXPECT_NE(what.find("group 1"), std::string::npos) << what;
		EXPECT_NE(what.find(b.field), std::string::npos) << what;
		EXPECT_EQ(code_of([&] { d->begin(gs, 1.0); }), CKPT_E_HPARAM);
		struct ckpt_status st = d->status();
		EXPECT_EQ(st.state, CKPT_STATE_IDLE) << b.field;
		EXPECT_EQ(st.commands_rejected, 0u) << b.field;
	}
	// The device refuses them too, when a client sends them anyway.
	struct ckpt_cmd cmd = {};
	cmd.opcode = CKPT_OP_BEGIN;
	cmd.step = 1;
	cmd.grad_scale = 0x3f800000u;
	cmd.n_groups = 2;
	cmd.groups[0] = ckpt::hparams_for_step(groups()[0], 1);
	cmd.groups[1] = ckpt::hparams_for_step(groups()[1], 1);
	cmd.groups[1].lr = 0xbf800000u;	// -1.0
	std::vector<uint8_t> page(CKPT_BLOCK);
	const int len = ckpt_cmd_encode(&cmd, page.data());
	ASSERT_GT(len, 0);
	const uint64_t padded = (static_cast<uint64_t>(len) + CKPT_SECTOR - 1) / CKPT_SECTOR * CKPT_SECTOR;
	EXPECT_EQ(code_of([&] { d->engine()->write(0, page.data(), padded); }), CKPT_E_HPARAM);
	struct ckpt_status st = d->status();
	EXPECT_EQ(st.state, CKPT_STATE_IDLE);
	EXPECT_EQ(st.last_error, CKPT_E_HPARAM);
}

// ---- skipping tensors and per-block step counts (COUNTS)

struct TensorState {
	std::vector<float> p, m, v;
	bool operator==(const TensorState &o) const
	{
		auto same = [](const std::vector<float> &a, const std::vector<float> &b) {
			return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * 4) == 0;
		};
		return same(p, o.p) && same(m, o.m) && same(v, o.v);
	}
};

static TensorState state_of(ckpt::Device &d, const std::string &name)
{
	const uint64_t n = d.manifest().find(name).numel;
	TensorState s{std::vector<float>(n), std::vector<float>(n), std::vector<float>(n)};
	d.read_state(name, s.p.data(), s.m.data(), s.v.data(), n);
	return s;
}

// Gradients of one step: a distinct value per tensor and step (fp16 bits).
static std::vector<uint16_t> grad_of(ckpt::Device &d, const std::string &name, int step)
{
	const uint64_t n = d.manifest().find(name).numel;
	std::vector<uint16_t> g(n);
	for (uint64_t i = 0; i < n; i++)
		g[i] = static_cast<uint16_t>(0x3000 + (i * 7 + name[0] * 13 + step * 101) % 0x0c00);
	return g;
}

static void load_masters(ckpt::Device &d)
{
	std::vector<std::pair<std::string, std::vector<float>>> vals;
	for (const char *name : {"a", "b", "c"}) {
		const uint64_t n = d.manifest().find(name).numel;
		std::vector<float> v(n);
		for (uint64_t i = 0; i < n; i++)
			v[i] = 0.25f + static_cast<float>(i % 97) / 128.0f;
		vals.emplace_back(name, std::move(v));
	}
	std::vector<std::pair<std::string, std::span<const float>>> spans;
	for (auto &[n, v] : vals)
		spans.emplace_back(n, v);
	d.load_params(spans);
}

void EngineTest::masters_steps_and_a_skip(ckpt::Device &d)
{
	load_masters(d);
	for (int i = 0; i < 3; i++)
		step(d);
	d.begin(groups(), 1.0);
	d.skip("b");
	for (const char *name : {"a", "c"}) {
		const uint64_t n = d.manifest().find(name).numel;
		std::vector<uint16_t> g(n, 0xbf00);
		d.write_grad(name, g.data(), n);
	}
	ASSERT_EQ(d.commit({}), ckpt::CommitResult::committed);
}

// One step: write the tensors in `write`, skip the rest.
static ckpt::CommitResult step_with(ckpt::Device &d, int step, std::initializer_list<const char *> write)
{
	std::vector<ckpt::GroupHparams> gs(2);
	for (auto &g : gs) {
		g.lr = 1e-2;
		g.weight_decay = 0.1;
	}
	d.begin(gs, 1.0);
	for (const char *name : {"a", "b", "c"}) {
		if (std::find_if(write.begin(), write.end(), [&](const char *w) {
			    return std::string(w) == name;
		    }) != write.end()) {
			const std::vector<uint16_t> g = grad_of(d, name, step);
			d.write_grad(name, g.data(), g.size());
		} else {
			d.skip(name);
		}
	}
	return d.commit({});
}

// Rollback: step 2 committed, rolled back to step 1 with step 1's state,
// counts, p_lo and blob bit for bit; the next step 2 is the one an unrolled
// device takes; refused with nothing to go back to, with a step open, and a
// second time (never two steps); kept across a reopen.
TEST_F(EngineTest, RollbackGoesBackOneStepOnce)
{
	auto d = open();
	EXPECT_EQ(code_of([&] { d->rollback(); }), CKPT_E_ROLLBACK);	// step 0
	load_masters(*d);
	ASSERT_EQ(step_with(*d, 1, {"a", "c"}), ckpt::CommitResult::committed);
	std::map<std::string, TensorState> s1;
	std::map<std::string, std::vector<uint16_t>> plo1;
	for (const char *n : {"a", "b", "c"}) {
		s1[n] = state_of(*d, n);
		plo1[n].resize(d->manifest().find(n).numel);
		d->read_params(n, plo1[n].data(), plo1[n].size());
	}
	ASSERT_EQ(step_with(*d, 2, {"a", "b", "c"}), ckpt::CommitResult::committed);
	EXPECT_FALSE(state_of(*d, "a") == s1["a"]);
	d->begin(groups(), 1.0);
	EXPECT_EQ(code_of([&] { d->rollback(); }), CKPT_E_STATE);	// a step is open
	d->abort();	// it wrote nothing: the previous slot is intact
	EXPECT_EQ(d->rollback(), 1u);
	EXPECT_EQ(d->status().committed_step, 1u);
	for (const char *n : {"a", "b", "c"}) {
		EXPECT_TRUE(state_of(*d, n) == s1[n]) << n;
		std::vector<uint16_t> plo(plo1[n].size());
		d->read_params(n, plo.data(), plo.size());
		EXPECT_EQ(plo, plo1[n]) << n;
	}
	EXPECT_EQ(d->tensor_step("b"), 0u);
	EXPECT_EQ(d->tensor_step("a"), 1u);
	const std::string twice = message_of([&] { d->rollback(); });
	EXPECT_NE(twice.find("once"), std::string::npos) << twice;
	EXPECT_EQ(code_of([&] { d->rollback(); }), CKPT_E_ROLLBACK);

	// The step after the rollback is the step 2 a device that never went
	// back takes, and the image is the same byte for byte.
	ASSERT_EQ(step_with(*d, 2, {"a", "b", "c"}), ckpt::CommitResult::committed);
	const TensorState a2 = state_of(*d, "a");
	d.reset();
	auto again = open();
	EXPECT_EQ(again->status().committed_step, 2u);
	EXPECT_TRUE(state_of(*again, "a") == a2);
	// A step written over the previous slot and aborted: nothing to go back to.
	std::vector<uint16_t> g(again->regions().n_params, 0x3c00);
	again->begin(groups(), 1.0);
	again->write_grad_window(0, g.data(), again->regions().window_bytes);
	again->abort();
	EXPECT_EQ(code_of([&] { again->rollback(); }), CKPT_E_ROLLBACK);
	EXPECT_EQ(again->status().committed_step, 2u);
}

// The param cache (EngineOptions::param_cache) answers what the device
// holds: a cached and an uncached engine on two copies of one image read the
// same params after a load, committed steps, a step skipped for overflow, a
// step written and aborted, a rollback and a reopen. After a committed step
// the cached engine reads no device: the params on the image are overwritten
// behind its back and it still reads the step's.
TEST_F(EngineTest, ParamCacheReadsWhatTheDeviceHolds)
{
	const std::string twin = (dir_ / "twin.img").string();
	fs::copy_file(path_, twin);
	ckpt::EngineOptions o;
	o.param_cache = true;
	auto cached = ckpt::Device::open(twin, o);
	auto plain = open();
	const auto same = [&](const char *when) {
		for (const char *n : {"a", "b", "c"}) {
			const uint64_t k = plain->manifest().find(n).numel;
			std::vector<uint16_t> x(k, 1), y(k, 2);
			plain->read_params(n, x.data(), k);
			cached->read_params(n, y.data(), k);
			EXPECT_EQ(x, y) << n << " " << when;
		}
	};
	load_masters(*plain);
	load_masters(*cached);
	same("after the load");
	for (int t = 1; t <= 2; t++) {
		ASSERT_EQ(step_with(*plain, t, {"a", "b", "c"}), ckpt::CommitResult::committed);
		ASSERT_EQ(step_with(*cached, t, {"a", "b", "c"}), ckpt::CommitResult::committed);
		same("after a step");
	}
	std::vector<uint16_t> inf(plain->regions().n_params, 0x7c00);
	for (ckpt::Device *d : {plain.get(), cached.get()})
		skipped_step(*d, groups(), 1.0, inf, 2);
	same("after an overflow");
	std::vector<uint16_t> g(plain->regions().n_params, 0x3c00);
	for (ckpt::Device *d : {plain.get(), cached.get()}) {
		d->begin(groups(), 1.0);
		d->write_grad_window(0, g.data(), d->regions().window_bytes);
		d->abort();
	}
	same("after an aborted step");
	for (ckpt::Device *d : {plain.get(), cached.get()})
		ASSERT_EQ(step_with(*d, 3, {"a", "c"}), ckpt::CommitResult::committed);
	for (ckpt::Device *d : {plain.get(), cached.get()})
		EXPECT_EQ(d->rollback(), 2u);
	same("after a rollback");
	for (ckpt::Device *d : {plain.get(), cached.get()})
		ASSERT_EQ(step_with(*d, 3, {"a", "b"}), ckpt::CommitResult::committed);
	same("after the step after the rollback");

	// read from memory: the committed params on the image zeroed
	const uint64_t n = cached->manifest().find("a").numel;	// the manifest goes with the device
	std::vector<uint16_t> want(n);
	cached->read_params("a", want.data(), n);
	{
		const ckpt::Image img = ckpt::Image::open(twin, false);
		const struct ckpt_regions &l = img.sb.regions;
		std::fstream f(twin, std::ios::in | std::ios::out | std::ios::binary);
		f.seekp(static_cast<std::streamoff>(ckpt_plo_offset(&l, img.sb.committed_slot, 0)));
		const std::vector<char> zeros(l.plo_chunk_bytes);
		f.write(zeros.data(), static_cast<std::streamsize>(zeros.size()));
	}
	std::vector<uint16_t> got(n, 1);
	cached->read_params("a", got.data(), n);
	EXPECT_EQ(got, want);
	// and a reopened engine starts with no cache: it reads the device's
	cached.reset();
	cached = ckpt::Device::open(twin, o);
	EXPECT_NE(code_of([&] { cached->read_params("a", got.data(), n); }), 0)
		<< "the zeroed params fail their checksum";
}

// The ROLLBACK command written to the control block is Engine::rollback:
// two copies of one image at step 2, one rolled back by the call, the other
// by raw command writes, end byte-identical. Every refusal (a step other
// than the committed one, a step open, a second rollback, the previous slot
// overwritten, a failed device) says why, is counted on the status page and
// leaves the image byte-identical.
TEST_F(EngineTest, RollbackCommandIsEngineRollback)
{
	{
		auto d = open();
		load_masters(*d);
		step(*d);
		step(*d);
	}
	const std::string twin = (dir_ / "twin.img").string();
	fs::copy_file(path_, twin);
	{
		auto e = ckpt::Engine::open(path_);
		EXPECT_EQ(e->rollback(), 1u);
	}

	auto e = ckpt::Engine::open(twin);
	std::vector<uint8_t> block(CKPT_BLOCK);
	auto send = [&](uint32_t op, uint64_t step) {
		auto c = std::make_unique<struct ckpt_cmd>();
		c->opcode = op;
		c->step = step;
		c->n_groups = 2;
		c->grad_scale = 0x3f800000;
		for (uint32_t i = 0; i < 2; i++)
			c->groups[i] = ckpt::hparams_for_step(groups()[i], step);
		const int len = ckpt_cmd_encode(c.get(), block.data());
		EXPECT_GT(len, 0);
		e->write(0, block.data(), (uint64_t(len) + 511) / 512 * 512);
	};
	auto refused = [&](uint64_t step, int code, const char *says) {
		const auto before = whole_file(twin);
		const uint64_t rejected = e->status().commands_rejected;
		const std::string m = message_of([&] { send(CKPT_OP_ROLLBACK, step); });
		EXPECT_NE(m.find(says), std::string::npos) << m;
		EXPECT_EQ(code_of([&] { send(CKPT_OP_ROLLBACK, step); }), code) << m;
		const struct ckpt_status st = e->status();
		EXPECT_EQ(st.commands_rejected, rejected + 2) << m;
		EXPECT_EQ(st.last_error, uint32_t(code)) << m;
		EXPECT_EQ(whole_file(twin), before) << m;
	};
	refused(1, CKPT_E_STEP, "the committed step is 2");
	refused(3, CKPT_E_STEP, "the committed step is 2");
	send(CKPT_OP_BEGIN, 3);
	refused(0, CKPT_E_STATE, "step 3 is open");
	send(CKPT_OP_ABORT, 3);	// nothing written: step 1 is still there
	send(CKPT_OP_ROLLBACK, 2);
	EXPECT_EQ(e->status().committed_step, 1u);
	refused(0, CKPT_E_ROLLBACK, "once");
	e.reset();
	EXPECT_TRUE(whole_file(twin) == whole_file(path_)) << "the command and the call wrote the same bytes";

	// The previous slot overwritten by a step that was then aborted.
	e = ckpt::Engine::open(twin);
	std::vector<uint16_t> g(e->regions().n_params, 0x3c00);
	for (uint64_t t : {2, 3}) {
		send(CKPT_OP_BEGIN, t);
		e->write(e->regions().grad_off, g.data(), e->regions().window_bytes);
		send(t == 2 ? CKPT_OP_COMMIT : CKPT_OP_ABORT, t);
	}
	refused(2, CKPT_E_ROLLBACK, "overwritten by step 3");
	// A failed device: a corrupt record of the committed slot fails the step.
	e.reset();
	{
		const struct ckpt_regions l = ckpt::Image::open(twin, false).sb.regions;
		const uint32_t slot = ckpt::Image::open(twin, false).sb.committed_slot;
		std::fstream f(twin, std::ios::in | std::ios::out | std::ios::binary);
		f.seekp(static_cast<std::streamoff>(ckpt_record_offset(&l, slot, 0) + 16));
		f.put('\xff');
	}
	e = ckpt::Engine::open(twin);
	send(CKPT_OP_BEGIN, 3);
	// The update's error is reported by the first call after it: the write
	// itself when a worker failed chunk 0 before the write of the window's
	// last chunk returned (so it does, one at a time, with pread/pwrite under
	// qemu-user), else the next command.
	code_of([&] { e->write(e->regions().grad_off, g.data(), e->regions().window_bytes); });
	EXPECT_EQ(e->status().state, uint32_t(CKPT_STATE_FAILED));
	EXPECT_NE(code_of([&] { send(CKPT_OP_ABORT, 3); }), 0);
	refused(0, CKPT_E_FAILED, "failed earlier");
}

// A rollback survives a reopen, and a reopened device can roll back.
TEST_F(EngineTest, RollbackAcrossReopen)
{
	{
		auto d = open();
		load_masters(*d);
		ASSERT_EQ(step_with(*d, 1, {"a", "b", "c"}), ckpt::CommitResult::committed);
	}
	TensorState a1;
	{
		auto d = open();
		a1 = state_of(*d, "a");
		ASSERT_EQ(step_with(*d, 2, {"a", "b", "c"}), ckpt::CommitResult::committed);
	}
	{
		auto d = open();
		EXPECT_EQ(d->rollback(), 1u);
	}
	auto d = open();
	EXPECT_EQ(d->status().committed_step, 1u);
	EXPECT_TRUE(state_of(*d, "a") == a1);
	EXPECT_EQ(code_of([&] { d->rollback(); }), CKPT_E_ROLLBACK);
}

// Fails one read, write or flush of the backing file's own I/O (the
// rollback's and the commit's) with EIO, before or after it is done
// (IoObserver::fault): the n-th one once armed. Keeps what it saw.
class FaultAt : public ckpt::IoObserver {
public:
	struct Io {
		Op op;
		uint64_t off;
		size_t len;
	};
	FaultAt(size_t n, Fault how) : n_(n), how_(how) {}
	void arm(bool on)
	{
		std::lock_guard lk(mu_);
		armed_ = on;
	}
	bool hit() const { return hit_; }
	std::vector<Io> seen() const
	{
		std::lock_guard lk(mu_);
		return seen_;
	}
	size_t writes() const
	{
		std::lock_guard lk(mu_);
		return writes_;
	}
	void written(uint64_t, const void *, size_t, bool) noexcept override
	{
		std::lock_guard lk(mu_);
		writes_++;
	}
	void flushed() noexcept override {}
	Fault fault(Op op, uint64_t off, size_t len) noexcept override
	{
		std::lock_guard lk(mu_);
		if (!armed_)
			return Fault::none;
		seen_.push_back({op, off, len});
		if (seen_.size() - 1 != n_)
			return Fault::none;
		hit_ = true;
		return how_;
	}

private:
	mutable std::mutex mu_;
	const size_t n_;
	const Fault how_;
	bool armed_ = false, hit_ = false;
	std::vector<Io> seen_;
	size_t writes_ = 0;
};

// An I/O error at every I/O of a rollback, before or after the I/O is done.
// Before the superblock write: the rollback is refused, nothing changed
// (the device stays at step 2 and can roll back again). From it on (the
// write itself, a write the device kept, its flush, its read-back) the
// device may commit either step: it fails, and writes nothing more (a step
// 3 would write the slot the disk may name as committed). Either way the
// image verifies after close, and a reopened device goes on from the step
// the disk commits, with that step's state.
TEST_F(EngineTest, RollbackFailingAtEveryIo)
{
	const std::string copy = (dir_ / "step2.img").string();
	std::map<uint64_t, TensorState> state;
	uint64_t sb_off;
	{
		auto d = open();
		load_masters(*d);
		for (int t : {1, 2}) {
			ASSERT_EQ(step_with(*d, t, {"a", "b", "c"}), ckpt::CommitResult::committed);
			state[t] = state_of(*d, "a");
		}
		d.reset();
		const ckpt::Image img = ckpt::Image::open(path_, false);
		sb_off = ckpt_sb_next_offset(&img.sb);
		fs::copy_file(path_, copy);
	}
	const auto verifies = [&](const std::string &why) {
		const std::string report = ckpt::verify_report(path_, false);
		EXPECT_NE(report.find("\"damage\":[]"), std::string::npos) << why << ": " << report;
	};
	size_t before_sb = 0, after_sb = 0;
	for (size_t n = 0;; n++) {
		bool done = false;
		for (auto how : {ckpt::IoObserver::Fault::before, ckpt::IoObserver::Fault::after}) {
			const std::string why = fmt::format("I/O {} failing {} it", n,
							    how == ckpt::IoObserver::Fault::before ? "before" : "after");
			fs::copy_file(copy, path_, fs::copy_options::overwrite_existing);
			FaultAt faults(n, how);
			ckpt::EngineOptions o;
			o.observer = &faults;
			auto d = ckpt::Device::open(path_, o);
			faults.arm(true);
			const int code = code_of([&] { d->rollback(); });
			faults.arm(false);
			if (!faults.hit()) {
				EXPECT_EQ(code, 0) << why;
				EXPECT_EQ(d->status().committed_step, 1u) << why;
				done = true;
				break;
			}
			ASSERT_EQ(code, CKPT_E_IO) << why;
			const std::vector<FaultAt::Io> seen = faults.seen();
			const auto sb = std::find_if(seen.begin(), seen.end(), [&](const FaultAt::Io &io) {
				return io.op == ckpt::IoObserver::Op::write && io.off == sb_off;
			});
			// the failed I/O is the last one seen: no superblock write
			// among them, it came before that write
			uint64_t commits = 2;
			if (sb == seen.end()) {
				before_sb++;
				const struct ckpt_status st = d->status();
				EXPECT_EQ(st.state, uint32_t(CKPT_STATE_IDLE)) << why;
				EXPECT_EQ(st.committed_step, 2u) << why;
				EXPECT_TRUE(state_of(*d, "a") == state[2]) << why;
				EXPECT_EQ(d->rollback(), 1u) << why << ": a refused rollback is repeatable";
				commits = 1;
			} else {
				after_sb++;
				EXPECT_EQ(d->status().state, uint32_t(CKPT_STATE_FAILED)) << why;
				const size_t writes = faults.writes();
				EXPECT_EQ(code_of([&] { d->begin(groups(), 1.0); }), CKPT_E_FAILED) << why;
				EXPECT_EQ(code_of([&] { d->rollback(); }), CKPT_E_FAILED) << why;
				EXPECT_EQ(faults.writes(), writes) << why << ": a failed device writes nothing";
				// the superblock on the file, whatever its write answered
				if (sb != seen.end() - 1 || how == ckpt::IoObserver::Fault::after)
					commits = 1;
			}
			d.reset();
			verifies(why);
			d = open();
			ASSERT_EQ(d->status().committed_step, commits) << why;
			EXPECT_TRUE(state_of(*d, "a") == state[commits]) << why;
			ASSERT_EQ(step_with(*d, int(commits) + 1, {"a", "b", "c"}), ckpt::CommitResult::committed)
				<< why;
			d.reset();
			verifies(why + ", then a step");
		}
		if (done)
			break;
	}
	EXPECT_GE(before_sb, 6u) << "the reads and re-stamps of the records, and the flush";
	EXPECT_GE(after_sb, 4u) << "the superblock write and its read-back";
}

// b shares chunk 1 with a: a skipped b keeps p, m, v and its count bit for
// bit while a, in the same chunk, is updated.
TEST_F(EngineTest, SkippedTensorKeepsItsStateBitForBit)
{
	auto d = open();
	load_masters(*d);
	ASSERT_EQ(step_with(*d, 1, {"a", "b", "c"}), ckpt::CommitResult::committed);
	const TensorState b1 = state_of(*d, "b"), a1 = state_of(*d, "a");
	std::vector<uint16_t> plo1(d->manifest().find("b").numel);
	d->read_params("b", plo1.data(), plo1.size());
	ASSERT_EQ(step_with(*d, 2, {"a", "c"}), ckpt::CommitResult::committed);
	EXPECT_TRUE(state_of(*d, "b") == b1);
	EXPECT_FALSE(state_of(*d, "a") == a1);
	std::vector<uint16_t> plo2(plo1.size());
	d->read_params("b", plo2.data(), plo2.size());
	EXPECT_EQ(plo1, plo2);
	EXPECT_EQ(d->tensor_step("a"), 2u);
	EXPECT_EQ(d->tensor_step("b"), 1u);
	EXPECT_EQ(d->tensor_step("c"), 2u);
	d.reset();
	auto again = open();	// the counts are on the device
	EXPECT_EQ(again->tensor_step("b"), 1u);
	EXPECT_TRUE(state_of(*again, "b") == b1);
}

// A tensor updated after being skipped is bias-corrected with its own count:
// b skipped at step 1 and given gradient G at step 2 ends where a device
// that gave b the same G at step 1 ends, bit for bit.
TEST_F(EngineTest, UpdateAfterSkipUsesTheTensorsOwnCount)
{
	auto d = open();
	load_masters(*d);
	ASSERT_EQ(step_with(*d, 1, {"a", "c"}), ckpt::CommitResult::committed);
	EXPECT_EQ(d->tensor_step("b"), 0u);
	d->begin(std::vector<ckpt::GroupHparams>(2, {1e-2, 0.9, 0.999, 1e-8, 0.1, false}), 1.0);
	const std::vector<uint16_t> g = grad_of(*d, "b", 7);
	d->write_grad("b", g.data(), g.size());
	d->skip("a");
	d->skip("c");
	ASSERT_EQ(d->commit({}), ckpt::CommitResult::committed);
	EXPECT_EQ(d->tensor_step("b"), 1u);
	const TensorState late = state_of(*d, "b");
	d.reset();

	fs::remove(path_);
	{
		ckpt::Layout l;
		l.add("a", {5000}, 0);
		l.add("b", {3000}, 0);
		l.add("c", {1000}, 1);
		ckpt::FormatOptions o;
		o.chunk_params = 4096;
		ckpt::format(path_, l, o);
	}
	auto fresh = open();
	load_masters(*fresh);
	fresh->begin(std::vector<ckpt::GroupHparams>(2, {1e-2, 0.9, 0.999, 1e-8, 0.1, false}), 1.0);
	fresh->write_grad("b", g.data(), g.size());
	fresh->skip("a");
	fresh->skip("c");
	ASSERT_EQ(fresh->commit({}), ckpt::CommitResult::committed);
	EXPECT_TRUE(state_of(*fresh, "b") == late);
}

// A write that ignores a lagging block's count (no bias correction for it)
// is caught at the update: COMMIT refuses (E_STEP), ABORT ends the step.
TEST_F(EngineTest, CountMismatchRefusesTheCommit)
{
	auto d = open();
	load_masters(*d);
	ASSERT_EQ(step_with(*d, 1, {"a", "c"}), ckpt::CommitResult::committed);
	const TensorState b0 = state_of(*d, "b");
	const struct ckpt_regions &l = d->regions();
	std::vector<uint16_t> g(l.n_params, 0x3c00);
	d->begin(groups(), 1.0);
	d->write_grad_window(0, g.data(), l.window_bytes);	// b at the group's step 2
	EXPECT_EQ(code_of([&] { d->commit({}); }), CKPT_E_STEP);
	EXPECT_EQ(d->status().state, CKPT_STATE_OPEN);
	d->abort();
	EXPECT_EQ(d->status().committed_step, 1u);
	EXPECT_TRUE(state_of(*d, "b") == b0);
	ASSERT_EQ(step_with(*d, 2, {"a", "b", "c"}), ckpt::CommitResult::committed);
	EXPECT_EQ(d->tensor_step("b"), 1u);
}

// RANGE is checked whole before anything changes.
TEST_F(EngineTest, RangeCommandIsChecked)
{
	auto d = open();
	struct ckpt_cmd cmd = {};
	cmd.opcode = CKPT_OP_RANGE;
	cmd.step = 1;
	cmd.n_ranges = 1;
	cmd.ranges[0] = {0, 4096, 0, 0, 0, CKPT_RANGE_SKIP};
	std::vector<uint8_t> page(CKPT_BLOCK);
	auto send = [&] {
		const int len = ckpt_cmd_encode(&cmd, page.data());
		ASSERT_GT(len, 0);
		d->engine()->write(0, page.data(), (static_cast<uint64_t>(len) + 511) / 512 * 512);
	};
	EXPECT_EQ(code_of(send), CKPT_E_STATE);	// no open step
	d->begin(groups(), 1.0);
	cmd.step = 2;
	EXPECT_EQ(code_of(send), CKPT_E_STEP);
	cmd.step = 1;
	cmd.ranges[0].len = 512;
	EXPECT_EQ(code_of(send), CKPT_E_ALIGN);
	cmd.ranges[0].len = d->regions().window_bytes + 4096;
	EXPECT_EQ(code_of(send), CKPT_E_RANGE);
	cmd.ranges[0] = {0, 4096, 1, 0x3f800000u, 0x3f800000u, 0};
	cmd.ranges[0].count = 2;	// beyond the open step
	EXPECT_EQ(code_of(send), CKPT_E_STEP);
	cmd.ranges[0].count = 1;
	cmd.ranges[0].bc2_sqrt = 0;	// outside (0, 1]
	EXPECT_EQ(code_of(send), CKPT_E_HPARAM);
	cmd.ranges[0] = {0, 8192, 0, 0, 0, CKPT_RANGE_SKIP};
	cmd.ranges[1] = {4096, 4096, 0, 0, 0, CKPT_RANGE_SKIP};
	cmd.n_ranges = 2;
	EXPECT_EQ(code_of(send), CKPT_E_TWICE);	// overlapping
	cmd.n_ranges = 1;
	send();
	EXPECT_EQ(code_of(send), CKPT_E_TWICE);	// already skipped
	const std::vector<uint16_t> g(4096, 0x3c00);
	d->write_grad_window(8192, g.data(), 8192);	// chunk 1 claimed
	cmd.ranges[0] = {8192, 4096, 0, 0, 0, CKPT_RANGE_SKIP};
	EXPECT_EQ(code_of(send), CKPT_E_TWICE);
	EXPECT_EQ(d->status().last_error, CKPT_E_TWICE);
}

// An image formatted before COUNTS opens and steps as before; skipping is
// refused there and the write of zeros remains the way.
TEST_F(EngineTest, ImageWithoutCountsKeepsWorking)
{
	fs::remove(path_);
	ckpt::Layout l;
	l.add("a", {5000}, 0);
	l.add("b", {3000}, 0);
	l.add("c", {1000}, 1);
	ckpt::FormatOptions o;
	o.chunk_params = 4096;
	o.incompat = CKPT_FEATURE_INCOMPAT_PLO_CRC | CKPT_FEATURE_INCOMPAT_META2;
	ckpt::format(path_, l, o);
	auto d = open();
	load_masters(*d);
	step(*d);
	EXPECT_EQ(d->tensor_step("b"), 1u);
	d->begin(groups(), 1.0);
	EXPECT_EQ(code_of([&] { d->skip("b"); }), CKPT_E_FEATURE);
	d->abort();
	step(*d);
	d.reset();
	const ckpt::Image img = ckpt::Image::open(path_, false);
	EXPECT_EQ(img.sb.feature_incompat & CKPT_FEATURE_INCOMPAT_COUNTS, 0u);
	EXPECT_EQ(img.sb.committed_step, 2u);
}

} // namespace

// The engine on the fallback (as where io_uring cannot be had, forced here):
// the same steps leave the same bytes on the device as with io_uring.
TEST_F(EngineTest, PreadFallbackWritesTheSameBytes)
{
	const std::string other = (dir_ / "sync.img").string();
	fs::copy_file(path_, other);
	for (const auto &[path, io] : {std::pair{path_, ckpt::Ring::Mode::Auto}, {other, ckpt::Ring::Mode::Sync}}) {
		ckpt::EngineOptions o;
		o.io = io;
		o.workers = 2;
		auto d = ckpt::Device::open(path, o);
		masters_steps_and_a_skip(*d);
	}
	EXPECT_TRUE(whole_file(path_) == whole_file(other));
}

// A directory on /dev/shm (tmpfs) named after the test's own, removed however the test ends.
struct ShmDir {
	fs::path path;
	explicit ShmDir(const fs::path &like) : path(fs::path("/dev/shm") / like.filename())
	{
		fs::create_directories(path);
	}
	~ShmDir() { fs::remove_all(path); }
};

// On tmpfs the engine maps the image and its I/O is the workers' copies
// (BackingFile::map): the same steps leave the same bytes as io_uring's on
// tmpfs and on the test's own file system, through every way a step ends
// (committed, skipped by a rank's block, overflowed, aborted, rolled back).
TEST_F(EngineTest, MappedTmpfsImageWritesTheSameBytes)
{
	struct statfs fs_shm;
	ASSERT_EQ(statfs("/dev/shm", &fs_shm), 0) << "the test needs /dev/shm";
	ASSERT_EQ(fs_shm.f_type, TMPFS_MAGIC) << "the test needs /dev/shm on tmpfs";
	const ShmDir shm_dir(dir_);
	const fs::path &shm = shm_dir.path;
	const std::string mapped = (shm / "mapped.img").string(), ring = (shm / "ring.img").string();
	fs::copy_file(path_, mapped);
	fs::copy_file(path_, ring);
	auto run = [&](const std::string &path, bool map) -> std::vector<float> {
		ckpt::EngineOptions o;
		o.map = map;
		o.workers = 2;
		auto d = ckpt::Device::open(path, o);
		struct statfs at;
		EXPECT_EQ(statfs(path.c_str(), &at), 0);
		EXPECT_EQ(d->engine()->image().file.mapped(), map && at.f_type == TMPFS_MAGIC) << path;
		masters_steps_and_a_skip(*d);
		EXPECT_EQ(d->rollback(), 3u);
		skipped_step(*d, groups(), 1.0, std::vector<uint16_t>(d->regions().n_params, 0x7c00), 3);
		std::vector<uint16_t> g(d->regions().n_params, 0x3c00);
		d->begin(groups(), 1.0);
		d->write_grad_window(0, g.data(), d->regions().window_bytes);
		d->abort();
		step(*d);
		std::vector<float> p(5000), m(5000), v(5000);
		d->engine()->read_state(0, 5000, p.data(), m.data(), v.data());
		return p;
	};
	const std::vector<float> on_disk = run(path_, true);
	EXPECT_EQ(run(mapped, true), on_disk);
	EXPECT_EQ(run(ring, false), on_disk);
	EXPECT_TRUE(whole_file(mapped) == whole_file(path_));
	EXPECT_TRUE(whole_file(ring) == whole_file(path_));
}

// Another process truncates a mapped image under a running trainer: the
// step that touches the missing pages fails as an I/O error of the device
// (the page's SIGBUS caught), the process lives, and nothing is committed.
TEST_F(EngineTest, TruncatedMappedImageFailsTheStepNotTheProcess)
{
	const ShmDir shm_dir(dir_);
	const fs::path &shm = shm_dir.path;
	const std::string path = (shm / "dev.img").string();
	fs::copy_file(path_, path);
	ckpt::EngineOptions o;
	o.workers = 2;
	auto d = ckpt::Device::open(path, o);
	ASSERT_TRUE(d->engine()->image().file.mapped());
	load_masters(*d);
	step(*d);
	const uint64_t committed = d->status().committed_step;
	const std::string kept = (shm / "kept.img").string();
	fs::copy_file(path, kept);
	ASSERT_EQ(truncate(path.c_str(), 8192), 0);	// the superblocks stay
	std::vector<uint16_t> g(d->regions().n_params, 0x3c00);
	EXPECT_EQ(code_of([&] {
		d->begin(groups(), 1.0);
		d->write_grad_window(0, g.data(), d->regions().window_bytes);
		d->commit({});
	}), CKPT_E_IO);
	d.reset();
	// the superblocks as the failed step left them, the rest as it was: the step never committed
	{
		std::ifstream in(kept, std::ios::binary);
		std::fstream out(path, std::ios::in | std::ios::out | std::ios::binary);
		in.seekg(8192);
		out.seekp(8192);
		out << in.rdbuf();
	}
	EXPECT_EQ(ckpt::Image::open(path, false).sb.committed_step, committed);
	step(*ckpt::Device::open(path));
}

// A SIGBUS that is no mapped copy's goes to the handler that was there
// before the engine's (which a map installs again wherever another replaced
// it, as the one below does).
TEST_F(EngineTest, SigbusOfNoMappedCopyGoesToTheHandlerBefore)
{
	const ShmDir shm(dir_);
	const std::string path = (shm.path / "file").string();
	fs::copy_file(path_, path);
	EXPECT_EXIT(
		{
			struct sigaction sa {};
			sa.sa_handler = [](int) { _exit(42); };
			sigaction(SIGBUS, &sa, nullptr);
			ckpt::BackingFile f = ckpt::BackingFile::open(path, true);
			if (f.map())
				raise(SIGBUS);
			_exit(1);
		},
		::testing::ExitedWithCode(42), "");
}

// A stripe set: the image over three drives as dm-stripe lays a device over
// them (chunk k of 16 KiB at drive k % 3, offset k / 3 * 16 KiB: the mapping
// the VM suite's stripe run proves against the kernel's dm-stripe). The
// same steps, on io_uring and on the fallback, leave the drives holding
// exactly the bytes of the image they were cut from.
TEST_F(EngineTest, StripeSetHoldsTheImageAsDmStripeLaysItOut)
{
	constexpr uint64_t S = 16384, N = 3;
	const std::string image = whole_file(path_);
	const uint64_t per = (image.size() + S * N - 1) / (S * N) * S;
	auto make_set = [&](const std::string &name) {
		std::vector<std::string> drive(N, std::string(per, '\0'));
		for (uint64_t k = 0; k * S < image.size(); k++)
			drive[k % N].replace(k / N * S, S, image.substr(k * S, S).append(S - std::min(S, image.size() - k * S), '\0'));
		std::vector<std::string> paths;
		for (uint64_t i = 0; i < N; i++) {
			paths.push_back((dir_ / fmt::format("{}-{}.drive", name, i)).string());
			std::ofstream(paths.back(), std::ios::binary) << drive[i];
		}
		const std::string desc = (dir_ / (name + ".stripe")).string();
		std::ofstream(desc) << fmt::format(R"({{"dm-ckpt-stripe-set": 1, "stripe_bytes": {}, "drives": ["{}", "{}", "{}"]}})",
						   S, name + "-0.drive", name + "-1.drive", paths[2]);
		return std::pair{desc, paths};
	};
	auto joined = [&](const std::vector<std::string> &paths) {
		std::vector<std::string> drive;
		for (const auto &p : paths)
			drive.push_back(whole_file(p));
		std::string out;
		for (uint64_t k = 0; out.size() < image.size(); k++)
			out += drive[k % N].substr(k / N * S, S);
		return out.substr(0, image.size());
	};
	const auto [auto_set, auto_drives] = make_set("auto");
	const auto [sync_set, sync_drives] = make_set("sync");
	std::mt19937 rng(7);
	std::normal_distribution<float> nd;
	{
		auto one = open();
		ckpt::EngineOptions o;
		o.workers = 2;
		auto striped = ckpt::Device::open(auto_set, o);
		o.io = ckpt::Ring::Mode::Sync;
		auto fallback = ckpt::Device::open(sync_set, o);
		EXPECT_TRUE(striped->engine()->image().file.striped());
		EXPECT_EQ(striped->engine()->image().file.size, per * N);
		// a second writer of a drive is refused, through the set or alone
		EXPECT_EQ(code_of([&] { ckpt::Device::open(auto_set); }), CKPT_E_STATE);
		EXPECT_EQ(code_of([&] { ckpt::Device::open(auto_drives[1]); }), CKPT_E_STATE);
		load_alike({one.get(), striped.get(), fallback.get()}, rng, nd);
		for (int i = 0; i < 4; i++)
			step_alike({one.get(), striped.get(), fallback.get()}, rng, nd);
		EXPECT_EQ(striped->rollback(), 3u);
		EXPECT_EQ(fallback->rollback(), 3u);
		EXPECT_EQ(one->rollback(), 3u);
		step_alike({one.get(), striped.get(), fallback.get()}, rng, nd);
	}
	const std::string want = whole_file(path_);
	EXPECT_NE(want, image);
	EXPECT_TRUE(joined(auto_drives) == want);
	EXPECT_TRUE(joined(sync_drives) == want);
	const ckpt::Image img = ckpt::Image::open(auto_set, false);
	EXPECT_EQ(img.sb.committed_step, 4u);
	// an export never replaces the descriptor, forced or not
	EXPECT_EQ(code_of([&] { ckpt::claim_output(auto_set, true); }), CKPT_E_STATE);
}

// What a descriptor says is checked before any drive is opened for writing.
TEST_F(EngineTest, StripeSetDescriptorIsChecked)
{
	const std::string d0 = (dir_ / "d0").string(), d1 = (dir_ / "d1").string(), desc = (dir_ / "s").string();
	for (const auto &p : {d0, d1})
		std::ofstream(p) << std::string(1 << 20, '\0');
	const struct {
		std::string text, says;
	} cases[] = {
		{R"({"dm-ckpt-stripe-set": 1, "stripe_bytes": 6000, "drives": ["d0"]})", "power of two"},
		{R"({"dm-ckpt-stripe-set": 1, "stripe_bytes": 2048, "drives": ["d0"]})", "power of two"},
		{R"({"dm-ckpt-stripe-set": 2, "stripe_bytes": 65536, "drives": ["d0"]})", "needs"},
		{R"({"dm-ckpt-stripe-set": 1, "stripe_bytes": 65536, "drives": []})", "1 to 64 paths"},
		{R"({"dm-ckpt-stripe-set": 1, "stripe_bytes": 65536, "drives": ["d0", "./d0"]})", "named twice"},
		{R"({"dm-ckpt-stripe-set": 1, "stripe_bytes": 65536, "drives": ["d0", "s"]})", "a stripe set itself"},
		{R"({"dm-ckpt-stripe-set": 1, "stripe_bytes": 65536, "drives": ["d0"], "x": 1})", "unknown key 'x'"},
		{R"({"dm-ckpt-stripe-set": 1, "stripe_bytes": 65536, "drives": ["d0", "nowhere"]})", "nowhere"},
		{R"({"dm-ckpt-stripe-set": 1, "stripe_bytes": 65536, "drives": [7]})", "not a path"},
		{R"({"dm-ckpt-stripe-set": 1, "stripe_bytes": 65536, "drives": ["d0", "d1"])", "not a JSON object"},
	};
	for (const auto &c : cases) {
		fs::remove(desc);
		std::ofstream(desc) << c.text;
		try {
			ckpt::BackingFile::open(desc, true);
			ADD_FAILURE() << "accepted: " << c.text;
		} catch (const ckpt::Error &e) {
			EXPECT_NE(std::string(e.what()).find(c.says), std::string::npos) << c.text << "\n" << e.what();
		}
	}
	// a valid one formats in place, on its drives (nothing past their common size)
	fs::remove(desc);
	std::ofstream(desc) << R"({"dm-ckpt-stripe-set": 1, "stripe_bytes": 65536, "drives": ["d0", "d1"]})";
	ckpt::Layout l;
	l.add("w", {20000}, 0);
	ckpt::FormatOptions o;
	o.chunk_params = 4096;
	ckpt::format(desc, l, o);
	EXPECT_EQ(whole_file(desc).rfind("{\"dm-ckpt-stripe-set\"", 0), 0u);	// still the descriptor
	EXPECT_EQ(ckpt::Image::open(desc, false).manifest.find("w").numel, 20000u);
	EXPECT_EQ(code_of([&] { ckpt::format(desc, l, o); }), CKPT_E_STATE);	// an image there, not forced
}

// The engine's I/O ring and its fallback where io_uring cannot be had
// (io_uring_setup refused: containers' seccomp profiles, qemu-user): the same
// completions, tags and results, -errno included.
// 8-bit moments (feature Q8): the record holds fp32 p and 8-bit codes with a
// scale per 256 params; the first step from zero moments gives the fp32
// image's params bit for bit (the update uses the new fp32 moments), later
// ones stay close; a load of state encodes, a read decodes, verify checks
// the smaller records.
TEST_F(EngineTest, EightBitMomentsStepLoadAndRead)
{
	const std::string q8 = (dir_ / "q8.img").string();
	ckpt::Layout lay;
	lay.add("a", {5000}, 0);
	lay.add("b", {3000}, 0);
	lay.add("c", {1000}, 1);
	ckpt::FormatOptions o;
	o.chunk_params = 4096;
	o.q8 = true;
	ckpt::format(q8, lay, o);
	auto d32 = open();
	auto d8 = ckpt::Device::open(q8, {});
	ASSERT_TRUE(d8->image().sb.feature_incompat & CKPT_FEATURE_INCOMPAT_Q8);
	EXPECT_FALSE(d32->image().sb.feature_incompat & CKPT_FEATURE_INCOMPAT_Q8);
	// 4 KiB header + 6 B * 4096 + 2 * 4 B * 16 scales, in 4 KiB blocks
	EXPECT_EQ(d8->regions().record_bytes, 4096u + 28672u);
	EXPECT_EQ(d32->regions().record_bytes, 4096u + 12u * 4096u);

	std::mt19937_64 rng(12);
	std::normal_distribution<float> nd(0.0f, 1.0f);
	const std::vector<float> a = load_alike({d32.get(), d8.get()}, rng, nd);

	std::vector<float> p32(5000), m32(5000), v32(5000), p8(5000), m8(5000), v8(5000);
	for (int step = 1; step <= 8; step++) {
		ASSERT_NO_FATAL_FAILURE(step_alike({d32.get(), d8.get()}, rng, nd));
		d32->read_state("a", p32.data(), m32.data(), v32.data(), 5000);
		d8->read_state("a", p8.data(), m8.data(), v8.data(), 5000);
		if (step == 1) {
			EXPECT_EQ(0, std::memcmp(p32.data(), p8.data(), 5000 * 4));
		}
		double dp = 0, dm = 0, mm = 0;
		for (size_t i = 0; i < 5000; i++) {
			dp = std::max(dp, (double)std::fabs(p8[i] - p32[i]));
			dm = std::max(dm, (double)std::fabs(m8[i] - m32[i]));
			mm = std::max(mm, (double)std::fabs(m32[i]));
		}
		// lr 1e-3: each step moves a param by about 1e-3 at most
		EXPECT_LT(dp, 2e-3 * step) << "step " << step;
		EXPECT_LT(dm, 0.07 * mm) << "step " << step;
	}

	// load_state encodes, read_state decodes: within the map's resolution
	std::vector<float> m(5000), v(5000);
	for (size_t i = 0; i < 5000; i++) {
		m[i] = nd(rng) * 1e-3f;
		v[i] = m[i] * m[i];
	}
	d8.reset();
	d8 = ckpt::Device::open(q8, {});
	std::vector<float> pb(3000), mb(3000), vb(3000), pc(1000), mc(1000), vc(1000);
	d8->read_state("b", pb.data(), mb.data(), vb.data(), 3000);
	d8->read_state("c", pc.data(), mc.data(), vc.data(), 1000);
	EXPECT_EQ(d8->status().committed_step, 8u);
	d8.reset();
	const std::string fresh = (dir_ / "fresh.img").string();
	ckpt::format(fresh, lay, o);
	d8 = ckpt::Device::open(fresh, {});
	d8->load_state({{"a", p8, m, v, 3}, {"b", pb, mb, vb, 3}, {"c", pc, mc, vc, 3}}, {});
	std::vector<float> p2(5000), m2(5000), v2(5000);
	d8->read_state("a", p2.data(), m2.data(), v2.data(), 5000);
	EXPECT_EQ(p2, p8);
	for (size_t i = 0; i < 5000; i++) {
		const size_t blk = i / CKPT_Q8_BLOCK * CKPT_Q8_BLOCK;
		float am = 0, av = 0;
		for (size_t k = blk; k < std::min<size_t>(blk + CKPT_Q8_BLOCK, 5000); k++) {
			am = std::max(am, std::fabs(m[k]));
			av = std::max(av, v[k]);
		}
		ASSERT_LE(std::fabs(m2[i] - m[i]), 0.0072 * am) << i;
		ASSERT_LE(std::fabs(v2[i] - v[i]), 0.0036 * av) << i;
	}
	EXPECT_EQ(d8->status().committed_step, 3u);
	d8.reset();
	const std::string report = ckpt::verify_report(fresh, false);
	EXPECT_NE(report.find("\"records_checked\":4,"), std::string::npos) << report;
	EXPECT_NE(report.find("\"damage\":[]"), std::string::npos) << report;
}

// 8-bit state read out and loaded into a new image (read_state then
// load_state, as an export and import or torch's state_dict do) is the same
// bytes: masters,
// codes and scales of every record, with fp32 and with bf16 masters, after
// steps that leave blocks of both signs' extremes.
TEST_F(EngineTest, EightBitStateReloadsBitForBit)
{
	const std::pair<const char *, size_t> tensors[] = {{"a", 5000}, {"b", 3000}, {"c", 1000}};
	ckpt::Layout lay;
	lay.add("a", {5000}, 0);
	lay.add("b", {3000}, 0);
	lay.add("c", {1000}, 1);
	const auto state_bytes = [](const std::string &path) {
		const ckpt::Image img = ckpt::Image::open(path, false);
		const struct ckpt_regions &l = img.sb.regions;
		const uint64_t n = ckpt_rec_data_bytes(img.sb.geo.chunk_shift, img.sb.feature_incompat);
		std::ifstream f(path, std::ios::binary);
		std::vector<char> out;
		for (uint64_t c = 0; c < img.sb.geo.n_chunks; c++) {
			std::vector<char> rec(n);
			f.seekg(static_cast<std::streamoff>(ckpt_record_offset(&l, img.sb.committed_slot, c) + CKPT_BLOCK));
			f.read(rec.data(), static_cast<std::streamsize>(n));
			out.insert(out.end(), rec.begin(), rec.end());
		}
		return out;
	};
	for (bool bm : {false, true}) {
		SCOPED_TRACE(bm ? "bf16 masters" : "fp32 masters");
		const std::string path = (dir_ / (bm ? "bf.img" : "q8.img")).string();
		ckpt::FormatOptions o;
		o.chunk_params = 4096;
		o.q8 = true;
		o.bf16_master = bm;
		ckpt::format(path, lay, o);
		auto d = ckpt::Device::open(path, {});
		std::mt19937_64 rng(14);
		std::normal_distribution<float> nd(0.0f, 1.0f);
		load_alike({d.get()}, rng, nd);
		for (int step = 1; step <= 4; step++) {	// gradients of the tensors only, as a trainer's
			d->begin(groups(), 1.0);
			for (const auto &[name, n] : tensors) {
				std::vector<uint16_t> g(n);
				for (uint16_t &x : g)
					x = ckpt_f32_to_bf16(std::bit_cast<uint32_t>(nd(rng) * 1e-3f));
				d->write_grad(name, g.data(), n);
			}
			ASSERT_EQ(d->commit({}), ckpt::CommitResult::committed);
		}
		std::vector<std::vector<float>> st;
		std::vector<ckpt::TensorState> ts;
		st.reserve(std::size(tensors));	// ts points into st
		for (const auto &[name, n] : tensors) {
			float *x = st.emplace_back(3 * n).data();
			d->read_state(name, x, x + n, x + 2 * n, n);
			ts.push_back({name, {x, n}, {x + n, n}, {x + 2 * n, n}, 4});
		}
		d.reset();
		const std::vector<char> before = state_bytes(path);
		const std::string again = path + ".again";	// a load goes before the first step
		ckpt::format(again, lay, o);
		d = ckpt::Device::open(again, {});
		d->load_state(ts, {});
		d.reset();
		const std::vector<char> after = state_bytes(again);
		ASSERT_EQ(after.size(), before.size());
		size_t diff = 0;
		for (size_t k = 0; k < after.size(); k++)
			diff += after[k] != before[k];
		EXPECT_EQ(diff, 0u) << "bytes of the state changed by a reload";
	}
}

// bf16 masters (feature BF16M, with Q8): records of 4 B of state per param;
// a load rounds the masters stochastically with the noise of (image uuid,
// the load's step, param index), the core's rule; every step's masters are
// bf16 and p_lo is exactly them; they track the fp32-master Q8 image; read
// of state gives the masters exactly, so load_state of them is exact; verify
// checks p_lo against the masters.
TEST_F(EngineTest, Bf16MastersStepLoadAndRead)
{
	ckpt::Layout lay;
	lay.add("a", {5000}, 0);
	lay.add("b", {3000}, 0);
	lay.add("c", {1000}, 1);
	ckpt::FormatOptions o;
	o.chunk_params = 4096;
	o.q8 = true;
	const std::string q8 = (dir_ / "q8.img").string(), bf = (dir_ / "bf.img").string();
	ckpt::format(q8, lay, o);
	o.bf16_master = true;
	ckpt::format(bf, lay, o);
	o.q8 = false;
	EXPECT_THROW(ckpt::format((dir_ / "no.img").string(), lay, o), ckpt::Error);	// needs Q8
	auto d8 = ckpt::Device::open(q8, {});
	auto db = ckpt::Device::open(bf, {});
	ASSERT_TRUE(db->image().sb.feature_incompat & CKPT_FEATURE_INCOMPAT_BF16M);
	// 4 KiB header + 4 B * 4096 + 2 * 4 B * 16 scales, in 4 KiB blocks
	EXPECT_EQ(db->regions().record_bytes, 4096u + 20480u);

	std::mt19937_64 rng(13);
	std::normal_distribution<float> nd(0.0f, 1.0f);
	const std::vector<float> a = load_alike({d8.get(), db.get()}, rng, nd);
	// the load's rounding: the core's, with step 0 and the params' indexes
	std::vector<float> pb(5000), mb(5000), vb(5000);
	db->read_state("a", pb.data(), mb.data(), vb.data(), 5000);
	{
		std::vector<uint32_t> x(5000);
		std::vector<uint16_t> want(5000);
		for (size_t i = 0; i < 5000; i++)
			x[i] = std::bit_cast<uint32_t>(a[i]);
		struct ckpt_sr sr;
		ckpt_sr_at(ckpt_sr_seed(db->image().sb.uuid), 0, 0, &sr);
		ckpt_sr_round(&sr, x.data(), want.data(), 5000);
		size_t up = 0;
		for (size_t i = 0; i < 5000; i++) {
			ASSERT_EQ(std::bit_cast<uint32_t>(pb[i]), static_cast<uint32_t>(want[i]) << 16) << i;
			up += std::fabs(pb[i]) > std::fabs(a[i]);
		}
		EXPECT_GT(up, 2000u);	// stochastic: about half round away from zero
		EXPECT_LT(up, 3000u);
	}

	std::vector<float> p8(5000), m8(5000), v8(5000);
	std::vector<uint16_t> plo(5000);
	for (int step = 1; step <= 8; step++) {
		ASSERT_NO_FATAL_FAILURE(step_alike({d8.get(), db.get()}, rng, nd));
		d8->read_state("a", p8.data(), m8.data(), v8.data(), 5000);
		db->read_state("a", pb.data(), mb.data(), vb.data(), 5000);
		db->read_params("a", plo.data(), 5000);
		double dp = 0;
		for (size_t i = 0; i < 5000; i++) {
			ASSERT_EQ(std::bit_cast<uint32_t>(pb[i]), static_cast<uint32_t>(plo[i]) << 16) << i;
			dp = std::max(dp, (double)std::fabs(pb[i] - p8[i]));
		}
		// lr 1e-3: each step moves a param by about 1e-3 at most; a bf16
		// ulp at 0.02 * 4 sigma is 2^-11
		EXPECT_LT(dp, 2e-3 * step + 1e-3) << "step " << step;
	}

	// read_state gives the masters exactly: loading them again keeps them
	std::vector<float> pB(3000), mB(3000), vB(3000), pC(1000), mC(1000), vC(1000);
	db->read_state("b", pB.data(), mB.data(), vB.data(), 3000);
	db->read_state("c", pC.data(), mC.data(), vC.data(), 1000);
	db.reset();
	const std::string fresh = (dir_ / "fresh.img").string();
	o.q8 = true;
	ckpt::format(fresh, lay, o);
	db = ckpt::Device::open(fresh, {});
	db->load_state({{"a", pb, mb, vb, 8}, {"b", pB, mB, vB, 8}, {"c", pC, mC, vC, 8}}, {});
	std::vector<float> p2(5000), m2(5000), v2(5000);
	db->read_state("a", p2.data(), m2.data(), v2.data(), 5000);
	EXPECT_EQ(p2, pb);
	db.reset();
	const std::string report = ckpt::verify_report(fresh, false);
	EXPECT_NE(report.find("\"records_checked\":4,"), std::string::npos) << report;
	EXPECT_NE(report.find("\"damage\":[]"), std::string::npos) << report;
}

TEST(Ring, SyncFallbackCompletesLikeIoUring)
{
	const fs::path path = fs::temp_directory_path() / fmt::format("ckpt-ring-{}", getpid());
	for (ckpt::Ring::Mode mode : {ckpt::Ring::Mode::Auto, ckpt::Ring::Mode::Sync}) {
		const bool want_sync = mode == ckpt::Ring::Mode::Sync;
		SCOPED_TRACE(want_sync ? "sync" : "auto");
		int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_TRUNC, 0600);
		ASSERT_GE(fd, 0);
		ckpt::Ring ring(8, mode);
		if (want_sync) {
			EXPECT_TRUE(ring.sync());
		}
		std::vector<uint8_t> a(4096, 0xa5), b(8192, 0x5a), back(4096 + 8192);
		ring.write(fd, a.data(), 4096, 0, 7);
		ring.write(fd, b.data(), 8192, 4096, 9);
		ring.submit();
		std::vector<std::pair<uint64_t, int>> got{ring.wait(), ring.wait()};
		std::sort(got.begin(), got.end());
		EXPECT_EQ(got, (std::vector<std::pair<uint64_t, int>>{{7, 4096}, {9, 8192}}));
		ring.read(fd, back.data(), static_cast<unsigned>(back.size()), 0, 1);
		ring.read(fd, back.data(), 512, 1u << 20, 2);	// past the end: 0 bytes
		ring.read(-1, back.data(), 512, 0, 3);		// -EBADF
		ring.submit();
		got = {ring.wait(), ring.wait(), ring.wait()};
		std::sort(got.begin(), got.end());
		EXPECT_EQ(got, (std::vector<std::pair<uint64_t, int>>{{1, 4096 + 8192}, {2, 0}, {3, -EBADF}}));
		EXPECT_TRUE(std::equal(a.begin(), a.end(), back.begin()));
		EXPECT_TRUE(std::equal(b.begin(), b.end(), back.begin() + 4096));
		if (ring.sync()) {	// nothing in flight: an error, not a hang
			EXPECT_THROW(ring.wait(), ckpt::Error);
		}
		::close(fd);
	}
	fs::remove(path);
}

// A new path is put in place without replacing anything: a file another
// process created there meanwhile stays, and the temporary one is removed.
TEST(TempFile, LinkNewNeverReplacesAFileThatAppeared)
{
	const fs::path dir = fs::temp_directory_path() / fmt::format("ckpt-linknew-{}", getpid());
	fs::remove_all(dir);
	fs::create_directory(dir);
	const std::string target = dir / "x.img";
	{
		ckpt::TempFile t(target, "tmp", O_WRONLY);
		ASSERT_EQ(::write(t.fd(), "mine", 4), 4);
		std::ofstream(target) << "theirs";	// created meanwhile
		try {
			t.link_new(target, true);
			ADD_FAILURE() << "link_new replaced " << target;
		} catch (const ckpt::Error &e) {
			EXPECT_EQ(e.code(), CKPT_E_STATE);
			EXPECT_NE(std::string(e.what()).find("appeared while it was being created"), std::string::npos)
				<< e.what();
		}
	}
	std::string have;
	std::getline(std::ifstream(target), have);
	EXPECT_EQ(have, "theirs");
	EXPECT_EQ(std::distance(fs::directory_iterator(dir), fs::directory_iterator{}), 1);	// no temporary left
	{
		ckpt::TempFile t(dir / "y.img", "tmp", O_WRONLY);
		ASSERT_EQ(::write(t.fd(), "mine", 4), 4);
		t.link_new(dir / "y.img", true);
	}
	std::getline(std::ifstream(dir / "y.img"), have);
	EXPECT_EQ(have, "mine");
	EXPECT_EQ(std::distance(fs::directory_iterator(dir), fs::directory_iterator{}), 2);
	fs::remove_all(dir);
}

// block_node gives a node of the device sysfs names (the VM's nvmeof suite
// makes /dev/KNAME another device's node); a name that is no block device,
// or a path, is refused.
TEST(BlockNode, NodeOfTheNumbersSysfsGives)
{
	for (const auto &e : fs::directory_iterator("/sys/class/block")) {
		const std::string kname = e.path().filename();
		std::string node;
		try {
			node = ckpt::block_node(kname);
		} catch (const ckpt::Error &err) {
			EXPECT_EQ(err.code(), CKPT_E_STATE);	// a container's /dev may lack it
			continue;
		}
		std::string dev;
		std::getline(std::ifstream(e.path() / "dev"), dev);
		struct stat st;
		ASSERT_EQ(::stat(node.c_str(), &st), 0) << node;
		EXPECT_TRUE(S_ISBLK(st.st_mode)) << node;
		EXPECT_EQ(fmt::format("{}:{}", major(st.st_rdev), minor(st.st_rdev)), dev) << kname << " -> " << node;
	}
	for (const std::string name : {"", "no-such-disk", "../../../dev/null", "loop0/../loop1"})
		try {
			ckpt::block_node(name);
			ADD_FAILURE() << "block_node('" << name << "') gave a node";
		} catch (const ckpt::Error &err) {
			EXPECT_EQ(err.code(), CKPT_E_STATE) << "'" << name << "'";
		}
}
