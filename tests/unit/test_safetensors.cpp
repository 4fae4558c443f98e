// SPDX-License-Identifier: MIT
// The safetensors reader and writer: round trips, and every lie a header can
// tell rejected with a message that says which.
#include <cstdio>
#include <cstring>
#include <fstream>
#include <string>

#include <gtest/gtest.h>
#include <unistd.h>

#include "error.hpp"
#include "interchange.hpp"
#include "safetensors.hpp"

extern "C" {
#include "ckpt_update.h"
}

namespace st = ckpt::safetensors;

namespace {

std::string tmp_path(const char *name)
{
	return std::string(testing::TempDir()) + "/st_" + std::to_string(getpid()) + "_" + name;
}

void write_raw(const std::string &path, uint64_t hlen, const std::string &header, size_t data_bytes)
{
	std::ofstream f(path, std::ios::binary | std::ios::trunc);
	for (int i = 0; i < 8; i++)
		f.put(static_cast<char>(hlen >> (8 * i)));
	f << header;
	f << std::string(data_bytes, '\0');
}

// Parses `header` over a data buffer of data_bytes; expects an error containing `want`.
void expect_rejected(const std::string &header, uint64_t data_bytes, const std::string &want)
{
	try {
		st::parse_header(header, data_bytes, "f");
		FAIL() << "accepted: " << header;
	} catch (const ckpt::Error &e) {
		EXPECT_NE(std::string(e.what()).find(want), std::string::npos) << e.what();
	}
}

} // namespace

TEST(Safetensors, DtypeSizes)
{
	EXPECT_EQ(st::dtype_bytes("F32"), 4u);
	EXPECT_EQ(st::dtype_bytes("BF16"), 2u);
	EXPECT_EQ(st::dtype_bytes("F64"), 8u);
	EXPECT_EQ(st::dtype_bytes("BOOL"), 1u);
	EXPECT_EQ(st::dtype_bytes("F17"), 0u);
}

TEST(Safetensors, ParsesAValidHeader)
{
	// keys in any order; tensors come back in data order
	auto h = st::parse_header(R"({"b": {"dtype": "F16", "shape": [2, 2], "data_offsets": [16, 24]},
		"__metadata__": {"step": "7"},
		"a": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]},
		"s": {"dtype": "I64", "shape": [], "data_offsets": [24, 32]},
		"e": {"dtype": "F32", "shape": [0, 3], "data_offsets": [32, 32]}})",
				  32, "f");
	ASSERT_EQ(h.tensors.size(), 4u);
	EXPECT_EQ(h.tensors[0].name, "a");
	EXPECT_EQ(h.tensors[1].name, "b");
	EXPECT_EQ(h.tensors[1].numel, 4u);
	EXPECT_EQ(h.tensors[2].name, "s");
	EXPECT_EQ(h.tensors[2].numel, 1u);
	EXPECT_EQ(h.tensors[3].numel, 0u);
	EXPECT_EQ(h.metadata.at("step"), "7");
	EXPECT_NE(h.find("b"), nullptr);
	EXPECT_EQ(h.find("zz"), nullptr);
}

TEST(Safetensors, RejectsLyingHeaders)
{
	expect_rejected(R"({"a": {"dtype": "F32", "shape": [8], "data_offsets": [0, 32]}})", 16, "run past the end");
	expect_rejected(R"({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
			    "b": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]}})", 12, "overlap");
	expect_rejected(R"({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
			    "b": {"dtype": "F32", "shape": [1], "data_offsets": [12, 16]}})", 16, "gap");
	expect_rejected(R"({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}})", 16, "the tensors cover 8");
	expect_rejected(R"({"a": {"dtype": "F16", "shape": [4], "data_offsets": [0, 16]}})", 16, "needs 8 bytes");
	expect_rejected(R"({"a": {"dtype": "F17", "shape": [4], "data_offsets": [0, 16]}})", 16, "unknown dtype");
	expect_rejected(R"({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
			    "a": {"dtype": "F32", "shape": [2], "data_offsets": [8, 16]}})", 16, "names 'a' twice");
	expect_rejected("{\"\xff\": {\"dtype\": \"F32\", \"shape\": [4], \"data_offsets\": [0, 16]}}", 16,
			"not valid JSON");
	expect_rejected(R"({"a": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]})", 16, "not valid JSON");
	expect_rejected(R"({"a": {"dtype": "F32", "shape": [4294967296, 4294967296], "data_offsets": [0, 16]}})", 16,
			"overflows");
	expect_rejected(R"({"a": {"dtype": "F32", "shape": [-4], "data_offsets": [0, 16]}})", 16, "non-negative");
	expect_rejected(R"({"a": {"dtype": "F32", "shape": [4], "data_offsets": [16, 0]}})", 16, "end before");
	expect_rejected(R"({"a": {"dtype": "F32", "shape": [4], "data_offsets": [0]}})", 16, "[begin, end]");
	expect_rejected(R"({"a": {"shape": [4], "data_offsets": [0, 16]}})", 16, "no dtype");
	expect_rejected(R"({"a": 3})", 16, "not an object");
	expect_rejected(R"({"__metadata__": {"k": 1}})", 0, "not a string");
	expect_rejected(R"([1, 2])", 0, "does not start with '{'");
}

TEST(Safetensors, ReaderBoundsTheHeaderBeforeReadingIt)
{
	const std::string p = tmp_path("huge");
	write_raw(p, 200'000'000, "{}", 0);
	EXPECT_THROW(st::Reader::open(p), ckpt::Error);
	write_raw(p, 4096, "{}", 0);	// longer than the file
	try {
		st::Reader::open(p);
		FAIL();
	} catch (const ckpt::Error &e) {
		EXPECT_NE(std::string(e.what()).find("larger than the file"), std::string::npos) << e.what();
	}
	{
		std::ofstream f(p, std::ios::binary | std::ios::trunc);
		f << "abc";
	}
	EXPECT_THROW(st::Reader::open(p), ckpt::Error);
	std::remove(p.c_str());
	EXPECT_THROW(st::Reader::open(p), ckpt::Error);	// missing
}

TEST(Safetensors, WriterReaderRoundTrip)
{
	const std::string p = tmp_path("rt");
	std::vector<float> a = {1.5f, -2.25f, 3e-8f, 65504.0f, 0.0f, -0.0f};
	std::vector<uint16_t> h16 = {0x3c00, 0xc000, 0x0001, 0x7bff};	// 1, -2, min subnormal, 65504
	std::vector<uint16_t> b16 = {0x3f80, 0xc040, 0x0001, 0x7f7f};	// 1, -3, tiny, max
	std::vector<double> d = {0.1, -1e300};
	{
		st::Writer w(p,
			     {{"a", "F32", {2, 3}}, {"h", "F16", {4}}, {"b", "BF16", {2, 2}}, {"d", "F64", {2}}},
			     {{"step", "42"}}, false);
		w.write(a.data(), a.size() * 4);
		w.write(h16.data(), h16.size() * 2);
		w.write(b16.data(), b16.size() * 2);
		w.write(d.data(), d.size() * 8);
		w.finish();
	}
	// header padded to 8 bytes with spaces
	std::ifstream f(p, std::ios::binary);
	uint64_t n = 0;
	f.read(reinterpret_cast<char *>(&n), 8);
	EXPECT_EQ(n % 8, 0u);

	auto r = st::Reader::open(p);
	EXPECT_EQ(r.header().metadata.at("step"), "42");
	ASSERT_EQ(r.header().tensors.size(), 4u);
	EXPECT_EQ(r.read_f32(*r.header().find("a")), a);
	EXPECT_EQ(r.header().find("a")->shape, (std::vector<uint64_t>{2, 3}));
	auto hh = r.read_f32(*r.header().find("h"));
	for (size_t i = 0; i < h16.size(); i++) {
		uint32_t bits;
		std::memcpy(&bits, &hh[i], 4);
		EXPECT_EQ(bits, ckpt_f16_to_f32(h16[i]));
	}
	auto bb = r.read_f32(*r.header().find("b"));
	for (size_t i = 0; i < b16.size(); i++) {
		uint32_t bits;
		std::memcpy(&bits, &bb[i], 4);
		EXPECT_EQ(bits, uint32_t{b16[i]} << 16);
	}
	auto dd = r.read_f32(*r.header().find("d"));
	EXPECT_EQ(dd[0], 0.1f);
	EXPECT_TRUE(std::isinf(dd[1]));
	std::remove(p.c_str());
}

TEST(Safetensors, WriterLeavesNoFileOnFailure)
{
	const std::string p = tmp_path("partial");
	std::remove(p.c_str());
	{
		st::Writer w(p, {{"a", "F32", {4}}}, {}, false);
		std::vector<float> x(3);
		EXPECT_THROW(w.write(x.data(), 12), ckpt::Error);	// wrong size
	}
	EXPECT_NE(access(p.c_str(), F_OK), 0);
	EXPECT_NE(access((p + ".tmp").c_str(), F_OK), 0);
	EXPECT_THROW(st::Writer(p, {{"a", "F32", {1}}, {"a", "F32", {1}}}, {}, false), ckpt::Error);
}

TEST(Safetensors, NonFloatDoesNotConvert)
{
	const std::string p = tmp_path("int");
	{
		st::Writer w(p, {{"i", "I64", {2}}}, {}, false);
		int64_t v[2] = {1, 2};
		w.write(v, 16);
		w.finish();
	}
	auto r = st::Reader::open(p);
	EXPECT_THROW(r.read_f32(r.header().tensors[0]), ckpt::Error);
	std::remove(p.c_str());
}

// The dm-ckpt.* metadata reads back exactly what was written, hyperparameters
// to the last bit of their doubles; a file without the keys has none.
TEST(Interchange, MetadataRoundTrip)
{
	namespace ix = ckpt::interchange;
	ix::Metadata m;
	m.dtype = CKPT_DTYPE_FP16;
	m.chunk_params = 8192;
	m.step = 123456789012ull;
	m.n_groups = 2;
	m.tensor_group = {{"a.weight", 0}, {"b.bias.group", 1}, {"dm-ckpt.odd", 0}};
	m.hparams = {ckpt::GroupHparams{1.0 / 3, 0.9, 0.999, 1e-8, 0.1, false},
		     ckpt::GroupHparams{2.5e-4, 0.0, 0.95, 0.0, 1e-300, true}};
	m.q8 = true;
	std::map<std::string, std::string> meta = {{"format", "pt"}};
	ix::write(m, meta);
	const auto r = ix::read(meta, "f");
	ASSERT_TRUE(r);
	EXPECT_EQ(r->dtype, m.dtype);
	EXPECT_EQ(r->chunk_params, m.chunk_params);
	EXPECT_EQ(r->step, m.step);
	EXPECT_EQ(r->n_groups, m.n_groups);
	EXPECT_EQ(r->tensor_group, m.tensor_group);
	EXPECT_EQ(r->hparams, m.hparams);
	EXPECT_TRUE(r->q8);
	EXPECT_FALSE(r->bf16_master);
	// bf16 masters (with 8-bit moments and dtype bf16); no state keys: fp32
	auto bm = m;
	bm.dtype = CKPT_DTYPE_BF16;
	bm.bf16_master = true;
	std::map<std::string, std::string> bmeta;
	ix::write(bm, bmeta);
	EXPECT_TRUE(ix::read(bmeta, "f")->bf16_master);
	bmeta.erase("dm-ckpt.state");
	bmeta.erase("dm-ckpt.master");
	EXPECT_FALSE(ix::read(bmeta, "f")->q8);
	EXPECT_FALSE(ix::read({{"format", "pt"}, {"step", "3"}}, "f"));
	for (const auto &[key, value] : std::map<std::string, std::string>{
		     {"dm-ckpt.step", "+1"}, {"dm-ckpt.step", " 1"}, {"dm-ckpt.step", "9223372036854775808"},
		     {"dm-ckpt.group.0.lr", "0x1p-3"}, {"dm-ckpt.group.0.lr", "1e999"},
		     {"dm-ckpt.group.00.lr", "1"}, {"dm-ckpt.tensor_group.", "0"}, {"dm-ckpt.state", "8BIT"},
		     {"dm-ckpt.master", "bf16"}}) {	// bf16 masters of an fp16 image
		auto bad = meta;
		bad[key] = value;
		try {
			(void)ix::read(bad, "f");
			ADD_FAILURE() << key << "=" << value << " was taken";
		} catch (const ckpt::Error &e) {
			EXPECT_EQ(e.code(), CKPT_E_INVAL) << e.what();
			EXPECT_NE(std::string(e.what()).find("f: __metadata__"), std::string::npos) << e.what();
		}
	}
}

// A sharded checkpoint's index: plain shard names in its folder only.
TEST(Interchange, IndexRefusesPathsOutOfItsFolder)
{
	EXPECT_EQ(st::parse_index(R"({"metadata": {"total_size": 8}, "weight_map": {"a": "s1", "b": "s2"}})", "i"),
		  (std::map<std::string, std::string>{{"a", "s1"}, {"b", "s2"}}));
	for (const char *text : {R"({"weight_map": {"a": "../s"}})", R"({"weight_map": {"a": "/etc/s"}})",
				 R"({"weight_map": {"a": "d/s"}})", R"({"weight_map": {"a": ".."}})",
				 R"({"weight_map": {"a": ""}})", R"({"weight_map": {"a": 1}})",
				 R"({"weight_map": {"a": "s", "a": "t"}})", R"({"weight_map": {}})",
				 R"({"weight_map": {"a": "s"}, "weight_map": {"b": "s"}})", R"({"metadata": []})",
				 R"([])", R"({"weight_map": {"a": "s"}, "extra": 1})"}) {
		EXPECT_THROW(st::parse_index(text, "i"), ckpt::Error) << text;
	}
}
