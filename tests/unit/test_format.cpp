// SPDX-License-Identifier: GPL-2.0 OR MIT
// Unit tests of the on-disk format, the command/status ABI and crc32c.
#include <gtest/gtest.h>

#include <climits>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "ckpt_codec.h"
#include "core_test_util.hpp"

extern "C" {
u32 ckpt_crc32c_sw(u32 seed, const void *p, size_t len);
u32 ckpt_crc32c_hw(u32 seed, const void *p, size_t len);
int ckpt_crc32c_hw_available(void);
}

namespace {

using Block = std::vector<uint8_t>;

Block new_block() { return Block(CKPT_BLOCK, 0); }

void put32(Block &b, size_t off, uint32_t v) { std::memcpy(b.data() + off, &v, 4); }
void put64(Block &b, size_t off, uint64_t v) { std::memcpy(b.data() + off, &v, 8); }
uint32_t get32(const Block &b, size_t off)
{
	uint32_t v;
	std::memcpy(&v, b.data() + off, 4);
	return v;
}
uint64_t get64(const Block &b, size_t off)
{
	uint64_t v;
	std::memcpy(&v, b.data() + off, 8);
	return v;
}

// Recompute the crc of a whole-block structure (superblock, status page).
void recrc_block(Block &b)
{
	put32(b, 8, 0);
	put32(b, 8, ckpt_crc32c(b.data(), CKPT_BLOCK));
}

// Recompute a command's crc over its stored length (clamped to the block).
void recrc_cmd(Block &b)
{
	uint32_t len = get32(b, offsetof(ckpt_cmd_disk, length));
	if (len > CKPT_BLOCK)
		len = CKPT_BLOCK;
	if (len < 12)
		len = 12;
	put32(b, 8, 0);
	put32(b, 8, ckpt_crc32c(b.data(), len));
}

// good with the 32-bit (64-bit) word at off set to v, and its crc redone.
Block patched32(Block b, size_t off, uint32_t v)
{
	put32(b, off, v);
	recrc_block(b);
	return b;
}

Block patched64(Block b, size_t off, uint64_t v)
{
	put64(b, off, v);
	recrc_block(b);
	return b;
}

void recrc_rec(Block &b)
{
	put32(b, offsetof(ckpt_rec_disk, crc32c), 0);
	put32(b, offsetof(ckpt_rec_disk, crc32c), ckpt_crc32c(b.data(), sizeof(ckpt_rec_disk)));
}

ckpt_geometry test_geo()
{
	return test_geometry(10, 11, 2, CKPT_DTYPE_FP16, 8192);
}

std::unique_ptr<ckpt_sb> test_sb(uint64_t sequence = 4, uint32_t blob_len = 100)
{
	auto sb = std::make_unique<ckpt_sb>();
	sb->geo = test_geo();
	EXPECT_EQ(ckpt_regions_compute(&sb->geo, &sb->regions), 0);
	for (int i = 0; i < 16; i++)
		sb->uuid[i] = uint8_t(0xa0 + i);
	sb->sequence = sequence;
	sb->manifest_len = 5000;
	sb->manifest_crc = 0xdeadbeef;
	sb->committed_step = 41;
	sb->committed_slot = 1;
	sb->blob_len = blob_len;
	for (uint32_t i = 0; i < blob_len; i++)
		sb->blob[i] = uint8_t(i * 7 + 3);
	return sb;
}

Block encode_sb(const ckpt_sb &sb)
{
	Block b(CKPT_BLOCK, 0xcc);
	EXPECT_EQ(ckpt_sb_encode(&sb, b.data()), 0);
	return b;
}

int decode_sb(const Block &b, uint64_t dev)
{
	auto out = std::make_unique<ckpt_sb>();
	return ckpt_sb_decode(b.data(), dev, out.get());
}

uint64_t dev_of(const ckpt_sb &sb) { return sb.regions.dev_bytes; }

std::unique_ptr<ckpt_cmd> begin_cmd(uint64_t step, uint32_t n_groups)
{
	return test_cmd(CKPT_OP_BEGIN, step, n_groups, f32(1.0f / 1024));
}

std::unique_ptr<ckpt_cmd> commit_cmd(uint64_t step, uint32_t blob_len)
{
	auto c = test_cmd(CKPT_OP_COMMIT, step);
	c->blob_len = blob_len;
	for (uint32_t i = 0; i < blob_len && i < CKPT_BLOB_MAX; i++)
		c->blob[i] = uint8_t(255 - i);
	return c;
}

std::unique_ptr<ckpt_cmd> abort_cmd(uint64_t step)
{
	return test_cmd(CKPT_OP_ABORT, step);
}

Block encode_cmd(const ckpt_cmd &c, int *len_out = nullptr)
{
	Block b(CKPT_BLOCK, 0xcc);
	int len = ckpt_cmd_encode(&c, b.data());
	EXPECT_GT(len, 0);
	if (len_out)
		*len_out = len;
	return b;
}

int decode_cmd(const Block &b, uint32_t len)
{
	auto out = std::make_unique<ckpt_cmd>();
	return ckpt_cmd_decode(b.data(), len, out.get());
}

} // namespace

// ---------------------------------------------------------------- crc32c

TEST(Crc32c, KnownVector)
{
	const char *s = "123456789";
	EXPECT_EQ(ckpt_crc32c(s, 9), 0xE3069283u);
	EXPECT_EQ(ckpt_crc32c_raw(~0u, s, 9), ~0xE3069283u);
	EXPECT_EQ(ckpt_crc32c_sw(~0u, s, 9), ~0xE3069283u);
	EXPECT_EQ(ckpt_crc32c_hw(~0u, s, 9), ~0xE3069283u);
	// Kernel semantics: no inversion, so seed 0 over zero bytes stays 0.
	const uint8_t zeros[32] = {};
	EXPECT_EQ(ckpt_crc32c_raw(0, zeros, sizeof(zeros)), 0u);
	EXPECT_EQ(ckpt_crc32c_raw(0x12345678u, s, 0), 0x12345678u);
	// RFC 3720 (iSCSI) test vectors: 32 bytes of zeros, of 0xff, ascending.
	uint8_t buf[32];
	std::memset(buf, 0, 32);
	EXPECT_EQ(ckpt_crc32c(buf, 32), 0x8A9136AAu);
	std::memset(buf, 0xff, 32);
	EXPECT_EQ(ckpt_crc32c(buf, 32), 0x62A8AB43u);
	for (int i = 0; i < 32; i++)
		buf[i] = uint8_t(i);
	EXPECT_EQ(ckpt_crc32c(buf, 32), 0x46DD794Eu);
}

TEST(Crc32c, Chaining)
{
	std::mt19937_64 rng(1);
	std::vector<uint8_t> data(1000);
	for (auto &c : data)
		c = uint8_t(rng());
	uint32_t whole = ckpt_crc32c_raw(0xabcdef01u, data.data(), data.size());
	for (size_t split : {0, 1, 7, 8, 9, 500, 999, 1000}) {
		uint32_t a = ckpt_crc32c_raw(0xabcdef01u, data.data(), split);
		EXPECT_EQ(ckpt_crc32c_raw(a, data.data() + split, data.size() - split), whole) << split;
	}
}

// fn against the slicing-by-8 tables: every alignment and short length, the
// lengths around a block, and random pieces of up to 70000 bytes.
using crc_fn = uint32_t (*)(uint32_t, const void *, size_t);
static void expect_matches_table(crc_fn fn)
{
	std::mt19937_64 rng(42);
	std::vector<uint8_t> data(70000 + 64);
	for (auto &c : data)
		c = uint8_t(rng());
	int checked = 0;
	for (size_t align = 0; align < 16; align++) {
		for (size_t len = 0; len <= 300; len++) {
			uint32_t seed = uint32_t(rng());
			const uint8_t *p = data.data() + align;
			ASSERT_EQ(fn(seed, p, len), ckpt_crc32c_sw(seed, p, len)) << "align " << align << " len " << len;
			checked++;
		}
	}
	for (size_t len : {4095, 4096, 4097, 65536, 70000}) {
		for (size_t align : {0, 1, 3, 8, 13}) {
			const uint8_t *p = data.data() + align;
			ASSERT_EQ(fn(~0u, p, len), ckpt_crc32c_sw(~0u, p, len));
			checked++;
		}
	}
	for (int i = 0; i < 2000; i++) {
		size_t align = rng() % 64, len = rng() % 70000;
		uint32_t seed = uint32_t(rng());
		const uint8_t *p = data.data() + align;
		ASSERT_EQ(fn(seed, p, len), ckpt_crc32c_sw(seed, p, len));
		checked++;
	}
	EXPECT_GT(checked, 5000);
}

TEST(Crc32c, HardwareMatchesTable)
{
	if (!ckpt_crc32c_hw_available())
		GTEST_SKIP() << "no crc32c instruction on this CPU (SSE4.2, ARMv8 CRC32)";
	expect_matches_table(ckpt_crc32c_hw);
}

// What every checksum goes through: ISA-L's crc32_iscsi in a native build.
TEST(Crc32c, DispatchedMatchesTable)
{
	expect_matches_table(ckpt_crc32c_raw);
}

// ---------------------------------------------------------------- strerror

TEST(Strerror, EveryErrorHasAMessage)
{
	std::set<std::string> seen;
	for (int e = 0; e < CKPT_E_MAX; e++) {
		const char *m = ckpt_strerror(e);
		ASSERT_NE(m, nullptr);
		EXPECT_STRNE(m, "unknown error") << e;
		EXPECT_GT(std::strlen(m), 3u);
		EXPECT_STREQ(ckpt_strerror(-e), m);
		EXPECT_TRUE(seen.insert(m).second) << "duplicate message " << m;
	}
	EXPECT_STREQ(ckpt_strerror(CKPT_E_MAX), "unknown error");
	EXPECT_STREQ(ckpt_strerror(-CKPT_E_MAX), "unknown error");
	EXPECT_STREQ(ckpt_strerror(1000), "unknown error");
	EXPECT_STREQ(ckpt_strerror(INT_MIN), "unknown error");
	EXPECT_STREQ(ckpt_strerror(INT_MAX), "unknown error");
}

// ---------------------------------------------------------------- geometry / layout

TEST(Geometry, ValidAndEveryFieldOutOfRange)
{
	ckpt_geometry g = test_geo();
	EXPECT_EQ(ckpt_geometry_check(&g), 0);
	EXPECT_EQ(ckpt_geometry_check(nullptr), -CKPT_E_INVAL);

	struct Case {
		const char *name;
		void (*mut)(ckpt_geometry &);
		bool ok;
	};
	const Case cases[] = {
		{"n_chunks 0", [](ckpt_geometry &x) { x.n_chunks = 0; }, false},
		{"n_chunks 1", [](ckpt_geometry &x) { x.n_chunks = 1; }, true},
		{"n_chunks max", [](ckpt_geometry &x) { x.n_chunks = CKPT_MAX_CHUNKS; }, true},
		{"n_chunks max+1", [](ckpt_geometry &x) { x.n_chunks = CKPT_MAX_CHUNKS + 1; }, false},
		{"n_chunks ~0", [](ckpt_geometry &x) { x.n_chunks = ~0u; }, false},
		{"shift min-1", [](ckpt_geometry &x) { x.chunk_shift = CKPT_MIN_CHUNK_SHIFT - 1; }, false},
		{"shift min", [](ckpt_geometry &x) { x.chunk_shift = CKPT_MIN_CHUNK_SHIFT; }, true},
		{"shift max", [](ckpt_geometry &x) { x.chunk_shift = CKPT_MAX_CHUNK_SHIFT; }, true},
		{"shift max+1", [](ckpt_geometry &x) { x.chunk_shift = CKPT_MAX_CHUNK_SHIFT + 1; }, false},
		{"shift 64", [](ckpt_geometry &x) { x.chunk_shift = 64; }, false},
		{"shift ~0", [](ckpt_geometry &x) { x.chunk_shift = ~0u; }, false},
		{"groups 0", [](ckpt_geometry &x) { x.n_groups = 0; }, false},
		{"groups 64", [](ckpt_geometry &x) { x.n_groups = 64; }, true},
		{"groups 65", [](ckpt_geometry &x) { x.n_groups = 65; }, false},
		{"dtype 0", [](ckpt_geometry &x) { x.dtype = 0; }, false},
		{"dtype bf16", [](ckpt_geometry &x) { x.dtype = CKPT_DTYPE_BF16; }, true},
		{"dtype 3", [](ckpt_geometry &x) { x.dtype = 3; }, false},
		{"optimizer 0", [](ckpt_geometry &x) { x.optimizer = 0; }, false},
		{"optimizer 2", [](ckpt_geometry &x) { x.optimizer = 2; }, false},
		{"manifest 0", [](ckpt_geometry &x) { x.manifest_bytes = 0; }, true},
		{"manifest 100", [](ckpt_geometry &x) { x.manifest_bytes = 100; }, false},
		{"manifest 4097", [](ckpt_geometry &x) { x.manifest_bytes = 4097; }, false},
		{"manifest max", [](ckpt_geometry &x) { x.manifest_bytes = CKPT_MANIFEST_MAX; }, true},
		{"manifest max+4k", [](ckpt_geometry &x) { x.manifest_bytes = CKPT_MANIFEST_MAX + 4096; }, false},
		{"manifest ~0 aligned", [](ckpt_geometry &x) { x.manifest_bytes = 0xfffff000u; }, false},
	};
	for (const auto &c : cases) {
		ckpt_geometry x = test_geo();
		c.mut(x);
		EXPECT_EQ(ckpt_geometry_check(&x), c.ok ? 0 : -CKPT_E_GEOMETRY) << c.name;
		ckpt_regions l;
		EXPECT_EQ(ckpt_regions_compute(&x, &l), c.ok ? 0 : -CKPT_E_GEOMETRY) << c.name;
	}
}

TEST(Layout, CanonicalValues)
{
	ckpt_geometry g = test_geo(); // 10 chunks of 2048 params, 8 KiB manifest
	ckpt_regions l;
	ASSERT_EQ(ckpt_regions_compute(&g, &l), 0);
	EXPECT_EQ(l.chunk_params, 2048u);
	EXPECT_EQ(l.n_params, 20480u);
	EXPECT_EQ(l.plo_chunk_bytes, 4096u);
	EXPECT_EQ(l.record_bytes, 4096u + 12u * 2048u);
	EXPECT_EQ(l.group_off, 8192u);
	EXPECT_EQ(l.group_bytes, 4096u);
	EXPECT_EQ(l.manifest_off, 12288u);
	EXPECT_EQ(l.manifest_bytes, 8192u);
	EXPECT_EQ(l.plo_off[0], 20480u);
	EXPECT_EQ(l.plo_off[1], 20480u + 40960u);
	EXPECT_EQ(l.rec_off[0], 20480u + 2 * 40960u);
	EXPECT_EQ(l.rec_off[1], l.rec_off[0] + 10 * l.record_bytes);
	EXPECT_EQ(l.dev_bytes, l.rec_off[1] + 10 * l.record_bytes);
	EXPECT_EQ(l.grad_off, 4096u);
	EXPECT_EQ(l.window_bytes, 40960u);
	EXPECT_EQ(l.param_off, 4096u + 40960u);
	EXPECT_EQ(l.image_off, 4096u + 2 * 40960u);
	EXPECT_EQ(l.virt_bytes, l.image_off + l.dev_bytes);
	EXPECT_EQ(ckpt_plo_offset(&l, 1, 3), l.plo_off[1] + 3 * 4096u);
	EXPECT_EQ(ckpt_record_offset(&l, 0, 9), l.rec_off[0] + 9 * l.record_bytes);
	EXPECT_EQ(ckpt_regions_compute(&g, nullptr), -CKPT_E_INVAL);
	EXPECT_EQ(ckpt_regions_compute(nullptr, &l), -CKPT_E_INVAL);
}

TEST(Layout, AlignedContiguousAndNoOverflowAtExtremes)
{
	const uint32_t chunks[] = {1, 2, 4095, 4096, 4097, 100000, CKPT_MAX_CHUNKS};
	const uint32_t shifts[] = {CKPT_MIN_CHUNK_SHIFT, 16, CKPT_MAX_CHUNK_SHIFT};
	const uint32_t manifests[] = {0, 4096, CKPT_MANIFEST_MAX};
	for (uint32_t n : chunks)
		for (uint32_t s : shifts)
			for (uint32_t m : manifests) {
				ckpt_geometry g = test_geo();
				g.n_chunks = n;
				g.chunk_shift = s;
				g.manifest_bytes = m;
				ckpt_regions l;
				ASSERT_EQ(ckpt_regions_compute(&g, &l), 0);
				// Exact arithmetic in 128 bits.
				unsigned __int128 cp = (unsigned __int128)1 << s;
				unsigned __int128 plo = (unsigned __int128)n * cp * 2;
				unsigned __int128 rec = (unsigned __int128)n * (4096 + 12 * cp);
				unsigned __int128 grp = ((unsigned __int128)n + 4095) / 4096 * 4096;
				unsigned __int128 end = 8192 + grp + m + 2 * plo + 2 * rec;
				ASSERT_EQ((unsigned __int128)l.dev_bytes, end);
				ASSERT_EQ((unsigned __int128)l.image_off, 4096 + 2 * plo);
				ASSERT_EQ((unsigned __int128)l.virt_bytes, (unsigned __int128)l.image_off + l.dev_bytes);
				ASSERT_EQ(l.group_bytes % 4096, 0u);
				ASSERT_GE(l.group_bytes, n);
				for (uint64_t off : {l.group_off, l.manifest_off, l.plo_off[0], l.plo_off[1],
						     l.rec_off[0], l.rec_off[1], l.dev_bytes, l.record_bytes,
						     l.param_off, l.virt_bytes})
					ASSERT_EQ(off % 4096, 0u);
				ASSERT_EQ(l.manifest_off, l.group_off + l.group_bytes);
				ASSERT_EQ(l.plo_off[0], l.manifest_off + l.manifest_bytes);
				ASSERT_EQ(l.plo_off[1], l.plo_off[0] + l.window_bytes);
				ASSERT_EQ(l.rec_off[0], l.plo_off[1] + l.window_bytes);
				ASSERT_EQ(l.rec_off[1], l.rec_off[0] + uint64_t(n) * l.record_bytes);
			}
}

// ---------------------------------------------------------------- superblock

TEST(Superblock, RoundTrip)
{
	for (uint32_t blob_len : {0u, 1u, 100u, CKPT_BLOB_MAX}) {
		auto sb = test_sb(6, blob_len);
		sb->regions.dev_bytes += 1 << 20; // a layout end beyond the minimum is kept
		Block b = encode_sb(*sb);
		// Encode zeroes the block: nothing of the 0xcc fill survives past the header.
		for (size_t i = sizeof(ckpt_sb_disk); i < CKPT_BLOCK; i++)
			ASSERT_EQ(b[i], 0) << i;
		auto out = std::make_unique<ckpt_sb>();
		std::memset(out.get(), 0x5a, sizeof(ckpt_sb));
		ASSERT_EQ(ckpt_sb_decode(b.data(), sb->regions.dev_bytes, out.get()), 0);
		EXPECT_EQ(std::memcmp(out->uuid, sb->uuid, 16), 0);
		EXPECT_EQ(out->sequence, 6u);
		EXPECT_EQ(std::memcmp(&out->geo, &sb->geo, sizeof(sb->geo)), 0);
		EXPECT_EQ(std::memcmp(&out->regions, &sb->regions, sizeof(sb->regions)), 0);
		EXPECT_EQ(out->manifest_len, 5000u);
		EXPECT_EQ(out->manifest_crc, 0xdeadbeefu);
		EXPECT_EQ(out->committed_step, 41u);
		EXPECT_EQ(out->committed_slot, 1u);
		EXPECT_EQ(out->blob_len, blob_len);
		EXPECT_EQ(std::memcmp(out->blob, sb->blob, blob_len), 0);
		for (uint32_t i = blob_len; i < CKPT_BLOB_MAX; i++)
			ASSERT_EQ(out->blob[i], 0);
		// Encoding the decoded copy gives the same bytes.
		Block b2 = encode_sb(*out);
		EXPECT_EQ(b, b2);
	}
	EXPECT_EQ(sizeof(ckpt_sb_disk), 2248u);
	EXPECT_EQ(offsetof(ckpt_sb_disk, crc32c), 8u);
}

TEST(Superblock, EncodeRefusesWhatDecodeWouldRefuse)
{
	Block b = new_block();
	{
		auto sb = test_sb();
		sb->geo.n_groups = 0;
		EXPECT_EQ(ckpt_sb_encode(sb.get(), b.data()), -CKPT_E_GEOMETRY);
	}
	{
		auto sb = test_sb();
		sb->regions.rec_off[1] += 4096;
		EXPECT_EQ(ckpt_sb_encode(sb.get(), b.data()), -CKPT_E_LAYOUT);
	}
	{
		auto sb = test_sb();
		sb->regions.dev_bytes -= 4096;
		EXPECT_EQ(ckpt_sb_encode(sb.get(), b.data()), -CKPT_E_TOO_SMALL);
	}
	{
		auto sb = test_sb();
		sb->committed_slot = 2;
		EXPECT_EQ(ckpt_sb_encode(sb.get(), b.data()), -CKPT_E_LAYOUT);
	}
	{
		auto sb = test_sb();
		sb->blob_len = CKPT_BLOB_MAX + 1;
		EXPECT_EQ(ckpt_sb_encode(sb.get(), b.data()), -CKPT_E_BLOB);
	}
	{
		auto sb = test_sb();
		sb->manifest_len = sb->geo.manifest_bytes + 1;
		EXPECT_EQ(ckpt_sb_encode(sb.get(), b.data()), -CKPT_E_MANIFEST);
	}
	auto sb = test_sb();
	EXPECT_EQ(ckpt_sb_encode(nullptr, b.data()), -CKPT_E_INVAL);
	EXPECT_EQ(ckpt_sb_encode(sb.get(), nullptr), -CKPT_E_INVAL);
	EXPECT_EQ(ckpt_sb_decode(nullptr, 1ull << 40, sb.get()), -CKPT_E_INVAL);
}

TEST(Superblock, HeaderCorruptions)
{
	auto sb = test_sb();
	const uint64_t dev = dev_of(*sb);
	const Block good = encode_sb(*sb);
	ASSERT_EQ(decode_sb(good, dev), 0);

	{ // bad magic (crc recomputed: magic is checked first anyway)
		Block b = good;
		put32(b, 0, CKPT_SB_MAGIC ^ 1);
		EXPECT_EQ(decode_sb(b, dev), -CKPT_E_MAGIC);
		recrc_block(b);
		EXPECT_EQ(decode_sb(b, dev), -CKPT_E_MAGIC);
		EXPECT_EQ(decode_sb(new_block(), dev), -CKPT_E_MAGIC);
	}
	// bad crc: any single bit anywhere in the block except the magic
	for (size_t byte : {4ul, 8ul, 11ul, 40ul, 100ul, 200ul, 2000ul, 2247ul, 2248ul, 4095ul}) {
		Block b = good;
		b[byte] ^= 0x10;
		EXPECT_EQ(decode_sb(b, dev), -CKPT_E_CRC) << byte;
	}
	{ // bad version, with a correct crc
		Block b = good;
		put32(b, offsetof(ckpt_sb_disk, version), 2);
		recrc_block(b);
		EXPECT_EQ(decode_sb(b, dev), -CKPT_E_VERSION);
		put32(b, offsetof(ckpt_sb_disk, version), 0);
		recrc_block(b);
		EXPECT_EQ(decode_sb(b, dev), -CKPT_E_VERSION);
	}
	{ // header_bytes
		Block b = good;
		put32(b, offsetof(ckpt_sb_disk, header_bytes), sizeof(ckpt_sb_disk) + 8);
		recrc_block(b);
		EXPECT_EQ(decode_sb(b, dev), -CKPT_E_VERSION);
		put32(b, offsetof(ckpt_sb_disk, header_bytes), 0);
		recrc_block(b);
		EXPECT_EQ(decode_sb(b, dev), -CKPT_E_VERSION);
	}
	for (uint32_t bit = 0; bit < 32; bit++) {
		Block b = good;
		put32(b, offsetof(ckpt_sb_disk, feature_incompat), 1u << bit);
		recrc_block(b);
		// META2 and Q8 change the layout the stored offsets and record
		// size must match; PLO_CRC and COUNTS change only what records carry.
		const uint32_t f = 1u << bit;
		EXPECT_EQ(decode_sb(b, dev), f == CKPT_FEATURE_INCOMPAT_META2 || f == CKPT_FEATURE_INCOMPAT_Q8
						     ? -CKPT_E_LAYOUT
					     : f == CKPT_FEATURE_INCOMPAT_PLO_CRC ||
							       f == CKPT_FEATURE_INCOMPAT_COUNTS ? 0
					     : -CKPT_E_FEATURE)
			<< "incompat " << bit;
		b = good;
		put32(b, offsetof(ckpt_sb_disk, feature_ro_compat), 1u << bit);
		recrc_block(b);
		EXPECT_EQ(decode_sb(b, dev), -CKPT_E_FEATURE) << "ro_compat " << bit;
		// Unknown compat features are fine by definition.
		b = good;
		put32(b, offsetof(ckpt_sb_disk, feature_compat), 1u << bit);
		recrc_block(b);
		EXPECT_EQ(decode_sb(b, dev), 0) << "compat " << bit;
	}
	{ // reserved fields and the unused tail are ignored (but covered by the crc)
		Block b = good;
		put32(b, offsetof(ckpt_sb_disk, reserved0), 0xffffffff);
		for (int i = 0; i < 4; i++)
			put64(b, offsetof(ckpt_sb_disk, reserved1) + 8 * i, ~0ull);
		b[4000] = 0x77;
		recrc_block(b);
		EXPECT_EQ(decode_sb(b, dev), 0);
	}
}

TEST(Superblock, GeometryCorruptions)
{
	auto sb = test_sb();
	const uint64_t dev = 1ull << 50;
	const Block good = encode_sb(*sb);
	struct Case {
		size_t off;
		uint32_t val;
	};
	const Case cases[] = {
		{offsetof(ckpt_sb_disk, n_chunks), 0},
		{offsetof(ckpt_sb_disk, n_chunks), CKPT_MAX_CHUNKS + 1},
		{offsetof(ckpt_sb_disk, n_chunks), 0xffffffff},
		{offsetof(ckpt_sb_disk, chunk_shift), CKPT_MIN_CHUNK_SHIFT - 1},
		{offsetof(ckpt_sb_disk, chunk_shift), CKPT_MAX_CHUNK_SHIFT + 1},
		{offsetof(ckpt_sb_disk, chunk_shift), 63},
		{offsetof(ckpt_sb_disk, chunk_shift), 0xffffffff},
		{offsetof(ckpt_sb_disk, n_groups), 0},
		{offsetof(ckpt_sb_disk, n_groups), CKPT_MAX_GROUPS + 1},
		{offsetof(ckpt_sb_disk, dtype), 0},
		{offsetof(ckpt_sb_disk, dtype), 3},
		{offsetof(ckpt_sb_disk, optimizer), 0},
		{offsetof(ckpt_sb_disk, optimizer), 2},
		{offsetof(ckpt_sb_disk, manifest_bytes), 8192 + 512},
		{offsetof(ckpt_sb_disk, manifest_bytes), CKPT_MANIFEST_MAX + 4096},
	};
	for (const auto &c : cases)
		EXPECT_EQ(decode_sb(patched32(good, c.off, c.val), dev), -CKPT_E_GEOMETRY)
			<< c.off << "=" << c.val;
	// A valid but different geometry no longer matches the stored offsets.
	for (const auto &c : std::vector<Case>{{offsetof(ckpt_sb_disk, n_chunks), 11},
					       {offsetof(ckpt_sb_disk, n_chunks), 9},
					       {offsetof(ckpt_sb_disk, chunk_shift), 12},
					       {offsetof(ckpt_sb_disk, manifest_bytes), 4096}}) {
		EXPECT_EQ(decode_sb(patched32(good, c.off, c.val), dev), -CKPT_E_LAYOUT)
			<< c.off << "=" << c.val;
	}
	// Geometry values that do not move anything are accepted.
	{
		Block b = good;
		put32(b, offsetof(ckpt_sb_disk, n_groups), 64);
		put32(b, offsetof(ckpt_sb_disk, dtype), CKPT_DTYPE_BF16);
		recrc_block(b);
		EXPECT_EQ(decode_sb(b, dev), 0);
	}
}

TEST(Superblock, EveryStoredOffsetAndSize)
{
	auto sb = test_sb();
	const uint64_t dev = 1ull << 50;
	const Block good = encode_sb(*sb);
	const size_t fields[] = {
		offsetof(ckpt_sb_disk, group_off),  offsetof(ckpt_sb_disk, manifest_off),
		offsetof(ckpt_sb_disk, plo_off),    offsetof(ckpt_sb_disk, plo_off) + 8,
		offsetof(ckpt_sb_disk, rec_off),    offsetof(ckpt_sb_disk, rec_off) + 8,
		offsetof(ckpt_sb_disk, record_bytes),
	};
	for (size_t off : fields) {
		const uint64_t v = get64(good, off);
		for (uint64_t nv : std::vector<uint64_t>{v + 4096, v - 4096, v + 1, v - 1,
						     v ^ (1ull << 63), 0, ~0ull}) {
			EXPECT_EQ(decode_sb(patched64(good, off, nv), dev), -CKPT_E_LAYOUT) << off << " = " << nv;
		}
	}
}

TEST(Superblock, DeviceSize)
{
	auto sb = test_sb();
	const uint64_t end = dev_of(*sb);
	const Block good = encode_sb(*sb);
	EXPECT_EQ(decode_sb(good, end), 0);
	EXPECT_EQ(decode_sb(good, end + 1), 0);
	EXPECT_EQ(decode_sb(good, ~0ull), 0);
	EXPECT_EQ(decode_sb(good, end - 1), -CKPT_E_TOO_SMALL);
	EXPECT_EQ(decode_sb(good, 0), -CKPT_E_TOO_SMALL);
	{ // stored dev_bytes below the layout end
		Block b = good;
		put64(b, offsetof(ckpt_sb_disk, dev_bytes), end - 4096);
		recrc_block(b);
		EXPECT_EQ(decode_sb(b, ~0ull), -CKPT_E_TOO_SMALL);
		put64(b, offsetof(ckpt_sb_disk, dev_bytes), 0);
		recrc_block(b);
		EXPECT_EQ(decode_sb(b, ~0ull), -CKPT_E_TOO_SMALL);
	}
	{ // stored dev_bytes above the layout end: the device must be that big
		Block b = good;
		put64(b, offsetof(ckpt_sb_disk, dev_bytes), end + (1 << 20));
		recrc_block(b);
		EXPECT_EQ(decode_sb(b, end), -CKPT_E_TOO_SMALL);
		auto out = std::make_unique<ckpt_sb>();
		EXPECT_EQ(ckpt_sb_decode(b.data(), end + (1 << 20), out.get()), 0);
		EXPECT_EQ(out->regions.dev_bytes, end + (1 << 20));
	}
}

TEST(Superblock, CommitRecordFields)
{
	auto sb = test_sb();
	const uint64_t dev = dev_of(*sb);
	const Block good = encode_sb(*sb);
	struct Case {
		size_t off;
		uint32_t val;
		int err;
	};
	const Case cases[] = {
		{offsetof(ckpt_sb_disk, blob_len), CKPT_BLOB_MAX + 1, -CKPT_E_BLOB},
		{offsetof(ckpt_sb_disk, blob_len), 0xffffffff, -CKPT_E_BLOB},
		{offsetof(ckpt_sb_disk, blob_len), CKPT_BLOB_MAX, 0},
		{offsetof(ckpt_sb_disk, committed_slot), 2, -CKPT_E_LAYOUT},
		{offsetof(ckpt_sb_disk, committed_slot), 0xffffffff, -CKPT_E_LAYOUT},
		{offsetof(ckpt_sb_disk, committed_slot), 0, 0},
		{offsetof(ckpt_sb_disk, manifest_len), 8193, -CKPT_E_MANIFEST},
		{offsetof(ckpt_sb_disk, manifest_len), 0xffffffff, -CKPT_E_MANIFEST},
		{offsetof(ckpt_sb_disk, manifest_len), 8192, 0},
		{offsetof(ckpt_sb_disk, manifest_len), 0, 0},
	};
	for (const auto &c : cases)
		EXPECT_EQ(decode_sb(patched32(good, c.off, c.val), dev), c.err)
			<< c.off << "=" << c.val;
}

TEST(Superblock, RandomMutationsNeverAcceptNonsense)
{
	// Hostile input: random bytes over a valid block, crc fixed up. Whatever
	// is accepted must be self-consistent.
	auto sb = test_sb();
	const uint64_t dev = dev_of(*sb);
	const Block good = encode_sb(*sb);
	std::mt19937_64 rng(7);
	int accepted = 0;
	auto out = std::make_unique<ckpt_sb>();
	for (int iter = 0; iter < 20000; iter++) {
		Block b = good;
		int n = 1 + int(rng() % 4);
		for (int k = 0; k < n; k++) {
			size_t pos = 12 + rng() % (sizeof(ckpt_sb_disk) - 12);
			b[pos] = uint8_t(rng());
		}
		recrc_block(b);
		int r = ckpt_sb_decode(b.data(), dev, out.get());
		ASSERT_LE(r, 0);
		ASSERT_GT(r, -CKPT_E_MAX);
		if (r == 0) {
			accepted++;
			ckpt_regions l;
			ASSERT_EQ(ckpt_regions_compute(&out->geo, &l), 0);
			ASSERT_LE(out->regions.dev_bytes, dev);
			ASSERT_LE(out->blob_len, CKPT_BLOB_MAX);
			ASSERT_LE(out->committed_slot, 1u);
			ASSERT_LE(out->manifest_len, out->geo.manifest_bytes);
		}
	}
	EXPECT_GT(accepted, 0); // mutations in the blob/uuid/seq are fine
}

// ---------------------------------------------------------------- ckpt_sb_pick

namespace {
struct PickFixture {
	std::unique_ptr<ckpt_sb> out = std::make_unique<ckpt_sb>();
	uint64_t dev = 0;
	int pick(const Block &b0, const Block &b1)
	{
		return ckpt_sb_pick(b0.data(), b1.data(), dev, out.get());
	}
};

Block sb_with_seq(uint64_t seq, uint64_t step, uint64_t *dev = nullptr)
{
	// A full blob that differs per sequence, so a torn write of it is visible.
	auto sb = test_sb(seq, CKPT_BLOB_MAX);
	sb->committed_step = step;
	sb->committed_slot = uint32_t(step & 1);
	for (uint32_t i = 0; i < CKPT_BLOB_MAX; i++)
		sb->blob[i] = uint8_t(seq * 31 + i);
	if (dev)
		*dev = dev_of(*sb);
	return encode_sb(*sb);
}
} // namespace

TEST(SuperblockPick, HighestValidSequence)
{
	PickFixture f;
	Block s4 = sb_with_seq(4, 40, &f.dev), s5 = sb_with_seq(5, 50), s6 = sb_with_seq(6, 60);
	EXPECT_EQ(f.pick(s4, s5), 1);
	EXPECT_EQ(f.out->sequence, 5u);
	EXPECT_EQ(f.out->committed_step, 50u);
	// copy 0 wins after copy 1 was decoded last: out must hold copy 0.
	EXPECT_EQ(f.pick(s6, s5), 0);
	EXPECT_EQ(f.out->sequence, 6u);
	EXPECT_EQ(f.out->committed_step, 60u);
	EXPECT_EQ(f.out->blob[0], uint8_t(6 * 31));
	EXPECT_EQ(ckpt_sb_next_offset(f.out.get()), CKPT_BLOCK);
	EXPECT_EQ(f.pick(s4, sb_with_seq(3, 30)), 0);
	EXPECT_EQ(f.out->sequence, 4u);
	EXPECT_EQ(ckpt_sb_next_offset(f.out.get()), CKPT_BLOCK);
	EXPECT_EQ(f.pick(s4, s5), 1);
	EXPECT_EQ(ckpt_sb_next_offset(f.out.get()), 0u);
	// Sequence 0 (freshly formatted, copy 1 never written).
	EXPECT_EQ(f.pick(sb_with_seq(0, 0), new_block()), 0);
	EXPECT_EQ(f.out->sequence, 0u);
	// Large sequences.
	EXPECT_EQ(f.pick(sb_with_seq(1ull << 40, 1), sb_with_seq((1ull << 40) - 1, 1)), 0);
}

TEST(SuperblockPick, FallsBackWhenOneCopyIsBad)
{
	PickFixture f;
	Block s4 = sb_with_seq(4, 40, &f.dev), s5 = sb_with_seq(5, 50);
	std::mt19937_64 rng(3);

	{ // newer copy corrupt: one bit
		Block b = s5;
		b[300] ^= 1;
		EXPECT_EQ(f.pick(s4, b), 0);
		EXPECT_EQ(f.out->sequence, 4u);
		EXPECT_EQ(f.out->committed_step, 40u);
	}
	{ // newer copy torn: its first sectors new, the rest random
		for (int sectors = 0; sectors < 8; sectors++) {
			Block b = s5;
			for (size_t i = size_t(sectors) * 512; i < CKPT_BLOCK; i++)
				b[i] = uint8_t(rng());
			EXPECT_EQ(f.pick(s4, b), 0) << sectors;
			EXPECT_EQ(f.out->sequence, 4u);
		}
	}
	// newer copy torn over an older one: some sectors new, the rest old
	for (int sectors = 1; sectors < 8; sectors++) {
		Block old3 = sb_with_seq(3, 30);
		Block b = s5;
		size_t cut = size_t(sectors) * 512;
		std::memcpy(b.data() + cut, old3.data() + cut, CKPT_BLOCK - cut);
		// Sectors past the header (5..7) are zero in both: not torn at all.
		EXPECT_EQ(f.pick(s4, b), cut >= sizeof(ckpt_sb_disk) ? 1 : 0) << sectors;
		// Old first sectors, new rest: torn, or all old (sequence 3 < 4).
		std::memcpy(b.data(), old3.data(), cut);
		std::memcpy(b.data() + cut, s5.data() + cut, CKPT_BLOCK - cut);
		EXPECT_EQ(f.pick(s4, b), 0) << sectors;
		EXPECT_EQ(f.out->sequence, 4u);
	}
	{ // copy 0 bad (random garbage), copy 1 good
		Block junk(CKPT_BLOCK);
		for (auto &c : junk)
			c = uint8_t(rng());
		EXPECT_EQ(f.pick(junk, s5), 1);
		EXPECT_EQ(f.out->sequence, 5u);
		Block torn = sb_with_seq(6, 60);
		std::memset(torn.data() + 1024, 0, CKPT_BLOCK - 1024);
		EXPECT_EQ(f.pick(torn, s5), 1);
		EXPECT_EQ(f.out->committed_step, 50u);
	}
	{ // a copy at the wrong offset (sequence parity) is not trusted
		EXPECT_EQ(f.pick(s5, sb_with_seq(3, 30)), 1);
		EXPECT_EQ(f.out->sequence, 3u);
		EXPECT_EQ(f.pick(s4, sb_with_seq(6, 60)), 0);
		EXPECT_EQ(f.out->sequence, 4u);
	}
}

TEST(SuperblockPick, FailsWhenBothBad)
{
	PickFixture f;
	Block s4 = sb_with_seq(4, 40, &f.dev), s5 = sb_with_seq(5, 50);
	Block zero = new_block();
	Block crc0 = s4;
	crc0[1000] ^= 0xff;
	Block crc1 = s5;
	crc1[1000] ^= 0xff;
	Block ver0 = s4;
	put32(ver0, offsetof(ckpt_sb_disk, version), 9);
	recrc_block(ver0);

	EXPECT_EQ(f.pick(zero, zero), -CKPT_E_MAGIC);
	// Copy 0 has no superblock at all: copy 1 says why there is none.
	EXPECT_EQ(f.pick(zero, crc1), -CKPT_E_CRC);
	EXPECT_EQ(f.pick(crc0, zero), -CKPT_E_CRC);
	EXPECT_EQ(f.pick(ver0, crc1), -CKPT_E_VERSION);
	// Both decode but both sit at the wrong offset.
	EXPECT_EQ(f.pick(s5, s4), -CKPT_E_NO_SB);
	// Device too small for both.
	f.dev -= 4096;
	EXPECT_EQ(f.pick(s4, s5), -CKPT_E_TOO_SMALL);
	EXPECT_EQ(ckpt_sb_pick(nullptr, s5.data(), f.dev, f.out.get()), -CKPT_E_INVAL);
}

// The copy not picked: blank and older commits are fine, anything else is
// damage the reader must report (a newer commit may have been lost).
TEST(SuperblockPick, OtherCopyDamage)
{
	PickFixture f;
	Block s4 = sb_with_seq(4, 40, &f.dev), s5 = sb_with_seq(5, 50);
	Block zero = new_block();
	Block crc1 = s5;
	crc1[1000] ^= 0xff;
	auto scratch = std::make_unique<ckpt_sb>();
	auto other = [&](const Block &b, uint32_t index) {
		return ckpt_sb_check_other(b.data(), index, f.dev, f.out.get(), scratch.get());
	};

	ASSERT_EQ(f.pick(s4, s5), 1);
	EXPECT_EQ(other(s4, 0), 0);		// the previous commit
	ASSERT_EQ(f.pick(zero, s5), 1);
	EXPECT_EQ(other(zero, 0), 0);		// never written (a fresh format)
	ASSERT_EQ(f.pick(s4, crc1), 0);		// the newest copy is corrupt: fall back ...
	EXPECT_EQ(other(crc1, 1), -CKPT_E_CRC);	// ... and say why
	Block torn = s5;			// a torn write: the tail is the old copy's
	std::memcpy(torn.data() + 2048, sb_with_seq(3, 30).data() + 2048, 2048);
	ASSERT_EQ(f.pick(s4, torn), 0);
	EXPECT_EQ(other(torn, 1), -CKPT_E_CRC);
	Block s6 = sb_with_seq(6, 60);		// valid, but at copy 1's offset
	ASSERT_EQ(f.pick(s4, s6), 0);
	EXPECT_EQ(other(s6, 1), -CKPT_E_NO_SB);
	EXPECT_EQ(ckpt_sb_check_other(s4.data(), 2, f.dev, f.out.get(), scratch.get()), -CKPT_E_INVAL);
}

// ---------------------------------------------------------------- metadata copies

TEST(Meta2, LayoutAppendsTheSecondCopyAndMovesNothing)
{
	ckpt_geometry g = test_geo();
	ckpt_regions v1, l;
	ASSERT_EQ(ckpt_regions_compute(&g, &v1), 0);
	ASSERT_EQ(ckpt_regions_compute_features(&g, 0, &l), 0);
	EXPECT_EQ(std::memcmp(&v1, &l, sizeof(l)), 0);
	EXPECT_EQ(v1.meta2_off, 0u);
	EXPECT_EQ(ckpt_meta_copies(&v1), 1u);

	ASSERT_EQ(ckpt_regions_compute_features(&g, CKPT_FEATURE_INCOMPAT_META2, &l), 0);
	EXPECT_EQ(ckpt_meta_copies(&l), 2u);
	EXPECT_EQ(l.meta2_off, v1.dev_bytes);
	EXPECT_EQ(l.dev_bytes, v1.dev_bytes + v1.group_bytes + v1.manifest_bytes);
	EXPECT_EQ(ckpt_group_offset(&l, 0), l.group_off);
	EXPECT_EQ(ckpt_manifest_offset(&l, 0), l.manifest_off);
	EXPECT_EQ(ckpt_group_offset(&l, 1), l.meta2_off);
	EXPECT_EQ(ckpt_manifest_offset(&l, 1), l.meta2_off + l.group_bytes);
	// every other offset and the virtual device's windows stay (its IMAGE
	// window holds the longer image)
	ckpt_regions a = l;
	a.meta2_off = 0;
	a.dev_bytes = v1.dev_bytes;
	EXPECT_EQ(a.virt_bytes, v1.virt_bytes + v1.group_bytes + v1.manifest_bytes);
	a.virt_bytes = v1.virt_bytes;
	EXPECT_EQ(std::memcmp(&a, &v1, sizeof(a)), 0);

	EXPECT_EQ(ckpt_regions_compute_features(&g, 1u << 31, &l), -CKPT_E_FEATURE);
	// the largest geometry still fits in 64 bits with the copy
	g.n_chunks = CKPT_MAX_CHUNKS;
	g.chunk_shift = CKPT_MAX_CHUNK_SHIFT;
	g.manifest_bytes = CKPT_MANIFEST_MAX;
	ASSERT_EQ(ckpt_regions_compute_features(&g, CKPT_FEATURE_INCOMPAT_META2, &l), 0);
	EXPECT_EQ(l.dev_bytes - l.meta2_off, l.group_bytes + l.manifest_bytes);
	EXPECT_EQ(l.meta2_off % 4096, 0u);
}

std::unique_ptr<ckpt_sb> meta2_sb(const std::vector<uint8_t> &groups)
{
	auto sb = test_sb();
	sb->feature_incompat = CKPT_FEATURE_INCOMPAT_META2;
	EXPECT_EQ(ckpt_regions_compute_features(&sb->geo, sb->feature_incompat, &sb->regions), 0);
	sb->group_crc = ckpt_crc32c(groups.data(), sb->geo.n_chunks);
	return sb;
}

TEST(Meta2, SuperblockCarriesTheGroupCrcAndTheLayout)
{
	const std::vector<uint8_t> groups = {0, 0, 0, 1, 1, 1, 1, 0, 0, 1};
	auto sb = meta2_sb(groups);
	Block b = encode_sb(*sb);
	EXPECT_EQ(get32(b, offsetof(ckpt_sb_disk, feature_incompat)), CKPT_FEATURE_INCOMPAT_META2);
	EXPECT_EQ(get64(b, offsetof(ckpt_sb_disk, meta2_off)), sb->regions.meta2_off);
	EXPECT_EQ(get32(b, offsetof(ckpt_sb_disk, group_crc)), sb->group_crc);
	auto out = std::make_unique<ckpt_sb>();
	ASSERT_EQ(ckpt_sb_decode(b.data(), dev_of(*sb), out.get()), 0);
	EXPECT_EQ(out->group_crc, sb->group_crc);
	EXPECT_EQ(out->regions.meta2_off, sb->regions.meta2_off);
	EXPECT_EQ(encode_sb(*out), b);
	// the second copy is part of the layout: a device without it is too small
	EXPECT_EQ(ckpt_sb_decode(b.data(), dev_of(*sb) - 1, out.get()), -CKPT_E_TOO_SMALL);
	// a stored meta2_off that is not the derived one
	Block bad = b;
	put64(bad, offsetof(ckpt_sb_disk, meta2_off), sb->regions.meta2_off + 4096);
	recrc_block(bad);
	EXPECT_EQ(decode_sb(bad, dev_of(*sb) + 4096), -CKPT_E_LAYOUT);
	// without the feature, meta2_off must be 0 and group_crc is not read
	auto v1 = test_sb();
	Block b1 = encode_sb(*v1);
	EXPECT_EQ(get64(b1, offsetof(ckpt_sb_disk, meta2_off)), 0u);
	put64(b1, offsetof(ckpt_sb_disk, meta2_off), sb->regions.meta2_off);
	recrc_block(b1);
	EXPECT_EQ(decode_sb(b1, dev_of(*sb)), -CKPT_E_LAYOUT);
	// encode refuses a layout that is not the feature's
	auto mixed = meta2_sb(groups);
	mixed->regions = v1->regions;
	Block tmp(CKPT_BLOCK);
	EXPECT_EQ(ckpt_sb_encode(mixed.get(), tmp.data()), -CKPT_E_LAYOUT);
}

TEST(Meta2, GroupTableCheck)
{
	std::vector<uint8_t> groups = {0, 0, 0, 1, 1, 1, 1, 0, 0, 1};
	groups.resize(4096, 0);
	auto sb = meta2_sb(groups);
	EXPECT_EQ(ckpt_group_table_check(sb.get(), groups.data()), 0);
	// one flipped byte, still a valid group: only the checksum sees it
	std::vector<uint8_t> flip = groups;
	flip[4] ^= 1;
	EXPECT_EQ(ckpt_group_table_check(sb.get(), flip.data()), -CKPT_E_CRC);
	// padding after the last chunk is not covered
	std::vector<uint8_t> pad = groups;
	pad[100] = 0xff;
	EXPECT_EQ(ckpt_group_table_check(sb.get(), pad.data()), 0);
	// a group out of range with a matching crc (a format bug) still refuses
	std::vector<uint8_t> range = groups;
	range[2] = 7;
	sb->group_crc = ckpt_crc32c(range.data(), sb->geo.n_chunks);
	EXPECT_EQ(ckpt_group_table_check(sb.get(), range.data()), -CKPT_E_LAYOUT);
	// without META2 there is no checksum: the range check is all there is
	auto v1 = test_sb();
	EXPECT_EQ(ckpt_group_table_check(v1.get(), flip.data()), 0);
	EXPECT_EQ(ckpt_group_table_check(v1.get(), range.data()), -CKPT_E_LAYOUT);
	EXPECT_EQ(ckpt_group_table_check(nullptr, groups.data()), -CKPT_E_INVAL);
	EXPECT_EQ(ckpt_group_table_check(v1.get(), nullptr), -CKPT_E_INVAL);
}

// ---------------------------------------------------------------- state record

// The one record check of both targets and every reader: each fault found,
// in order, and nothing else taken for one.
TEST(Record, CheckFindsEveryFault)
{
	const uint32_t shift = CKPT_MIN_CHUNK_SHIFT;
	const size_t cp = size_t(1) << shift;
	std::mt19937 rng(5);
	Block rec(CKPT_BLOCK + 12 * cp);
	for (size_t i = CKPT_BLOCK; i < rec.size(); i++)
		rec[i] = uint8_t(rng());
	std::vector<uint8_t> plo(2 * cp);
	for (auto &x : plo)
		x = uint8_t(rng());
	ckpt_rec want{};
	want.chunk = 7;
	want.slot = 1;
	want.chunk_shift = shift;
	want.step = 42;
	want.sequence = 99;
	ckpt_rec r = want;
	r.data_crc = ckpt_crc32c(rec.data() + CKPT_BLOCK, 12 * cp);
	r.plo_crc = ckpt_plo_crc(plo.data(), shift);
	ckpt_rec_encode(&r, rec.data());
	const Block good = rec;
	const uint8_t *data = rec.data() + CKPT_BLOCK;
	const uint32_t feat = CKPT_FEATURE_INCOMPAT_PLO_CRC;
	ckpt_rec got{};
	EXPECT_EQ(ckpt_rec_check(rec.data(), data, plo.data(), &want, feat, &got), CKPT_REC_OK);
	EXPECT_EQ(std::memcmp(&got, &r, sizeof(r)), 0);

	rec[8] ^= 1;	// header field: header crc
	EXPECT_EQ(ckpt_rec_check(rec.data(), data, plo.data(), &want, feat, &got), CKPT_REC_HEADER);
	for (auto field : {&ckpt_rec::chunk, &ckpt_rec::slot, &ckpt_rec::chunk_shift}) {
		ckpt_rec w = want;
		w.*field ^= 1;
		rec = good;
		EXPECT_EQ(ckpt_rec_check(rec.data(), data, plo.data(), &w, feat, &got), CKPT_REC_PLACE);
	}
	rec = good;
	rec[CKPT_BLOCK + 5 * cp] ^= 0x10;	// a bit of m
	EXPECT_EQ(ckpt_rec_check(rec.data(), data, plo.data(), &want, feat, &got), CKPT_REC_DATA);
	EXPECT_EQ(ckpt_rec_check(rec.data(), nullptr, plo.data(), &want, feat, &got), CKPT_REC_OK)
		<< "data not given: not checked";
	rec = good;
	for (auto field : {&ckpt_rec::step, &ckpt_rec::sequence}) {
		ckpt_rec w = want;
		w.*field += 1;
		EXPECT_EQ(ckpt_rec_check(rec.data(), data, plo.data(), &w, feat, &got), CKPT_REC_STEP);
		EXPECT_EQ(got.step, 42u);
	}
	plo[2 * cp - 1] ^= 0x80;
	EXPECT_EQ(ckpt_rec_check(rec.data(), data, plo.data(), &want, feat, &got), CKPT_REC_PLO);
	EXPECT_EQ(ckpt_rec_check(rec.data(), data, plo.data(), &want, 0, &got), CKPT_REC_OK)
		<< "an image without PLO_CRC has no p_lo checksum";
	EXPECT_EQ(ckpt_rec_check(rec.data(), data, nullptr, &want, feat, &got), CKPT_REC_OK);
	for (int f = CKPT_REC_OK; f <= CKPT_REC_PLO; f++)
		EXPECT_STRNE(ckpt_rec_fault_str(static_cast<ckpt_rec_fault>(f)), "unknown fault");
}

TEST(Record, RoundTripAndCorruptions)
{
	ckpt_rec r{};
	r.chunk = 12345;
	r.slot = 1;
	r.chunk_shift = 16;
	r.data_crc = 0xfeedf00d;
	r.step = 1ull << 33;
	r.sequence = 77;
	Block good(CKPT_BLOCK, 0xcc);
	ckpt_rec_encode(&r, good.data());
	for (size_t i = sizeof(ckpt_rec_disk); i < CKPT_BLOCK; i++)
		ASSERT_EQ(good[i], 0);
	EXPECT_EQ(sizeof(ckpt_rec_disk), 64u);
	ckpt_rec o{};
	ASSERT_EQ(ckpt_rec_decode(good.data(), &o), 0);
	EXPECT_EQ(std::memcmp(&o, &r, sizeof(r)), 0);

	Block b = good;
	put32(b, 0, 0);
	EXPECT_EQ(ckpt_rec_decode(b.data(), &o), -CKPT_E_MAGIC);
	for (size_t byte = 4; byte < sizeof(ckpt_rec_disk); byte++) {
		b = good;
		b[byte] ^= 0x40;
		EXPECT_EQ(ckpt_rec_decode(b.data(), &o), -CKPT_E_CRC) << byte;
	}
	b = good;
	put32(b, offsetof(ckpt_rec_disk, slot), 2);
	recrc_rec(b);
	EXPECT_EQ(ckpt_rec_decode(b.data(), &o), -CKPT_E_RECORD);
	b = good;
	put32(b, offsetof(ckpt_rec_disk, chunk_shift), 23);
	recrc_rec(b);
	EXPECT_EQ(ckpt_rec_decode(b.data(), &o), -CKPT_E_RECORD);
	b = good;
	put32(b, offsetof(ckpt_rec_disk, chunk_shift), 10);
	recrc_rec(b);
	EXPECT_EQ(ckpt_rec_decode(b.data(), &o), -CKPT_E_RECORD);
	b = good;
	put32(b, offsetof(ckpt_rec_disk, chunk), CKPT_MAX_CHUNKS);
	recrc_rec(b);
	EXPECT_EQ(ckpt_rec_decode(b.data(), &o), -CKPT_E_RECORD);
	b = good;
	put64(b, offsetof(ckpt_rec_disk, reserved), ~0ull);
	recrc_rec(b);
	EXPECT_EQ(ckpt_rec_decode(b.data(), &o), 0);
	// Bytes after the header are not part of the header crc.
	b = good;
	b[2000] = 1;
	EXPECT_EQ(ckpt_rec_decode(b.data(), &o), 0);
	EXPECT_EQ(ckpt_rec_decode(nullptr, &o), -CKPT_E_INVAL);
}

// ---------------------------------------------------------------- commands

TEST(Command, RoundTrip)
{
	EXPECT_EQ(sizeof(ckpt_cmd_disk), 64u);
	EXPECT_EQ(sizeof(ckpt_hparams_disk), 48u);
	for (uint32_t ng : {1u, 2u, 17u, CKPT_MAX_GROUPS}) {
		auto c = begin_cmd(123456789012ull, ng);
		int len;
		Block b = encode_cmd(*c, &len);
		ASSERT_EQ(len, int(64 + 48 * ng));
		for (size_t i = size_t(len); i < CKPT_BLOCK; i++)
			ASSERT_EQ(b[i], 0);
		auto o = std::make_unique<ckpt_cmd>();
		std::memset(o.get(), 0xa5, sizeof(ckpt_cmd));
		ASSERT_EQ(ckpt_cmd_decode(b.data(), uint32_t(len), o.get()), 0);
		EXPECT_EQ(std::memcmp(o.get(), c.get(), sizeof(ckpt_cmd)), 0) << ng;
		ASSERT_EQ(ckpt_cmd_decode(b.data(), CKPT_BLOCK, o.get()), 0);
		EXPECT_EQ(std::memcmp(o.get(), c.get(), sizeof(ckpt_cmd)), 0) << ng;
	}
	for (uint32_t bl : {0u, 1u, 100u, CKPT_BLOB_MAX}) {
		auto c = commit_cmd(99, bl);
		int len;
		Block b = encode_cmd(*c, &len);
		ASSERT_EQ(len, int(64 + bl));
		auto o = std::make_unique<ckpt_cmd>();
		ASSERT_EQ(ckpt_cmd_decode(b.data(), uint32_t(len), o.get()), 0);
		EXPECT_EQ(std::memcmp(o.get(), c.get(), sizeof(ckpt_cmd)), 0) << bl;
	}
	{
		auto c = abort_cmd(0);
		int len;
		Block b = encode_cmd(*c, &len);
		ASSERT_EQ(len, 64);
		auto o = std::make_unique<ckpt_cmd>();
		ASSERT_EQ(ckpt_cmd_decode(b.data(), 512, o.get()), 0);
		EXPECT_EQ(std::memcmp(o.get(), c.get(), sizeof(ckpt_cmd)), 0);
	}
	{ // decode reads only the command's bytes: an exact-size heap buffer
		auto c = commit_cmd(5, 10);
		int len;
		Block b = encode_cmd(*c, &len);
		std::vector<uint8_t> exact(b.begin(), b.begin() + len);
		auto o = std::make_unique<ckpt_cmd>();
		EXPECT_EQ(ckpt_cmd_decode(exact.data(), uint32_t(len), o.get()), 0);
	}
}

TEST(Command, EncodeRejectsBadCommands)
{
	Block b = new_block();
	auto c = begin_cmd(1, 0);
	EXPECT_EQ(ckpt_cmd_encode(c.get(), b.data()), -CKPT_E_GROUPS);
	c = begin_cmd(1, CKPT_MAX_GROUPS + 1);
	EXPECT_EQ(ckpt_cmd_encode(c.get(), b.data()), -CKPT_E_GROUPS);
	c = commit_cmd(1, CKPT_BLOB_MAX + 1);
	EXPECT_EQ(ckpt_cmd_encode(c.get(), b.data()), -CKPT_E_BLOB);
	c = abort_cmd(1);
	c->opcode = 0;
	EXPECT_EQ(ckpt_cmd_encode(c.get(), b.data()), -CKPT_E_OPCODE);
	c->opcode = CKPT_OP_ROLLBACK + 1;
	EXPECT_EQ(ckpt_cmd_encode(c.get(), b.data()), -CKPT_E_OPCODE);
	EXPECT_EQ(ckpt_cmd_encode(nullptr, b.data()), -CKPT_E_INVAL);
}

TEST(Command, Corruptions)
{
	auto bc = begin_cmd(7, 3);
	int blen;
	const Block begin = encode_cmd(*bc, &blen);
	auto cc = commit_cmd(7, 33);
	int clen;
	const Block commit = encode_cmd(*cc, &clen);
	auto ac = abort_cmd(7);
	int alen;
	const Block abort = encode_cmd(*ac, &alen);
	const size_t L = offsetof(ckpt_cmd_disk, length);

	// magic
	for (const Block *g : {&begin, &commit, &abort}) {
		Block b = *g;
		put32(b, 0, CKPT_SB_MAGIC);
		recrc_cmd(b);
		EXPECT_EQ(decode_cmd(b, CKPT_BLOCK), -CKPT_E_MAGIC);
	}
	// crc: every byte of the command, not the bytes after it
	for (int i = 4; i < blen; i++) {
		if (i >= int(L) && i < int(L) + 4)
			continue; // the length field: changes what the crc covers
		Block b = begin;
		b[size_t(i)] ^= 0x01;
		ASSERT_EQ(decode_cmd(b, CKPT_BLOCK), -CKPT_E_CRC) << i;
	}
	{
		Block b = begin;
		b[size_t(blen)] = 0xff;
		b[CKPT_BLOCK - 1] = 0xff;
		EXPECT_EQ(decode_cmd(b, CKPT_BLOCK), 0);
	}
	// version
	{
		Block b = commit;
		put32(b, offsetof(ckpt_cmd_disk, version), 2);
		recrc_cmd(b);
		EXPECT_EQ(decode_cmd(b, CKPT_BLOCK), -CKPT_E_VERSION);
	}
	// opcode
	for (uint32_t op : {0u, CKPT_OP_ROLLBACK + 1u, 0x100u, 0xffffffffu}) {
		Block b = abort;
		put32(b, offsetof(ckpt_cmd_disk, opcode), op);
		recrc_cmd(b);
		EXPECT_EQ(decode_cmd(b, CKPT_BLOCK), -CKPT_E_OPCODE) << op;
	}
	// length field: out of bounds
	for (uint32_t len : {0u, 12u, 63u, CKPT_BLOCK + 1, 0x10000u, 0xffffffffu}) {
		Block b = abort;
		put32(b, L, len);
		recrc_cmd(b);
		EXPECT_EQ(decode_cmd(b, CKPT_BLOCK), -CKPT_E_LENGTH) << len;
	}
	// length field: in bounds but not header + payload for the opcode
	for (int32_t delta : {-48, -1, 1, 48, 512}) {
		Block b = begin;
		put32(b, L, uint32_t(blen + delta));
		recrc_cmd(b);
		EXPECT_EQ(decode_cmd(b, CKPT_BLOCK), -CKPT_E_LENGTH) << "begin " << delta;
		b = commit;
		put32(b, L, uint32_t(clen + delta));
		recrc_cmd(b);
		EXPECT_EQ(decode_cmd(b, CKPT_BLOCK), -CKPT_E_LENGTH) << "commit " << delta;
	}
	for (uint32_t len : {65u, 64u + 48u, CKPT_BLOCK}) {
		Block b = abort;
		put32(b, L, len);
		recrc_cmd(b);
		EXPECT_EQ(decode_cmd(b, CKPT_BLOCK), -CKPT_E_LENGTH) << "abort " << len;
	}
	{ // BEGIN n_groups disagrees with the length
		Block b = begin;
		put32(b, offsetof(ckpt_cmd_disk, n_groups), 4);
		recrc_cmd(b);
		EXPECT_EQ(decode_cmd(b, CKPT_BLOCK), -CKPT_E_LENGTH);
	}
	{ // COMMIT blob_len disagrees with the length
		Block b = commit;
		put32(b, offsetof(ckpt_cmd_disk, blob_len), 32);
		recrc_cmd(b);
		EXPECT_EQ(decode_cmd(b, CKPT_BLOCK), -CKPT_E_LENGTH);
	}
	// n_groups out of range (length made consistent where possible)
	for (uint32_t ng : {0u, 65u, 0xffffffffu}) {
		Block b = begin;
		put32(b, offsetof(ckpt_cmd_disk, n_groups), ng);
		uint64_t want = 64 + 48ull * ng;
		if (want <= CKPT_BLOCK)
			put32(b, L, uint32_t(want));
		recrc_cmd(b);
		EXPECT_EQ(decode_cmd(b, CKPT_BLOCK), -CKPT_E_GROUPS) << ng;
	}
	// blob too big
	for (uint32_t bl : {CKPT_BLOB_MAX + 1, 4096u - 64u, 0xffffffffu}) {
		Block b = commit;
		put32(b, offsetof(ckpt_cmd_disk, blob_len), bl);
		uint64_t want = 64ull + bl;
		if (want <= CKPT_BLOCK)
			put32(b, L, uint32_t(want));
		recrc_cmd(b);
		EXPECT_EQ(decode_cmd(b, CKPT_BLOCK), -CKPT_E_BLOB) << bl;
	}
	// truncated write: the carrying write is shorter than the command
	EXPECT_EQ(decode_cmd(begin, uint32_t(blen)), 0);
	EXPECT_EQ(decode_cmd(begin, uint32_t(blen - 1)), -CKPT_E_LENGTH);
	EXPECT_EQ(decode_cmd(begin, 64), -CKPT_E_LENGTH);
	EXPECT_EQ(decode_cmd(abort, 63), -CKPT_E_LENGTH);
	EXPECT_EQ(decode_cmd(abort, 0), -CKPT_E_LENGTH);
	EXPECT_EQ(decode_cmd(commit, uint32_t(clen - 1)), -CKPT_E_LENGTH);
	// reserved fields ignored (but covered by the crc)
	{
		Block b = begin;
		put64(b, offsetof(ckpt_cmd_disk, reserved), ~0ull);
		put32(b, 64 + offsetof(ckpt_hparams_disk, reserved), 0xffffffff);
		recrc_cmd(b);
		EXPECT_EQ(decode_cmd(b, CKPT_BLOCK), 0);
	}
	// fields of other opcodes are ignored and come back zero
	{
		Block b = abort;
		put32(b, offsetof(ckpt_cmd_disk, n_groups), 5);
		put32(b, offsetof(ckpt_cmd_disk, blob_len), 5);
		put32(b, offsetof(ckpt_cmd_disk, grad_scale), 5);
		recrc_cmd(b);
		auto o = std::make_unique<ckpt_cmd>();
		ASSERT_EQ(ckpt_cmd_decode(b.data(), CKPT_BLOCK, o.get()), 0);
		EXPECT_EQ(o->n_groups, 0u);
		EXPECT_EQ(o->blob_len, 0u);
		EXPECT_EQ(o->grad_scale, 0u);
		EXPECT_EQ(o->step, 7u);
	}
}

// ROLLBACK: a header and nothing else, its step carried whole (0: whichever
// step is committed); what does not belong to it is ignored and comes back
// zero, a payload or a short write is refused, as for ABORT.
TEST(Command, RollbackRoundTripAndHostile)
{
	for (uint64_t step : {0ull, 1ull, 123456789012ull, ~0ull}) {
		auto c = test_cmd(CKPT_OP_ROLLBACK, step);
		int len;
		Block b = encode_cmd(*c, &len);
		ASSERT_EQ(len, 64);
		EXPECT_EQ(get32(b, offsetof(ckpt_cmd_disk, opcode)), uint32_t(CKPT_OP_ROLLBACK));
		for (size_t i = size_t(len); i < CKPT_BLOCK; i++)
			ASSERT_EQ(b[i], 0);
		auto o = std::make_unique<ckpt_cmd>();
		std::memset(o.get(), 0xa5, sizeof(ckpt_cmd));
		ASSERT_EQ(ckpt_cmd_decode(b.data(), 512, o.get()), 0);
		EXPECT_EQ(std::memcmp(o.get(), c.get(), sizeof(ckpt_cmd)), 0) << step;
	}
	// Encode ignores the fields of other opcodes too.
	auto c = test_cmd(CKPT_OP_ROLLBACK, 9);
	c->n_groups = 3;
	c->blob_len = 7;
	c->n_ranges = 2;
	int len;
	const Block rb = encode_cmd(*c, &len);
	ASSERT_EQ(len, 64);
	auto o = std::make_unique<ckpt_cmd>();
	ASSERT_EQ(ckpt_cmd_decode(rb.data(), CKPT_BLOCK, o.get()), 0);
	EXPECT_EQ(o->opcode, uint32_t(CKPT_OP_ROLLBACK));
	EXPECT_EQ(o->step, 9u);
	EXPECT_EQ(o->n_groups + o->blob_len + o->n_ranges, 0u);

	const size_t L = offsetof(ckpt_cmd_disk, length);
	for (uint32_t bad : {0u, 63u, 65u, 64u + 48u, CKPT_BLOCK, CKPT_BLOCK + 1, 0xffffffffu}) {
		Block b = rb;
		put32(b, L, bad);
		recrc_cmd(b);
		EXPECT_EQ(decode_cmd(b, CKPT_BLOCK), -CKPT_E_LENGTH) << "a payload or a short header " << bad;
	}
	EXPECT_EQ(decode_cmd(rb, 63), -CKPT_E_LENGTH) << "a write shorter than the command";
	for (int i = 4; i < 64; i++) {
		if (i >= int(L) && i < int(L) + 4)
			continue;
		Block b = rb;
		b[size_t(i)] ^= 0x80;
		ASSERT_EQ(decode_cmd(b, CKPT_BLOCK), -CKPT_E_CRC) << i;
	}
	{
		Block b = rb;
		put32(b, offsetof(ckpt_cmd_disk, version), CKPT_ABI_VERSION + 1);
		recrc_cmd(b);
		EXPECT_EQ(decode_cmd(b, CKPT_BLOCK), -CKPT_E_VERSION);
	}
	{ // hostile fields of other opcodes: ignored, zero
		Block b = rb;
		put32(b, offsetof(ckpt_cmd_disk, n_groups), 0xffffffff);
		put32(b, offsetof(ckpt_cmd_disk, blob_len), 0xffffffff);
		put32(b, offsetof(ckpt_cmd_disk, grad_scale), 0x7f800000);
		put64(b, offsetof(ckpt_cmd_disk, reserved), ~0ull);
		recrc_cmd(b);
		ASSERT_EQ(ckpt_cmd_decode(b.data(), CKPT_BLOCK, o.get()), 0);
		EXPECT_EQ(o->n_groups + o->blob_len + o->grad_scale + o->n_ranges, 0u);
		EXPECT_EQ(o->step, 9u);
	}
}

TEST(Command, RandomBytesNeverCrash)
{
	std::mt19937_64 rng(11);
	auto bc = begin_cmd(7, 3);
	int blen;
	const Block begin = encode_cmd(*bc, &blen);
	auto o = std::make_unique<ckpt_cmd>();
	for (int iter = 0; iter < 20000; iter++) {
		Block b = begin;
		int n = 1 + int(rng() % 3);
		for (int k = 0; k < n; k++)
			b[12 + rng() % 200] = uint8_t(rng());
		if (rng() & 1)
			recrc_cmd(b);
		uint32_t len = uint32_t(rng() % (CKPT_BLOCK + 1));
		int r = ckpt_cmd_decode(b.data(), len, o.get());
		ASSERT_LE(r, 0);
		if (r == 0) {
			ASSERT_LE(o->n_groups, CKPT_MAX_GROUPS);
			ASSERT_LE(o->blob_len, CKPT_BLOB_MAX);
		}
	}
}

// ---------------------------------------------------------------- status page

namespace {
std::unique_ptr<ckpt_status> test_status()
{
	auto st = std::make_unique<ckpt_status>();
	st->state = CKPT_STATE_OPEN;
	st->last_result = CKPT_RESULT_REJECTED;
	st->last_error = CKPT_E_TWICE;
	st->first_io_error = 5;
	st->committed_step = 1ull << 40;
	st->open_step = (1ull << 40) + 1;
	st->committed_slot = 1;
	st->overflow = 1;
	st->chunks_done = 17;
	st->steps_committed = 100;
	st->steps_skipped = 3;
	st->steps_aborted = 2;
	st->commands_rejected = 9;
	st->grad_bytes = 1ull << 45;
	st->param_bytes = 1ull << 44;
	st->io_errors = 1;
	st->geo = test_geo();
	st->blob_len = 300;
	for (int i = 0; i < 300; i++)
		st->blob[i] = uint8_t(i ^ 0x5a);
	return st;
}
} // namespace

TEST(Status, RoundTripAndCorruptions)
{
	auto st = test_status();
	Block good(CKPT_BLOCK, 0xcc);
	ckpt_status_encode(st.get(), good.data());
	for (size_t i = sizeof(ckpt_status_disk); i < CKPT_BLOCK; i++)
		ASSERT_EQ(good[i], 0);
	auto o = std::make_unique<ckpt_status>();
	std::memset(o.get(), 0x33, sizeof(ckpt_status));
	ASSERT_EQ(ckpt_status_decode(good.data(), o.get()), 0);
	// ckpt_status has no padding holes, so memcmp is exact.
	EXPECT_EQ(std::memcmp(o.get(), st.get(), offsetof(ckpt_status, blob) + 300), 0);
	for (uint32_t i = 300; i < CKPT_BLOB_MAX; i++)
		ASSERT_EQ(o->blob[i], 0);

	Block b = good;
	put32(b, 0, CKPT_CMD_MAGIC);
	recrc_block(b);
	EXPECT_EQ(ckpt_status_decode(b.data(), o.get()), -CKPT_E_MAGIC);
	for (size_t byte : {4ul, 9ul, 12ul, 100ul, 200ul, 3000ul, 4095ul}) {
		b = good;
		b[byte] ^= 0x80;
		EXPECT_EQ(ckpt_status_decode(b.data(), o.get()), -CKPT_E_CRC) << byte;
	}
	// Fields out of range under a correct crc are refused; the reserved words are ignored.
	const struct {
		size_t off;
		uint32_t val;
		int err;
	} fields[] = {
		{offsetof(ckpt_status_disk, version), 2, -CKPT_E_VERSION},
		{offsetof(ckpt_status_disk, blob_len), CKPT_BLOB_MAX + 1, -CKPT_E_BLOB},
		{offsetof(ckpt_status_disk, state), 3, -CKPT_E_INVAL},
		{offsetof(ckpt_status_disk, last_result), 5, -CKPT_E_INVAL},
		{offsetof(ckpt_status_disk, committed_slot), 2, -CKPT_E_INVAL},
	};
	for (const auto &c : fields)
		EXPECT_EQ(ckpt_status_decode(patched32(good, c.off, c.val).data(), o.get()), c.err) << c.off;
	b = patched64(good, offsetof(ckpt_status_disk, reserved), ~0ull);
	EXPECT_EQ(ckpt_status_decode(b.data(), o.get()), 0);
}
