// SPDX-License-Identifier: MIT
// The C ABI (ckpt.h) as a C program sees it: handles, threads, and arguments
// checked before they are used.
#include <gtest/gtest.h>

#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include "ckpt.h"
#include "ckpt_format.h"

namespace {

namespace fs = std::filesystem;

constexpr uint64_t n_w = 256 * 1024;	// read_state of w takes a while
constexpr uint64_t n_b = 1000;

class CapiTest : public ::testing::Test {
protected:
	void SetUp() override
	{
		dir_ = fs::temp_directory_path() /
		       ("ckpt-capi-" + std::to_string(getpid()) + "-" + std::to_string(counter_++));
		fs::create_directories(dir_);
		path_ = (dir_ / "dev.img").string();
		ckpt_layout_builder *l = ckpt_layout_new();
		ASSERT_NE(l, nullptr);
		ASSERT_EQ(ckpt_layout_add(l, "w", &n_w, 1, 0), 0) << ckpt_last_error();
		ASSERT_EQ(ckpt_layout_add(l, "b", &n_b, 1, 0), 0) << ckpt_last_error();
		ASSERT_EQ(ckpt_format(path_.c_str(), l, CKPT_BF16, 4096, 0), 0) << ckpt_last_error();
		ckpt_layout_free(l);
	}
	void TearDown() override { fs::remove_all(dir_); }

	ckpt_device *open()
	{
		ckpt_device *d = nullptr;
		EXPECT_EQ(ckpt_open(path_.c_str(), &d), 0) << ckpt_last_error();
		return d;
	}

	fs::path dir_;
	std::string path_;
	static inline int counter_ = 0;
};

const ckpt_group_hparams hp = {1e-3, 0.9, 0.999, 1e-8, 0.01, 0};

// 12a: the count is checked against the device before anything is allocated
// or read from groups (2^32-1 groups would be 206 GB, and reads past the
// caller's array).
TEST_F(CapiTest, BeginChecksTheGroupCountFirst)
{
	ckpt_device *d = open();
	for (uint32_t n : {0u, 2u, CKPT_MAX_GROUPS + 1, UINT32_MAX}) {
		EXPECT_EQ(ckpt_begin(d, &hp, n, 1.0), -CKPT_E_GROUPS) << n;
		EXPECT_NE(std::string(ckpt_last_error()).find(std::to_string(n) + " hyperparameter groups"),
			  std::string::npos)
			<< ckpt_last_error();
	}
	struct ckpt_info info;
	ASSERT_EQ(ckpt_info(d, &info), 0);
	EXPECT_EQ(info.state, 0u);	// still idle
	EXPECT_EQ(ckpt_begin(d, &hp, 1, 1.0), 0) << ckpt_last_error();
	ckpt_close(d);
}

TEST_F(CapiTest, CallsAfterCloseFail)
{
	ckpt_device *d = open();
	ckpt_close(d);
	ckpt_close(d);	// twice is a no-op
	ckpt_device *other = open();	// a new handle never reuses a closed one
	EXPECT_NE(other, d);
	struct ckpt_info info;
	EXPECT_EQ(ckpt_info(d, &info), -CKPT_E_STATE);
	EXPECT_STREQ(ckpt_last_error(), "device is closed");
	std::vector<uint16_t> g(n_b);
	EXPECT_EQ(ckpt_write_grad(d, "b", g.data(), n_b), -CKPT_E_STATE);
	EXPECT_EQ(ckpt_begin(d, &hp, 1, 1.0), -CKPT_E_STATE);
	EXPECT_EQ(ckpt_info(other, &info), 0) << ckpt_last_error();
	// a handle that was never issued
	auto *junk = reinterpret_cast<ckpt_device *>(uintptr_t{0xdeadbeef});
	EXPECT_EQ(ckpt_info(junk, &info), -CKPT_E_INVAL);
	EXPECT_NE(std::string(ckpt_last_error()).find("not a device"), std::string::npos);
	ckpt_close(junk);	// ignored
	EXPECT_EQ(ckpt_info(nullptr, &info), -CKPT_E_INVAL);
	ckpt_close(other);
}

// Item 4: close while other threads are inside calls on the device (the
// buffer they read into was unmapped under them): close waits for them, and
// their next calls fail with CKPT_E_STATE.
TEST_F(CapiTest, CloseWaitsForCallsInFlight)
{
	for (int round = 0; round < 5; round++) {
		ckpt_device *d = open();
		std::atomic<bool> closing{false}, closed{false};
		std::atomic<int> ok_calls{0}, after_close{0}, bad{0};
		std::vector<std::thread> threads;
		for (int t = 0; t < 3; t++)
			threads.emplace_back([&] {
				std::vector<float> p(n_w), m(n_w), v(n_w);
				for (;;) {
					const bool was_closed = closed.load();
					const int r = ckpt_read_state(d, "w", p.data(), m.data(), v.data(), n_w);
					if (r == 0 && !was_closed)
						ok_calls++;
					else if (r == -CKPT_E_STATE && closing.load())
						after_close++;
					else
						bad++;
					if (was_closed)
						return;
				}
			});
		while (ok_calls.load() < 3)
			std::this_thread::yield();
		closing = true;
		ckpt_close(d);
		closed = true;
		for (auto &t : threads)
			t.join();
		EXPECT_EQ(bad.load(), 0);
		EXPECT_GE(after_close.load(), 3);
	}
}

// Calls on one handle from two threads are serialized: a step's status read
// and its command never interleave with another thread's.
TEST_F(CapiTest, TwoThreadsOnOneHandle)
{
	ckpt_device *d = open();
	std::atomic<int> bad{0}, committed{0};
	// a begin meets the other thread's open step (E_STATE); a step begun
	// is written and committed by its thread, whole
	auto stepper = [&] {
		std::vector<uint16_t> gw(n_w), gb(n_b);
		for (int i = 0; i < 20; i++) {
			int r = ckpt_begin(d, &hp, 1, 1.0);
			if (r == -CKPT_E_STATE) {
				std::this_thread::yield();
				continue;
			}
			if (r == 0)
				r = ckpt_write_grad(d, "w", gw.data(), n_w);
			if (r == 0)
				r = ckpt_write_grad(d, "b", gb.data(), n_b);
			if (r == 0)
				r = ckpt_commit(d, "x", 1);
			if (r == CKPT_COMMITTED)
				committed++;
			else
				bad++;
		}
	};
	auto reader = [&] {
		std::vector<float> p(n_b), m(n_b), v(n_b);
		struct ckpt_info info;
		char blob[8];
		for (int i = 0; i < 100; i++)
			if (ckpt_info(d, &info) != 0 ||
			    ckpt_read_state(d, "b", p.data(), m.data(), v.data(), n_b) != 0 ||
			    ckpt_blob(d, blob, sizeof(blob)) < 0)
				bad++;
	};
	std::thread a(stepper), b(stepper), c(reader);
	a.join();
	b.join();
	c.join();
	EXPECT_EQ(bad.load(), 0) << ckpt_last_error();
	EXPECT_GT(committed.load(), 0);
	struct ckpt_info info;
	ASSERT_EQ(ckpt_info(d, &info), 0);
	EXPECT_EQ(info.committed_step, static_cast<uint64_t>(committed.load()));
	ckpt_close(d);
}

} // namespace
