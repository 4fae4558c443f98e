// SPDX-License-Identifier: MIT
// C++ errors over the libckpt C ABI (ckpt.h): an exception carrying an enum
// ckpt_err code and a message naming what is wrong. Header-only, built on the
// public C API and {fmt} alone, so that the library's own C++ code and its
// C++ callers (ckptctl) throw and catch the same type.
#pragma once

#include <stdexcept>
#include <string>
#include <utility>

#include <fmt/format.h>

#include "ckpt.h"

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

// ret of a libckpt C ABI call: returned when not negative, else thrown with
// the library's message for it (ckpt_last_error).
inline int check(int ret)
{
	if (ret < 0)
		throw Error(-ret, ckpt_last_error());
	return ret;
}

} // namespace ckpt
