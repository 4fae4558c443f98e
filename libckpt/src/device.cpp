// SPDX-License-Identifier: MIT
#include "device.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "block_target.hpp"
#include "error.hpp"
#include "verify.hpp"

extern "C" {
#include "ckpt_step.h"
}

namespace ckpt {

namespace {

uint32_t f32_bits(double v)
{
	float f = static_cast<float>(v);
	uint32_t u;
	std::memcpy(&u, &f, 4);
	return u;
}

} // namespace

// The scalars of torch.optim.AdamW's step, computed the way it computes them:
// in double, then used as fp32 by the tensor arithmetic.
struct ckpt_hparams hparams_for_step(const GroupHparams &g, uint64_t step)
{
	const double t = static_cast<double>(step);
	const double bc1 = 1.0 - std::pow(g.beta1, t);
	const double bc2 = 1.0 - std::pow(g.beta2, t);
	struct ckpt_hparams h = {};
	h.lr = f32_bits(g.lr);
	h.beta1 = f32_bits(g.beta1);
	h.beta2 = f32_bits(g.beta2);
	h.eps = f32_bits(g.eps);
	h.weight_decay = f32_bits(g.weight_decay);
	h.one_minus_beta1 = f32_bits(1.0 - g.beta1);
	h.one_minus_beta2 = f32_bits(1.0 - g.beta2);
	h.step_size = f32_bits(g.lr / bc1);
	h.bc2_sqrt = f32_bits(std::sqrt(bc2));
	h.decay = f32_bits(g.adam_l2 ? 1.0 : 1.0 - g.lr * g.weight_decay);
	h.flags = g.adam_l2 ? CKPT_GROUP_ADAM_L2 : 0;
	return h;
}

// A device-mapper device is a dm-ckpt virtual device served by the kernel;
// anything else is a backing file or device for the userspace engine.
std::unique_ptr<Device> Device::open(const std::string &path, const EngineOptions &opts)
{
	std::unique_ptr<Device> d(new Device());
	if (auto image = BlockTarget::image_of(path)) {
		d->backing_ = std::move(*image);
		d->kernel_ = std::make_unique<BlockTarget>(BackingFile::open(path, true));
		d->target_ = d->kernel_.get();
	} else {
		d->engine_ = Engine::open(path, opts);
		d->target_ = d->engine_.get();
	}
	d->cmd_ = std::make_unique<struct ckpt_cmd>();
	d->page_ = Buffer(CKPT_BLOCK);
	d->tail_ = Buffer(d->regions().plo_chunk_bytes + CKPT_BLOCK);
	d->plo_checked_.assign(d->geometry().n_chunks, false);
	if (d->kernel_) {
		const struct ckpt_status st = d->status();
		if (memcmp(&st.geo, &d->geometry(), sizeof(st.geo)) != 0)
			fail(CKPT_E_LAYOUT, "{}: the target's geometry disagrees with its backing device {}",
			     path, d->backing_->file.path);
	}
	return d;
}

struct ckpt_status Device::status()
{
	struct ckpt_status st;
	target_->read(0, page_.as(), CKPT_BLOCK);
	traffic_.status_reads++;
	traffic_.control_bytes += CKPT_BLOCK;
	check_core(ckpt_status_decode(page_.as(), &st), "status page");
	committed_ = st.committed_step;
	open_step_ = st.state == CKPT_STATE_OPEN ? st.open_step : 0;
	known_ = true;
	return st;
}

// A refused or failed command may leave the device other than the client
// thought (a rollback message, a failed commit): the next step asks it.
void Device::send(const struct ckpt_cmd &cmd)
{
	int len = ckpt_cmd_encode(&cmd, page_.as());
	check_core(len, "encode command");
	const uint64_t bs = target_->block_size();
	uint64_t padded = (static_cast<uint64_t>(len) + bs - 1) / bs * bs;
	try {
		target_->write(0, page_.as(), padded);
	} catch (const Error &) {
		known_ = false;
		throw;
	}
	traffic_.commands++;
	traffic_.control_bytes += padded;
}

void Device::begin(std::span<const GroupHparams> groups, double grad_scale)
{
	if (groups.size() != geometry().n_groups)
		fail(CKPT_E_GROUPS, "begin: {} hyperparameter groups given, the device has {}",
		     groups.size(), geometry().n_groups);
	if (!std::isfinite(grad_scale) || grad_scale <= 0)
		fail(CKPT_E_HPARAM, "begin: grad_scale {} must be finite and positive", grad_scale);
	for (size_t i = 0; i < groups.size(); i++)
		check_hparams(groups[i], fmt::format("begin: group {}", i));
	if (!known_)
		status();
	struct ckpt_cmd &cmd = *cmd_;
	// The step after the committed one as last seen; if the device moved
	// since (a rollback message to the kernel target), it refuses the step
	// (E_STEP, nothing changed): ask it, and once more.
	for (bool again = true;; again = false) {
		cmd = {};
		cmd.opcode = CKPT_OP_BEGIN;
		cmd.step = committed_ + 1;
		cmd.grad_scale = f32_bits(grad_scale);
		cmd.n_groups = static_cast<uint32_t>(groups.size());
		for (size_t i = 0; i < groups.size(); i++) {
			cmd.groups[i] = hparams_for_step(groups[i], cmd.step);
			// What the target checks on the fp32 values (ckpt_hparams_check).
			const char *field = nullptr;
			if (ckpt_hparams_check(&cmd.groups[i], &field) < 0)
				fail(CKPT_E_HPARAM, "begin: group {}: {} out of range at step {} (lr {}, betas ({}, {}), "
						    "eps {}, weight_decay {})",
				     i, field, cmd.step, groups[i].lr, groups[i].beta1, groups[i].beta2,
				     groups[i].eps, groups[i].weight_decay);
		}
		try {
			send(cmd);
			break;
		} catch (const Error &e) {
			const uint64_t was = committed_;
			if (e.code() != CKPT_E_STEP || !again || (status(), committed_ == was))
				throw;
		}
	}
	groups_.assign(groups.begin(), groups.end());
	if (counts_at_ != committed_)
		counts_.clear();
	counts_at_ = committed_;
	pending_.clear();
	open_step_ = cmd.step;
}

CommitResult Device::commit(std::span<const uint8_t> blob)
{
	if (blob.size() > CKPT_BLOB_MAX)
		fail(CKPT_E_BLOB, "commit: trainer blob of {} bytes, at most {}", blob.size(), CKPT_BLOB_MAX);
	if (!known_)
		status();
	struct ckpt_cmd &cmd = *cmd_;
	cmd.opcode = CKPT_OP_COMMIT;
	cmd.step = open_step_ ? open_step_ : committed_ + 1;
	cmd.n_groups = 0;
	cmd.blob_len = static_cast<uint32_t>(blob.size());
	if (!blob.empty())
		std::memcpy(cmd.blob, blob.data(), blob.size());
	try {
		send(cmd);
	} catch (const Error &e) {
		if (e.code() == CKPT_E_STEP && has_counts() && status().state == CKPT_STATE_OPEN)
			fail(CKPT_E_STEP, "commit: a block's step count is not the one its update was "
					  "bias-corrected for (the GRAD window was written around the "
					  "tensors' counts); abort the step");
		throw;
	}
	// The one status read of a step: committed, or skipped for an overflow.
	const struct ckpt_status st = status();
	grad_sumsq_.reset();
	if (st.grad_sumsq_step == cmd.step)
		grad_sumsq_ = st.grad_sumsq;
	if (st.last_result == CKPT_RESULT_OVERFLOW)
		return CommitResult::overflow;
	counts_ = std::move(pending_);	// untouched tensors are read again
	pending_.clear();
	counts_at_ = cmd.step;
	// The step wrote every chunk's p_lo, rounded from checked state.
	plo_checked_.assign(plo_checked_.size(), true);
	return CommitResult::committed;
}

void Device::abort()
{
	if (!known_)
		status();
	struct ckpt_cmd &cmd = *cmd_;
	cmd.opcode = CKPT_OP_ABORT;
	cmd.step = open_step_;
	cmd.n_groups = 0;
	cmd.blob_len = 0;
	send(cmd);
	open_step_ = 0;
}

// The ROLLBACK command, to either target: from the committed step, so a
// commit by another opener in between is refused (E_STEP), not undone.
uint64_t Device::rollback()
{
	const struct ckpt_status st = status();
	struct ckpt_cmd &cmd = *cmd_;
	cmd = {};
	cmd.opcode = CKPT_OP_ROLLBACK;
	cmd.step = st.committed_step;
	try {
		send(cmd);
	} catch (const Error &e) {
		if (!kernel_)
			throw;	// the engine says why itself
		if (e.code() == CKPT_E_OPCODE)
			fail(CKPT_E_OPCODE, "rollback: the kernel target does not know the ROLLBACK command (a "
					    "dm-ckpt module older than this library): load the current module, or "
					    "deactivate the device and run ckptctl restore --rollback on {}",
			     backing_->file.path);
		if (e.code() == CKPT_E_ROLLBACK) {
			// The target answers only the code: the backing device tells why.
			backing_->reload_superblock();
			const RollbackCheck rb = check_rollback(*backing_, inspect_superblocks(backing_->file));
			fail(CKPT_E_ROLLBACK, "rollback: {}", rb.reason.empty() ? ckpt_strerror(e.code()) : rb.reason);
		}
		if (e.code() == CKPT_E_STATE && st.state == CKPT_STATE_OPEN)
			fail(CKPT_E_STATE, "rollback: step {} is open; commit or abort it first", st.open_step);
		throw;
	}
	// The committed state changed under the caches of the newer one.
	known_ = false;
	counts_at_ = ~0ULL;
	counts_.clear();
	pending_.clear();
	plo_checked_.assign(plo_checked_.size(), false);
	return status().committed_step;
}

const Tensor &Device::tensor(const std::string &name, uint64_t n)
{
	const Tensor &t = manifest().find(name);
	if (n != t.numel)
		fail(CKPT_E_SIZE, "tensor '{}' has {} elements, {} given", name, t.numel, n);
	return t;
}

// A tensor's gradient covers its whole extent: its values, then zeros for the
// padding it owns, so every chunk is complete once all tensors are written.
void Device::write_grad(const std::string &name, const uint16_t *grad, uint64_t n)
{
	const Tensor &t = tensor(name, n);
	uint64_t next = open_step_;
	if (has_counts()) {
		// A tensor skipped before lags: its update is bias-corrected for
		// its own count, as torch's per-param state["step"].
		next = read_count(t) + 1;
		if (next != open_step_)
			send_range(t, 0, next);
	}
	const struct ckpt_regions &l = regions();
	const uint64_t base = l.grad_off + t.offset * 2;
	const uint64_t bs = target_->block_size();	// extents are 4 KiB multiples
	const uint64_t body = t.numel * 2 / bs * bs;
	const uint64_t tail = t.extent * 2 - body;
	std::memset(tail_.as(), 0, tail);
	std::memcpy(tail_.as(), reinterpret_cast<const uint8_t *>(grad) + body, t.numel * 2 - body);
	// One write where the tensor ends on a sector, else the body and the tail;
	// a failed body write leaves nothing to undo (the target changed nothing).
	if (body)
		target_->write(base, grad, body);
	traffic_.grad_bytes += body;
	if (tail)
		target_->write(base + body, tail_.as(), tail);
	traffic_.grad_bytes += tail;
	pending_[name] = next;
}

uint64_t Device::read_count(const Tensor &t)
{
	if (auto it = counts_.find(t.name); it != counts_.end() && counts_at_ != ~0ULL)
		return it->second;
	const uint64_t count = tensor_step(t.name);
	counts_[t.name] = count;
	return count;
}

uint64_t Device::tensor_step(const std::string &name)
{
	const Tensor &t = manifest().find(name);
	if (backing_)	// the kernel may have committed since
		backing_->reload_superblock();
	return image().tensor_count(image().sb, t);
}

void Device::send_range(const Tensor &t, uint32_t flags, uint64_t count)
{
	struct ckpt_cmd &cmd = *cmd_;
	cmd = {};
	cmd.opcode = CKPT_OP_RANGE;
	cmd.step = open_step_;
	cmd.n_ranges = 1;
	struct ckpt_range &r = cmd.ranges[0];
	r.off = t.offset * 2;
	r.len = t.extent * 2;
	r.flags = flags;
	if (!(flags & CKPT_RANGE_SKIP)) {
		if (t.group >= groups_.size())
			fail(CKPT_E_STATE, "tensor '{}': no open step", t.name);
		const struct ckpt_hparams h = hparams_for_step(groups_[t.group], count);
		r.count = count;
		r.step_size = h.step_size;
		r.bc2_sqrt = h.bc2_sqrt;
	}
	send(cmd);
}

// The tensor's blocks keep their state: the target copies them to the
// step's slot unchanged. Their chunks still need a write of the GRAD
// window to complete (zeros, ignored).
void Device::skip(const std::string &name)
{
	const Tensor &t = manifest().find(name);
	if (!has_counts())
		fail(CKPT_E_FEATURE, "skip '{}': the image has no per-block step counts (formatted "
				     "without the COUNTS feature); write a zero gradient instead", name);
	send_range(t, CKPT_RANGE_SKIP, 0);
	const struct ckpt_regions &l = regions();
	const uint64_t cb = l.plo_chunk_bytes;
	if (!zeros_.size())
		zeros_ = Buffer(cb);
	for (uint64_t off = t.offset * 2, end = off + t.extent * 2; off < end;) {
		const uint64_t n = std::min(end - off, cb - off % cb);	// up to a chunk end
		target_->write(l.grad_off + off, zeros_.as(), n);
		traffic_.grad_bytes += n;
		off += n;
	}
	if (!pending_.count(name))
		pending_[name] = read_count(t);
}

void Device::write_grad_window(uint64_t off, const void *buf, uint64_t len)
{
	const struct ckpt_regions &l = regions();
	if (off > l.window_bytes || len > l.window_bytes - off)
		fail(CKPT_E_RANGE, "gradient write of {} bytes at {}: beyond the GRAD window", len, off);
	target_->write(l.grad_off + off, buf, len);
	traffic_.grad_bytes += len;
}

// A bit flipped in committed p_lo would come back into a resumed model: before
// the first read of a chunk's params, its committed p_lo is checked against
// the checksum in its record header. The header's own crc, step and sequence
// tie it to the superblock; its p, m, v (six times larger) are not read, a
// step checks those.
void Device::check_params(const Tensor &t)
{
	if (!(image().sb.feature_incompat & CKPT_FEATURE_INCOMPAT_PLO_CRC) || !t.numel)
		return;
	const uint64_t cp = regions().chunk_params;
	const uint32_t first = static_cast<uint32_t>(t.offset / cp);
	const uint32_t last = static_cast<uint32_t>((t.offset + t.numel - 1) / cp);
	bool fresh = false;
	for (uint32_t c = first; c <= last; c++) {
		if (plo_checked_[c])
			continue;
		if (backing_ && !fresh) {	// the kernel may have committed since
			backing_->reload_superblock();
			fresh = true;
		}
		const Image &img = image();
		const struct ckpt_sb &sb = img.sb;
		const struct ckpt_regions &l = sb.regions;
		if (!plo_check_.size())
			plo_check_ = Buffer(CKPT_BLOCK + l.plo_chunk_bytes);
		uint8_t *plo = plo_check_.as() + CKPT_BLOCK;
		img.file.pread_all(plo_check_.as(), CKPT_BLOCK, ckpt_record_offset(&l, sb.committed_slot, c));
		img.file.pread_all(plo, l.plo_chunk_bytes, ckpt_plo_offset(&l, sb.committed_slot, c));
		img.check_record(plo_check_.as(), c, sb.committed_slot, sb.committed_step, sb.sequence, false,
				 plo);
		plo_checked_[c] = true;
	}
}

void Device::read_params(const std::string &name, uint16_t *out, uint64_t n)
{
	const Tensor &t = tensor(name, n);
	check_params(t);
	target_->read(regions().param_off + t.offset * 2, out, n * 2);
	traffic_.param_bytes += n * 2;
}

void Device::read_params_multi(std::span<const ParamsOut> outs)
{
	std::vector<ReadPiece> pieces;
	uint64_t bytes = 0;
	for (const ParamsOut &o : outs) {
		const Tensor &t = tensor(o.name, o.n);
		pieces.push_back({regions().param_off + t.offset * 2, o.out, o.n * 2});
		bytes += o.n * 2;
	}
	for (const ParamsOut &o : outs)
		check_params(manifest().find(o.name));
	target_->read_many(pieces);
	traffic_.param_bytes += bytes;
}

void Device::read_state(const std::string &name, float *p, float *m, float *v, uint64_t n)
{
	const Tensor &t = tensor(name, n);
	if (engine_)
		return engine_->read_state(t.offset, n, p, m, v);
	// The kernel target serves no state: read the committed slot of the
	// backing device, as its superblock says now. An open step writes the
	// other slot, so this holds while one is open too, as on the engine.
	// Should another client commit and write this slot meanwhile, the
	// records' step and sequence change, which the record checks refuse
	// (E_RECORD) rather than mix steps.
	backing_->reload_superblock();
	Buffer bounce(regions().record_bytes);
	const struct ckpt_sb &sb = backing_->sb;
	backing_->read_state(sb.committed_slot, sb.committed_step, sb.sequence, t.offset, n, p, m, v, bounce);
}

void Device::load_params(const std::vector<std::pair<std::string, std::span<const float>>> &values)
{
	std::vector<StateSpan> spans;
	for (const auto &[name, vals] : values) {
		const Tensor &t = tensor(name, vals.size());
		spans.push_back({t.offset, t.numel, vals.data(), nullptr, nullptr});
	}
	if (!engine_)
		fail(CKPT_E_STATE, "load_params needs the userspace engine: load the backing device "
				   "before the kernel target is created on it");
	const struct ckpt_sb &sb = engine_->superblock();
	known_ = false;
	engine_->load_state(spans, sb.committed_step, {sb.blob, sb.blob_len});
}

// Checked whole before anything is written: a state the update could not
// have produced (check_state_span) or one that is not the device's whole
// state is refused, and the device keeps its own. The state is committed as
// the largest of the tensors' steps; a tensor below it (torch's AdamW counts
// only the steps that gave a param a gradient) keeps its own count in its
// blocks, so its next bias correction is the one torch would use.
void Device::load_state(const std::vector<TensorState> &tensors, std::span<const uint8_t> blob)
{
	if (!engine_)
		fail(CKPT_E_STATE, "load_state needs the userspace engine: load the backing device "
				   "before the kernel target is created on it");
	const std::vector<Tensor> &all = manifest().tensors();
	std::vector<bool> given(all.size());
	std::vector<StateSpan> spans;
	uint64_t step = 0;
	for (const TensorState &s : tensors)
		step = std::max(step, s.step);
	for (const TensorState &s : tensors) {
		const Tensor &t = tensor(s.name, s.p.size());
		const size_t index = static_cast<size_t>(&t - all.data());
		if (given[index])
			fail(CKPT_E_TWICE, "load_state: tensor '{}' given twice", t.name);
		given[index] = true;
		if (s.m.size() != t.numel || s.v.size() != t.numel)
			fail(CKPT_E_SIZE, "load_state: tensor '{}' has {} elements, its exp_avg {} and exp_avg_sq {}",
			     t.name, t.numel, s.m.size(), s.v.size());
		spans.push_back({t.offset, t.numel, s.p.data(), s.m.data(), s.v.data(), s.step, t.extent});
		check_state_span(spans.back(), step, has_counts(), fmt::format("load_state: tensor '{}'", t.name));
	}
	for (size_t i = 0; i < all.size(); i++)
		if (!given[i])
			fail(CKPT_E_NAME, "load_state: tensor '{}' of the device is not given: the state is loaded whole",
			     all[i].name);
	known_ = false;
	engine_->load_state(spans, step, blob);
}

} // namespace ckpt
