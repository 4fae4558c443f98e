// SPDX-License-Identifier: MIT
// ckptctl's errors: libckpt's own (ckpt_error.hpp, a public header), thrown by
// ckptctl itself or for a failed libckpt call (ckpt::check).
#pragma once

#include <memory>

#include <nlohmann/json.hpp>

#include "ckpt.h"
#include "ckpt_error.hpp"

namespace ckptctl {

using ckpt::check;
using ckpt::Error;
using ckpt::fail;

// A report a libckpt call returned as malloc'ed JSON text: f(char **).
template <typename F> nlohmann::json report(F &&f)
{
	char *text = nullptr;
	check(f(&text));
	const std::unique_ptr<char, decltype(&ckpt_free)> guard(text, ckpt_free);
	return nlohmann::json::parse(text);
}

} // namespace ckptctl
