// SPDX-License-Identifier: MIT
#include "engine.hpp"

#include <algorithm>
#include <cerrno>
#include <cstring>

#include <xmmintrin.h>

#include "error.hpp"

extern "C" {
#include "ckpt_update.h"
}

namespace ckpt {

namespace {

uint64_t align_down(uint64_t v, uint64_t a) { return v / a * a; }
uint64_t align_up(uint64_t v, uint64_t a) { return (v + a - 1) / a * a; }

} // namespace

// One worker thread's pipeline: its own ring and `depth` chunk buffers, so the
// read of the next chunk's state runs while this one computes, and its writes
// drain behind.
class Engine::Worker {
public:
	struct Slot {
		Buffer rec;
		Buffer plo;
		const Job *job = nullptr;
		int writes = 0;
	};

	Worker(const struct ckpt_layout &l, unsigned depth) : ring(depth * 2 + 2)
	{
		slots.resize(depth);
		for (Slot &s : slots) {
			s.rec = Buffer(l.record_bytes);
			s.plo = Buffer(l.plo_chunk_bytes);
		}
	}

	Ring ring;
	std::vector<Slot> slots;
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
	block_ = Buffer(CKPT_BLOCK);
	const struct ckpt_layout &l = img_.sb.layout;

	claimed_.assign(ckpt_bitmap_words(img_.sb.geo.n_chunks), 0);
	applied_.assign(ckpt_bitmap_words(img_.sb.geo.n_chunks), 0);
	ckpt_sm_init(&sm_, &img_.sb, claimed_.data(), applied_.data());
	cmd_ = std::make_unique<struct ckpt_cmd>();

	size_t n_stages = std::clamp<uint64_t>(opts_.staging_bytes / l.plo_chunk_bytes, 2,
					       std::max(2u, img_.sb.geo.n_chunks));
	stages_.resize(n_stages);
	const uint32_t sectors = static_cast<uint32_t>(l.plo_chunk_bytes / CKPT_SECTOR);
	for (Stage &s : stages_) {
		s.grad = Buffer(l.plo_chunk_bytes);
		s.cover.assign(ckpt_bitmap_words(sectors), 0);
	}
	stage_of_.assign(img_.sb.geo.n_chunks, -1);
	bounce_ = Buffer(std::max<uint64_t>(l.record_bytes, l.plo_chunk_bytes + CKPT_BLOCK));
	batch_.jobs.reserve(img_.sb.geo.n_chunks);

	unsigned n = opts_.workers ? opts_.workers
				   : std::clamp(std::thread::hardware_concurrency(), 1u, 4u);
	for (unsigned i = 0; i < n; i++)
		workers_.push_back(std::make_unique<Worker>(l, std::max(1u, opts_.depth)));
	for (unsigned i = 0; i < n; i++)
		threads_.emplace_back([this, i] { worker_main(*workers_[i]); });
}

Engine::~Engine()
{
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
// same answer the kernel target gives a client that sees only -EIO.
void Engine::write(uint64_t off, const void *buf, uint64_t len)
{
	std::lock_guard call(call_mu_);
	try {
		dispatch_write(off, buf, len);
	} catch (const Error &e) {
		ckpt_sm_rejected(&sm_, e.code());
		throw;
	}
}

void Engine::dispatch_write(uint64_t off, const void *buf, uint64_t len)
{
	const struct ckpt_layout &l = img_.sb.layout;
	if (len == 0)
		return;
	if (off % CKPT_SECTOR || len % CKPT_SECTOR)
		fail(CKPT_E_ALIGN, "write of {} bytes at {}: not {}-byte aligned", len, off, CKPT_SECTOR);
	if (off >= l.virt_bytes || len > l.virt_bytes - off)
		fail(CKPT_E_RANGE, "write of {} bytes at {}: beyond the device ({} bytes)", len, off,
		     l.virt_bytes);
	if (off < l.grad_off) {
		if (off != 0 || len > CKPT_BLOCK)
			fail(CKPT_E_RANGE, "a command is one write at offset 0 of at most {} bytes",
			     CKPT_BLOCK);
		control_write(buf, len);
	} else if (off < l.param_off) {
		if (len > l.param_off - off)
			fail(CKPT_E_RANGE, "gradient write of {} bytes at {} runs into the PARAM window",
			     len, off);
		grad_write(off - l.grad_off, static_cast<const uint8_t *>(buf), len);
	} else {
		fail(CKPT_E_READONLY, "the PARAM window is read-only (write at {})", off);
	}
}

void Engine::read(uint64_t off, void *buf, uint64_t len)
{
	std::lock_guard call(call_mu_);
	const struct ckpt_layout &l = img_.sb.layout;
	if (off >= l.virt_bytes || len > l.virt_bytes - off)
		fail(CKPT_E_RANGE, "read of {} bytes at {}: beyond the device ({} bytes)", len, off,
		     l.virt_bytes);
	auto *out = static_cast<uint8_t *>(buf);
	while (len) {
		uint64_t n;
		if (off < l.grad_off) {
			n = std::min(len, l.grad_off - off);
			struct ckpt_status st;
			ckpt_sm_status(&sm_, &img_.sb, &st);
			st.grad_bytes = grad_bytes_;
			st.param_bytes = param_bytes_;
			ckpt_status_encode(&st, block_.as());
			std::memcpy(out, block_.as() + off, n);
		} else if (off < l.param_off) {
			n = std::min(len, l.param_off - off);
			std::memset(out, 0, n);
		} else {
			n = len;
			param_read(off - l.param_off, out, n);
		}
		out += n;
		off += n;
		len -= n;
	}
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

void Engine::control_write(const void *buf, uint64_t len)
{
	struct ckpt_cmd &cmd = *cmd_;
	int ret = ckpt_cmd_decode(buf, static_cast<uint32_t>(len), &cmd);
	if (ret == 0) {
		switch (cmd.opcode) {
		case CKPT_OP_BEGIN:
			ret = ckpt_sm_begin(&sm_, &cmd);
			break;
		case CKPT_OP_ABORT:
			ret = ckpt_sm_abort(&sm_, &cmd);
			if (ret >= 0)
				release_stages();
			break;
		case CKPT_OP_COMMIT:
			ret = ckpt_sm_commit(&sm_, &cmd);
			if (ret == CKPT_RESULT_OVERFLOW)
				release_stages();
			if (ret == CKPT_RESULT_COMMITTED) {
				struct ckpt_sb next;
				check_core(ckpt_sb_next(&img_.sb, sm_.open_step, ckpt_sm_dst_slot(&sm_), cmd.blob,
							cmd.blob_len, &next), "next superblock");
				try {
					commit_superblock(next);
				} catch (const Error &e) {
					ckpt_sm_commit_failed(&sm_, EIO);
					throw;
				}
				ckpt_sm_committed(&sm_);
				release_stages();
			}
			break;
		}
	}
	check_core(ret, "command rejected");
}

// Orders the commit: every chunk write of the step is complete (the batches
// waited for them); flush makes them durable; only then the superblock that
// points at them is written, with FUA, over the older copy.
void Engine::commit_superblock(const struct ckpt_sb &next)
{
	img_.file.flush();
	std::memset(block_.as(), 0, CKPT_BLOCK);
	check_core(ckpt_sb_encode(&next, block_.as()), "encode superblock");
	img_.file.pwrite_durable(block_.as(), CKPT_BLOCK, ckpt_sb_next_offset(&img_.sb));
	img_.sb = next;
}

// ---------------------------------------------------------------- gradients

Engine::Stage *Engine::stage_for(uint32_t chunk)
{
	int32_t i = stage_of_[chunk];
	if (i >= 0)
		return &stages_[static_cast<size_t>(i)];
	for (size_t k = 0; k < stages_.size(); k++)
		if (stages_[k].chunk < 0)
			return &stages_[k];
	return nullptr;
}

void Engine::release_stages()
{
	for (Stage &s : stages_) {
		if (s.chunk >= 0)
			stage_of_[static_cast<size_t>(s.chunk)] = -1;
		s.chunk = -1;
		std::fill(s.cover.begin(), s.cover.end(), 0);
	}
}

void Engine::grad_write(uint64_t off, const uint8_t *buf, uint64_t len)
{
	const struct ckpt_layout &l = img_.sb.layout;
	const uint64_t cb = l.plo_chunk_bytes;
	const uint32_t sectors = static_cast<uint32_t>(cb / CKPT_SECTOR);

	if (sm_.state == CKPT_STATE_FAILED)
		fail(CKPT_E_FAILED, "the device failed earlier (first error: {}); no new steps",
		     strerror(static_cast<int>(sm_.first_io_error)));
	if (sm_.state != CKPT_STATE_OPEN)
		fail(CKPT_E_STATE, "gradient write with no open step");

	// Check every piece before changing anything, so a refused write leaves
	// the step exactly as it was.
	size_t free_stages = 0;
	for (const Stage &s : stages_)
		free_stages += s.chunk < 0;
	for_each_piece(off, len, cb, [&](uint32_t c, uint64_t in, uint64_t n) {
		if (claimed_[c / 64] >> (c % 64) & 1)
			fail(CKPT_E_TWICE, "gradient of chunk {} written twice in step {}", c, sm_.open_step);
		int32_t si = stage_of_[c];
		if (n == cb && si >= 0)
			fail(CKPT_E_TWICE, "gradient of chunk {} written twice in step {}", c, sm_.open_step);
		if (n == cb)
			return;
		if (si < 0) {
			if (!free_stages--)
				fail(CKPT_E_NOSPC, "staging for partial chunks is full ({} chunks)",
				     stages_.size());
			return;
		}
		const auto &cover = stages_[static_cast<size_t>(si)].cover;
		for (uint64_t s = in / CKPT_SECTOR; s < (in + n) / CKPT_SECTOR; s++)
			if (cover[s / 64] >> (s % 64) & 1)
				fail(CKPT_E_TWICE, "gradient at param {} written twice in step {}",
				     (c * cb + s * CKPT_SECTOR) / 2, sm_.open_step);
	});

	batch_.jobs.clear();
	for_each_piece(off, len, cb, [&](uint32_t c, uint64_t in, uint64_t n) {
		const uint8_t *src = buf + (c * cb + in - off);
		if (n == cb) {
			batch_.jobs.push_back({c, reinterpret_cast<const uint16_t *>(src), nullptr});
			return;
		}
		Stage *s = stage_for(c);
		s->chunk = c;
		stage_of_[c] = static_cast<int32_t>(s - stages_.data());
		std::memcpy(s->grad.as() + in, src, n);
		check_core(ckpt_cover_add(s->cover.data(), sectors, static_cast<uint32_t>(in / CKPT_SECTOR),
					  static_cast<uint32_t>(n / CKPT_SECTOR)), "stage gradient");
		if (ckpt_cover_full(s->cover.data(), sectors))
			batch_.jobs.push_back({c, s->grad.as<uint16_t>(), nullptr});
	});
	for (const Job &j : batch_.jobs)
		check_core(ckpt_sm_claim(&sm_, j.chunk), "claim chunk");
	grad_bytes_ += len;
	run_batch();
	for (const Job &j : batch_.jobs) {
		int32_t si = stage_of_[j.chunk];
		if (si >= 0) {
			Stage &s = stages_[static_cast<size_t>(si)];
			s.chunk = -1;
			std::fill(s.cover.begin(), s.cover.end(), 0);
			stage_of_[j.chunk] = -1;
		}
	}
	if (batch_.error)
		throw Error(batch_.error, batch_.message);
}

// ---------------------------------------------------------------- workers

void Engine::run_batch()
{
	if (batch_.jobs.empty())
		return;
	std::unique_lock lk(mu_);
	batch_.next = 0;
	batch_.error = 0;
	batch_.message.clear();
	batch_.workers_left = static_cast<unsigned>(workers_.size());
	generation_++;
	work_cv_.notify_all();
	done_cv_.wait(lk, [this] { return batch_.workers_left == 0; });
}

void Engine::batch_failed(const Error &e)
{
	std::lock_guard lk(mu_);
	if (!batch_.error) {
		batch_.error = e.code();
		batch_.message = e.what();
	}
	if (e.code() == CKPT_E_IO || e.code() == CKPT_E_RECORD)
		ckpt_sm_fail(&sm_, EIO);
}

void Engine::worker_main(Worker &w)
{
	const struct ckpt_layout &l = img_.sb.layout;
	const uint64_t cp = l.chunk_params;
	const int fd = img_.file.fd.get();
	uint64_t seen = 0;

	// The update must give the kernel's bits: round to nearest, no flush of
	// denormals, whatever floating-point mode the creating thread had.
	_mm_setcsr(0x1f80);
	for (;;) {
		{
			std::unique_lock lk(mu_);
			work_cv_.wait(lk, [&] { return stopping_ || generation_ != seen; });
			if (stopping_)
				return;
			seen = generation_;
		}
		const bool load = batch_.jobs.front().load != nullptr;
		const uint32_t src = ckpt_sm_src_slot(&sm_), dst = ckpt_sm_dst_slot(&sm_);
		const uint64_t step = load ? load_step_ : sm_.open_step;
		unsigned inflight = 0;
		bool stop = false;
		try {
			for (;;) {
				for (size_t i = 0; i < w.slots.size() && !stop; i++) {
					Worker::Slot &s = w.slots[i];
					if (s.job)
						continue;
					size_t k = batch_.next.fetch_add(1);
					if (k >= batch_.jobs.size()) {
						stop = true;
						break;
					}
					s.job = &batch_.jobs[k];
					w.ring.read(fd, s.rec.as(), static_cast<unsigned>(l.record_bytes),
						    ckpt_record_offset(&l, src, s.job->chunk), i);
					inflight++;
				}
				if (!inflight)
					break;
				w.ring.submit();
				auto [tag, res] = w.ring.wait();
				inflight--;
				Worker::Slot &s = w.slots[tag];
				const uint32_t chunk = s.job->chunk;
				if (res < 0)
					fail(CKPT_E_IO, "backing I/O on chunk {} failed: {}", chunk, strerror(-res));
				if (s.writes) {		// a write completed
					if (--s.writes == 0) {
						std::lock_guard lk(mu_);
						if (!load)
							ckpt_sm_applied(&sm_, chunk, false, true);
						s.job = nullptr;
					}
					continue;
				}
				if (static_cast<uint64_t>(res) != l.record_bytes)
					fail(CKPT_E_IO, "short read of chunk {} state", chunk);
				// The full check, data checksum included: a step must not
				// turn bit rot into new committed state with a fresh checksum.
				struct ckpt_rec id;
				ckpt_rec_committed(&img_.sb, chunk, &id);
				img_.check_record(s.rec.as(), id, true);
				auto *p = reinterpret_cast<uint32_t *>(s.rec.as() + CKPT_BLOCK);
				uint32_t nonfinite = 0;
				if (load) {
					for (const StateSpan &span : *s.job->load) {
						uint64_t lo = std::max(span.offset, chunk * cp);
						uint64_t hi = std::min(span.offset + span.n, (chunk + 1) * cp);
						if (lo >= hi)
							continue;
						const uint64_t in = lo - chunk * cp, from = lo - span.offset;
						const float *src_of[3] = {span.p, span.m, span.v};
						for (int k = 0; k < 3; k++) {
							uint32_t *to = p + k * cp + in;
							if (src_of[k])
								std::memcpy(to, src_of[k] + from, (hi - lo) * 4);
							else
								std::memset(to, 0, (hi - lo) * 4);
						}
					}
					ckpt_round_params(img_.sb.geo.dtype, p, s.plo.as<uint16_t>(), cp);
				} else {
					const struct ckpt_hparams *hp = &sm_.groups[img_.group_table[chunk]];
					nonfinite = ckpt_update_chunk(hp, sm_.grad_scale, img_.sb.geo.dtype, s.job->grad,
								      p, p + cp, p + 2 * cp,
								      s.plo.as<uint16_t>(), cp);
				}
				if (nonfinite) {	// the step will be skipped: write nothing
					std::lock_guard lk(mu_);
					ckpt_sm_applied(&sm_, chunk, true, false);
					s.job = nullptr;
					continue;
				}
				ckpt_rec_next(&img_.sb, chunk, step, &id);
				ckpt_rec_seal(s.rec.as(), p, s.plo.as(), &id, img_.sb.feature_incompat);
				w.ring.write(fd, s.rec.as(), static_cast<unsigned>(l.record_bytes),
					     ckpt_record_offset(&l, dst, chunk), tag);
				w.ring.write(fd, s.plo.as(), static_cast<unsigned>(l.plo_chunk_bytes),
					     ckpt_plo_offset(&l, dst, chunk), tag);
				s.writes = 2;
				inflight += 2;
			}
		} catch (const Error &e) {
			batch_failed(e);
			batch_.next = batch_.jobs.size();	// others stop taking jobs
			while (inflight) {			// never leave I/O on our buffers
				try {
					w.ring.wait();
				} catch (const Error &) {
				}
				inflight--;
			}
		}
		for (Worker::Slot &s : w.slots) {
			s.job = nullptr;
			s.writes = 0;
		}
		std::lock_guard lk(mu_);
		if (--batch_.workers_left == 0)
			done_cv_.notify_all();
	}
}

// ---------------------------------------------------------------- reads

void Engine::param_read(uint64_t off, uint8_t *buf, uint64_t len)
{
	const struct ckpt_layout &l = img_.sb.layout;
	for_each_piece(off, len, l.plo_chunk_bytes, [&](uint32_t c, uint64_t in, uint64_t n) {
		uint32_t slot = ckpt_sm_read_slot(&sm_, c);
		uint64_t lo = align_down(in, CKPT_BLOCK), hi = align_up(in + n, CKPT_BLOCK);
		img_.file.pread_all(bounce_.as(), hi - lo, ckpt_plo_offset(&l, slot, c) + lo);
		std::memcpy(buf, bounce_.as() + (in - lo), n);
		buf += n;
	});
	param_bytes_ += len;
}

void Engine::read_state(uint64_t offset, uint64_t n, float *p, float *m, float *v)
{
	std::lock_guard call(call_mu_);
	// Latest applied: the new slot for chunks this open step has written.
	// A state read spans the tensor's chunks; all of them must be on one
	// side, which holds outside an open step and after its last write.
	const struct ckpt_sb &sb = img_.sb;
	if (offset >= sb.layout.n_params || n > sb.layout.n_params - offset)
		fail(CKPT_E_RANGE, "state read of {} params at {}: out of range", n, offset);
	for_each_piece(offset, n, sb.layout.chunk_params, [&](uint32_t c, uint64_t in, uint64_t k) {
		const uint32_t slot = ckpt_sm_read_slot(&sm_, c);
		struct ckpt_rec id;
		if (slot == sb.committed_slot)
			ckpt_rec_committed(&sb, c, &id);
		else
			ckpt_rec_next(&sb, c, sm_.open_step, &id);
		img_.read_state(id, c * sb.layout.chunk_params + in, k, p, m, v, bounce_);
		p += k;
		m += k;
		v += k;
	});
}

// ---------------------------------------------------------------- load_state

void Engine::load_state(const std::vector<StateSpan> &spans, uint64_t step, std::span<const uint8_t> blob)
{
	std::lock_guard call(call_mu_);
	const struct ckpt_layout &l = img_.sb.layout;
	if (sm_.state == CKPT_STATE_FAILED)
		fail(CKPT_E_FAILED, "the device failed earlier; no changes accepted");
	if (sm_.state != CKPT_STATE_IDLE)
		fail(CKPT_E_STATE, "loading state while step {} is open", sm_.open_step);
	if (img_.sb.committed_step != 0)
		fail(CKPT_E_STATE, "state can be loaded only before the first step (committed step is {})",
		     img_.sb.committed_step);
	if (step > CKPT_STEP_MAX)
		fail(CKPT_E_STEP, "step {} is beyond the largest step a device can continue from ({})", step,
		     CKPT_STEP_MAX);
	if (blob.size() > CKPT_BLOB_MAX)
		fail(CKPT_E_BLOB, "trainer blob of {} bytes, at most {}", blob.size(), CKPT_BLOB_MAX);
	for (const StateSpan &s : spans)
		if (s.offset >= l.n_params || s.n > l.n_params - s.offset || !s.p)
			fail(CKPT_E_RANGE, "state load of {} params at {}: out of range", s.n, s.offset);

	// Every chunk goes to the other slot, loaded or copied, so the flip of
	// committed_slot below moves the whole state at once.
	load_step_ = step;
	batch_.jobs.clear();
	for (uint32_t c = 0; c < img_.sb.geo.n_chunks; c++)
		batch_.jobs.push_back({c, nullptr, &spans});
	run_batch();
	if (batch_.error)
		throw Error(batch_.error, batch_.message);
	struct ckpt_sb next;
	check_core(ckpt_sb_next(&img_.sb, step, img_.sb.committed_slot ^ 1, blob.data(),
				static_cast<uint32_t>(blob.size()), &next), "next superblock");
	commit_superblock(next);
	// The step machine starts over from the new commit.
	ckpt_sm_init(&sm_, &img_.sb, claimed_.data(), applied_.data());
}

} // namespace ckpt
