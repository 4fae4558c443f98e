// SPDX-License-Identifier: MIT
// The tensor manifests' JSON (layout.cpp): the user's layout for ckptctl
// format --manifest, and the manifest read back from a device. Numbers must
// be JSON integers in range: nlohmann's get<unsigned>() would convert 1.5 to
// 1, wrap -1 or 2^32 + 4096, and a float beyond the range is undefined
// behaviour (found by tests/fuzz's manifest target).
#include <gtest/gtest.h>

#include <string>

#include "ckpt_error.hpp"
#include "layout.hpp"

namespace {

// The error code and message of parse_layout_json on text, or 0 and "".
std::pair<int, std::string> layout_error(const std::string &text)
{
	try {
		ckpt::parse_layout_json(text, "m.json");
	} catch (const ckpt::Error &e) {
		return {e.code(), e.what()};
	}
	return {0, ""};
}

std::string user(const std::string &chunk_params, const std::string &shape, const std::string &group)
{
	return R"({"dtype": "bf16", "chunk_params": )" + chunk_params + R"(, "tensors": [{"name": "w", "shape": )" +
	       shape + R"(, "group": )" + group + "}]}";
}

TEST(LayoutJson, ValidLayout)
{
	const ckpt::LayoutFile f = ckpt::parse_layout_json(user("4096", "[64, 64]", "1"), "m.json");
	EXPECT_EQ(f.chunk_params, 4096u);
	EXPECT_EQ(f.dtype, "bf16");
	const auto p = f.layout.place(12, CKPT_DTYPE_BF16);
	ASSERT_EQ(p.tensors.size(), 1u);
	EXPECT_EQ(p.tensors[0].numel, 4096u);
	EXPECT_EQ(p.tensors[0].group, 1u);
}

TEST(LayoutJson, NumbersMustBeIntegersInRange)
{
	const struct {
		std::string text, says;
	} cases[] = {
		{user("1e30", "[64]", "0"), "chunk_params must be an integer from 0 to 4294967295, not 1e+30"},
		{user("4294971392", "[64]", "0"), "chunk_params must be an integer"},
		{user("4096.5", "[64]", "0"), "chunk_params must be an integer"},
		{user("-4096", "[64]", "0"), "chunk_params must be an integer"},
		{user("4096", "[1.5]", "0"), "tensor 'w': a shape dimension must be an integer"},
		{user("4096", "[-1]", "0"), "tensor 'w': a shape dimension must be an integer"},
		{user("4096", "[1e300]", "0"), "tensor 'w': a shape dimension must be an integer"},
		{user("4096", "64", "0"), "tensor 'w': shape must be an array"},
		{user("4096", "[64]", "-1"), "tensor 'w': group must be an integer"},
		{user("4096", "[64]", "0.5"), "tensor 'w': group must be an integer"},
		{user("4096", "[64]", "4294967296"), "tensor 'w': group must be an integer"},
	};
	for (const auto &c : cases) {
		const auto [code, what] = layout_error(c.text);
		EXPECT_EQ(code, CKPT_E_MANIFEST) << c.text;
		EXPECT_NE(what.find(c.says), std::string::npos) << c.text << "\n" << what;
		EXPECT_EQ(what.rfind("m.json: ", 0), 0u) << what;
	}
}

// A device's manifest: one tensor of 4096 params in 2 chunks of 2048.
struct Device {
	ckpt_geometry geo{};
	ckpt_layout l{};
	std::vector<uint8_t> table{0, 0};
	Device()
	{
		geo.n_chunks = 2;
		geo.chunk_shift = CKPT_MIN_CHUNK_SHIFT;
		geo.n_groups = 1;
		geo.dtype = CKPT_DTYPE_BF16;
		geo.optimizer = CKPT_OPT_ADAM;
		geo.manifest_bytes = CKPT_BLOCK;
		EXPECT_EQ(ckpt_layout_compute(&geo, &l), 0);
	}
	std::string manifest(const std::string &offset, const std::string &numel, const std::string &group = "0")
	{
		return R"({"format": "dm-ckpt-manifest", "version": 1, "dtype": "bf16", "chunk_params": 2048, )"
		       R"("tensors": [{"name": "w", "shape": [4096], "group": )" +
		       group + R"(, "offset": )" + offset + R"(, "numel": )" + numel + "}]}";
	}
};

TEST(ManifestJson, NumbersMustBeIntegersInRange)
{
	Device d;
	const ckpt::Manifest m = ckpt::Manifest::decode(d.manifest("0", "4096"), d.l, d.geo, d.table);
	EXPECT_EQ(m.find("w").extent, 4096u);
	const struct {
		std::string text, says;
	} cases[] = {
		{d.manifest("0.5", "4096"), "offset must be an integer"},
		{d.manifest("1e30", "4096"), "offset must be an integer"},
		{d.manifest("-0", "4096"), "offset must be an integer"},
		{d.manifest("0", "4096.0"), "numel must be an integer"},
		{d.manifest("0", "4096", "0.0"), "group must be an integer"},
		{d.manifest("0", "4096", "4294967296"), "group must be an integer"},
	};
	for (const auto &c : cases) {
		try {
			ckpt::Manifest::decode(c.text, d.l, d.geo, d.table);
			ADD_FAILURE() << "accepted: " << c.text;
		} catch (const ckpt::Error &e) {
			EXPECT_EQ(e.code(), CKPT_E_MANIFEST);
			EXPECT_NE(std::string(e.what()).find(c.says), std::string::npos) << c.text << "\n" << e.what();
		}
	}
}

} // namespace
