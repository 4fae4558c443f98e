// SPDX-License-Identifier: MIT
// The I/O a run made on its backing file, recorded in completion order, and
// the images a crash during that run could leave behind.
//
// The model is a disk with a volatile write cache: a write is durable once a
// flush completed after it, or by itself when it was forced (FUA, RWF_DSYNC);
// until then it may or may not be on the media, independently of every other
// write; and the write in flight at the crash may be torn at any sector
// boundary.
#pragma once

#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

#include "io.hpp"

namespace crash {

struct Event {
	enum Kind { write, durable_write, flush } kind;
	uint64_t off = 0;
	std::vector<uint8_t> data;
	bool is_write() const { return kind != flush; }
};

// The recording layer: an IoObserver handed to the engine (EngineOptions).
class Recorder : public ckpt::IoObserver {
public:
	void written(uint64_t off, const void *buf, size_t len, bool durable) noexcept override;
	void flushed() noexcept override;
	// A copy of what has been recorded so far.
	std::vector<Event> events() const;
	size_t size() const;

private:
	mutable std::mutex mu_;
	std::vector<Event> events_;
};

// One crash state: the events [0, point) completed, of the writes not yet
// made durable those in `in` reached the media, and, when torn.len, the
// write at `point` (in flight) reached it only in [torn.off, torn.off + len).
struct CrashState {
	size_t point = 0;
	std::vector<size_t> in;		// event indices, ascending
	struct {
		uint64_t off = 0;	// within the write
		uint64_t len = 0;	// 0: not torn
	} torn;
	std::string describe(const std::vector<Event> &ev) const;
};

struct EnumerateOptions {
	unsigned exhaustive_max = 10;	// subsets enumerated up to 2^this, else sampled
	unsigned samples = 32;		// random subsets per crash point when sampled
	bool torn_every_sector = false;	// tear at every boundary, not only the first and last
	uint64_t seed = 1;
};

// Every crash state of the recorded run that respects flush ordering, each
// once: at crash point k, the subsets of the writes since the last flush
// that hold write k-1 (the others are states of an earlier point); all of
// them while there are few, else all-in, only-forced and a seeded random
// sample. Then, for every write, the state where it was in flight with all
// earlier undurable writes in, torn at 512 B and at 4 KiB: only its first or
// only its last unit written, and the one unit short of it either way (every
// boundary with torn_every_sector).
std::vector<CrashState> enumerate(const std::vector<Event> &ev, const EnumerateOptions &o);

// Builds images of crash states from the image before the first event, in
// the order enumerate() gives them (by crash point).
class ImageBuilder {
public:
	ImageBuilder(std::vector<uint8_t> initial, const std::vector<Event> &ev);
	std::vector<uint8_t> build(const CrashState &s);
	// The image after every event: what the run left.
	std::vector<uint8_t> final_image();

private:
	void advance(size_t point);	// durable_ to the last flush before point

	const std::vector<Event> &ev_;
	std::vector<uint8_t> durable_;	// the image up to and including event flushed_ - 1
	size_t flushed_ = 0;		// events before this are on the media
};

// The number of superblock writes (commits) an image of s holds whole: which
// commit it must open at. A superblock write is one to the first two blocks.
size_t commits_in(const std::vector<Event> &ev, const CrashState &s, const std::vector<uint8_t> &img);
bool is_superblock_write(const Event &e);

} // namespace crash
