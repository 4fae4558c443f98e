// SPDX-License-Identifier: MIT
// ckptctl's errors: an exception with an enum ckpt_err code and a message,
// thrown by ckptctl itself or for a failed libckpt call (check, which takes
// the library's words from ckpt_last_error). Built on the public C ABI
// alone: libckpt's own C++ error type is internal to it.
#pragma once

#include <memory>
#include <stdexcept>
#include <string>
#include <utility>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "ckpt_admin.h"

namespace ckptctl {

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

// ret of a libckpt call: returned when not negative, else thrown with the
// library's message for it.
inline int check(int ret)
{
	if (ret < 0)
		throw Error(-ret, ckpt_last_error());
	return ret;
}

// A report a libckpt call returned as malloc'ed JSON text: f(char **).
template <typename F> nlohmann::json report(F &&f)
{
	char *text = nullptr;
	check(f(&text));
	const std::unique_ptr<char, decltype(&ckpt_free)> guard(text, ckpt_free);
	return nlohmann::json::parse(text);
}

} // namespace ckptctl
