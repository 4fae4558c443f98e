// SPDX-License-Identifier: MIT
#include "engine.hpp"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <new>
#include <utility>

#include <cfenv>

#include "error.hpp"
#include "verify.hpp"

extern "C" {
#include "ckpt_update.h"
}

namespace ckpt {

namespace {

uint64_t align_down(uint64_t v, uint64_t a) { return v / a * a; }
uint64_t align_up(uint64_t v, uint64_t a) { return (v + a - 1) / a * a; }

// A load of state into one chunk's record data (fp32 p, m, v; a span
// without m or v loads zeros). With Q8 the moments of the quantization
// blocks a span touches are decoded into tmp, overwritten and encoded again;
// tensors start at multiples of CKPT_TENSOR_ALIGN, so no two spans share a
// block, and blocks no span touches keep their bytes. With BF16M the masters
// are rounded to bf16 stochastically, with the noise of the load's step.
void load_spans(const std::vector<StateSpan> &spans, uint32_t chunk, uint32_t shift, uint32_t incompat,
		uint64_t seed, uint64_t step, uint8_t *data, std::vector<uint32_t> &tmp)
{
	const uint64_t cp = 1ull << shift;
	const bool q8 = incompat & CKPT_FEATURE_INCOMPAT_Q8;
	const bool bm = incompat & CKPT_FEATURE_INCOMPAT_BF16M;
	auto *p = reinterpret_cast<uint32_t *>(data);
	for (const StateSpan &span : spans) {
		const uint64_t lo = std::max(span.offset, chunk * cp);
		const uint64_t hi = std::min(span.offset + span.n, (chunk + 1) * cp);
		if (lo >= hi)
			continue;
		const uint64_t in = lo - chunk * cp, from = lo - span.offset;
		uint32_t *m = p + cp + in, *v = p + 2 * cp + in;
		struct ckpt_q8_state q;
		uint64_t qlo = 0, qn = 0;
		if (q8) {
			qlo = align_down(in, CKPT_Q8_BLOCK);
			qn = align_up(hi - chunk * cp, CKPT_Q8_BLOCK) - qlo;
			tmp.resize(2 * qn + (hi - lo));
			ckpt_q8_state_at(data, shift, incompat, qlo, &q);
			ckpt_q8_decode(&q, tmp.data(), tmp.data() + qn, qn);
			m = tmp.data() + (in - qlo);
			v = tmp.data() + qn + (in - qlo);
		}
		const float *src_of[3] = {span.p, span.m, span.v};
		uint32_t *to_of[3] = {bm ? tmp.data() + 2 * qn : p + in, m, v};
		for (int k = 0; k < 3; k++) {
			if (src_of[k])
				std::memcpy(to_of[k], src_of[k] + from, (hi - lo) * 4);
			else
				std::memset(to_of[k], 0, (hi - lo) * 4);
		}
		if (bm) {
			struct ckpt_sr sr;
			ckpt_sr_at(seed, step, lo, &sr);
			ckpt_sr_round(&sr, to_of[0], reinterpret_cast<uint16_t *>(data) + in, hi - lo);
		}
		if (q8)
			ckpt_q8_encode(&q, tmp.data(), tmp.data() + qn, qn);
	}
}

// The p_lo of a chunk's masters in a record's data: with BF16M the bf16
// masters themselves, else the fp32 ones rounded to nearest even.
void plo_of_masters(const struct ckpt_sb &sb, const uint8_t *data, uint16_t *plo, uint64_t n)
{
	if (sb.feature_incompat & CKPT_FEATURE_INCOMPAT_BF16M)
		std::memcpy(plo, data, n * 2);
	else
		ckpt_round_params(sb.geo.dtype, reinterpret_cast<const uint32_t *>(data), plo, n);
}

// A load of state into a chunk (load_state: initial masters, an import): the
// spans' values and counts into its checked record rec, its p_lo, sealed for
// the load's step (job.dst).
void load_chunk(const struct ckpt_sb &sb, const std::vector<StateSpan> &spans,
		const struct ckpt_update_job &job, uint8_t *rec, uint16_t *plo, std::vector<uint32_t> &scratch)
{
	const uint64_t cp = sb.regions.chunk_params;
	const uint32_t chunk = job.chunk;
	const uint64_t step = job.dst.step;
	load_spans(spans, chunk, sb.geo.chunk_shift, sb.feature_incompat, ckpt_sr_seed(sb.uuid), step,
		   rec + CKPT_BLOCK, scratch);
	plo_of_masters(sb, rec + CKPT_BLOCK, plo, cp);
	if (sb.feature_incompat & CKPT_FEATURE_INCOMPAT_COUNTS) {
		ckpt_rec_set_counts(rec, sb.geo.chunk_shift, step);
		// a tensor that lags the step keeps its own count in each block it owns
		for (const StateSpan &span : spans) {
			const uint64_t lo = std::max(span.offset, chunk * cp);
			const uint64_t hi = std::min(span.offset + std::max(span.n, span.extent), (chunk + 1) * cp);
			if (span.count == ~0ULL || lo >= hi)
				continue;
			for (uint64_t b = (lo - chunk * cp) >> CKPT_BLOCK_SHIFT;
			     b <= (hi - 1 - chunk * cp) >> CKPT_BLOCK_SHIFT; b++)
				ckpt_rec_set_count(rec, static_cast<uint32_t>(b), span.count);
		}
	}
	ckpt_rec_seal(rec, reinterpret_cast<uint32_t *>(rec + CKPT_BLOCK), plo, &job.dst, sb.feature_incompat);
}

} // namespace

// One worker thread's pipeline: its own ring and `depth` chunk buffers, so the
// read of the next chunk's state runs while this one computes, and its writes
// drain behind.
class Engine::Worker {
public:
	struct Slot {
		Buffer rec;
		Buffer plo;
		Job job{};
		struct ckpt_update_job upd{};	// what the core's update of it is for
		enum ckpt_update_result result{};
		bool busy = false;
		int writes = 0;
	};

	Worker(const struct ckpt_regions &l, unsigned depth, Ring::Mode io) : ring(depth * 2 + 2, io)
	{
		slots.resize(depth);
		taken.resize(depth);
		for (Slot &s : slots) {
			s.rec = Buffer(l.record_bytes);
			s.plo = Buffer(l.plo_chunk_bytes);
		}
	}

	Ring ring;
	std::vector<Slot> slots;
	std::vector<unsigned> taken;	// the slots whose reads are to be issued
	// Q8: the update's scratch, and a load's decoded moments
	std::vector<uint32_t> q8 = std::vector<uint32_t>(CKPT_Q8_TMP_WORDS);
	std::vector<uint32_t> load;
};

Engine::Engine(const EngineOptions &opts) : opts_(opts) {}

std::unique_ptr<Engine> Engine::open(const std::string &path, const EngineOptions &opts)
{
	std::unique_ptr<Engine> e(new Engine(opts));
	e->start(path);
	return e;
}

void Engine::start(const std::string &path)
{
	img_ = Image::open(path, true);
	img_.file.observer = opts_.observer;
	if (opts_.map)
		img_.file.map();
	block_ = Buffer(CKPT_BLOCK);
	const struct ckpt_regions &l = img_.sb.regions;

	const uint32_t n_chunks = img_.sb.geo.n_chunks;
	claimed_.assign(ckpt_bitmap_words(n_chunks), 0);
	applied_.assign(ckpt_bitmap_words(n_chunks), 0);
	sumsq_.assign(n_chunks, 0);
	cmd_ = std::make_unique<struct ckpt_cmd>();
	spare_ = std::make_unique<struct ckpt_sb>();

	// The memory the core's step protocol runs in: it tells the sizes.
	const uint32_t n_stages = ckpt_stage_count(opts_.staging_bytes, l.plo_chunk_bytes, n_chunks);
	const uint64_t cover_words = ckpt_bitmap_words(l.plo_chunk_bytes / CKPT_SECTOR);
	stages_.assign(n_stages, {});
	stage_grad_.resize(n_stages);
	stage_cover_.assign(n_stages * cover_words, 0);
	for (uint32_t i = 0; i < n_stages; i++) {
		stage_grad_[i] = Buffer(l.plo_chunk_bytes);
		stages_[i].grad = stage_grad_[i].as();
		stages_[i].cover = stage_cover_.data() + i * cover_words;
	}
	stage_of_.assign(n_chunks, CKPT_STAGE_FREE);
	if (img_.sb.feature_incompat & CKPT_FEATURE_INCOMPAT_COUNTS)
		modes_.assign(ckpt_step_blocks(&l), 0);
	const struct ckpt_step_mem mem = {
		.claimed = claimed_.data(), .applied = applied_.data(),
		.modes = modes_.empty() ? nullptr : modes_.data(), .stages = stages_.data(),
		.n_stages = n_stages, .stage_of = stage_of_.data(), .spare = spare_.get(),
		.block = block_.as(), .cmd = cmd_.get(), .sumsq = sumsq_.data(),
	};
	ckpt_step_init(&step_, &ops_, this, &img_.sb, &mem);
	bounce_ = Buffer(std::max<uint64_t>(l.record_bytes, l.plo_chunk_bytes + CKPT_BLOCK));
	read_ring_ = std::make_unique<Ring>(32, opts_.io);
	if (opts_.param_cache) {
		plo_cache_ = Buffer(static_cast<size_t>(n_chunks) * l.plo_chunk_bytes);
		plo_cache_slot_.assign(n_chunks, kUncached);
	}

	unsigned n = opts_.workers ? opts_.workers
				   : std::clamp(std::thread::hardware_concurrency(), 1u, 4u);
	const unsigned depth = std::max(1u, opts_.depth);
	const unsigned queued = opts_.queue_chunks ? opts_.queue_chunks : 4 * n * depth;
	for (unsigned i = 0; i < queued; i++) {
		grads_.emplace_back(l.plo_chunk_bytes);
		free_grads_.push_back(i);
	}
	for (unsigned i = 0; i < n; i++)
		workers_.push_back(std::make_unique<Worker>(l, depth, opts_.io));
	for (unsigned i = 0; i < n; i++)
		threads_.emplace_back([this, i] { worker_main(*workers_[i]); });
}

Engine::~Engine()
{
	drain();
	{
		std::lock_guard lk(mu_);
		stopping_ = true;
	}
	work_cv_.notify_all();
	for (std::thread &t : threads_)
		t.join();
}

// ---------------------------------------------------------------- virtual device

// A refused write changes nothing but the status page, which tells why: the
// same answer the kernel target gives a client that sees only -EIO. The core
// routes (ckpt_step_route) and records the refusal; the engine words it.
void Engine::write(uint64_t off, const void *buf, uint64_t len)
{
	std::lock_guard call(call_mu_);
	report_error();
	struct ckpt_route r;
	const int ret = ckpt_step_route(&step_, off, len, CKPT_ROUTE_WRITE, &r);
	if (ret) {
		const struct ckpt_regions &l = img_.sb.regions;
		switch (-ret) {
		case CKPT_E_ALIGN:
			fail(-ret, "write of {} bytes at {}: not {}-byte aligned", len, off, CKPT_SECTOR);
		case CKPT_E_READONLY:
			fail(-ret, "the {} window is read-only (write at {})",
			     r.window == CKPT_WIN_IMAGE ? "IMAGE" : "PARAM", off);
		}
		if (r.window == CKPT_WIN_CTRL)
			fail(-ret, "a command is one write at offset 0 of at most {} bytes", CKPT_BLOCK);
		if (r.window == CKPT_WIN_GRAD)
			fail(-ret, "gradient write of {} bytes at {} runs into the PARAM window", len, off);
		fail(-ret, "write of {} bytes at {}: beyond the device ({} bytes)", len, off, l.virt_bytes);
	}
	if (r.window == CKPT_WIN_CTRL)
		control_write(buf, len);
	else if (r.window == CKPT_WIN_GRAD)
		grad_write(r.off, static_cast<const uint8_t *>(buf), len);
}

// A read goes window by window, and chunk by chunk in the PARAM window, as
// the core cuts it (the kernel target's dm_accept_partial_bio). The PARAM
// pieces of every read of the call, each from the slot with its chunk's
// latest values, are read together: one batch on the read ring, straight
// into the caller's memory where it is aligned (or the file buffered).
void Engine::read(uint64_t off, void *buf, uint64_t len)
{
	const ReadPiece piece{off, buf, len};
	read_many({&piece, 1});
}

void Engine::read_many(std::span<const ReadPiece> pieces)
{
	std::lock_guard call(call_mu_);
	drain();
	const struct ckpt_regions &l = img_.sb.regions;
	param_pieces_.clear();
	uint64_t param_bytes = 0;
	for (const ReadPiece &p : pieces) {
		auto *out = static_cast<uint8_t *>(p.dst);
		for (uint64_t off = p.off, len = p.len; len;) {
			struct ckpt_route r;
			if (ckpt_step_route(&step_, off, len, 0, &r))
				fail(CKPT_E_RANGE, "read of {} bytes at {}: beyond the device ({} bytes)", len, off,
				     l.virt_bytes);
			if (r.window == CKPT_WIN_CTRL) {
				struct ckpt_status st;
				{
					std::lock_guard lk(mu_);
					ckpt_sm_status(&step_.sm, &img_.sb, &st);
					st.grad_bytes = step_.grad_bytes;
				}
				st.param_bytes = param_bytes_;
				ckpt_status_encode(&st, block_.as());
				std::memcpy(out, block_.as() + r.off, r.len);
			} else if (r.window == CKPT_WIN_GRAD) {
				std::memset(out, 0, r.len);
			} else if (r.window == CKPT_WIN_IMAGE) {	// the backing image's bytes
				param_pieces_.push_back({r.off, out, r.len});
			} else {
				uint32_t slot;
				{
					std::lock_guard lk(mu_);
					slot = ckpt_sm_read_slot(&step_.sm, r.chunk);
				}
				if (!plo_cache_slot_.empty() && plo_cache_slot_[r.chunk] == slot)
					std::memcpy(out, plo_cache_.as() + r.chunk * l.plo_chunk_bytes + r.in, r.len);
				else
					param_pieces_.push_back({ckpt_plo_offset(&l, slot, r.chunk) + r.in, out,
								 r.len});
				param_bytes += r.len;
			}
			out += r.len;
			off += r.len;
			len -= r.len;
		}
	}
	read_pieces(img_.file, *read_ring_, 16, param_pieces_, bounce_);
	param_bytes_ += param_bytes;
}

struct ckpt_status Engine::status()
{
	struct ckpt_status st;
	uint8_t page[CKPT_BLOCK];
	read(0, page, sizeof(page));
	check_core(ckpt_status_decode(page, &st), "status page");
	return st;
}

// ---------------------------------------------------------------- commands

// The host side of the core's step protocol (ckpt_step.h): the sm lock is
// mu_, the command lock call_mu_ (held by every caller of ckpt_step_*). The
// ops never throw through the C core: they return errors, and keep the
// message for the throw that follows.
struct EngineOps {
	struct Src {
		const uint8_t *p;
	};

	static Engine &of(void *host) { return *static_cast<Engine *>(host); }
	static void lock(void *host) { of(host).mu_.lock(); }
	static void unlock(void *host) { of(host).mu_.unlock(); }
	static int flush(void *host)
	{
		Engine &e = of(host);
		return e.img_.file.commit_flush(e.io_message_);
	}
	static int write_sb(void *host, const void *block, uint64_t off)
	{
		Engine &e = of(host);
		return e.img_.file.commit_write_sb(block, off, e.io_message_);
	}
	static int read(void *host, void *buf, uint64_t off, uint64_t len)
	{
		Engine &e = of(host);
		return e.img_.file.commit_read(buf, off, len, e.io_message_);
	}
	static int write(void *host, const void *buf, uint64_t off, uint64_t len)
	{
		Engine &e = of(host);
		return e.img_.file.commit_write(buf, off, len, e.io_message_);
	}
	// page aligned: the backing file may be open with O_DIRECT
	static void *alloc(void *, uint64_t bytes) { return std::aligned_alloc(4096, (bytes + 4095) & ~uint64_t{4095}); }
	static void free(void *, void *p) { std::free(p); }
	static void copy(void *, void *src, void *dst, uint64_t n)
	{
		auto *s = static_cast<Src *>(src);
		std::memcpy(dst, s->p, n);
		s->p += n;
	}
	static int dispatch(void *host, void *src, uint32_t chunk, const void *grad)
	{
		Engine &e = of(host);
		auto *s = static_cast<Src *>(src);
		if (!grad) {
			grad = s->p;
			s->p += e.step_.chunk_bytes;
		}
		e.enqueue(chunk, grad);
		return 0;
	}
	static void drain(void *host) { of(host).drain(); }
};

const struct ckpt_step_ops Engine::ops_ = {
	.lock = EngineOps::lock,
	.unlock = EngineOps::unlock,
	.drain = EngineOps::drain,
	.flush = EngineOps::flush,
	.write_sb = EngineOps::write_sb,
	.copy = EngineOps::copy,
	.dispatch = EngineOps::dispatch,
	.dispatched = nullptr,	// dispatch copied the gradients: nothing to wait for
	.quiesce = nullptr,	// reads hold call_mu_: none is in flight during a command
	.failed = nullptr,	// control_write throws the io message instead
	.read = EngineOps::read,
	.write = EngineOps::write,
	.alloc = EngineOps::alloc,
	.free = EngineOps::free,
	.fpu_begin = nullptr,	// userspace: the FPU is always usable
	.fpu_end = nullptr,
};

// ---------------------------------------------------------------- commands

void Engine::control_write(const void *buf, uint64_t len)
{
	io_message_.clear();
	command_done(ckpt_step_command(&step_, buf, static_cast<uint32_t>(len)));
}

// What a command through the core (ckpt_step_command, ckpt_step_exec) answered.
void Engine::command_done(int ret)
{
	report_error();		// an update failed: the cause, before what the command says
	if (ret < 0 && step_.rollback.part != CKPT_ROLLBACK_OK)
		throw Error(-ret, rollback_refusal(-ret));
	if (ret == -CKPT_E_IO)
		throw Error(CKPT_E_IO, io_message_.empty() ? "committing the step failed" : io_message_);
	check_core(ret, "command rejected");
}

// ---------------------------------------------------------------- gradients

void Engine::grad_write(uint64_t off, const uint8_t *buf, uint64_t len)
{
	EngineOps::Src src{buf};
	const int ret = ckpt_step_grad_write(&step_, off, len, &src);
	if (!ret)
		return;
	report_error();
	const int code = -ret;
	switch (code) {
	case CKPT_E_FAILED:
		fail(code, "the device failed earlier (first error: {}); no new steps",
		     strerror(static_cast<int>(step_.sm.first_io_error)));
	case CKPT_E_STATE:
		fail(code, "gradient write with no open step");
	case CKPT_E_TWICE:
		fail(code, "gradient write of {} bytes at {}: written twice in step {}", len, off,
		     step_.sm.open_step);
	case CKPT_E_NOSPC:
		fail(code, "gradient write of {} bytes at {}: staging for partial chunks is full ({} chunks)",
		     len, off, step_.mem.n_stages);
	default:
		fail(code, "gradient write of {} bytes at {} refused: {}", len, off, ckpt_strerror(code));
	}
}

// ---------------------------------------------------------------- workers

// A chunk for the workers. Its gradients are copied (the core releases a
// completed stage, and the caller its buffer, once the write returns): into
// a free buffer of the queue, waiting for one while every one is queued.
void Engine::enqueue(uint32_t chunk, const void *grad)
{
	std::unique_lock lk(mu_);
	uint32_t g = kNoGrad;
	if (grad) {
		free_cv_.wait(lk, [this] { return !free_grads_.empty(); });
		g = free_grads_.back();
		free_grads_.pop_back();
		lk.unlock();
		std::memcpy(grads_[g].as(), grad, step_.chunk_bytes);
		lk.lock();
	}
	queue_.push_back({chunk, g, nullptr});
	lk.unlock();
	work_cv_.notify_one();
}

// Until every queued chunk is done (ckpt_step_ops drain; reads; load_state).
void Engine::drain()
{
	std::unique_lock lk(mu_);
	done_cv_.wait(lk, [this] { return queue_.empty() && !busy_; });
}

// The first failure of an update, reported by the next write or command
// (a COMMIT drains first, so its step's failures are all known by then);
// the machine has failed, so every later one is refused as failed.
void Engine::report_error()
{
	std::unique_lock lk(mu_);
	if (!error_)
		return;
	const int code = std::exchange(error_, 0);
	std::string message = std::move(error_message_);
	lk.unlock();
	throw Error(code, message);
}

// io_errno: the errno of the failed I/O (the io_uring result), EIO for a
// corrupt record; the status page reports the first one. The queue is
// dropped: the machine has failed and no step can commit.
void Engine::job_failed(const Error &e, int io_errno)
{
	std::lock_guard lk(mu_);
	if (!error_ && !step_.sm.first_io_error) {
		error_ = e.code();
		error_message_ = e.what();
	}
	ckpt_sm_fail(&step_.sm, io_errno);
	for (const Job &j : queue_)
		if (j.grad != kNoGrad)
			free_grads_.push_back(j.grad);
	queue_.clear();
	free_cv_.notify_all();
}

// Caller holds mu_.
void Engine::job_done(const Job &job)
{
	if (job.grad != kNoGrad) {
		free_grads_.push_back(job.grad);
		free_cv_.notify_one();
	}
	if (--busy_ == 0 && queue_.empty())
		done_cv_.notify_all();
}

// The engine's builds of the update for the core's chunk sequence
// (ckpt_step_update): ckpt_update_chunk* run this CPU's row of the core's
// table (ckpt_update_pick, the kernel's rule too); no FPU brackets, no slices.
const struct ckpt_update_ops Engine::update_ops_ = {
	.update = ckpt_update_chunk,
	.update_q8 = ckpt_update_chunk_q8,
	.update_q8bf = ckpt_update_chunk_q8bf,
	.fpu_begin = nullptr,
	.fpu_end = nullptr,
	.slice = 0,
};

// The core runs the update of a chunk (ckpt_step_update); a worker only
// reads and writes records around it, on its ring, several chunks in flight.
void Engine::worker_main(Worker &w)
{
	const struct ckpt_regions &l = img_.sb.regions;
	const BackingFile &file = img_.file;
	unsigned inflight = 0, reading = 0;	// I/Os in flight; of them, reads

	// The update must give the kernel's bits: round to nearest, no flush of
	// denormals, whatever floating-point mode the creating thread had
	// (glibc's default environment: MXCSR 0x1f80 on x86-64, FPCR 0 on aarch64).
	std::fesetenv(FE_DFL_ENV);
	// A slot's chunk is done: the core told (a step's update; a load has
	// nothing to tell), the slot free, the job counted.
	auto finish = [&](Worker::Slot &s, std::optional<enum ckpt_update_result> result) {
		std::lock_guard lk(mu_);
		if (result)
			ckpt_step_update_done(&step_, &s.upd, *result);
		s.busy = false;
		job_done(s.job);
	};
	for (;;) {
		// Take queued chunks into the free slots; sleep only when idle.
		// Their reads are issued after, unlocked. A mapped file's I/O is
		// copies done at once: one chunk at a time then, read, updated
		// and written while its record is in this core's cache.
		unsigned taken = 0;
		const size_t takes = !file.mapped() ? w.slots.size() : reading ? 0 : 1;
		{
			std::unique_lock lk(mu_);
			if (!inflight)
				work_cv_.wait(lk, [&] { return stopping_ || !queue_.empty(); });
			if (stopping_ && !inflight)
				return;
			for (size_t i = 0; i < w.slots.size() && taken < takes && !queue_.empty(); i++) {
				Worker::Slot &s = w.slots[i];
				if (s.busy)
					continue;
				s.job = queue_.front();
				queue_.pop_front();
				s.busy = true;
				s.writes = 0;
				busy_++;
				const uint32_t c = s.job.chunk;
				ckpt_step_job(&step_, c, img_.group_table[c],
					      s.job.load ? load_step_ : step_.sm.open_step, &s.upd);
				w.taken[taken++] = static_cast<unsigned>(i);
			}
		}
		int io_errno = EIO;
		try {
			for (unsigned k = 0; k < taken; k++, inflight++, reading++) {
				Worker::Slot &s = w.slots[w.taken[k]];
				w.ring.read(file, s.rec.as(), static_cast<unsigned>(l.record_bytes),
					    ckpt_record_offset(&l, s.upd.src.slot, s.job.chunk), w.taken[k]);
			}
			w.ring.submit();
			auto [tag, res] = w.ring.wait();
			inflight--;
			Worker::Slot &s = w.slots[tag];
			const uint32_t chunk = s.job.chunk;
			if (res < 0) {
				io_errno = -res;
				fail(CKPT_E_IO, "backing I/O on chunk {} failed: {}", chunk, strerror(-res));
			}
			if (s.writes) {		// a write completed
				if (--s.writes == 0) {
					if (IoObserver *o = img_.file.observer) {
						o->written(ckpt_record_offset(&l, s.upd.dst.slot, chunk), s.rec.as(),
							   l.record_bytes, false);
						o->written(ckpt_plo_offset(&l, s.upd.dst.slot, chunk), s.plo.as(),
							   l.plo_chunk_bytes, false);
					}
					// the chunk's cache entry was dropped when
					// its writes were queued (no reader meanwhile:
					// reads drain the workers first)
					if (!plo_cache_slot_.empty()) {
						std::memcpy(plo_cache_.as() + chunk * l.plo_chunk_bytes, s.plo.as(),
							    l.plo_chunk_bytes);
						plo_cache_slot_[chunk] = static_cast<uint8_t>(s.upd.dst.slot);
					}
					finish(s, s.job.load ? std::nullopt : std::optional(s.result));
				}
				continue;
			}
			reading--;
			if (static_cast<uint64_t>(res) != l.record_bytes)
				fail(CKPT_E_IO, "short read of chunk {} state", chunk);
			if (s.job.load) {
				img_.check_record(s.rec.as(), s.upd.src, true);
				load_chunk(img_.sb, *s.job.load, s.upd, s.rec.as(), s.plo.as<uint16_t>(), w.load);
				s.result = CKPT_UPDATE_WRITE;
			} else {
				s.result = ckpt_step_update(&step_, &update_ops_, this, &s.upd, s.rec.as(),
							    grads_[s.job.grad].as<uint16_t>(), s.plo.as<uint16_t>(),
							    w.q8.data());
				if (s.result == CKPT_UPDATE_DAMAGED)
					img_.fail_record(s.rec.as(), s.upd.src, s.upd.fault, s.upd.got);
			}
			if (s.result != CKPT_UPDATE_WRITE) {	// nothing to write
				finish(s, s.result);
				continue;
			}
			if (!plo_cache_slot_.empty())
				plo_cache_slot_[chunk] = kUncached;	// until both writes are done
			w.ring.write(file, s.rec.as(), static_cast<unsigned>(l.record_bytes),
				     ckpt_record_offset(&l, s.upd.dst.slot, chunk), tag);
			w.ring.write(file, s.plo.as(), static_cast<unsigned>(l.plo_chunk_bytes),
				     ckpt_plo_offset(&l, s.upd.dst.slot, chunk), tag);
			s.writes = 2;
			inflight += 2;
		} catch (const Error &e) {
			job_failed(e, io_errno);
			while (inflight) {			// never leave I/O on our buffers
				try {
					w.ring.wait();
				} catch (const Error &) {
				}
				inflight--;
			}
			reading = 0;
			std::lock_guard lk(mu_);
			for (Worker::Slot &s : w.slots) {
				if (!s.busy)
					continue;
				s.busy = false;
				s.writes = 0;
				job_done(s.job);
			}
		}
	}
}

// ---------------------------------------------------------------- reads

void Engine::read_state(uint64_t offset, uint64_t n, float *p, float *m, float *v)
{
	std::lock_guard call(call_mu_);
	drain();
	// The committed state, as the kernel target's client reads it from the
	// backing device, even while a step is open: an open step may yet be
	// aborted, so a checkpoint of its state would hold a step that never
	// existed. The open step writes the other slot; this one stays intact.
	const struct ckpt_sb &sb = img_.sb;
	if (offset >= sb.regions.n_params || n > sb.regions.n_params - offset)
		fail(CKPT_E_RANGE, "state read of {} params at {}: out of range", n, offset);
	for_each_piece(offset, n, sb.regions.chunk_params, [&](uint32_t c, uint64_t in, uint64_t k) {
		struct ckpt_rec id;
		ckpt_rec_committed(&sb, c, &id);
		img_.read_state(id, c * sb.regions.chunk_params + in, k, p, m, v, bounce_);
		p += k;
		m += k;
		v += k;
	});
}

// ---------------------------------------------------------------- load_state

void check_state_span(const StateSpan &s, uint64_t step, bool counts, const std::string &what)
{
	const struct {
		const float *x;
		const char *name;
	} parts[] = {{s.p, "param"}, {s.m, "exp_avg"}, {s.v, "exp_avg_sq"}};
	for (const auto &[x, name] : parts)
		for (uint64_t k = 0; x && k < s.n; k++)
			if (!std::isfinite(x[k]) || (x == s.v && x[k] < 0))
				fail(CKPT_E_HPARAM, "{} {} element {} is {}", what, name, k, x[k]);
	if (s.count == ~0ULL || s.count == step)
		return;
	if (s.count > step)
		fail(CKPT_E_STEP, "{} is at step {}, beyond the step {} the state is loaded as", what, s.count, step);
	if (!counts)
		fail(CKPT_E_FEATURE, "{} was updated in {} of the {} steps, and the image keeps no per-tensor step "
				     "counts (format it with chunks of at most 2^19 params)", what, s.count, step);
}

void Engine::load_state(const std::vector<StateSpan> &spans, uint64_t step, std::span<const uint8_t> blob)
{
	std::lock_guard call(call_mu_);
	switch (const int ret = ckpt_step_load_check(&step_, step, blob.size()); -ret) {
	case 0:
		break;
	case CKPT_E_FAILED:
		fail(-ret, "the device failed earlier; no changes accepted");
	case CKPT_E_STATE:
		if (step_.sm.state == CKPT_STATE_OPEN)
			fail(-ret, "loading state while step {} is open", step_.sm.open_step);
		fail(-ret, "state can be loaded only before the first step (committed step is {})",
		     step_.sm.committed_step);
	case CKPT_E_STEP:
		fail(-ret, "step {} is beyond the largest step a device can continue from ({})", step,
		     CKPT_STEP_MAX);
	case CKPT_E_BLOB:
		fail(-ret, "trainer blob of {} bytes, at most {}", blob.size(), CKPT_BLOB_MAX);
	default:
		fail(-ret, "loading state refused: {}", ckpt_strerror(-ret));
	}
	for (const StateSpan &s : spans)
		if (ckpt_step_load_span(&step_, s.offset, s.n) || !s.p)
			fail(CKPT_E_RANGE, "state load of {} params at {}: out of range", s.n, s.offset);

	// Every chunk goes to the other slot, loaded or copied, so the commit
	// below moves the whole state at once.
	report_error();
	load_step_ = step;
	{
		std::lock_guard lk(mu_);
		for (uint32_t c = 0; c < img_.sb.geo.n_chunks; c++)
			queue_.push_back({c, kNoGrad, &spans});
	}
	work_cv_.notify_all();
	drain();
	report_error();
	io_message_.clear();
	if (ckpt_step_load_commit(&step_, step, blob.data(), static_cast<uint32_t>(blob.size())) < 0)
		throw Error(CKPT_E_IO, io_message_.empty() ? "loading state: commit failed" : io_message_);
}

// ---------------------------------------------------------------- rollback

// The ROLLBACK command, as a client writes it to the control block.
uint64_t Engine::rollback(uint64_t step)
{
	std::lock_guard call(call_mu_);
	report_error();
	*cmd_ = {};
	cmd_->opcode = CKPT_OP_ROLLBACK;
	cmd_->step = step;
	io_message_.clear();
	command_done(ckpt_step_exec(&step_, cmd_.get(), nullptr));
	return img_.sb.committed_step;
}

// Why the core's rollback (ckpt_step_rollback) refused or failed with code,
// in words: what it found where (step_.rollback).
std::string Engine::rollback_refusal(int code) const
{
	const struct ckpt_rollback_fault &f = step_.rollback;
	const struct ckpt_sb &sb = img_.sb;
	const uint64_t prev = sb.committed_step - 1;
	const auto io = [&](std::string_view what) {
		return fmt::format("rollback: {}: {}", what,
				   io_message_.empty() ? std::string(strerror(-f.io_errno)) : io_message_);
	};
	switch (f.part) {
	case CKPT_ROLLBACK_MACHINE:
		switch (code) {
		case CKPT_E_FAILED:
			return "rollback: the device failed earlier; no changes accepted";
		case CKPT_E_STATE:
			return fmt::format("rollback: step {} is open; commit or abort it first", step_.sm.open_step);
		case CKPT_E_STEP:
			return fmt::format("rollback from step {}: the committed step is {}", step_.mem.cmd->step,
					   sb.committed_step);
		default:
			return "rollback: the committed step is 0: there is no previous step";
		}
	case CKPT_ROLLBACK_OLDER:
		if (code == CKPT_E_IO)
			return io(fmt::format("reading the older superblock copy ({})", f.older_index));
		if (f.older)
			return fmt::format("rollback: the older superblock copy ({}) is not valid ({}): step {} is "
					   "not readable",
					   f.older_index, ckpt_strerror(-f.older), prev);
		return fmt::format("rollback: the older superblock copy commits step {} (sequence {}), not step {} "
				   "(sequence {}): a rollback goes back one step, once",
				   f.older_step, f.older_sequence, prev, sb.sequence - 1);
	case CKPT_ROLLBACK_RECORD:
		if (code == CKPT_E_IO)
			return io(fmt::format("reading chunk {} of slot {}", f.chunk, f.slot));
		if (f.got_valid && f.got.step > sb.committed_step)
			return fmt::format("rollback: chunk {} of slot {} was overwritten by step {} (a step began "
					   "after step {} committed): step {} is gone",
					   f.chunk, f.slot, f.got.step, sb.committed_step, prev);
		return fmt::format("rollback: chunk {} of slot {} does not hold step {} intact ({})", f.chunk,
				   f.slot, prev, ckpt_rec_fault_str(f.rec));
	case CKPT_ROLLBACK_RESTAMP:
		return io(fmt::format("re-stamping chunk {} of slot {}", f.chunk, f.slot));
	case CKPT_ROLLBACK_COMMIT:
		return io("commit");
	case CKPT_ROLLBACK_NOMEM:
		return "rollback: out of memory";
	default:
		return fmt::format("rollback refused: {}", ckpt_strerror(code));
	}
}

} // namespace ckpt
