// SPDX-License-Identifier: MIT
// Hostile input against the userspace engine, as tests/kmod/hostile_test.c
// does against the kernel target: random bytes into the control block, the
// GRAD and PARAM windows and past the end; reads and writes of every size from
// 512 B to 8 MiB at odd offsets; garbage commands; two threads racing
// BEGIN/COMMIT. Each is refused with a clear error (the status page says
// why) and the committed state (params, both moments, the trainer blob) is
// unchanged; `verify` passes. And one writer per image: a second open from
// another process, from the same process, or from a forked child is refused,
// the first opener keeps working and nothing changes on disk. Seeded and
// bounded (a few seconds).
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <random>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>
#include <sys/select.h>
#include <sys/wait.h>
#include <unistd.h>

#include "ckpt.h"
#include "device.hpp"
#include "format.hpp"
#include "admin.hpp"

namespace {

namespace fs = std::filesystem;

constexpr uint64_t kBig = 8u << 20;	// the largest I/O tried

// Everything a committed step stands for.
struct Snapshot {
	uint64_t step = 0;
	std::vector<float> p, m, v;
	std::vector<uint16_t> lo;
	std::vector<uint8_t> blob;
	bool operator==(const Snapshot &) const = default;
};

class HostileTest : public ::testing::Test {
protected:
	void SetUp() override
	{
		dir_ = fs::temp_directory_path() / fmt::format("ckpt-hostile-{}-{}", getpid(), counter_++);
		fs::create_directories(dir_);
		path_ = (dir_ / "dev.img").string();
		format(path_);
		rng_.seed(20261203);
		junk_.resize(kBig + 4096);
		for (auto &b : junk_)
			b = static_cast<uint8_t>(rng_());
	}
	void TearDown() override { fs::remove_all(dir_); }

	// Three tensors over 8 chunks of 4096 params, two groups.
	static void format(const std::string &path)
	{
		ckpt::Layout l;
		l.add("a", {5000}, 0);
		l.add("b", {3000, 3}, 0);
		l.add("c", {13000}, 1);
		ckpt::FormatOptions o;
		o.chunk_params = 4096;
		o.dtype = CKPT_DTYPE_FP16;
		ckpt::format(path, l, o);
	}

	static std::vector<ckpt::GroupHparams> groups()
	{
		std::vector<ckpt::GroupHparams> g(2);
		g[1].lr = 3e-3;
		g[1].adam_l2 = true;
		return g;
	}

	// The same gradients at every step (so racing writers agree), finite.
	static std::vector<uint16_t> grads(const struct ckpt_regions &l)
	{
		std::vector<uint16_t> g(l.n_params);
		for (uint64_t i = 0; i < g.size(); i++)
			g[i] = static_cast<uint16_t>(0x2000 + (i * 2654435761u) % 0x2000) |
			       static_cast<uint16_t>((i & 1) << 15);
		return g;
	}

	static void step(ckpt::Device &d, std::string_view blob = "hostile")
	{
		const auto g = grads(d.regions());
		d.begin(groups(), 0.5);
		d.write_grad_window(0, g.data(), d.regions().window_bytes);
		const auto *b = reinterpret_cast<const uint8_t *>(blob.data());
		ASSERT_EQ(d.commit({b, blob.size()}), ckpt::CommitResult::committed);
	}

	static Snapshot snapshot(ckpt::Device &d)
	{
		Snapshot s;
		const struct ckpt_status st = d.status();
		s.step = st.committed_step;
		s.blob.assign(st.blob, st.blob + st.blob_len);
		for (const ckpt::Tensor &t : d.manifest().tensors()) {
			std::vector<float> p(t.numel), m(t.numel), v(t.numel);
			std::vector<uint16_t> lo(t.numel);
			d.read_state(t.name, p.data(), m.data(), v.data(), t.numel);
			d.read_params(t.name, lo.data(), t.numel);
			s.p.insert(s.p.end(), p.begin(), p.end());
			s.m.insert(s.m.end(), m.begin(), m.end());
			s.v.insert(s.v.end(), v.begin(), v.end());
			s.lo.insert(s.lo.end(), lo.begin(), lo.end());
		}
		return s;
	}

	// ckptctl verify's verdict on the closed image.
	std::string verify() const
	{
		const auto j = nlohmann::json::parse(ckpt::verify_report(path_, false));
		const auto &r = j.contains("report") ? j["report"] : j;
		return r.value("status", "?");
	}

	std::vector<char> file_bytes() const
	{
		std::ifstream f(path_, std::ios::binary);
		return {std::istreambuf_iterator<char>(f), {}};
	}

	// The code and message of what f threw (0 and "" if nothing).
	static std::pair<int, std::string> refusal(const std::function<void()> &f)
	{
		try {
			f();
		} catch (const ckpt::Error &e) {
			return {e.code(), e.what()};
		}
		return {0, {}};
	}

	// Places to aim at: each region's start and odd sectors in it, the
	// boundaries, past the end.
	static std::vector<uint64_t> targets(const struct ckpt_regions &l)
	{
		return {0, 512, 3 * 512, l.grad_off, l.grad_off + 7 * 512,
			l.grad_off + l.plo_chunk_bytes - 512, l.param_off - 512, l.param_off,
			l.param_off + 5 * 512, l.virt_bytes - 512, l.virt_bytes, l.virt_bytes + 9 * 512,
			l.virt_bytes + (1ull << 40), UINT64_MAX - 511};
	}

	static std::vector<uint64_t> sizes()
	{
		return {512, 1024, 1536, 4096, 4608, 8192 + 512, 65536, 1u << 20, (1u << 20) + 512,
			(3u << 20) - 1536, kBig};
	}

	fs::path dir_;
	std::string path_;
	std::mt19937_64 rng_;
	std::vector<uint8_t> junk_;
	static inline int counter_ = 0;
};

// With no step open, no write of random bytes is taken anywhere; each one
// is refused with a message and recorded on the status page. Reads of the
// same shapes answer the page, zeros, params, or E_RANGE past the end.
TEST_F(HostileTest, RandomBytesEverywhere)
{
	auto d = ckpt::Device::open(path_);
	step(*d);
	const Snapshot before = snapshot(*d);
	ckpt::Engine &e = *d->engine();
	const struct ckpt_regions &l = d->regions();
	std::vector<uint8_t> rd(kBig + 512);
	uint64_t refused = 0;
	for (uint64_t at : targets(l)) {
		for (uint64_t size : sizes()) {
			for (uint64_t odd : {0u, 1u, 511u}) {
				for (uint64_t len : {size, size - 1, size + 3}) {
					const uint64_t off = at + odd;
					const uint8_t *src = junk_.data() + rng_() % 4096;
					auto [code, msg] = refusal([&] { e.write(off, src, len); });
					ASSERT_NE(code, 0) << "write of " << len << " at " << off << " taken";
					EXPECT_FALSE(msg.empty());
					const struct ckpt_status st = d->status();
					EXPECT_EQ(st.last_error, static_cast<uint32_t>(code)) << msg;
					EXPECT_EQ(st.last_result, CKPT_RESULT_REJECTED) << msg;
					EXPECT_EQ(st.state, CKPT_STATE_IDLE) << msg;
					refused++;

					auto [rcode, rmsg] = refusal([&] { e.read(off, rd.data(), len); });
					const bool inside = off < l.virt_bytes && len <= l.virt_bytes - off;
					EXPECT_EQ(rcode, inside ? 0 : CKPT_E_RANGE)
						<< "read of " << len << " at " << off << ": " << rmsg;
				}
			}
		}
	}
	const struct ckpt_status st = d->status();
	EXPECT_EQ(st.commands_rejected, refused);
	EXPECT_EQ(st.first_io_error, 0u);
	EXPECT_EQ(snapshot(*d), before);
	step(*d);	// it still steps
	d.reset();
	EXPECT_EQ(verify(), "ok");
}

// The refusals name what was wrong, by region.
TEST_F(HostileTest, RefusalsSayWhy)
{
	auto d = ckpt::Device::open(path_);
	ckpt::Engine &e = *d->engine();
	const struct ckpt_regions &l = d->regions();
	const uint8_t *j = junk_.data();
	EXPECT_EQ(refusal([&] { e.write(l.grad_off, j, 4096); }).first, CKPT_E_STATE);
	EXPECT_EQ(refusal([&] { e.write(l.param_off, j, 4096); }).first, CKPT_E_READONLY);
	EXPECT_EQ(refusal([&] { e.write(l.virt_bytes, j, 4096); }).first, CKPT_E_RANGE);
	EXPECT_EQ(refusal([&] { e.write(UINT64_MAX - 511, j, 512); }).first, CKPT_E_RANGE);
	EXPECT_EQ(refusal([&] { e.write(l.grad_off + 1, j, 512); }).first, CKPT_E_ALIGN);
	EXPECT_EQ(refusal([&] { e.write(512, j, 512); }).first, CKPT_E_RANGE);
	EXPECT_EQ(refusal([&] { e.write(0, j, 8192); }).first, CKPT_E_RANGE);
	EXPECT_EQ(refusal([&] { e.write(0, j, 512); }).first, CKPT_E_MAGIC);
	EXPECT_EQ(refusal([&] { e.read(UINT64_MAX - 511, junk_.data(), 4096); }).first, CKPT_E_RANGE);
	EXPECT_EQ(refusal([&] { e.read(l.virt_bytes - 1, junk_.data(), 2); }).first, CKPT_E_RANGE);
}

// A step open: junk outside the GRAD window and garbage commands are refused
// and leave the step open; junk gradients are gradients; ABORT; the
// committed state is the last commit.
TEST_F(HostileTest, GarbageWithAStepOpen)
{
	auto d = ckpt::Device::open(path_);
	step(*d);
	const Snapshot before = snapshot(*d);
	ckpt::Engine &e = *d->engine();
	const struct ckpt_regions &l = d->regions();
	d->begin(groups(), 0.5);
	const uint64_t t = d->status().open_step;
	for (uint64_t at : targets(l)) {
		if (at >= l.grad_off && at < l.param_off)
			continue;
		for (uint64_t len : sizes())
			EXPECT_NE(refusal([&] { e.write(at, junk_.data(), len); }).first, 0);
	}
	// random bytes as commands, every length up to the block
	for (int k = 0; k < 64; k++) {
		const uint64_t len = 512 * (1 + rng_() % 8);
		EXPECT_NE(refusal([&] { e.write(0, junk_.data() + 4096 * k, len); }).first, 0);
	}
	// a valid COMMIT with one bit flipped
	auto cmd = std::make_unique<struct ckpt_cmd>();
	std::vector<uint8_t> b(CKPT_BLOCK);
	cmd->opcode = CKPT_OP_COMMIT;
	cmd->step = t;
	cmd->blob_len = 100;
	for (int k = 0; k < 300; k++) {
		const int len = ckpt_cmd_encode(cmd.get(), b.data());
		ASSERT_GT(len, 0);
		const uint64_t bit = rng_() % (static_cast<uint64_t>(len) * 8);
		b[bit / 8] ^= static_cast<uint8_t>(1u << (bit % 8));
		EXPECT_NE(refusal([&] { e.write(0, b.data(), 512); }).first, 0);
	}
	// well-formed commands with hostile fields
	int sent = 0;
	for (int k = 0; k < 500; k++) {
		const uint64_t r = rng_();
		*cmd = {};
		cmd->opcode = static_cast<uint32_t>(r % 4);
		cmd->step = (r & 8) ? rng_() : (r >> 8) % 4;
		cmd->grad_scale = static_cast<uint32_t>(rng_());
		cmd->n_groups = 1 + static_cast<uint32_t>((r >> 16) % CKPT_MAX_GROUPS);
		for (auto &g : cmd->groups) {
			auto *w = reinterpret_cast<uint32_t *>(&g);
			for (size_t i = 0; i < sizeof(g) / 4; i++)
				w[i] = static_cast<uint32_t>(rng_());
		}
		cmd->blob_len = static_cast<uint32_t>((r >> 24) % (CKPT_BLOB_MAX + 1));
		std::memcpy(cmd->blob, junk_.data(), cmd->blob_len);
		if (cmd->opcode == CKPT_OP_COMMIT && cmd->step == t)
			cmd->step = t + 1;	// the one command that would be right
		if (cmd->opcode == CKPT_OP_ABORT && (cmd->step == t || cmd->step == 0))
			cmd->step = t + 3;
		if (ckpt_cmd_encode(cmd.get(), b.data()) < 0)
			continue;
		sent++;
		auto [code, msg] = refusal([&] { e.write(0, b.data(), CKPT_BLOCK); });
		EXPECT_NE(code, 0) << "command " << cmd->opcode << " step " << cmd->step << " taken";
		EXPECT_FALSE(msg.empty());
	}
	EXPECT_GT(sent, 300);
	struct ckpt_status st = d->status();
	EXPECT_EQ(st.state, CKPT_STATE_OPEN);
	EXPECT_EQ(st.open_step, t);
	EXPECT_EQ(st.last_result, CKPT_RESULT_REJECTED);
	// junk gradients: taken, or refused as written twice / out of range
	for (uint64_t len : sizes()) {
		const uint64_t off = l.grad_off + (rng_() % (l.window_bytes / 512)) * 512;
		const int code = refusal([&] { e.write(off, junk_.data(), len); }).first;
		EXPECT_TRUE(code == 0 || code == CKPT_E_TWICE || code == CKPT_E_RANGE) << code;
	}
	d->abort();
	EXPECT_EQ(snapshot(*d), before);
	step(*d);
	d.reset();
	EXPECT_EQ(verify(), "ok");
}

// Two threads drive one engine: each loops BEGIN(committed + 1), every
// chunk (whole or in two staged halves, in its own random order), sometimes
// ABORT, COMMIT. Whatever interleaving, the committed state is that of the
// same number of steps run by one thread.
TEST_F(HostileTest, TwoThreadsRaceBeginCommit)
{
	constexpr uint64_t kLast = 12;
	auto d = ckpt::Device::open(path_);
	ckpt::Engine &e = *d->engine();
	const struct ckpt_regions l = d->regions();
	const auto g = grads(l);
	const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
	std::atomic<uint64_t> refusals{0};

	auto racer = [&](uint64_t seed) {
		std::mt19937_64 r(seed);
		auto cmd = std::make_unique<struct ckpt_cmd>();
		std::vector<uint8_t> page(CKPT_BLOCK);
		auto send = [&] {
			const int len = ckpt_cmd_encode(cmd.get(), page.data());
			if (refusal([&] { e.write(0, page.data(), (len + 511) / 512 * 512); }).first)
				refusals++;
		};
		const uint64_t cb = l.plo_chunk_bytes;
		std::vector<uint32_t> order(l.window_bytes / cb);
		while (std::chrono::steady_clock::now() < deadline) {
			std::vector<uint8_t> sp(CKPT_BLOCK);
			struct ckpt_status st;
			e.read(0, sp.data(), CKPT_BLOCK);
			ASSERT_EQ(ckpt_status_decode(sp.data(), &st), 0);
			if (st.committed_step >= kLast)
				return;
			const uint64_t t = st.committed_step + 1;
			*cmd = {};
			cmd->opcode = CKPT_OP_BEGIN;
			cmd->step = t;
			cmd->grad_scale = 0x3f000000;	// 0.5f
			cmd->n_groups = 2;
			const auto gr = groups();
			for (int i = 0; i < 2; i++)
				cmd->groups[i] = ckpt::hparams_for_step(gr[i], t);
			send();
			for (uint32_t c = 0; c < order.size(); c++)
				order[c] = c;
			std::shuffle(order.begin(), order.end(), r);
			for (uint32_t c : order) {
				const auto *src = reinterpret_cast<const uint8_t *>(g.data()) + c * cb;
				const uint64_t off = l.grad_off + c * cb;
				int code;
				if (r() & 1) {
					code = refusal([&] { e.write(off, src, cb); }).first;
				} else {
					code = refusal([&] { e.write(off + cb / 2, src + cb / 2, cb / 2); }).first;
					code |= refusal([&] { e.write(off, src, cb / 2); }).first;
				}
				if (code)
					refusals++;
			}
			if (r() % 4 == 0) {
				*cmd = {};
				cmd->opcode = CKPT_OP_ABORT;
				cmd->step = t;
				send();
			}
			*cmd = {};
			cmd->opcode = CKPT_OP_COMMIT;
			cmd->step = t;
			cmd->blob_len = 7;
			std::memcpy(cmd->blob, "hostile", 7);
			send();
		}
	};
	std::thread a(racer, 1), b(racer, 2);
	a.join();
	b.join();
	struct ckpt_status st = d->status();
	if (st.state == CKPT_STATE_OPEN)
		d->abort();
	st = d->status();
	EXPECT_EQ(st.committed_step, kLast) << "no progress in 20 s";
	EXPECT_EQ(st.first_io_error, 0u);
	EXPECT_GT(refusals.load(), 0u);
	const Snapshot raced = snapshot(*d);
	d.reset();
	EXPECT_EQ(verify(), "ok");

	// the same steps, one after the other, on an image formatted alike
	const std::string ref = (dir_ / "ref.img").string();
	format(ref);
	auto r = ckpt::Device::open(ref);
	for (uint64_t t = 0; t < raced.step; t++)
		step(*r);
	EXPECT_EQ(snapshot(*r), raced);
}

// Readers take no lock: verify while a trainer commits steps must not call
// the image corrupt (a commit moves the slot it was reading; before, it did,
// about one run in ten), and export must not fail on "stale records". The
// trainer pauses between steps as a real one computes its next gradients:
// committing back to back, it left a loaded machine's verify no moment when
// the image held still, and every verify was refused as busy.
TEST_F(HostileTest, ReadersWhileATrainerRuns)
{
	auto d = ckpt::Device::open(path_);
	step(*d);
	std::atomic<bool> stop{false};
	std::thread trainer([&] {
		for (int i = 0; !stop; i++) {
			step(*d);
			if (i % 2)
				std::this_thread::sleep_for(std::chrono::milliseconds(20));
		}
	});
	int ok = 0, busy = 0;
	for (int i = 0; i < 60; i++) {
		try {
			const std::string v = verify();
			EXPECT_EQ(v, "ok");
			ok += v == "ok";
			ckpt::export_image_report(path_, (dir_ / "out.safetensors").string(), 0);
		} catch (const ckpt::Error &e) {
			// an image that never held still is refused, not called corrupt
			EXPECT_EQ(e.code(), CKPT_E_STATE) << e.what();
			EXPECT_NE(std::string(e.what()).find("a trainer is committing steps"), std::string::npos)
				<< e.what();
			busy++;
		}
	}
	stop = true;
	trainer.join();
	EXPECT_GT(ok, 0);
	d.reset();
	EXPECT_EQ(verify(), "ok");
}

// ---------------------------------------------------------------- one writer

TEST_F(HostileTest, SecondOpenInOneProcessIsRefused)
{
	auto d = ckpt::Device::open(path_);
	step(*d);
	const auto bytes = file_bytes();
	auto [code, msg] = refusal([&] { ckpt::Device::open(path_); });
	EXPECT_EQ(code, CKPT_E_STATE);
	EXPECT_NE(msg.find(path_ + " is in use: this process"), std::string::npos) << msg;
	EXPECT_EQ(file_bytes(), bytes);
	step(*d);	// the first keeps working
	d.reset();
	ckpt::Device::open(path_);	// closed: free again
}

// Another process holds the image: refused, told who; the holder goes on.
TEST_F(HostileTest, SecondProcessIsRefused)
{
	int go[2], ready[2];
	ASSERT_EQ(pipe(go), 0);
	ASSERT_EQ(pipe(ready), 0);
	const pid_t pid = fork();
	if (pid == 0) {
		int rc = 1;
		try {
			auto d = ckpt::Device::open(path_);
			(void)!write(ready[1], "r", 1);
			char c;
			(void)!read(go[0], &c, 1);
			step(*d);	// still working after the refusal
			rc = d->status().committed_step == 1 ? 0 : 2;
		} catch (...) {
		}
		_exit(rc);
	}
	char c = 0;
	ASSERT_EQ(read(ready[0], &c, 1), 1);
	const auto bytes = file_bytes();
	auto [code, msg] = refusal([&] { ckpt::Device::open(path_); });
	EXPECT_EQ(code, CKPT_E_STATE);
	EXPECT_NE(msg.find(fmt::format("in use: process {} (", pid)), std::string::npos) << msg;
	EXPECT_NE(msg.find("one writer at a time"), std::string::npos) << msg;
	EXPECT_EQ(file_bytes(), bytes);
	ASSERT_EQ(write(go[1], "g", 1), 1);
	int status;
	ASSERT_EQ(waitpid(pid, &status, 0), pid);
	EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
	auto d = ckpt::Device::open(path_);
	EXPECT_EQ(d->status().committed_step, 1u);
}

// A child forked from the opener (through the C ABI, as Python's
// multiprocessing or a data loader's workers would): its own open is refused,
// the device it inherited is refused instead of hanging on threads it does
// not have, closing it there tears nothing down, and it does not keep the
// image locked once the parent has closed it.
TEST_F(HostileTest, ForkedChildIsRefused)
{
	ckpt_device *d = nullptr;
	ASSERT_EQ(ckpt_open(path_.c_str(), &d), 0) << ckpt_last_error();
	struct ckpt_device_status st0;
	ASSERT_EQ(ckpt_status(d, &st0), 0);
	const auto bytes = file_bytes();
	const pid_t parent = getpid();
	int go[2];
	ASSERT_EQ(pipe(go), 0);

	const pid_t pid = fork();
	if (pid == 0) {
		auto child = [&]() -> int {
			ckpt_device *d2 = nullptr;
			if (ckpt_open(path_.c_str(), &d2) != -CKPT_E_STATE ||
			    !strstr(ckpt_last_error(), fmt::format("in use: process {} (", parent).c_str()))
				return 1;
			struct ckpt_device_status st;
			const std::string forked = fmt::format("opened by process {}, which this process was "
							       "forked from", parent);
			if (ckpt_status(d, &st) != -CKPT_E_STATE || !strstr(ckpt_last_error(), forked.c_str()))
				return 2;
			if (ckpt_abort(d) != -CKPT_E_STATE)
				return 3;
			std::vector<uint16_t> g(5000, 0x3c00);
			if (ckpt_write_grad(d, "a", g.data(), g.size()) != -CKPT_E_STATE)
				return 4;
			ckpt_close(d);	// forgets it: nothing to join here
			if (ckpt_status(d, &st) != -CKPT_E_STATE)
				return 5;
			return 0;
		};
		const char rc = static_cast<char>('0' + child());
		(void)!write(go[1], &rc, 1);
		if (rc == '0')
			sleep(30);	// alive while the parent closes and reopens
		_exit(0);
	}
	// a child stuck in the inherited device never answers
	struct timeval tv = {30, 0};
	fd_set fds;
	FD_ZERO(&fds);
	FD_SET(go[0], &fds);
	char c = 0;
	const bool answered = select(go[0] + 1, &fds, nullptr, nullptr, &tv) == 1 &&
			      read(go[0], &c, 1) == 1;
	EXPECT_TRUE(answered) << "the child hung in the device it inherited";
	EXPECT_EQ(c, '0') << "the child's check that failed";
	EXPECT_EQ(file_bytes(), bytes);
	struct ckpt_device_status st;
	EXPECT_EQ(ckpt_status(d, &st), 0) << ckpt_last_error();
	EXPECT_EQ(st.committed_step, st0.committed_step);
	ckpt_close(d);
	// the child is still alive: it must not hold the lock
	const int rc = ckpt_open(path_.c_str(), &d);
	EXPECT_EQ(rc, 0) << ckpt_last_error();
	if (!rc)
		ckpt_close(d);
	kill(pid, SIGKILL);
	waitpid(pid, nullptr, 0);
}

} // namespace
