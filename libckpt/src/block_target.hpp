// SPDX-License-Identifier: MIT
// A dm-ckpt virtual device served by the kernel target (/dev/mapper/NAME).
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "engine.hpp"

namespace ckpt {

// Gradient writes are asynchronous, as the engine's: each is checked for
// alignment, copied into a slab of aligned memory (the caller may reuse its
// buffer at once; O_DIRECT needs aligned memory anyway) and queued on an
// io_uring; the queue is submitted once it holds 1 MiB or 32 writes, so small
// tensors go down together. Commands and reads first submit and wait for
// every write (a COMMIT finds its step complete, a read sees every write
// before it). A write the target fails or refuses is reported, with what
// the status page says of it, by the next write or command, once.
class BlockTarget : public Target {
public:
	explicit BlockTarget(BackingFile dev);
	~BlockTarget() override;
	// The virtual device's backing device, from sysfs, if path is a dm device.
	static std::optional<std::string> backing_of(const std::string &path);
	// The image of the dm-ckpt virtual device at path (none if it is not one),
	// read-only: through the target's IMAGE window, or, on a target that
	// has none (dm-ckpt before 0.4), from the backing device (backing_of).
	static std::optional<Image> image_of(const std::string &path);

	void write(uint64_t off, const void *buf, uint64_t len) override;
	void read(uint64_t off, void *buf, uint64_t len) override;
	void read_many(std::span<const ReadPiece> pieces) override;
	uint32_t block_size() const override { return block_; }
	void forsake() noexcept override { dev_.fd.reset(); }

private:
	// Why the target refused a request: its status page says.
	[[noreturn]] void refused(const char *what, uint64_t off, uint64_t len, int err);

	bool read_status(struct ckpt_status &st);
	void command(uint64_t off, const uint8_t *src, uint64_t len);
	uint32_t slab_for(uint64_t len);
	void submit();
	void reap(bool wait);
	void drain();
	void report_error();

	struct Slab {
		Buffer mem;
		uint64_t used = 0;
		unsigned writes = 0;		// in flight from it
	};
	struct Io {
		uint64_t off, len;
		uint32_t slab;
	};

	BackingFile dev_;
	uint32_t block_ = CKPT_SECTOR;	// logical block size of the virtual device
	uint64_t rejected_seen_ = 0;	// the target's count of refusals, last seen
	Buffer bounce_;			// O_DIRECT needs aligned memory
	std::vector<Slab> slabs_;
	std::vector<uint32_t> free_slabs_;
	uint32_t cur_ = ~0u;		// the slab being filled
	std::vector<Io> ios_;		// by tag
	std::vector<uint32_t> free_ios_;
	unsigned inflight_ = 0;		// writes queued or submitted, not completed
	unsigned queued_ = 0;		// of which not submitted
	uint64_t queued_bytes_ = 0;
	// The first write that failed, until a write or command reports it.
	int error_ = 0;
	uint64_t error_off_ = 0, error_len_ = 0;
	Ring ring_;			// last: torn down before the slabs it writes from
};

} // namespace ckpt
