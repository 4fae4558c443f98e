// SPDX-License-Identifier: MIT
// The tensor manifests' JSON (manifest.cpp): the user's layout for ckptctl
// format --manifest, and the manifest read back from a device. Numbers must
// be JSON integers in range: nlohmann's get<unsigned>() would convert 1.5 to
// 1, wrap -1 or 2^32 + 4096, and a float beyond the range is undefined
// behaviour (found by tests/fuzz's manifest target).
#include <gtest/gtest.h>

#include <string>

#include "error.hpp"
#include "manifest.hpp"

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
		{user("1e30", "[64]", "0"), "$.chunk_params: must be an integer from 0 to 4294967295, not 1e+30"},
		{user("4294971392", "[64]", "0"), "$.chunk_params: must be an integer"},
		{user("4096.5", "[64]", "0"), "$.chunk_params: must be an integer"},
		{user("-4096", "[64]", "0"), "$.chunk_params: must be an integer"},
		{user("4096", "[1.5]", "0"), "tensor 'w': $.tensors[0].shape[0]: must be an integer"},
		{user("4096", "[64, -1]", "0"), "tensor 'w': $.tensors[0].shape[1]: must be an integer"},
		{user("4096", "[1e300]", "0"), "tensor 'w': $.tensors[0].shape[0]: must be an integer"},
		{user("4096", "64", "0"), "tensor 'w': $.tensors[0].shape: must be an array"},
		{user("4096", "[64]", "-1"), "tensor 'w': $.tensors[0].group: must be an integer"},
		{user("4096", "[64]", "0.5"), "tensor 'w': $.tensors[0].group: must be an integer"},
		{user("4096", "[64]", "4294967296"), "tensor 'w': $.tensors[0].group: must be an integer"},
	};
	for (const auto &c : cases) {
		const auto [code, what] = layout_error(c.text);
		EXPECT_EQ(code, CKPT_E_MANIFEST) << c.text;
		EXPECT_NE(what.find(c.says), std::string::npos) << c.text << "\n" << what;
		EXPECT_EQ(what.rfind("m.json: ", 0), 0u) << what;
	}
}

// Every key is known, every required key is there, every value has its
// type; the message names the key and its JSON path, in the project's
// words (nlohmann's exception texts were passed through before).
TEST(LayoutJson, StrictKeysAndTypes)
{
	const struct {
		std::string text, says;
	} cases[] = {
		{R"({"dtype": "bf16", "chunk_param": 4096, "tensors": [{"name": "w", "shape": [64]}]})",
		 "m.json: $.chunk_param: unknown key 'chunk_param' (known keys here: dtype, chunk_params, tensors, groups)"},
		{R"({"tensors": [{"name": "w", "shape": [64]}, {"name": "b", "shpe": [64]}]})",
		 "m.json: $.tensors[1].shpe: unknown key 'shpe' (known keys here: name, shape, group)"},
		{R"({"tensors": [{"name": "w", "shape": [64], "a b": 1}]})", "m.json: $.tensors[0][\"a b\"]: unknown key 'a b'"},
		{R"({"tensors": [{"name": "w"}]})", "m.json: tensor 'w': $.tensors[0]: missing key 'shape'"},
		{R"({"tensors": [{"shape": [64]}]})", "m.json: $.tensors[0]: missing key 'name'"},
		{R"({"dtype": "bf16"})", "m.json: $: missing key 'tensors'"},
		{R"({"tensors": [{"name": 5, "shape": [64]}]})", "m.json: $.tensors[0].name: must be a string, not 5"},
		{R"({"dtype": 16, "tensors": [{"name": "w", "shape": [64]}]})", "m.json: $.dtype: must be a string, not 16"},
		{R"({"tensors": {"name": "w"}})", "m.json: $.tensors: must be a non-empty array of tensors"},
		{R"({"tensors": []})", "m.json: $.tensors: must be a non-empty array of tensors, not []"},
		{R"({"tensors": ["w"]})", "m.json: $.tensors[0]: must be an object, not \"w\""},
		{R"([1])", "m.json: not a JSON object"},
	};
	for (const auto &c : cases) {
		const auto [code, what] = layout_error(c.text);
		EXPECT_EQ(code, CKPT_E_MANIFEST) << c.text;
		EXPECT_NE(what.find(c.says), std::string::npos) << c.text << "\n" << what;
		EXPECT_EQ(what.find("json.exception"), std::string::npos) << what;
	}
}

// A device's manifest: one tensor of 4096 params in 2 chunks of 2048.
struct Device {
	ckpt_geometry geo{};
	ckpt_regions l{};
	std::vector<uint8_t> table{0, 0};
	Device()
	{
		geo.n_chunks = 2;
		geo.chunk_shift = CKPT_MIN_CHUNK_SHIFT;
		geo.n_groups = 1;
		geo.dtype = CKPT_DTYPE_BF16;
		geo.optimizer = CKPT_OPT_ADAM;
		geo.manifest_bytes = CKPT_BLOCK;
		EXPECT_EQ(ckpt_regions_compute(&geo, &l), 0);
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
		{d.manifest("0.5", "4096"), "$.tensors[0].offset: must be an integer"},
		{d.manifest("1e30", "4096"), "$.tensors[0].offset: must be an integer"},
		{d.manifest("-0", "4096"), "$.tensors[0].offset: must be an integer"},
		{d.manifest("0", "4096.0"), "$.tensors[0].numel: must be an integer"},
		{d.manifest("0", "4096", "0.0"), "$.tensors[0].group: must be an integer"},
		{d.manifest("0", "4096", "4294967296"), "$.tensors[0].group: must be an integer"},
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

TEST(ManifestJson, StrictKeysAndTypes)
{
	Device d;
	std::string extra = d.manifest("0", "4096");
	extra.insert(extra.find("\"offset\""), "\"stride\": 1, ");
	std::string missing = d.manifest("0", "4096");
	missing.erase(missing.find(", \"numel\""), 15);
	std::string top = d.manifest("0", "4096");
	top.insert(1, "\"comment\": \"x\", ");
	std::string version = d.manifest("0", "4096");
	version.replace(version.find("\"version\": 1"), 12, "\"version\": \"1\"");
	const struct {
		std::string text, says;
	} cases[] = {
		{extra, "tensor manifest: $.tensors[0].stride: unknown key 'stride'"},
		{missing, "tensor manifest: $.tensors[0]: missing key 'numel'"},
		{top, "tensor manifest: $.comment: unknown key 'comment'"},
		{version, "tensor manifest: $.version: must be an integer from 0 to 4294967295, not \"1\""},
	};
	for (const auto &c : cases) {
		try {
			ckpt::Manifest::decode(c.text, d.l, d.geo, d.table);
			ADD_FAILURE() << "accepted: " << c.text;
		} catch (const ckpt::Error &e) {
			EXPECT_EQ(e.code(), CKPT_E_MANIFEST);
			EXPECT_NE(std::string(e.what()).find(c.says), std::string::npos) << c.text << "\n" << e.what();
			EXPECT_EQ(std::string(e.what()).find("json.exception"), std::string::npos) << e.what();
		}
	}
}

// A rank's share: a piece of a param cut by a sharded run and the share's
// record; what a hostile manifest says about them is checked against the
// tensor it describes.
TEST(ManifestJson, PieceAndShardRecords)
{
	Device d;
	auto share = [&](const std::string &name, const std::string &piece, const std::string &shard) {
		return R"({"format": "dm-ckpt-manifest", "version": 1, "dtype": "bf16", "chunk_params": 2048, )"
		       R"("tensors": [{"name": ")" + name + R"(", "shape": [4096], "group": 0, "offset": 0, )"
		       R"("numel": 4096, "piece": )" + piece + "}], \"shard\": " + shard + "}";
	};
	const std::string piece = R"({"param": "w", "shape": [64, 128], "begin": 2048})";
	const std::string shard = R"({"rank": 1, "world": 2, "rule": 2, "params": 8192, "digest": 7})";
	const ckpt::Manifest m = ckpt::Manifest::decode(share("w[2048:6144]", piece, shard), d.l, d.geo, d.table);
	ASSERT_TRUE(m.find("w[2048:6144]").piece);
	EXPECT_EQ(m.find("w[2048:6144]").piece->shape, (std::vector<uint64_t>{64, 128}));
	ASSERT_TRUE(m.shard());
	EXPECT_EQ(m.shard()->rank, 1u);
	const struct {
		std::string text, says;
	} cases[] = {
		{share("w[0:4096]", piece, shard), "'w[0:4096]' is not params 2048.. of 'w'"},
		{share("w[2048:6144]", R"({"param": "w", "shape": [64, 64], "begin": 2048})", shard),
		 "is not params 2048.. of 'w' (shape 64x64)"},
		{share("w[2048:6144]", R"({"param": "w", "shape": [64, 128], "begin": 18446744073709551615})", shard),
		 "is not params"},
		{share("w[2048:6144]", R"({"param": "w", "shape": [64, 128]})", shard), "missing key 'begin'"},
		{share("w[2048:6144]", piece, R"({"rank": 2, "world": 2, "rule": 2, "params": 8192, "digest": 7})"),
		 "rank 2 of 2 by rule 2"},
		{share("w[2048:6144]", piece, R"({"rank": 0, "world": 1, "rule": 2, "params": 8192, "digest": 7})"),
		 "is no rank's share"},
		{share("w[2048:6144]", piece, R"({"rank": 0, "world": 2, "rule": 3, "params": 8192, "digest": 7})"),
		 "is no rank's share"},
		{share("w[2048:6144]", piece, R"({"rank": 0, "world": 2, "rule": 2, "params": 100, "digest": 7})"),
		 "holding 4096 of 100 params"},
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
