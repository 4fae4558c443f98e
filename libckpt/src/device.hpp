// SPDX-License-Identifier: MIT
// The client side of a dm-ckpt device: tensors by name, steps as commands,
// hyperparameters computed in double as PyTorch does. It talks to a Target
// (the userspace engine here), through the virtual device's byte ABI only.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "engine.hpp"
#include "manifest.hpp"

namespace ckpt {

// fp32 bit patterns of what the update needs for step t.
struct ckpt_hparams hparams_for_step(const GroupHparams &g, uint64_t step);

// fp32 params, exp_avg and exp_avg_sq of one tensor and the step they are at,
// for Device::load_state.
struct TensorState {
	std::string name;
	std::span<const float> p, m, v;
	uint64_t step = 0;
};

// The outcomes of a commit, with the values of enum ckpt_result.
enum class CommitResult : uint32_t {
	committed = CKPT_RESULT_COMMITTED,
	overflow = CKPT_RESULT_OVERFLOW,
};

// What a client moved through the virtual device since it was opened: the
// bytes it wrote to the GRAD window (tails padded to the block size), read
// from the PARAM window, and of control (commands written, status pages
// read), with the count of commands and of status-page reads. The same
// count whichever target serves the device (struct ckpt_traffic in ckpt.h).
struct Traffic {
	uint64_t grad_bytes = 0;
	uint64_t param_bytes = 0;
	uint64_t control_bytes = 0;
	uint64_t commands = 0;
	uint64_t status_reads = 0;
};

// One tensor's params to read back (Device::read_params_multi).
struct ParamsOut {
	std::string name;
	uint16_t *out;
	uint64_t n;
};

class Device {
public:
	static std::unique_ptr<Device> open(const std::string &path, const EngineOptions &opts = {});

	struct ckpt_status status();
	const Manifest &manifest() const { return image().manifest; }
	const struct ckpt_geometry &geometry() const { return image().sb.geo; }
	const struct ckpt_regions &regions() const { return image().sb.regions; }
	// Damaged superblock/metadata copies skipped when the image was read.
	std::vector<std::string> warnings() const { return image().warnings(); }
	// Writes to the device must be multiples of this (512 B, 4 KiB on 4Kn).
	uint32_t block_size() const { return target_->block_size(); }
	// The userspace engine, or null when the kernel target serves the device.
	Engine *engine() { return engine_.get(); }
	// See Target::forsake: for a child forked from the opener.
	void forsake() noexcept { target_->forsake(); }
	// The image as read at open (the engine's, or the kernel target's backing
	// device): uuid, geometry and manifest; its committed step may be stale.
	const Image &image() const { return engine_ ? engine_->image() : *backing_; }

	void begin(std::span<const GroupHparams> groups, double grad_scale);
	// A tensor's gradient; a tensor whose step count lags the open step
	// (skipped before) is bias-corrected with its own count.
	void write_grad(const std::string &name, const uint16_t *grad, uint64_t n);
	// Leave the tensor as it is in the open step: params, moments and step
	// count (torch's param without a gradient). Needs the COUNTS feature.
	void skip(const std::string &name);
	// The number of committed steps that updated the tensor (COUNTS), else
	// the committed step.
	uint64_t tensor_step(const std::string &name);
	// Raw bytes at an offset of the GRAD window: sector-aligned, any order.
	void write_grad_window(uint64_t off, const void *buf, uint64_t len);
	CommitResult commit(std::span<const uint8_t> blob);
	// The gradients' sum of squares (fp64 bits) of the step the last
	// commit() ended, as the device reported it; none when it did not.
	std::optional<uint64_t> grad_sumsq() const { return grad_sumsq_; }
	void abort();
	// The previous step committed again: the ROLLBACK command, on the
	// engine and on the kernel target alike; the step now committed. No
	// step may be open; never two steps back.
	uint64_t rollback();
	void read_params(const std::string &name, uint16_t *out, uint64_t n);
	// Several tensors' params in one batch: a step's read-back.
	void read_params_multi(std::span<const ParamsOut> outs);
	const Traffic &traffic() const { return traffic_; }
	void read_state(const std::string &name, float *p, float *m, float *v, uint64_t n);
	void load_params(const std::vector<std::pair<std::string, std::span<const float>>> &values);
	// A whole optimizer state from outside (ckpt_load_state in ckpt.h): every
	// tensor once, committed as their step with blob.
	void load_state(const std::vector<TensorState> &tensors, std::span<const uint8_t> blob);

private:
	Device() = default;
	void send(const struct ckpt_cmd &cmd);
	const Tensor &tensor(const std::string &name, uint64_t n);
	void check_params(const Tensor &t);
	bool has_counts() const { return image().sb.feature_incompat & CKPT_FEATURE_INCOMPAT_COUNTS; }
	uint64_t read_count(const Tensor &t);
	void send_range(const Tensor &t, uint32_t flags, uint64_t count);

	// The open step's groups and step, and each tensor's step count as of
	// counts_at_ (its committed step), with this step's changes in pending_.
	// committed_ and open_step_ are what the last status page or command
	// said (known_): a step needs no status read but the one after COMMIT.
	std::vector<GroupHparams> groups_;
	uint64_t open_step_ = 0;
	uint64_t committed_ = 0;
	bool known_ = false;
	// The gradients' sum of squares (fp64 bits) of the step this handle's last
	// COMMIT ended, from the status page read after it; unset when the device
	// did not report it.
	std::optional<uint64_t> grad_sumsq_;
	Traffic traffic_;
	uint64_t counts_at_ = ~0ULL;
	std::unordered_map<std::string, uint64_t> counts_, pending_;
	Buffer zeros_;		// one chunk of zero gradients, for skip

	// Chunks whose committed p_lo was checked against its record (PLO_CRC
	// images), once per open: every committed step writes all of them anew.
	std::vector<bool> plo_checked_;
	Buffer plo_check_;	// a record header and a chunk of p_lo

	std::unique_ptr<Engine> engine_;
	std::unique_ptr<Target> kernel_;	// the kernel target's virtual device
	std::optional<Image> backing_;		// its backing device, read-only
	Target *target_ = nullptr;
	std::unique_ptr<struct ckpt_cmd> cmd_;
	Buffer page_;		// one command or status page
	Buffer tail_;		// the last partial sectors of a tensor, zero padded
};

} // namespace ckpt
