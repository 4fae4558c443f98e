// SPDX-License-Identifier: MIT
// ckptctl's tenant table as read from a drive: what ckptctl writes comes back
// whole, and every table that is not sound is refused, whatever its checksum
// says (its names become cgroup directories, device-mapper names and metric
// labels; its extents device-mapper tables).
#include <functional>

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "tenant_table.hpp"

using nlohmann::json;
using namespace ckptctl;

namespace {

constexpr uint64_t kDrive = 64 * kMiB + 4096;	// a drive of 64 MiB and a bit
const char *kUuid = "0f1e2d3c-4b5a-4968-8776-a5b4c3d2e1f0";

Table two_tenants()
{
	Table t;
	t.uuid = kUuid;
	t.read_bps = 3000000000;
	t.write_bps = 2000000000;
	t.tenants.push_back({"job-42", "11111111-2222-4333-8444-555555555555", kMiB, 8 * kMiB, 1001, 1001, 300, 0});
	t.tenants.push_back({"job_43", "66666666-7777-4888-9999-aaaaaaaaaaaa", 20 * kMiB, 44 * kMiB, 1002, 100, 100,
			     500000000});
	return t;
}

// The table's JSON with one edit.
std::string edited(const std::function<void(json &)> &edit)
{
	json j = json::parse(table_json(two_tenants()));
	edit(j);
	return j.dump();
}

} // namespace

TEST(TenantTable, WhatIsWrittenIsReadBack)
{
	const auto t = parse_table(table_json(two_tenants()), kDrive);
	ASSERT_TRUE(t);
	const Table want = two_tenants();
	EXPECT_EQ(t->uuid, want.uuid);
	EXPECT_EQ(t->read_bps, want.read_bps);
	EXPECT_EQ(t->write_bps, want.write_bps);
	ASSERT_EQ(t->tenants.size(), 2u);
	for (size_t i = 0; i < 2; i++) {
		const Tenant &a = t->tenants[i], &b = want.tenants[i];
		EXPECT_EQ(a.name, b.name);
		EXPECT_EQ(a.uuid, b.uuid);
		EXPECT_EQ(a.start, b.start);
		EXPECT_EQ(a.bytes, b.bytes);
		EXPECT_EQ(a.uid, b.uid);
		EXPECT_EQ(a.gid, b.gid);
		EXPECT_EQ(a.weight, b.weight);
		EXPECT_EQ(a.max_bps, b.max_bps);
	}
}

TEST(TenantTable, ATableFromBeforeTheSharesReadsWithDefaults)
{
	const auto t = parse_table(edited([](json &j) {
		j.erase("read_bps");
		j.erase("write_bps");
		for (json &x : j["tenants"]) {
			x.erase("weight");
			x.erase("max_bps");
		}
	}), kDrive);
	ASSERT_TRUE(t);
	EXPECT_EQ(t->read_bps, 0u);
	EXPECT_EQ(t->tenants[0].weight, kDefaultWeight);
	EXPECT_EQ(t->tenants[1].max_bps, 0u);
	EXPECT_TRUE(parse_table(R"({"uuid":"0f1e2d3c-4b5a-4968-8776-a5b4c3d2e1f0","tenants":[]})", kDrive));
}

TEST(TenantTable, UnsoundTablesAreRefused)
{
	const std::vector<std::pair<const char *, std::function<void(json &)>>> cases = {
		{"a name that climbs out of the cgroup", [](json &j) { j["tenants"][0]["name"] = ".."; }},
		{"a name with a slash", [](json &j) { j["tenants"][0]["name"] = "a/b"; }},
		{"a name that would forge a metric", [](json &j) { j["tenants"][0]["name"] = "a\"} 1\nx{"; }},
		{"an empty name", [](json &j) { j["tenants"][0]["name"] = ""; }},
		{"a name of 65 characters", [](json &j) { j["tenants"][0]["name"] = std::string(65, 'a'); }},
		{"a name twice", [](json &j) { j["tenants"][1]["name"] = "job-42"; }},
		{"a tenant uuid not made by ckptctl", [](json &j) { j["tenants"][1]["uuid"] = "x"; }},
		{"an uppercase uuid", [](json &j) { j["tenants"][1]["uuid"] = "66666666-7777-4888-9999-AAAAAAAAAAAA"; }},
		{"the drive's uuid missing", [](json &j) { j.erase("uuid"); }},
		{"an extent in the table's MiB", [](json &j) { j["tenants"][0]["start"] = 0; }},
		{"an extent not of whole MiB", [](json &j) { j["tenants"][0]["start"] = kMiB + 4096; }},
		{"a size not of whole MiB", [](json &j) { j["tenants"][0]["bytes"] = kMiB + 512; }},
		{"an empty extent", [](json &j) { j["tenants"][0]["bytes"] = 0; }},
		{"an extent past the drive", [](json &j) { j["tenants"][1]["bytes"] = 45 * kMiB; }},
		{"an extent that wraps", [](json &j) { j["tenants"][1]["bytes"] = UINT64_MAX - 20 * kMiB + 1; }},
		{"two extents that overlap", [](json &j) { j["tenants"][1]["start"] = 8 * kMiB; }},
		{"a negative start", [](json &j) { j["tenants"][1]["start"] = -1; }},
		{"a start as a fraction", [](json &j) { j["tenants"][1]["start"] = 20.5 * kMiB; }},
		{"a start as text", [](json &j) { j["tenants"][1]["start"] = "20971520"; }},
		{"a uid past 32 bits", [](json &j) { j["tenants"][0]["uid"] = uint64_t{1} << 32; }},
		{"a negative gid", [](json &j) { j["tenants"][0]["gid"] = -1; }},
		{"weight 0", [](json &j) { j["tenants"][0]["weight"] = 0; }},
		{"weight 10001", [](json &j) { j["tenants"][0]["weight"] = 10001; }},
		{"a weight past 32 bits that would wrap to 100", [](json &j) {
			 j["tenants"][0]["weight"] = (uint64_t{1} << 32) + 100; }},
		{"a cap beyond the largest", [](json &j) { j["tenants"][1]["max_bps"] = kMaxBps + 1; }},
		{"a drive bandwidth beyond the largest", [](json &j) { j["read_bps"] = kMaxBps + 1; }},
		{"a read bandwidth without a write one", [](json &j) { j["write_bps"] = 0; }},
		{"tenants not a list", [](json &j) { j["tenants"] = 7; }},
		{"a tenant not an object", [](json &j) { j["tenants"][0] = "job"; }},
		{"a tenant without its owner", [](json &j) { j["tenants"][0].erase("uid"); }},
	};
	for (const auto &[what, edit] : cases)
		EXPECT_FALSE(parse_table(edited(edit), kDrive)) << what;
	EXPECT_FALSE(parse_table("not json", kDrive));
	EXPECT_FALSE(parse_table("[]", kDrive));
	EXPECT_FALSE(parse_table(table_json(two_tenants()), 63 * kMiB)) << "a drive smaller than its tenants";
}

TEST(TenantTable, Names)
{
	EXPECT_TRUE(valid_tenant_name("job-42_a"));
	EXPECT_TRUE(valid_tenant_name(std::string(64, 'z')));
	for (const char *bad : {"", ".", "..", "a.b", "a b", "a/b", "é", "a\n"})
		EXPECT_FALSE(valid_tenant_name(bad)) << bad;
}
