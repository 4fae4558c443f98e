// SPDX-License-Identifier: MIT
// The progress line of a long command (format, import, export, verify), on
// stderr, fed by libckpt's progress hook (ckpt_set_progress).
#pragma once

#include <chrono>
#include <cstdint>
#include <string>

namespace ckptctl {

class Progress {
public:
	enum class Mode {
		tty,	// on a terminal, once the work has taken a second (the default)
		off,	// --no-progress
		always,	// --progress: from the start, one line per second when not a terminal
	};
	// Reports while the object lives, as "ckptctl CMD: PHASE 42%".
	Progress(std::string cmd, Mode mode);
	~Progress();
	Progress(const Progress &) = delete;
	Progress &operator=(const Progress &) = delete;

private:
	using clock = std::chrono::steady_clock;
	static void hook(void *self, const char *what, uint64_t done, uint64_t total);
	void update(const char *what, uint64_t done, uint64_t total);
	void clear();

	std::string cmd_;
	bool on_ = false, tty_ = false, forced_ = false, shown_ = false;
	clock::time_point start_, last_;
};

} // namespace ckptctl
