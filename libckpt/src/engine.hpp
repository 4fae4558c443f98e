// SPDX-License-Identifier: MIT
// The userspace engine: the dm-ckpt target's semantics over a file or block
// device, for machines without the kernel module. It serves the same virtual
// device (control block, GRAD window, PARAM window) as the kernel target, so a
// client cannot tell them apart, and writes byte-identical backing images.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "error.hpp"
#include "image.hpp"

extern "C" {
#include "ckpt_step.h"
}

namespace ckpt {

// What both the userspace engine and a dm-ckpt block device offer: reads and
// writes at byte offsets of the virtual device.
class Target {
public:
	virtual ~Target() = default;
	virtual void write(uint64_t off, const void *buf, uint64_t len) = 0;
	virtual void read(uint64_t off, void *buf, uint64_t len) = 0;
	// Several reads at once (offsets of the virtual device), as one batch
	// where the target can (the read-back of a step's params).
	virtual void read_many(std::span<const ReadPiece> pieces)
	{
		for (const ReadPiece &p : pieces)
			read(p.off, p.dst, p.len);
	}
	// Writes must be multiples of it: 512 B, or 4 KiB on a 4Kn device.
	virtual uint32_t block_size() const { return CKPT_SECTOR; }
	// In a child forked from the process that opened it: closes this
	// process's copy of the device's file descriptor, so that the writer's
	// lock (or the O_EXCL claim) goes with the opener, and touches nothing
	// else (threads, rings and mutexes are the opener's). The target is
	// then unusable here and must not be destroyed here either.
	virtual void forsake() noexcept {}
};

struct EngineOptions {
	unsigned workers = 0;			// 0: one per CPU, at most 4
	unsigned depth = 3;			// chunks in flight per worker
	unsigned queue_chunks = 0;		// gradient chunks queued for the workers; 0: 4 per slot
	uint64_t staging_bytes = CKPT_STAGING_DEFAULT;	// partial-chunk gradients
	IoObserver *observer = nullptr;		// sees every backing write and flush (tests/crash)
	Ring::Mode io = Ring::Mode::Auto;	// Sync: pread/pwrite even where io_uring works (tests)
	// Keep each chunk's params as last written (2 B/param of memory) and
	// serve reads of the PARAM window from them while the backing device
	// holds the same bytes: a trainer's read-back after every step then
	// costs no device reads.
	bool param_cache = false;
	// A backing file on tmpfs is mapped, and its I/O is the workers'
	// copies (BackingFile::map); false: io_uring as for any file (tests).
	bool map = true;
};

// fp32 p, exp_avg, exp_avg_sq of n params at a param offset, for load_state;
// m and v may be null (zero moments).
struct StateSpan {
	uint64_t offset;
	uint64_t n;
	const float *p;
	const float *m;
	const float *v;
	uint64_t count = ~0ULL;	// its step count (COUNTS); ~0: the loaded step
	uint64_t extent = 0;	// the params whose blocks get count: the tensor's extent
				// (the padding it owns lags with it); 0: n
};

// The one check of a state loaded from outside (Device::load_state, import),
// before anything is written: values the update could have produced (p and m
// finite, v finite and not negative) and a step count of its own, not above
// step, that differs from step only where the image keeps per-block counts
// (counts: feature COUNTS). what names the tensor in the messages.
void check_state_span(const StateSpan &s, uint64_t step, bool counts, const std::string &what);

class Engine : public Target {
public:
	static std::unique_ptr<Engine> open(const std::string &path, const EngineOptions &opts = {});
	~Engine() override;

	void write(uint64_t off, const void *buf, uint64_t len) override;
	void read(uint64_t off, void *buf, uint64_t len) override;
	void read_many(std::span<const ReadPiece> pieces) override;
	void forsake() noexcept override { img_.file.forsake(); }

	// Beyond the virtual device: what only the backing device knows.
	const struct ckpt_sb &superblock() const { return img_.sb; }
	const struct ckpt_regions &regions() const { return img_.sb.regions; }
	const Manifest &manifest() const { return img_.manifest; }
	const Image &image() const { return img_; }
	struct ckpt_status status();
	// State from outside (initial masters, an imported checkpoint): fp32
	// p, m, v of the spans; params outside them keep theirs. Only before
	// the first step. Commits like a step does (every chunk to the other
	// slot, flush, then a superblock with committed_step = step and the
	// trainer blob), so a crash keeps either the old or the new state.
	void load_state(const std::vector<StateSpan> &spans, uint64_t step, std::span<const uint8_t> blob);
	// Makes the previous step the committed one again: the ROLLBACK command
	// (step: the committed step it goes back from, 0 whichever), which a
	// client may also write to the control block. The core's rule
	// (ckpt_step_rollback): only with no step open, once (never two steps
	// back), and only while the other slot still holds that step intact.
	// Returns the step now committed.
	uint64_t rollback(uint64_t step = 0);
	// fp32 p, m, v of n params at param offset, checksums verified.
	void read_state(uint64_t offset, uint64_t n, float *p, float *m, float *v);

private:
	// A chunk for the workers: its update (grad, an index into grads_) or,
	// for load_state, its loaded state (load).
	struct Job {
		uint32_t chunk;
		uint32_t grad;				// kNoGrad for load_state
		const std::vector<StateSpan> *load;
	};
	static constexpr uint32_t kNoGrad = ~0u;
	class Worker;

	explicit Engine(const EngineOptions &opts);
	void start(const std::string &path);
	void enqueue(uint32_t chunk, const void *grad);
	void drain();
	void report_error();
	void worker_main(Worker &w);
	void job_failed(const Error &e, int io_errno);
	void job_done(const Job &job);

	void control_write(const void *buf, uint64_t len);
	void command_done(int ret);
	std::string rollback_refusal(int code) const;
	void grad_write(uint64_t off, const uint8_t *buf, uint64_t len);
	static const struct ckpt_step_ops ops_;
	static const struct ckpt_update_ops update_ops_;

	EngineOptions opts_;
	Image img_;
	struct ckpt_step step_ {};		// the protocol; step_.sm under mu_
	std::vector<uint64_t> claimed_, applied_;
	std::vector<uint64_t> sumsq_;		// per chunk: its gradients' sum of squares
	std::unique_ptr<struct ckpt_cmd> cmd_;
	std::unique_ptr<struct ckpt_sb> spare_;
	std::vector<struct ckpt_stage_buf> stages_;
	std::vector<Buffer> stage_grad_;
	std::vector<uint64_t> stage_cover_;
	std::vector<uint32_t> stage_of_;	// chunk -> stage index or CKPT_STAGE_FREE
	std::vector<uint8_t> modes_;		// COUNTS: what the open step does per block
	Buffer block_;				// superblock/status/bounce
	Buffer bounce_;				// PARAM reads' unaligned ends, read_state
	std::unique_ptr<Ring> read_ring_;	// PARAM reads, batched (under call_mu_)
	// param_cache: each chunk's params as last written, and the slot they
	// were written to (kUncached while a write is under way or failed). A
	// read whose slot (ckpt_sm_read_slot) is that slot gets these bytes:
	// only the workers write a slot's params, and they update both.
	static constexpr uint8_t kUncached = 0xff;
	Buffer plo_cache_;
	std::vector<uint8_t> plo_cache_slot_;
	std::vector<ReadPiece> param_pieces_;	// a read's pieces in the backing file
	uint64_t param_bytes_ = 0;
	uint64_t load_step_ = 0;		// the step load_state commits
	std::string io_message_;		// why the core's last read, write, flush or superblock write failed

	std::mutex call_mu_;			// one virtual-device call at a time
	// The queue of dispatched chunks and step_.sm from workers. A gradient
	// write copies each complete chunk into a free buffer of grads_ (waiting
	// for one while all are queued) and returns: the workers update behind
	// it, across tensor boundaries, and every read or command of the virtual
	// device waits for them first (drain), so what a client sees is what a
	// client of the kernel target sees, whose bios end after their update.
	std::mutex mu_;
	std::condition_variable work_cv_, done_cv_, free_cv_;
	std::deque<Job> queue_;
	unsigned busy_ = 0;			// jobs taken by workers, not yet done
	std::vector<Buffer> grads_;
	std::vector<uint32_t> free_grads_;
	bool stopping_ = false;
	// The first failure of an update, until a write or command reports it.
	int error_ = 0;
	std::string error_message_;
	friend struct EngineOps;
	std::vector<std::unique_ptr<Worker>> workers_;
	std::vector<std::thread> threads_;
};

} // namespace ckpt
