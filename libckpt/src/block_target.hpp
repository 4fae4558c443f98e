// SPDX-License-Identifier: MIT
// A dm-ckpt virtual device served by the kernel target (/dev/mapper/NAME).
#pragma once

#include <optional>
#include <string>

#include "engine.hpp"

namespace ckpt {

class BlockTarget : public Target {
public:
	explicit BlockTarget(BackingFile dev);
	// The virtual device's backing device, from sysfs, if path is a dm device.
	static std::optional<std::string> backing_of(const std::string &path);

	void write(uint64_t off, const void *buf, uint64_t len) override;
	void read(uint64_t off, void *buf, uint64_t len) override;
	uint32_t block_size() const override { return block_; }
	void forsake() noexcept override { dev_.fd.reset(); }

private:
	// Why the target refused a request: its status page says.
	[[noreturn]] void refused(const char *what, uint64_t off, uint64_t len, int err);

	bool read_status(struct ckpt_status &st);

	BackingFile dev_;
	uint32_t block_ = CKPT_SECTOR;	// logical block size of the virtual device
	uint64_t rejected_seen_ = 0;	// the target's count of refusals, last seen
	Buffer bounce_;			// O_DIRECT needs aligned memory
};

} // namespace ckpt
