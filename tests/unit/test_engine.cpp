// SPDX-License-Identifier: MIT
// The userspace engine at the byte level of the virtual device: what the
// kernel target must answer the same way.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <vector>

#include "device.hpp"
#include "format.hpp"

namespace {

namespace fs = std::filesystem;

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

	fs::path dir_;
	std::string path_;
	static inline int counter_ = 0;
};

TEST_F(EngineTest, RegionsOfTheVirtualDevice)
{
	auto d = open();
	ckpt::Engine &e = *d->engine();
	const struct ckpt_layout &l = d->layout();
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
	const struct ckpt_layout &l = d->layout();
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
	const struct ckpt_layout &l = d->layout();
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
	const struct ckpt_layout &l = d->layout();
	std::vector<uint16_t> g(l.n_params, 0x3c00);
	d->begin(groups(), 1.0);
	d->write_grad_window(0, g.data(), l.window_bytes);
	ASSERT_EQ(d->commit({}), ckpt::CommitResult::committed);
	std::vector<uint16_t> before(5000), after(5000);
	d->read_params("a", before.data(), before.size());

	g[4097] = 0x7f80;	// +Inf in bf16, in chunk 1
	d->begin(groups(), 1.0);
	d->write_grad_window(0, g.data(), l.window_bytes);
	EXPECT_EQ(d->status().overflow, 1u);
	EXPECT_EQ(d->commit({}), ckpt::CommitResult::overflow);
	struct ckpt_status st = d->status();
	EXPECT_EQ(st.committed_step, 1u);
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
		const struct ckpt_layout &l = d->layout();
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
		const struct ckpt_layout l = ckpt::Image::open(path_, false).sb.layout;
		std::fstream f(path_, std::ios::in | std::ios::out | std::ios::binary);
		f.seekp(static_cast<std::streamoff>(ckpt_record_offset(&l, 0, 2) + 16));
		f.put('\xff');	// the step field of chunk 2's record, committed slot
	}
	auto d = open();
	const struct ckpt_layout &l = d->layout();
	std::vector<uint16_t> g(l.n_params, 0x3c00);
	d->begin(groups(), 1.0);
	EXPECT_EQ(code_of([&] { d->write_grad_window(0, g.data(), l.window_bytes); }), CKPT_E_RECORD);
	struct ckpt_status st = d->status();
	EXPECT_EQ(st.state, CKPT_STATE_FAILED);
	EXPECT_EQ(code_of([&] { d->commit({}); }), CKPT_E_FAILED);
	EXPECT_EQ(st.committed_step, 0u);
}

} // namespace
