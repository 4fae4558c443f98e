// SPDX-License-Identifier: MIT
#include "tenant_table.hpp"

#include <algorithm>
#include <cctype>
#include <climits>
#include <cstdint>
#include <set>

#include <nlohmann/json.hpp>

using nlohmann::json;

namespace ckptctl {

namespace {

// As ckpt_uuid_string writes one: 8-4-4-4-12 lowercase hex digits.
bool valid_uuid(const std::string &u)
{
	if (u.size() != 36)
		return false;
	for (size_t i = 0; i < u.size(); i++) {
		const bool dash = i == 8 || i == 13 || i == 18 || i == 23;
		if (dash ? u[i] != '-' : !(std::isdigit(static_cast<unsigned char>(u[i])) || (u[i] >= 'a' && u[i] <= 'f')))
			return false;
	}
	return true;
}

bool sound(const Table &t, uint64_t drive_bytes)
{
	if (!valid_uuid(t.uuid) || !t.read_bps != !t.write_bps)
		return false;
	const uint64_t end = drive_bytes / kMiB * kMiB;
	std::set<std::string> names;
	std::vector<std::pair<uint64_t, uint64_t>> extents;
	for (const Tenant &x : t.tenants) {
		if (!valid_tenant_name(x.name) || !names.insert(x.name).second || !valid_uuid(x.uuid) ||
		    x.weight < kMinWeight)
			return false;
		if (x.start % kMiB || x.bytes % kMiB || x.bytes == 0 || x.start < kTableBytes || x.start > end ||
		    x.bytes > end - x.start)
			return false;
		extents.push_back({x.start, x.start + x.bytes});
	}
	std::sort(extents.begin(), extents.end());
	for (size_t i = 1; i < extents.size(); i++)
		if (extents[i].first < extents[i - 1].second)
			return false;
	return true;
}

} // namespace

bool valid_tenant_name(const std::string &name)
{
	return !name.empty() && name.size() <= 64 && std::all_of(name.begin(), name.end(), [](char c) {
		return std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_';
	});
}

std::string table_json(const Table &t)
{
	json j{{"uuid", t.uuid}, {"read_bps", t.read_bps}, {"write_bps", t.write_bps}, {"tenants", json::array()}};
	for (const Tenant &x : t.tenants)
		j["tenants"].push_back({{"name", x.name}, {"uuid", x.uuid}, {"start", x.start}, {"bytes", x.bytes},
					{"uid", x.uid}, {"gid", x.gid}, {"weight", x.weight}, {"max_bps", x.max_bps}});
	return j.dump();
}

std::optional<Table> parse_table(const std::string &text, uint64_t drive_bytes)
{
	struct Unsound {};
	// o's member key: an unsigned integer no larger than max (json would
	// cast a negative or larger one), or dflt where it may be missing
	const auto number = [](const json &o, const char *key, uint64_t max, std::optional<uint64_t> dflt = {}) {
		if (dflt && !o.contains(key))
			return *dflt;
		const json &v = o.at(key);
		if (!v.is_number_unsigned() || v.get<uint64_t>() > max)
			throw Unsound{};
		return v.get<uint64_t>();
	};
	const json j = json::parse(text, nullptr, false);
	Table t;
	try {
		// read_bps, write_bps, weight and max_bps came with the shares: optional
		t.uuid = j.at("uuid").get<std::string>();
		t.read_bps = number(j, "read_bps", kMaxBps, 0);
		t.write_bps = number(j, "write_bps", kMaxBps, 0);
		for (const json &x : j.at("tenants"))
			t.tenants.push_back({x.at("name").get<std::string>(), x.at("uuid").get<std::string>(),
					     number(x, "start", UINT64_MAX), number(x, "bytes", UINT64_MAX),
					     static_cast<uint32_t>(number(x, "uid", UINT32_MAX)),
					     static_cast<uint32_t>(number(x, "gid", UINT32_MAX)),
					     static_cast<uint32_t>(number(x, "weight", kMaxWeight, kDefaultWeight)),
					     number(x, "max_bps", kMaxBps, 0)});
	} catch (const json::exception &) {
		return std::nullopt;
	} catch (const Unsound &) {
		return std::nullopt;
	}
	if (!sound(t, drive_bytes))
		return std::nullopt;
	return t;
}

} // namespace ckptctl
