// SPDX-License-Identifier: MIT
// The C ABI (ckpt.h) as a C program sees it: handles, threads, and arguments
// checked before they are used.
#include <gtest/gtest.h>

#include <csignal>
#include <sys/resource.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <sstream>
#include <regex>
#include <map>
#include <thread>
#include <utility>
#include <vector>

#include "ckpt_admin.h"
#include "ckpt_codec.h"
#include "status_test_util.hpp"

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
		ASSERT_EQ(ckpt_format(path_.c_str(), l, CKPT_DTYPE_BF16, 4096, 0), 0) << ckpt_last_error();
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

// One step that updates w and b; then their step counts.
std::pair<uint64_t, uint64_t> step_counts_after_a_step(ckpt_device *d)
{
	std::vector<uint16_t> gw(n_w, 0x3c00), gb(n_b, 0xbc00);
	EXPECT_EQ(ckpt_begin(d, &hp, 1, 1.0), 0) << ckpt_last_error();
	EXPECT_EQ(ckpt_write_grad(d, "w", gw.data(), n_w), 0) << ckpt_last_error();
	EXPECT_EQ(ckpt_write_grad(d, "b", gb.data(), n_b), 0) << ckpt_last_error();
	EXPECT_EQ(ckpt_commit(d, nullptr, 0), CKPT_RESULT_COMMITTED) << ckpt_last_error();
	uint64_t w = 0, b = 0;
	EXPECT_EQ(ckpt_tensor_step(d, "w", &w), 0);
	EXPECT_EQ(ckpt_tensor_step(d, "b", &b), 0);
	return {w, b};
}

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

// Every count of a caller's array is checked before an entry is read: ndim
// against CKPT_MAX_DIMS, and a call's tensor count against the device's
// (each name may appear once). The arrays here hold one entry, so reading
// a second would run past them (ASan reports it; 2^32-1 faults anyway).
TEST_F(CapiTest, CountsAreCheckedBeforeTheArraysAreRead)
{
	ckpt_layout_builder *l = ckpt_layout_new();
	ASSERT_NE(l, nullptr);
	const uint64_t one[1] = {4};
	for (uint32_t ndim : {uint32_t{CKPT_MAX_DIMS + 1}, 1000u, UINT32_MAX}) {
		EXPECT_EQ(ckpt_layout_add(l, "x", one, ndim, 0), -CKPT_E_INVAL) << ndim;
		EXPECT_NE(std::string(ckpt_last_error()).find(std::to_string(ndim) + " dimensions"),
			  std::string::npos)
			<< ckpt_last_error();
	}
	const uint64_t eight[CKPT_MAX_DIMS] = {1, 1, 1, 1, 1, 1, 1, 2};
	EXPECT_EQ(ckpt_layout_add(l, "x", eight, CKPT_MAX_DIMS, 0), 0) << ckpt_last_error();
	ckpt_layout_free(l);
	EXPECT_EQ(ckpt_abi_constant("CKPT_MAX_DIMS"), CKPT_MAX_DIMS);

	ckpt_device *d = open();	// two tensors, w and b
	const char *names[1] = {"b"};
	std::vector<float> f(n_b);
	std::vector<uint16_t> h(n_b);
	const float *fs[1] = {f.data()};
	uint16_t *hs[1] = {h.data()};
	const uint64_t ns[1] = {n_b}, steps[1] = {0};
	for (uint32_t count : {3u, UINT32_MAX}) {
		const std::string want = std::to_string(count) + " tensors given, the device has 2";
		EXPECT_EQ(ckpt_load_params_multi(d, count, names, fs, ns), -CKPT_E_RANGE) << count;
		EXPECT_NE(std::string(ckpt_last_error()).find(want), std::string::npos) << ckpt_last_error();
		EXPECT_EQ(ckpt_load_state(d, count, names, fs, fs, fs, ns, steps, nullptr, 0), -CKPT_E_RANGE);
		EXPECT_NE(std::string(ckpt_last_error()).find(want), std::string::npos) << ckpt_last_error();
		EXPECT_EQ(ckpt_read_params_multi(d, count, names, hs, ns), -CKPT_E_RANGE);
		EXPECT_NE(std::string(ckpt_last_error()).find(want), std::string::npos) << ckpt_last_error();
	}
	// nothing changed: still at step 0, and one tensor at a time works
	struct ckpt_info info;
	ASSERT_EQ(ckpt_info(d, &info), 0);
	EXPECT_EQ(info.committed_step, 0u);
	EXPECT_EQ(ckpt_read_params_multi(d, 1, names, hs, ns), 0) << ckpt_last_error();
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
			if (r == CKPT_RESULT_COMMITTED)
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

// ---- names: the lists of ckpt_abi.h as the library answers them

TEST(CapiNames, ListsAndNames)
{
	EXPECT_EQ(ckpt_abi_count("errors"), static_cast<uint32_t>(CKPT_E_MAX));
	EXPECT_STREQ(ckpt_err_name(CKPT_E_TWICE), "E_TWICE");
	EXPECT_STREQ(ckpt_err_name(-CKPT_E_TWICE), "E_TWICE");
	EXPECT_STREQ(ckpt_err_name(CKPT_E_MAX), "unknown");
	EXPECT_STREQ(ckpt_strerror(-CKPT_E_TWICE), "gradient written twice in one step");
	EXPECT_EQ(ckpt_abi_count("states"), 3u);
	EXPECT_STREQ(ckpt_state_name(CKPT_STATE_OPEN), "open");
	EXPECT_STREQ(ckpt_state_name(99), "unknown");
	EXPECT_STREQ(ckpt_result_name(CKPT_RESULT_COMMITTED), "committed");
	EXPECT_STREQ(ckpt_result_name(CKPT_RESULT_OVERFLOW), "overflow");
	ASSERT_EQ(ckpt_abi_count("dtypes"), 2u);
	for (uint32_t i = 0; i < ckpt_abi_count("dtypes"); i++) {
		const int code = ckpt_dtype_code(i);
		ASSERT_GT(code, 0);
		EXPECT_EQ(ckpt_dtype_parse(ckpt_dtype_name(code)), code);
	}
	EXPECT_EQ(ckpt_dtype_code(2), -CKPT_E_RANGE);
	EXPECT_EQ(ckpt_dtype_parse("bf16"), CKPT_DTYPE_BF16);
	EXPECT_EQ(ckpt_dtype_parse("fp16"), CKPT_DTYPE_FP16);
	EXPECT_EQ(ckpt_dtype_parse("fp32"), -CKPT_E_DTYPE);
	EXPECT_STREQ(ckpt_dtype_safetensors(CKPT_DTYPE_BF16), "BF16");
	EXPECT_EQ(ckpt_abi_count("nonsense"), 0u);
	EXPECT_EQ(ckpt_abi_count(nullptr), 0u);
	EXPECT_EQ(ckpt_abi_sizeof("ckpt_device_status"), sizeof(struct ckpt_device_status));
	EXPECT_EQ(ckpt_abi_sizeof("ckpt_info"), sizeof(struct ckpt_info));
	EXPECT_EQ(ckpt_abi_sizeof("struct ckpt_info"), 0u);
	EXPECT_EQ(ckpt_abi_constant("CKPT_EXPORT_LOWP"), CKPT_EXPORT_LOWP);
	EXPECT_EQ(ckpt_abi_constant("CKPT_EXPORT_OPTIMIZER"), CKPT_EXPORT_OPTIMIZER);
	EXPECT_EQ(ckpt_abi_constant("CKPT_EXPORT_FORCE"), CKPT_EXPORT_FORCE);
	EXPECT_EQ(ckpt_abi_constant("CKPT_NOPE"), -1);
	// member i of the status struct is the uint64_t ckpt_status_field(i) names
	const uint32_t n = ckpt_abi_count("status");
	EXPECT_EQ(n * sizeof(uint64_t), sizeof(struct ckpt_device_status));
	EXPECT_STREQ(ckpt_status_field(0), "state");
	EXPECT_STREQ(ckpt_status_field(ckpt_abi_count("status_fields") - 1), "io_errors");
	EXPECT_STREQ(ckpt_status_field(ckpt_abi_count("status_fields")), "n_chunks");
	EXPECT_EQ(ckpt_status_field(n), nullptr);
}

// ---- the kernel target's dm status line

constexpr const char *good_line = "open 3 4 2/8 1 overflow 16 5 3 1 2 7 4096 8192 9";

TEST(CapiDmStatus, ParsesEveryField)
{
	struct ckpt_device_status st;
	std::memset(&st, 0xff, sizeof(st));
	ASSERT_EQ(ckpt_dm_status_parse(good_line, &st), 0) << ckpt_last_error();
	const ckpt_device_status want = {.state = CKPT_STATE_OPEN, .committed_step = 3, .open_step = 4,
		.chunks_done = 2, .overflow = 1, .last_result = CKPT_RESULT_OVERFLOW, .last_error = 16,
		.first_io_error = 5, .steps_committed = 3, .steps_skipped = 1, .steps_aborted = 2,
		.commands_rejected = 7, .grad_bytes = 4096, .param_bytes = 8192, .io_errors = 9,
		.n_chunks = 8, .chunk_params = 0, .n_params = 0, .n_groups = 0, .dtype = 0,
		.grad_sumsq = 0, .grad_sumsq_step = 0};
	expect_counters(st, want);
	EXPECT_EQ(st.n_chunks, 8u);
	EXPECT_EQ(st.chunk_params, 0u);	// not on the line
	// blanks of any kind and number between fields, the kernel's newline
	EXPECT_EQ(ckpt_dm_status_parse("  idle\t0 0 0/1 0 none 0 0 0 0 0 0 0 0 18446744073709551615\n", &st), 0)
		<< ckpt_last_error();
	EXPECT_EQ(st.io_errors, UINT64_MAX);

	char *json = nullptr;
	ASSERT_EQ(ckpt_dm_status_parse(good_line, &st), 0);
	ASSERT_EQ(ckpt_status_json(&st, &json), 0) << ckpt_last_error();
	const std::string j = json;
	ckpt_free(json);
	for (const char *want : {"\"state\":\"open\"", "\"last_result\":\"overflow\"", "\"chunks_done\":2",
				 "\"n_chunks\":8", "\"io_errors\":9", "\"last_error_name\":\"gradient written twice",
				 "\"first_io_error_name\":\"Input/output error\""})
		EXPECT_NE(j.find(want), std::string::npos) << want << " not in " << j;
}

// Two devices' status lines in Prometheus' text format: every family once,
// HELP and TYPE before its samples, one sample per device (per value for the
// two enums), counters named _total, label values escaped. Hostile labels are
// refused and nothing is returned.
TEST(CapiDmStatus, PrometheusTextOfTwoDevices)
{
	struct ckpt_device_status st[2];
	ASSERT_EQ(ckpt_dm_status_parse(good_line, &st[0]), 0);
	ASSERT_EQ(ckpt_dm_status_parse("idle 7 0 0/4 0 committed 0 0 7 0 0 0 1 2 0", &st[1]), 0);
	char *text = nullptr;
	ASSERT_EQ(ckpt_status_prometheus(st, 2, R"([{"name": "a"}, {"name": "b\"c\\d\ne", "job": "j1"}])", &text),
		  0)
		<< ckpt_last_error();
	const std::string t = text;
	ckpt_free(text);

	std::map<std::string, std::string> type;	// family -> its TYPE
	std::map<std::string, int> samples;		// family -> samples seen
	std::istringstream in(t);
	std::string line, family;
	const std::regex sample(R"(^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{([a-zA-Z_][a-zA-Z0-9_]*="([^"\\]|\\.)*",?)*\})? [0-9]+$)");
	while (std::getline(in, line)) {
		std::smatch m;
		if (line.rfind("# HELP ", 0) == 0) {
			family = line.substr(7, line.find(' ', 7) - 7);
			EXPECT_EQ(type.count(family), 0u) << family << " twice";
		} else if (line.rfind("# TYPE ", 0) == 0) {
			const std::string rest = line.substr(7);
			EXPECT_EQ(rest.substr(0, rest.find(' ')), family) << "TYPE after its HELP: " << line;
			type[family] = rest.substr(rest.find(' ') + 1);
		} else {
			ASSERT_TRUE(std::regex_match(line, m, sample)) << "not a sample: " << line;
			EXPECT_EQ(m[1].str(), family) << "a sample outside its family: " << line;
			samples[family]++;
		}
	}
	EXPECT_EQ(type.size(), size_t{CKPT_STATUS_N} + 1) << "a family per field of the line, and dm_ckpt_chunks";
	for (const auto &[f, ty] : type) {
		const bool total = f.size() > 6 && f.compare(f.size() - 6, 6, "_total") == 0;
		EXPECT_EQ(ty, total ? "counter" : "gauge") << f;
		const int per_device = f == "dm_ckpt_state" ? CKPT_STATE_MAX : f == "dm_ckpt_last_result" ? CKPT_RESULT_MAX : 1;
		EXPECT_EQ(samples[f], 2 * per_device) << f;
	}
	for (const char *want : {"dm_ckpt_committed_step{name=\"a\"} 3\n",
				 "dm_ckpt_committed_step{name=\"b\\\"c\\\\d\\ne\",job=\"j1\"} 7\n",
				 "dm_ckpt_state{name=\"a\",state=\"open\"} 1\n", "dm_ckpt_state{name=\"a\",state=\"idle\"} 0\n",
				 "dm_ckpt_last_result{name=\"a\",result=\"overflow\"} 1\n",
				 "dm_ckpt_steps_committed_total{name=\"a\"} 3\n", "dm_ckpt_grad_bytes_total{name=\"a\"} 4096\n",
				 "dm_ckpt_io_errors_total{name=\"a\"} 9\n", "dm_ckpt_first_io_error{name=\"a\"} 5\n",
				 "dm_ckpt_chunks{name=\"a\"} 8\n", "# TYPE dm_ckpt_steps_committed_total counter\n"})
		EXPECT_NE(t.find(want), std::string::npos) << want << " not in\n" << t;

	// no labels at all: bare samples; no devices: only the HELP and TYPE lines
	ASSERT_EQ(ckpt_status_prometheus(st, 1, "[{}]", &text), 0) << ckpt_last_error();
	EXPECT_NE(std::string(text).find("\ndm_ckpt_committed_step 3\n"), std::string::npos) << text;
	ckpt_free(text);
	ASSERT_EQ(ckpt_status_prometheus(nullptr, 0, "[]", &text), 0) << ckpt_last_error();
	EXPECT_EQ(std::string(text).find("\ndm_"), std::string::npos) << text;
	ckpt_free(text);

	for (const char *bad : {"", "{}", "[{}]", "[{\"name\": \"a\"}, 3]", "[{\"1x\": \"a\"}, {}]",
				"[{\"__name\": \"a\"}, {}]", "[{\"a-b\": \"a\"}, {}]", "[{\"name\": 3}, {}]",
				"[{\"\": \"a\"}, {}]", "[{}, {}, {}]", "not json"}) {
		text = nullptr;
		EXPECT_EQ(ckpt_status_prometheus(st, 2, bad, &text), -CKPT_E_INVAL) << bad;
		EXPECT_EQ(text, nullptr) << bad;
	}
	EXPECT_EQ(ckpt_status_prometheus(nullptr, 2, "[{}, {}]", &text), -CKPT_E_INVAL);
	EXPECT_EQ(ckpt_status_prometheus(st, 2, nullptr, &text), -CKPT_E_INVAL);
	EXPECT_EQ(ckpt_status_prometheus(st, 2, "[{}, {}]", nullptr), -CKPT_E_INVAL);
}

TEST(CapiDmStatus, RefusesHostileInputAndChangesNothing)
{
	const char *bad[] = {
		"",
		"open",
		"open 3 4 2/8 1 overflow 16 5 3 1 2 7 4096 8192",		// 14 fields
		"open 3 4 2/8 1 overflow 16 5 3 1 2 7 4096 8192 9 10",	// 16
		"opened 3 4 2/8 1 overflow 16 5 3 1 2 7 4096 8192 9",	// unknown state
		"unknown 3 4 2/8 1 overflow 16 5 3 1 2 7 4096 8192 9",
		"open 3 4 2/8 1 committedx 16 5 3 1 2 7 4096 8192 9",	// unknown result
		"open -3 4 2/8 1 overflow 16 5 3 1 2 7 4096 8192 9",	// strtoull takes "-3"
		"open +3 4 2/8 1 overflow 16 5 3 1 2 7 4096 8192 9",
		"open 0x3 4 2/8 1 overflow 16 5 3 1 2 7 4096 8192 9",
		"open 3 4 2/8 1 overflow 16 5 3 1 2 7 4096 8192 18446744073709551616",	// 2^64
		"open 3 4 2/8 4294967296 overflow 16 5 3 1 2 7 4096 8192 9",	// U32 field
		"open 3 4 2 1 overflow 16 5 3 1 2 7 4096 8192 9",		// no DONE/TOTAL
		"open 3 4 2/ 1 overflow 16 5 3 1 2 7 4096 8192 9",
		"open 3 4 /8 1 overflow 16 5 3 1 2 7 4096 8192 9",
		"open 3 4 2/8/8 1 overflow 16 5 3 1 2 7 4096 8192 9",
		"open 3 4 9/8 1 overflow 16 5 3 1 2 7 4096 8192 9",	// more done than chunks
		"open 3 4 2/8 1 overflow 16 5 3 1 2 7 4096 8192 9x",
		"open 3 4 2/8 1 overflow 16 5 3 1 2 7 4096 8192 ٩",	// a non-ASCII digit
	};
	for (const char *line : bad) {
		struct ckpt_device_status st, before;
		std::memset(&st, 0xa5, sizeof(st));
		before = st;
		EXPECT_EQ(ckpt_dm_status_parse(line, &st), -CKPT_E_INVAL) << "'" << line << "'";
		EXPECT_NE(std::string(ckpt_last_error()), "") << line;
		EXPECT_EQ(std::memcmp(&st, &before, sizeof(st)), 0) << "changed on '" << line << "'";
	}
	struct ckpt_device_status st;
	EXPECT_EQ(ckpt_dm_status_parse(nullptr, &st), -CKPT_E_INVAL);
	EXPECT_EQ(ckpt_dm_status_parse(good_line, nullptr), -CKPT_E_INVAL);
	EXPECT_EQ(ckpt_status_json(&st, nullptr), -CKPT_E_INVAL);
	// the message names the field
	ckpt_dm_status_parse("open 3 4 2/8 1 overflow 16 5 3 1 2 7 4096 x 9", &st);
	EXPECT_NE(std::string(ckpt_last_error()).find("param_bytes"), std::string::npos) << ckpt_last_error();
}

// ---- uuid

std::string file_uuid(const std::string &path)
{
	// struct ckpt_sb_disk: le32 magic "CKPT" at 0, the uuid's 16 bytes at
	// byte 32, in the copy (at 0 or 4 KiB) that has been written
	std::ifstream f(path, std::ios::binary);
	for (int copy = 0; copy < 2; copy++) {
		char b[48];
		f.seekg(copy * 4096);
		f.read(b, sizeof(b));
		if (std::memcmp(b, "CKPT", 4) == 0)
			return std::string(b + 32, 16);
	}
	return "";
}

TEST_F(CapiTest, UuidOfDeviceAndImage)
{
	uint8_t a[16], b[16];
	ckpt_device *d = open();
	ASSERT_EQ(ckpt_uuid(d, a), 0) << ckpt_last_error();
	ckpt_close(d);
	ASSERT_EQ(ckpt_image_uuid(path_.c_str(), b), 0) << ckpt_last_error();
	EXPECT_EQ(std::memcmp(a, b, 16), 0);
	EXPECT_EQ(std::string(reinterpret_cast<char *>(a), 16), file_uuid(path_));
	EXPECT_NE(std::string(16, '\0'), file_uuid(path_));
	char text[37];
	ckpt_uuid_string(a, text);
	ASSERT_EQ(std::strlen(text), 36u);
	for (int i : {8, 13, 18, 23})
		EXPECT_EQ(text[i], '-') << text;
	char hex[3];
	snprintf(hex, sizeof(hex), "%02x", a[15]);
	EXPECT_EQ(std::string(text + 34), hex);
	// another format, another uuid; not an image, an error
	const std::string other = (dir_ / "other.img").string();
	ckpt_layout_builder *l = ckpt_layout_new();
	ASSERT_EQ(ckpt_layout_add(l, "w", &n_b, 1, 0), 0);
	ASSERT_EQ(ckpt_format(other.c_str(), l, CKPT_DTYPE_FP16, 2048, 0), 0) << ckpt_last_error();
	ckpt_layout_free(l);
	ASSERT_EQ(ckpt_image_uuid(other.c_str(), b), 0) << ckpt_last_error();
	EXPECT_NE(std::memcmp(a, b, 16), 0);
	const std::string junk = (dir_ / "junk").string();
	std::ofstream(junk) << std::string(16384, 'x');
	EXPECT_LT(ckpt_image_uuid(junk.c_str(), b), 0);
	EXPECT_NE(std::string(ckpt_last_error()).find(junk), std::string::npos) << ckpt_last_error();
	EXPECT_EQ(ckpt_image_uuid((dir_ / "none").c_str(), b), -CKPT_E_IO) << ckpt_last_error();
	EXPECT_EQ(ckpt_image_uuid(nullptr, b), -CKPT_E_INVAL);
}

// ---- status of an open device

TEST_F(CapiTest, StatusOfADevice)
{
	ckpt_device *d = open();
	struct ckpt_device_status st;
	ASSERT_EQ(ckpt_status(d, &st), 0) << ckpt_last_error();
	EXPECT_EQ(st.state, CKPT_STATE_IDLE);
	EXPECT_EQ(st.chunk_params, 4096u);
	EXPECT_EQ(st.n_chunks, 65u);	// 64 of w, 1 of b
	EXPECT_EQ(st.n_params, 65u * 4096);
	EXPECT_EQ(st.dtype, static_cast<uint64_t>(CKPT_DTYPE_BF16));
	EXPECT_EQ(st.n_groups, 1u);
	ASSERT_EQ(ckpt_begin(d, &hp, 1, 1.0), 0) << ckpt_last_error();
	ASSERT_EQ(ckpt_status(d, &st), 0);
	EXPECT_EQ(st.state, CKPT_STATE_OPEN);
	EXPECT_EQ(st.open_step, 1u);
	EXPECT_EQ(ckpt_abort(d), 0);
	ASSERT_EQ(ckpt_status(d, &st), 0);
	EXPECT_EQ(st.steps_aborted, 1u);
	EXPECT_EQ(st.last_result, CKPT_RESULT_ABORTED);
	EXPECT_EQ(ckpt_status(d, nullptr), -CKPT_E_INVAL);
	ckpt_close(d);
	EXPECT_EQ(ckpt_status(d, &st), -CKPT_E_STATE);
}

// ---- export: what is refused leaves nothing behind

TEST_F(CapiTest, ExportRefusals)
{
	ckpt_device *d = open();
	const std::string out = (dir_ / "out.safetensors").string();
	EXPECT_EQ(ckpt_export(d, out.c_str(), 1u << 3, nullptr), -CKPT_E_INVAL);
	EXPECT_EQ(ckpt_export(d, out.c_str(), 0, "[1]"), -CKPT_E_INVAL);
	EXPECT_EQ(ckpt_export(d, out.c_str(), 0, "{\"a\": 1}"), -CKPT_E_INVAL);
	EXPECT_NE(std::string(ckpt_last_error()).find("'a'"), std::string::npos) << ckpt_last_error();
	EXPECT_EQ(ckpt_export(d, out.c_str(), 0, "{\"a\""), -CKPT_E_INVAL);
	EXPECT_EQ(ckpt_export(d, path_.c_str(), 0, nullptr), -CKPT_E_INVAL) << "the image itself";
	EXPECT_EQ(ckpt_export(d, dir_.c_str(), 0, nullptr), -CKPT_E_INVAL) << "a directory";
	EXPECT_EQ(ckpt_export(d, nullptr, 0, nullptr), -CKPT_E_INVAL);
	ASSERT_EQ(ckpt_begin(d, &hp, 1, 1.0), 0) << ckpt_last_error();
	EXPECT_EQ(ckpt_export(d, out.c_str(), 0, nullptr), -CKPT_E_STATE);
	ASSERT_EQ(ckpt_abort(d), 0);
	EXPECT_FALSE(fs::exists(out));
	for (const auto &e : fs::directory_iterator(dir_))
		EXPECT_EQ(e.path().string().find(".tmp"), std::string::npos) << e.path();
	ASSERT_EQ(ckpt_export(d, out.c_str(), CKPT_EXPORT_OPTIMIZER, "{\"k\": \"v\"}"), 0) << ckpt_last_error();
	// 8-byte header length, then the JSON header; 3 tensors per name, fp32
	std::ifstream f(out, std::ios::binary);
	uint64_t n = 0;
	f.read(reinterpret_cast<char *>(&n), 8);
	std::string h(n, '\0');
	f.read(h.data(), static_cast<std::streamsize>(n));
	EXPECT_NE(h.find("\"k\":\"v\""), std::string::npos) << h;
	EXPECT_NE(h.find("\"w.exp_avg_sq\""), std::string::npos) << h;
	EXPECT_EQ(fs::file_size(out), 8 + n + 3 * 4 * (n_w + n_b));
	ckpt_close(d);
}

// ---- tool operations: JSON reports

std::string take(char *p)
{
	std::string s = p ? p : "";
	ckpt_free(p);
	return s;
}

TEST_F(CapiTest, ImageInfoVerifyRestore)
{
	char *json = nullptr;
	ASSERT_EQ(ckpt_image_info(path_.c_str(), &json), 0) << ckpt_last_error();
	const std::string info = take(json);
	uint8_t u[16];
	char text[37];
	ASSERT_EQ(ckpt_image_uuid(path_.c_str(), u), 0);
	ckpt_uuid_string(u, text);
	EXPECT_NE(info.find(std::string("\"uuid\":\"") + text + "\""), std::string::npos) << info;
	EXPECT_NE(info.find("\"n_chunks\":65"), std::string::npos) << info;
	EXPECT_NE(info.find("\"name\":\"w\""), std::string::npos) << info;

	ASSERT_EQ(ckpt_verify(path_.c_str(), 0, &json), 0) << ckpt_last_error();
	std::string v = take(json);
	EXPECT_NE(v.find("\"status\":\"ok\""), std::string::npos) << v;
	EXPECT_EQ(ckpt_verify(path_.c_str(), 4, &json), -CKPT_E_INVAL);

	// a flipped bit in a committed record: verify reports it, not fails
	{
		std::fstream f(path_, std::ios::in | std::ios::out | std::ios::binary);
		ASSERT_EQ(ckpt_image_info(path_.c_str(), &json), 0);
		const std::string j = take(json);
		const size_t at = j.find("\"rec_off\":[");
		ASSERT_NE(at, std::string::npos);
		const uint64_t rec0 = std::stoull(j.substr(at + 11));
		// committed slot 0 after format; byte 5000: fp32 data of chunk 0
		f.seekg(static_cast<std::streamoff>(rec0 + 5000));
		char c;
		f.read(&c, 1);
		c ^= 1;
		f.seekp(static_cast<std::streamoff>(rec0 + 5000));
		f.write(&c, 1);
	}
	ASSERT_EQ(ckpt_verify(path_.c_str(), 0, &json), 0) << ckpt_last_error();
	v = take(json);
	EXPECT_NE(v.find("\"status\":\"corrupt\""), std::string::npos) << v;
	ASSERT_EQ(ckpt_restore(path_.c_str(), 0, &json), 0) << ckpt_last_error();
	v = take(json);
	EXPECT_NE(v.find("\"committed_ok\":false"), std::string::npos) << v;
	EXPECT_EQ(ckpt_restore(path_.c_str(), 2, &json), -CKPT_E_INVAL);

	// not an image
	const std::string junk = (dir_ / "junk").string();
	std::ofstream(junk) << std::string(16384, 'x');
	EXPECT_LT(ckpt_image_info(junk.c_str(), &json), 0);
	EXPECT_NE(std::string(ckpt_last_error()).find(junk), std::string::npos) << ckpt_last_error();
	EXPECT_EQ(ckpt_image_info(path_.c_str(), nullptr), -CKPT_E_INVAL);
	EXPECT_EQ(ckpt_image_info(nullptr, &json), -CKPT_E_INVAL);
	// a regular file is no dm-ckpt device node
	char *backing = reinterpret_cast<char *>(1);
	EXPECT_EQ(ckpt_backing_of(path_.c_str(), &backing), 0);
	EXPECT_EQ(backing, reinterpret_cast<char *>(1)) << "untouched";
}

TEST_F(CapiTest, FormatManifestAndImportOptions)
{
	char *json = nullptr;
	const std::string img = (dir_ / "m.img").string(), man = (dir_ / "m.json").string();
	std::ofstream(man) << R"({"dtype": "fp16", "chunk_params": 2048, "tensors": [{"name": "a", "shape": [5, 7]}]})";
	EXPECT_EQ(ckpt_format_manifest(img.c_str(), "{}", &json), -CKPT_E_INVAL) << "no manifest";
	EXPECT_EQ(ckpt_format_manifest(img.c_str(), "[]", &json), -CKPT_E_INVAL);
	EXPECT_EQ(ckpt_format_manifest(img.c_str(), R"({"manifest": 3})", &json), -CKPT_E_INVAL);
	EXPECT_NE(std::string(ckpt_last_error()).find("manifest"), std::string::npos) << ckpt_last_error();
	EXPECT_FALSE(fs::exists(img));
	const std::string opts = R"({"manifest": ")" + man + R"("})";
	ASSERT_EQ(ckpt_format_manifest(img.c_str(), opts.c_str(), &json), 0) << ckpt_last_error();
	const std::string r = take(json);
	EXPECT_NE(r.find("\"dtype\":\"fp16\""), std::string::npos) << r;
	EXPECT_NE(r.find("\"chunk_params\":2048"), std::string::npos) << r;
	// the image exists now: without force, format refuses to overwrite it
	EXPECT_LT(ckpt_format_manifest(img.c_str(), opts.c_str(), &json), 0);
	EXPECT_LT(ckpt_import(img.c_str(), (dir_ / "none.safetensors").c_str(), "{}", &json), 0);
	EXPECT_EQ(ckpt_import(img.c_str(), man.c_str(), R"({"step": "x"})", &json), -CKPT_E_INVAL);
	EXPECT_NE(std::string(ckpt_last_error()).find("step"), std::string::npos) << ckpt_last_error();
}

TEST(CapiFit, LargestLayout)
{
	struct ckpt_fit f;
	ASSERT_EQ(ckpt_fit(1ull << 30, 0, 0, &f), 0) << ckpt_last_error();
	EXPECT_EQ(f.chunk_params, 65536u);
	EXPECT_GT(f.n_chunks, 0u);
	EXPECT_LE(f.backing_bytes, 1ull << 30);
	EXPECT_EQ(f.n_params, static_cast<uint64_t>(f.n_chunks) * 65536);
	EXPECT_EQ(f.record_bytes, 4096 + 12ull * 65536);
	struct ckpt_fit more;
	ASSERT_EQ(ckpt_fit(1ull << 30, 0, 1u << 20, &more), 0);
	EXPECT_EQ(more.chunk_params, 1u << 19) << "p_lo covers a 1 MiB write unit";
	ASSERT_EQ(ckpt_fit(4096, 2048, 0, &f), 0);
	EXPECT_EQ(f.n_chunks, 0u);
	EXPECT_EQ(ckpt_fit(1ull << 30, 3000, 0, &f), -CKPT_E_GEOMETRY);
	EXPECT_EQ(ckpt_fit(1ull << 30, 1024, 0, &f), -CKPT_E_GEOMETRY);
	EXPECT_EQ(ckpt_fit(1ull << 30, 1u << 23, 0, &f), -CKPT_E_GEOMETRY);
	EXPECT_EQ(ckpt_fit(1ull << 30, 0, 0, nullptr), -CKPT_E_INVAL);
}

TEST(CapiConvert, LowpAndCrc)
{
	const float in[3] = {1.0f, -2.0f, 65504.0f};
	uint16_t out[3];
	ASSERT_EQ(ckpt_to_lowp(CKPT_DTYPE_BF16, in, out, 3), 0);
	EXPECT_EQ(out[0], 0x3f80);
	EXPECT_EQ(out[1], 0xc000);
	ASSERT_EQ(ckpt_to_lowp(CKPT_DTYPE_FP16, in, out, 3), 0);
	EXPECT_EQ(out[0], 0x3c00);
	EXPECT_EQ(out[2], 0x7bff);
	EXPECT_EQ(ckpt_to_lowp(7, in, out, 3), -CKPT_E_DTYPE);
	// crc32c("123456789") = 0xe3069283, in one call or two
	EXPECT_EQ(ckpt_crc32c_update(0, "123456789", 9), 0xe3069283u);
	EXPECT_EQ(ckpt_crc32c_update(ckpt_crc32c_update(0, "1234", 4), "56789", 5), 0xe3069283u);
}

} // namespace

namespace {

// ckpt_load_state: every tensor once, sane values; anything else is refused and the device keeps its state (step 0, zero moments).
TEST_F(CapiTest, LoadStateWholeOrNothing)
{
	ckpt_device *d = open();
	std::vector<float> pw(n_w, 0.25f), mw(n_w, 0.01f), vw(n_w, 0.04f);
	std::vector<float> pb(n_b, -1.0f), mb(n_b, -0.5f), vb(n_b, 2.0f);
	const char *names[] = {"w", "b"};
	const float *p[] = {pw.data(), pb.data()}, *m[] = {mw.data(), mb.data()}, *v[] = {vw.data(), vb.data()};
	uint64_t ns[] = {n_w, n_b}, steps[] = {7, 7};
	auto refused = [&](const char *words) {
		EXPECT_NE(std::string(ckpt_last_error()).find(words), std::string::npos) << ckpt_last_error();
		struct ckpt_info info;
		ASSERT_EQ(ckpt_info(d, &info), 0);
		EXPECT_EQ(info.committed_step, 0u);
		std::vector<float> sp(n_b), sm(n_b), sv(n_b);
		ASSERT_EQ(ckpt_read_state(d, "b", sp.data(), sm.data(), sv.data(), n_b), 0);
		EXPECT_EQ(sm, std::vector<float>(n_b, 0.0f));
	};
	EXPECT_EQ(ckpt_load_state(d, 2, names, p, m, nullptr, ns, steps, nullptr, 0), -CKPT_E_INVAL);
	refused("v is NULL");
	EXPECT_EQ(ckpt_load_state(d, 1, names, p, m, v, ns, steps, nullptr, 0), -CKPT_E_NAME);
	refused("tensor 'b' of the device is not given");
	const char *twice[] = {"w", "w"};
	const float *pw2[] = {pw.data(), pw.data()}, *mw2[] = {mw.data(), mw.data()};
	const float *vw2[] = {vw.data(), vw.data()};
	uint64_t nw2[] = {n_w, n_w};
	EXPECT_EQ(ckpt_load_state(d, 2, twice, pw2, mw2, vw2, nw2, steps, nullptr, 0), -CKPT_E_TWICE);
	refused("tensor 'w' given twice");
	vb[999] = -1.0f;
	EXPECT_EQ(ckpt_load_state(d, 2, names, p, m, v, ns, steps, nullptr, 0), -CKPT_E_HPARAM);
	refused("tensor 'b' exp_avg_sq element 999 is -1");
	vb[999] = 2.0f;
	uint64_t short_ns[] = {n_w, n_b - 1};
	EXPECT_EQ(ckpt_load_state(d, 2, names, p, m, v, short_ns, steps, nullptr, 0), -CKPT_E_SIZE);
	refused("tensor 'b' has 1000 elements, 999 given");
	std::vector<uint8_t> big(CKPT_BLOB_MAX + 1);
	EXPECT_EQ(ckpt_load_state(d, 2, names, p, m, v, ns, steps, big.data(), big.size()), -CKPT_E_BLOB);
	refused("trainer blob");

	// tensors at different steps (torch's AdamW counts only a param's steps
	// with a gradient): committed as the largest, each keeping its own count
	uint64_t uneven[] = {7, 6};
	ASSERT_EQ(ckpt_load_state(d, 2, names, p, m, v, ns, uneven, "blob", 4), 0) << ckpt_last_error();
	ckpt_close(d);
	d = open();
	struct ckpt_info info;
	ASSERT_EQ(ckpt_info(d, &info), 0);
	EXPECT_EQ(info.committed_step, 7u);
	uint64_t count = 0;
	ASSERT_EQ(ckpt_tensor_step(d, "w", &count), 0) << ckpt_last_error();
	EXPECT_EQ(count, 7u);
	ASSERT_EQ(ckpt_tensor_step(d, "b", &count), 0) << ckpt_last_error();
	EXPECT_EQ(count, 6u);
	char blob[8] = {};
	EXPECT_EQ(ckpt_blob(d, blob, sizeof(blob)), 4);
	EXPECT_STREQ(blob, "blob");
	std::vector<float> sp(n_b), sm(n_b), sv(n_b);
	ASSERT_EQ(ckpt_read_state(d, "b", sp.data(), sm.data(), sv.data(), n_b), 0);
	EXPECT_EQ(sp, pb);
	EXPECT_EQ(sm, mb);
	EXPECT_EQ(sv, vb);
	// only before the first step
	EXPECT_EQ(ckpt_load_state(d, 2, names, p, m, v, ns, steps, nullptr, 0), -CKPT_E_STATE);
	EXPECT_NE(std::string(ckpt_last_error()).find("only before the first step (committed step is 7)"),
		  std::string::npos)
		<< ckpt_last_error();
	// the next step updates b with its own count (the padding b owns lags with it)
	EXPECT_EQ(step_counts_after_a_step(d), (std::pair<uint64_t, uint64_t>{8, 7}));
	ckpt_close(d);
}

} // namespace

namespace {

// A safetensors file written byte by byte, its __metadata__ entries as given
// (a key twice included): b with its moments, F32, for an import
// --with-optimizer --partial into CapiTest's image at step 5.
void write_state_file(const std::string &path, const std::vector<std::pair<std::string, std::string>> &extra)
{
	std::string meta = R"("dm-ckpt.format_version": "1", "dm-ckpt.dtype": "bf16", "dm-ckpt.chunk_params": "4096",)"
			   R"( "dm-ckpt.step": "5", "dm-ckpt.n_groups": "1", "dm-ckpt.tensor_group.w": "0",)"
			   R"( "dm-ckpt.tensor_group.b": "0", "step": "5")";
	for (const auto &[k, v] : extra)
		meta += ", \"" + k + "\": \"" + v + "\"";
	std::string header = "{\"__metadata__\": {" + meta + "}";
	std::vector<float> data;
	for (const auto &[name, value] : {std::pair<std::string, float>{"b", 0.5f}, {"b.exp_avg", 0.1f},
					  {"b.exp_avg_sq", 0.01f}}) {
		header += ", \"" + name + "\": {\"dtype\": \"F32\", \"shape\": [" + std::to_string(n_b) +
			  "], \"data_offsets\": [" + std::to_string(data.size() * 4) + ", " +
			  std::to_string((data.size() + n_b) * 4) + "]}";
		data.insert(data.end(), n_b, value);
	}
	header += "}";
	header.append((8 - header.size() % 8) % 8, ' ');
	std::ofstream f(path, std::ios::binary);
	const uint64_t len = header.size();	// little-endian hosts only, as the library
	f.write(reinterpret_cast<const char *>(&len), 8);
	f << header;
	f.write(reinterpret_cast<const char *>(data.data()), static_cast<std::streamsize>(data.size() * 4));
}

std::string file_bytes(const std::string &path)
{
	std::ifstream f(path, std::ios::binary);
	return std::string(std::istreambuf_iterator<char>(f), {});
}

// A tensor's own step count in the metadata (dm-ckpt.tensor_step.NAME) is
// outside input: not a number, negative, above the step, of an unknown
// tensor or given twice is refused in the project's words and nothing of
// the image is written; a good one becomes the tensor's count.
TEST_F(CapiTest, ImportRefusesHostileTensorSteps)
{
	char *json = nullptr;
	const std::string from = (dir_ / "state.safetensors").string();
	const std::string before = file_bytes(path_);
	const std::string opts = R"({"with_optimizer": true, "partial": true})";
	const struct {
		std::vector<std::pair<std::string, std::string>> meta;
		const char *words;
	} cases[] = {
		{{{"dm-ckpt.tensor_step.b", "three"}}, "dm-ckpt.tensor_step.b: 'three' is not an integer from 0 to 5"},
		{{{"dm-ckpt.tensor_step.b", "3.0"}}, "dm-ckpt.tensor_step.b: '3.0' is not an integer"},
		{{{"dm-ckpt.tensor_step.b", ""}}, "dm-ckpt.tensor_step.b: '' is not an integer"},
		{{{"dm-ckpt.tensor_step.b", "-1"}}, "dm-ckpt.tensor_step.b: '-1' is not an integer from 0 to 5"},
		{{{"dm-ckpt.tensor_step.b", "6"}}, "dm-ckpt.tensor_step.b: '6' is not an integer from 0 to 5"},
		{{{"dm-ckpt.tensor_step.b", "18446744073709551616"}}, "is not an integer from 0 to 5"},
		{{{"dm-ckpt.tensor_step.zz", "3"}}, "dm-ckpt.tensor_step.zz: names no tensor"},
		{{{"dm-ckpt.tensor_step.", "3"}}, "dm-ckpt.tensor_step.: names no tensor"},
		{{{"dm-ckpt.tensor_step.b", "3"}, {"dm-ckpt.tensor_step.b", "4"}},
		 "names 'dm-ckpt.tensor_step.b' twice"},
	};
	for (const auto &c : cases) {
		SCOPED_TRACE(c.words);
		write_state_file(from, c.meta);
		EXPECT_EQ(ckpt_import(path_.c_str(), from.c_str(), opts.c_str(), &json), -CKPT_E_INVAL);
		EXPECT_NE(std::string(ckpt_last_error()).find(c.words), std::string::npos) << ckpt_last_error();
		EXPECT_EQ(file_bytes(path_), before) << "the image was written";
	}
	write_state_file(from, {{"dm-ckpt.tensor_step.b", "3"}});
	ASSERT_EQ(ckpt_import(path_.c_str(), from.c_str(), opts.c_str(), &json), 0) << ckpt_last_error();
	ckpt_free(json);
	ckpt_device *d = open();
	uint64_t count = 0;
	struct ckpt_info info;
	ASSERT_EQ(ckpt_info(d, &info), 0);
	EXPECT_EQ(info.committed_step, 5u);
	ASSERT_EQ(ckpt_tensor_step(d, "b", &count), 0) << ckpt_last_error();
	EXPECT_EQ(count, 3u);
	ASSERT_EQ(ckpt_tensor_step(d, "w", &count), 0) << ckpt_last_error();
	EXPECT_EQ(count, 5u);
	EXPECT_EQ(step_counts_after_a_step(d), (std::pair<uint64_t, uint64_t>{6, 4}));
	ckpt_close(d);
}

} // namespace

namespace {

// A gradient write whose update fails behind it (the step's record slot
// lies beyond RLIMIT_FSIZE: EFBIG) is taken, and the failure surfaces at
// the COMMIT, which commits nothing: the committed step and the params read
// back are those of before.
TEST_F(CapiTest, AFailedWriteSurfacesAtCommitAndTheCommittedStepStays)
{
	char *json = nullptr;
	ASSERT_EQ(ckpt_image_info(path_.c_str(), &json), 0) << ckpt_last_error();
	const std::string j = take(json);
	const size_t at = j.find("\"rec_off\":[");
	ASSERT_NE(at, std::string::npos);
	const uint64_t rec1 = std::stoull(j.substr(j.find(',', at) + 1));	// step 1 writes slot 1
	ckpt_device *d = open();
	std::vector<uint16_t> before(n_w), after(n_w), gw(n_w, 0x3c00), gb(n_b, 0xbc00);
	ASSERT_EQ(ckpt_read_params(d, "w", before.data(), n_w), 0) << ckpt_last_error();
	ASSERT_EQ(truncate(path_.c_str(), static_cast<off_t>(rec1)), 0);
	struct rlimit old_lim;
	ASSERT_EQ(getrlimit(RLIMIT_FSIZE, &old_lim), 0);
	struct rlimit lim = old_lim;
	lim.rlim_cur = rec1;
	auto old_sig = signal(SIGXFSZ, SIG_IGN);
	ASSERT_EQ(setrlimit(RLIMIT_FSIZE, &lim), 0);
	const int begun = ckpt_begin(d, &hp, 1, 1.0);
	const int wrote = ckpt_write_grad(d, "b", gb.data(), n_b);	// one chunk: taken
	const int committed = ckpt_commit(d, nullptr, 0);
	const std::string why = ckpt_last_error();
	setrlimit(RLIMIT_FSIZE, &old_lim);
	signal(SIGXFSZ, old_sig);
	EXPECT_EQ(begun, 0);
	EXPECT_EQ(wrote, 0);
	EXPECT_EQ(committed, -CKPT_E_IO) << why;
	EXPECT_NE(why.find("File too large"), std::string::npos) << why;
	struct ckpt_info info;
	ASSERT_EQ(ckpt_info(d, &info), 0);
	EXPECT_EQ(info.committed_step, 0u);
	ASSERT_EQ(ckpt_read_params(d, "w", after.data(), n_w), 0) << ckpt_last_error();
	EXPECT_EQ(before, after);
	EXPECT_EQ(ckpt_commit(d, nullptr, 0), -CKPT_E_FAILED);
	ckpt_close(d);
}

} // namespace
