// SPDX-License-Identifier: MIT
#include "ckpttab.hpp"

#include <cctype>
#include <cerrno>
#include <charconv>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>

#include <fmt/format.h>

#include "dm.hpp"
#include "fail.hpp"

namespace ckptctl {

std::string canonical_uuid(const std::string &s)
{
	if (s.size() != 36)
		return "";
	std::string out;
	for (size_t i = 0; i < s.size(); i++) {
		const char c = s[i];
		if (i == 8 || i == 13 || i == 18 || i == 23) {
			if (c != '-')
				return "";
		} else if (!std::isxdigit(static_cast<unsigned char>(c))) {
			return "";
		}
		out += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
	}
	return out;
}

namespace {

uint32_t number(const std::string &where, const std::string &key, const std::string &v, uint32_t max)
{
	uint32_t n = 0;
	const auto [end, ec] = std::from_chars(v.data(), v.data() + v.size(), n);
	if (v.empty() || ec != std::errc() || end != v.data() + v.size() || n < 1 || n > max)
		fail(CKPT_E_INVAL, "{}: {}={}: not a number from 1 to {}", where, key, v, max);
	return n;
}

void parse_options(TabEntry &e, const std::string &where, const std::string &field)
{
	if (field == "-" || field == "defaults")
		return;
	std::set<std::string> seen;
	std::stringstream in(field);
	std::string opt;
	while (std::getline(in, opt, ',')) {
		const size_t eq = opt.find('=');
		const std::string key = opt.substr(0, eq);
		if (!seen.insert(key).second)
			fail(CKPT_E_INVAL, "{}: option '{}' given twice", where, key);
		if (eq == std::string::npos && key == "ro")
			e.read_only = true;
		else if (eq == std::string::npos && key == "noauto")
			e.noauto = true;
		else if (eq != std::string::npos && key == "queue_depth")
			e.queue_depth = number(where, key, opt.substr(eq + 1), 128);
		else if (eq != std::string::npos && key == "staging_kb")
			e.staging_kb = number(where, key, opt.substr(eq + 1), 4194304);
		else
			fail(CKPT_E_INVAL, "{}: unknown option '{}' (ro, noauto, queue_depth=N, staging_kb=K)", where,
			     opt);
	}
	if (field.empty() || field.back() == ',')
		fail(CKPT_E_INVAL, "{}: empty option in '{}'", where, field);
}

} // namespace

std::vector<TabEntry> parse_ckpttab(const std::string &text, const std::string &file)
{
	std::vector<TabEntry> out;
	std::set<std::string> names, uuids;
	std::map<std::string, std::string> paths;	// the path as resolved -> as first written
	std::stringstream in(text);
	std::string line;
	for (unsigned no = 1; std::getline(in, line); no++) {
		const std::string where = fmt::format("{}:{}", file, no);
		for (const char c : line)
			if (c != '\t' && !std::isprint(static_cast<unsigned char>(c)))
				fail(CKPT_E_INVAL, "{}: a control or non-ASCII byte (0x{:02x})", where,
				     static_cast<unsigned char>(c));
		std::stringstream fields(line);
		std::vector<std::string> f;
		for (std::string w; fields >> w;)
			f.push_back(w);
		if (f.empty() || f[0][0] == '#')
			continue;
		if (f.size() < 2 || f.size() > 3)
			fail(CKPT_E_INVAL, "{}: {} field{}; want NAME DEVICE [OPTIONS]", where, f.size(),
			     f.size() == 1 ? "" : "s");
		TabEntry e;
		e.line = no;
		e.name = f[0];
		try {
			dm::check_name(e.name);
		} catch (const Error &x) {
			fail(CKPT_E_INVAL, "{}: {}", where, x.what());
		}
		if (!names.insert(e.name).second)
			fail(CKPT_E_INVAL, "{}: the name {} is listed twice", where, e.name);
		const std::string &dev = f[1];
		if (dev.rfind("UUID=", 0) == 0) {
			e.uuid = canonical_uuid(dev.substr(5));
			if (e.uuid.empty())
				fail(CKPT_E_INVAL, "{}: '{}' is not UUID=xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx", where, dev);
			if (!uuids.insert(e.uuid).second)
				fail(CKPT_E_INVAL, "{}: the image {} is listed twice", where, e.uuid);
		} else if (dev[0] == '/') {
			e.path = dev;
			// One device, however it is spelled: symlinks (/dev/disk/by-id/...)
			// and '..' resolved as far as the path exists, the rest lexically.
			std::error_code ec;
			std::string key = std::filesystem::weakly_canonical(dev, ec).string();
			if (ec)
				key = std::filesystem::path(dev).lexically_normal().string();
			if (const auto [it, fresh] = paths.emplace(key, dev); !fresh)
				fail(CKPT_E_INVAL, "{}: the device {} is listed twice{}", where, dev,
				     it->second == dev ? "" : fmt::format(" (as {})", it->second));
		} else {
			fail(CKPT_E_INVAL, "{}: device '{}' is neither UUID=<image uuid> nor an absolute path", where,
			     dev);
		}
		if (f.size() == 3)
			parse_options(e, where, f[2]);
		out.push_back(e);
	}
	return out;
}

std::vector<TabEntry> read_ckpttab(const std::string &file)
{
	std::error_code ec;
	const auto st = std::filesystem::status(file, ec);
	if (ec)
		fail(CKPT_E_IO, "cannot read {}: {}", file, ec.message());
	if (!std::filesystem::is_regular_file(st))
		fail(CKPT_E_INVAL, "{} is not a regular file", file);
	if (std::filesystem::file_size(file, ec) > (1u << 20))
		fail(CKPT_E_INVAL, "{} is larger than 1 MiB: not a ckpttab", file);
	std::ifstream in(file, std::ios::binary);
	if (!in)
		fail(CKPT_E_IO, "cannot read {}: {}", file, std::strerror(errno));
	std::stringstream text;
	text << in.rdbuf();
	if (in.bad())
		fail(CKPT_E_IO, "cannot read {}: {}", file, std::strerror(errno));
	return parse_ckpttab(text.str(), file);
}

} // namespace ckptctl
