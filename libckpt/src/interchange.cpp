// SPDX-License-Identifier: MIT
#include "interchange.hpp"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <set>

#include <fmt/format.h>

#include "error.hpp"

extern "C" {
#include "ckpt_step.h"
}

namespace ckpt::interchange {

namespace {

const std::string pre = prefix;
const std::string tensor_pre = pre + "tensor_group.";
const std::string tensor_step_pre = pre + "tensor_step.";
const std::string group_pre = pre + "group.";
const char *const hparam_keys[] = {"lr", "beta1", "beta2", "eps", "weight_decay", "flags"};

std::string shown(const std::string &s)
{
	std::string out;
	for (unsigned char c : s.substr(0, 120))
		out += (c >= 0x20 && c < 0x7f) ? static_cast<char>(c) : '?';
	return s.size() > 120 ? out + "..." : out;
}

struct Parser {
	const std::string &what;

	[[noreturn]] void bad(const std::string &key, const std::string &why) const
	{
		fail(CKPT_E_INVAL, "{}: __metadata__ {}: {}", what, shown(key), why);
	}

	// A decimal integer as written here: digits only, no sign, no leading zero.
	uint64_t uint(const std::string &key, const std::string &v, uint64_t max) const
	{
		uint64_t n = 0;
		bool ok = !v.empty() && v.size() <= 20 && (v.size() == 1 || v[0] != '0');
		for (char c : v) {
			if (!ok || c < '0' || c > '9' || __builtin_mul_overflow(n, 10, &n) ||
			    __builtin_add_overflow(n, static_cast<uint64_t>(c - '0'), &n)) {
				ok = false;
				break;
			}
		}
		if (!ok || n > max)
			bad(key, fmt::format("'{}' is not an integer from 0 to {}", shown(v), max));
		return n;
	}

	// An optional key of two values: false for the first (also when absent),
	// true for the second.
	bool choice(const std::string &key, std::map<std::string, const std::string *> &scalars, const char *no,
		    const char *yes) const
	{
		const auto it = scalars.find(key.substr(pre.size()));
		if (it == scalars.end() || *it->second == no)
			return false;
		if (*it->second != yes)
			bad(key, fmt::format("'{}' is not {} or {}", shown(*it->second), no, yes));
		return true;
	}

	double real(const std::string &key, const std::string &v) const
	{
		char *end = nullptr;
		errno = 0;
		// Decimal only: strtod would also take spaces, hex, "inf" and "nan".
		const bool decimal = !v.empty() && v.find_first_not_of("0123456789+-.eE") == std::string::npos;
		const double d = decimal ? strtod(v.c_str(), &end) : NAN;
		if (!end || *end || errno == ERANGE || !std::isfinite(d))
			bad(key, fmt::format("'{}' is not a finite number", shown(v)));
		return d;
	}
};

} // namespace

void write(const Metadata &m, std::map<std::string, std::string> &meta)
{
	meta[pre + "format_version"] = std::to_string(CKPT_FORMAT_VERSION);
	meta[pre + "dtype"] = ckpt_dtype_name(m.dtype);
	meta[pre + "chunk_params"] = std::to_string(m.chunk_params);
	meta[pre + "step"] = std::to_string(m.step);
	meta[pre + "n_groups"] = std::to_string(m.n_groups);
	meta[pre + "state"] = m.q8 ? "8bit" : "fp32";
	meta[pre + "master"] = m.bf16_master ? "bf16" : "fp32";
	for (const auto &[name, g] : m.tensor_group)
		meta[tensor_pre + name] = std::to_string(g);
	for (const auto &[name, n] : m.tensor_step)
		meta[tensor_step_pre + name] = std::to_string(n);
	for (size_t g = 0; g < m.hparams.size(); g++) {
		const GroupHparams &h = m.hparams[g];
		const std::string k = fmt::format("{}{}.", group_pre, g);
		// {} is the shortest text that reads back as the same double.
		meta[k + "lr"] = fmt::format("{}", h.lr);
		meta[k + "beta1"] = fmt::format("{}", h.beta1);
		meta[k + "beta2"] = fmt::format("{}", h.beta2);
		meta[k + "eps"] = fmt::format("{}", h.eps);
		meta[k + "weight_decay"] = fmt::format("{}", h.weight_decay);
		meta[k + "flags"] = std::to_string(h.adam_l2 ? CKPT_GROUP_ADAM_L2 : 0);
	}
}

std::optional<Metadata> read(const std::map<std::string, std::string> &meta, const std::string &what)
{
	const Parser p{what};
	Metadata m;
	std::map<std::string, const std::string *> scalars;	// format_version, dtype, ...
	std::map<uint64_t, std::map<std::string, const std::string *>> groups;
	std::map<std::string, const std::string *> tensor_steps;
	bool any = false;
	for (const auto &[key, value] : meta) {
		if (key.compare(0, pre.size(), pre) != 0)
			continue;
		any = true;
		const std::string rest = key.substr(pre.size());
		if (key.compare(0, tensor_pre.size(), tensor_pre) == 0) {
			const std::string name = key.substr(tensor_pre.size());
			if (name.empty())
				p.bad(key, "no tensor name after the prefix");
			m.tensor_group[name] = static_cast<uint32_t>(p.uint(key, value, CKPT_MAX_GROUPS - 1));
		} else if (key.compare(0, tensor_step_pre.size(), tensor_step_pre) == 0) {
			tensor_steps[key.substr(tensor_step_pre.size())] = &value;
		} else if (key.compare(0, group_pre.size(), group_pre) == 0) {
			const std::string g = key.substr(group_pre.size());
			const size_t dot = g.find('.');
			const std::string field = dot == std::string::npos ? "" : g.substr(dot + 1);
			if (std::find(std::begin(hparam_keys), std::end(hparam_keys), field) == std::end(hparam_keys))
				p.bad(key, fmt::format("unknown key: a group's keys are {}.G.lr, .beta1, .beta2, .eps, "
						       ".weight_decay and .flags", group_pre.substr(0, group_pre.size() - 1)));
			groups[p.uint(key, g.substr(0, dot), CKPT_MAX_GROUPS - 1)][field] = &value;
		} else if (rest == "format_version" || rest == "dtype" || rest == "chunk_params" || rest == "step" ||
			   rest == "n_groups" || rest == "state" || rest == "master") {
			scalars[rest] = &value;
		} else {
			p.bad(key, "unknown dm-ckpt key");
		}
	}
	if (!any)
		return std::nullopt;
	for (const char *k : {"format_version", "dtype", "chunk_params", "step", "n_groups"})
		if (!scalars.count(k))
			fail(CKPT_E_INVAL, "{}: __metadata__ has dm-ckpt keys but no {}{}", what, pre, k);
	const std::string version = pre + "format_version";
	if (p.uint(version, *scalars["format_version"], UINT32_MAX) != CKPT_FORMAT_VERSION)
		p.bad(version, fmt::format("version {} is not the one this library reads ({})",
					   shown(*scalars["format_version"]), CKPT_FORMAT_VERSION));
	const int dt = ckpt_dtype_parse(scalars["dtype"]->c_str());
	if (dt < 0)
		p.bad(pre + "dtype", fmt::format("'{}' is not bf16 or fp16", shown(*scalars["dtype"])));
	m.dtype = static_cast<uint32_t>(dt);
	const uint64_t cp = p.uint(pre + "chunk_params", *scalars["chunk_params"], UINT32_MAX);
	if (cp & (cp - 1) || cp < (1u << CKPT_MIN_CHUNK_SHIFT) || cp > (1u << CKPT_MAX_CHUNK_SHIFT))
		p.bad(pre + "chunk_params", fmt::format("{} is not a power of two from {} to {}", cp,
							1u << CKPT_MIN_CHUNK_SHIFT, 1u << CKPT_MAX_CHUNK_SHIFT));
	m.chunk_params = static_cast<uint32_t>(cp);
	m.step = p.uint(pre + "step", *scalars["step"], CKPT_STEP_MAX);
	m.n_groups = static_cast<uint32_t>(p.uint(pre + "n_groups", *scalars["n_groups"], CKPT_MAX_GROUPS));
	if (m.n_groups == 0)
		p.bad(pre + "n_groups", "must be at least 1");
	m.q8 = p.choice(pre + "state", scalars, "fp32", "8bit");
	m.bf16_master = p.choice(pre + "master", scalars, "fp32", "bf16");
	// the one combination the update implements (format refuses the others)
	if (m.bf16_master && (!m.q8 || m.dtype != CKPT_DTYPE_BF16))
		p.bad(pre + "master", "bf16 masters come only with dm-ckpt.state 8bit and dm-ckpt.dtype bf16");
	if (m.tensor_group.empty())
		fail(CKPT_E_INVAL, "{}: __metadata__ has dm-ckpt keys but no {}NAME (each tensor's group)", what,
		     tensor_pre);
	uint32_t top = 0;
	for (const auto &[name, g] : m.tensor_group) {
		if (g >= m.n_groups)
			p.bad(tensor_pre + name, fmt::format("group {} is not below {}n_groups {}", g, pre, m.n_groups));
		top = std::max(top, g);
	}
	if (top + 1 != m.n_groups)
		fail(CKPT_E_INVAL, "{}: __metadata__ {}n_groups is {}, but the tensors use groups 0 to {}", what, pre,
		     m.n_groups, top);
	for (const auto &[name, value] : tensor_steps) {
		const std::string key = tensor_step_pre + name;
		if (!m.tensor_group.count(name))
			p.bad(key, fmt::format("names no tensor of {}NAME", tensor_pre));
		const uint64_t n = p.uint(key, *value, m.step);	// a tensor cannot be ahead of the step
		if (n != m.step)	// written only where it lags
			m.tensor_step[name] = n;
	}
	if (groups.empty())
		return m;
	for (uint32_t g = 0; g < m.n_groups; g++) {
		auto it = groups.find(g);
		if (it == groups.end())
			fail(CKPT_E_INVAL, "{}: __metadata__ has hyperparameters for some groups but not for group {}",
			     what, g);
		for (const char *f : hparam_keys)
			if (!it->second.count(f))
				fail(CKPT_E_INVAL, "{}: __metadata__ has no {}{}.{}", what, group_pre, g, f);
	}
	if (groups.rbegin()->first >= m.n_groups)
		p.bad(fmt::format("{}{}", group_pre, groups.rbegin()->first),
		      fmt::format("group {} is not below {}n_groups {}", groups.rbegin()->first, pre, m.n_groups));
	for (const auto &[g, f] : groups) {
		const std::string k = fmt::format("{}{}.", group_pre, g);
		GroupHparams h;
		h.lr = p.real(k + "lr", *f.at("lr"));
		h.beta1 = p.real(k + "beta1", *f.at("beta1"));
		h.beta2 = p.real(k + "beta2", *f.at("beta2"));
		h.eps = p.real(k + "eps", *f.at("eps"));
		h.weight_decay = p.real(k + "weight_decay", *f.at("weight_decay"));
		const uint64_t flags = p.uint(k + "flags", *f.at("flags"), UINT32_MAX);
		if (flags & ~uint64_t{CKPT_GROUP_ADAM_L2})
			p.bad(k + "flags", fmt::format("{} has unknown bits (known: {} for Adam with L2)", flags,
						       CKPT_GROUP_ADAM_L2));
		h.adam_l2 = flags != 0;
		try {
			check_hparams(h, fmt::format("{}: __metadata__ group {}", what, g));
		} catch (const Error &e) {
			fail(CKPT_E_INVAL, "{}", e.what());
		}
		m.hparams.push_back(h);
	}
	return m;
}

} // namespace ckpt::interchange
