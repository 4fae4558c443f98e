// SPDX-License-Identifier: MIT
// The library's C++ errors: an exception carrying an enum ckpt_err code and a
// message naming what is wrong, which the C ABI (capi.cpp) turns into a
// negated code and ckpt_last_error(). Internal: callers of libckpt see only
// the C ABI (ckptctl has its own error type over it).
#pragma once

#include <stdexcept>
#include <string>
#include <utility>

#include <fmt/format.h>

#include "ckpt_codec.h"	// ckpt_strerror, the core's

namespace ckpt {

class Error : public std::runtime_error {
public:
	Error(int code, const std::string &what) : std::runtime_error(what), code_(code) {}
	// A positive enum ckpt_err, as the C ABI returns it negated.
	int code() const { return code_; }

private:
	int code_;
};

template <typename... Args>
[[noreturn]] void fail(int code, fmt::format_string<Args...> f, Args &&...args)
{
	throw Error(code, fmt::format(f, std::forward<Args>(args)...));
}

// Throws when a call that returns -err failed, with context in front of the
// error's message (ckpt_strerror).
inline void check_core(int ret, const std::string &context)
{
	if (ret < 0)
		throw Error(-ret, fmt::format("{}: {}", context, ckpt_strerror(-ret)));
}

} // namespace ckpt
