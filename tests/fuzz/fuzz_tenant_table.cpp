// SPDX-License-Identifier: MIT
// ckptctl's tenant table as read from a drive (parse_table, tools/ckptctl/
// tenant_table.cpp). Input: the drive's size (8 bytes, little-endian), then
// the JSON of a copy. A table accepted is sound (names, uuids, weights,
// extents of whole MiB after the table, inside the drive, apart) and reads
// back the same from what ckptctl would write for it.
#include <algorithm>
#include <string>

#include "fuzz_util.hpp"
#include "tenant_table.hpp"

using namespace ckptctl;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	if (size > 65536)
		return 0;
	size_t pos = 0;
	const std::vector<uint8_t> head = fuzz::take(data, size, pos, 8);
	uint64_t drive = 0;
	for (int i = 7; i >= 0; i--)
		drive = drive << 8 | head[i];
	const std::string text(reinterpret_cast<const char *>(data) + std::min(pos, size), size - std::min(pos, size));
	const auto t = parse_table(text, drive);
	if (!t)
		return 0;
	std::vector<std::pair<uint64_t, uint64_t>> extents;
	for (const Tenant &x : t->tenants) {
		FUZZ_ASSERT(valid_tenant_name(x.name) && x.uuid.size() == 36);
		FUZZ_ASSERT(x.weight >= kMinWeight && x.weight <= kMaxWeight && x.max_bps <= kMaxBps);
		FUZZ_ASSERT(x.start >= kTableBytes && x.start % kMiB == 0 && x.bytes % kMiB == 0 && x.bytes > 0);
		FUZZ_ASSERT(x.start + x.bytes > x.start && x.start + x.bytes <= drive);
		extents.push_back({x.start, x.start + x.bytes});
	}
	std::sort(extents.begin(), extents.end());
	for (size_t i = 1; i < extents.size(); i++)
		FUZZ_ASSERT(extents[i].first >= extents[i - 1].second);
	const auto again = parse_table(table_json(*t), drive);
	FUZZ_ASSERT(again && table_json(*again) == table_json(*t));
	return 0;
}
