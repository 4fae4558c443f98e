// SPDX-License-Identifier: MIT
#include "progress.hpp"

#include <cstdio>
#include <unistd.h>

#include <fmt/format.h>

#include "ckpt_admin.h"

namespace ckptctl {

Progress::Progress(std::string cmd, Mode mode)
	: cmd_(std::move(cmd)), tty_(isatty(STDERR_FILENO) == 1), forced_(mode == Mode::always), start_(clock::now())
{
	on_ = mode == Mode::always || (mode == Mode::tty && tty_);
	if (on_)
		ckpt_set_progress(hook, this);
}

Progress::~Progress()
{
	if (!on_)
		return;
	ckpt_set_progress(nullptr, nullptr);
	clear();
}

void Progress::hook(void *self, const char *what, uint64_t done, uint64_t total)
{
	static_cast<Progress *>(self)->update(what, done, total);
}

void Progress::clear()
{
	if (shown_ && tty_)
		fmt::print(stderr, "\r\033[K");
	shown_ = false;
}

void Progress::update(const char *what, uint64_t done, uint64_t total)
{
	const auto now = clock::now();
	const bool end = done >= total;
	if (!forced_ && now - start_ < std::chrono::seconds(1))
		return;
	// a terminal line is redrawn 10 times a second; a log gets a line a second
	if (!end && shown_ && now - last_ < (tty_ ? std::chrono::milliseconds(100) : std::chrono::seconds(1)))
		return;
	if (end && !shown_ && !forced_)
		return;
	last_ = now;
	const unsigned pct = total ? static_cast<unsigned>(done * 100 / total) : 100;
	const std::string phase = cmd_ == what ? "" : fmt::format("{} ", what);
	const auto secs = std::chrono::duration_cast<std::chrono::seconds>(now - start_).count();
	fmt::print(stderr, "{}ckptctl {}: {}{}% ({} s){}", tty_ ? "\r" : "", cmd_, phase, pct, secs,
		   tty_ ? "\033[K" : "\n");
	shown_ = true;
	if (end)	// the command's own output follows on a clean line
		clear();
}

} // namespace ckptctl
