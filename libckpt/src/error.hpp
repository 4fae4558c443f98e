// SPDX-License-Identifier: MIT
#pragma once

#include <stdexcept>
#include <string>

#include <fmt/format.h>

extern "C" {
#include "ckpt_format.h"
}

namespace ckpt {

// Every failure of the library: a core error code (enum ckpt_err) and a
// message naming what is wrong.
class Error : public std::runtime_error {
public:
	Error(int code, const std::string &what) : std::runtime_error(what), code_(code) {}
	int code() const { return code_; }

private:
	int code_;
};

template <typename... Args>
[[noreturn]] void fail(int code, fmt::format_string<Args...> f, Args &&...args)
{
	throw Error(code, fmt::format(f, std::forward<Args>(args)...));
}

// Throws when a core call returned -err, with context in front of the core's message.
inline void check_core(int ret, const std::string &context)
{
	if (ret < 0)
		throw Error(-ret, fmt::format("{}: {}", context, ckpt_strerror(-ret)));
}

} // namespace ckpt
