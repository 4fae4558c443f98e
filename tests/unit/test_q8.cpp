// SPDX-License-Identifier: MIT
// 8-bit moments (feature Q8): the block-wise dynamic quantization and the
// update on it. Every build of the update must give the scalar one's bytes
// (the kernel's SSE2 and AVX2 builds are two of them); the codes stay within
// the map's resolution of the values they stand for.
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

extern "C" {
#include "ckpt_update.h"
#include "ckpt_update_variants.h"
#include "ckpt_q8_tables.h"
}

namespace {

uint32_t bits(float f) { return std::bit_cast<uint32_t>(f); }
float flt(uint32_t u) { return std::bit_cast<float>(u); }

// The Q8 part of a record's data for n params (its own buffer).
struct Q8 {
	explicit Q8(uint64_t n) : m(n), v(n), ms(n / CKPT_Q8_BLOCK), vs(n / CKPT_Q8_BLOCK) {}
	struct ckpt_q8_state state() { return {m.data(), v.data(), ms.data(), vs.data()}; }
	std::vector<uint8_t> m, v;
	std::vector<uint32_t> ms, vs;
	bool operator==(const Q8 &o) const { return m == o.m && v == o.v && ms == o.ms && vs == o.vs; }
};

// Values spread over many decades (each block its own range), some zeros.
std::vector<uint32_t> spread(std::mt19937_64 &rng, uint64_t n, bool non_negative)
{
	std::uniform_real_distribution<double> u(0.0, 1.0);
	std::vector<uint32_t> x(n);
	for (uint64_t b = 0; b < n; b += CKPT_Q8_BLOCK) {
		const double top = std::pow(10.0, -12.0 + 14.0 * u(rng));
		const int kind = static_cast<int>(rng() % 4);
		for (uint64_t i = b; i < b + CKPT_Q8_BLOCK; i++) {
			double val = kind == 0 ? 0.0 : top * std::pow(10.0, -8.0 * u(rng));
			if (kind == 1 && i % 7 == 0)
				val = 0.0;
			if (!non_negative && (rng() & 1))
				val = -val;
			x[i] = bits(static_cast<float>(val));
		}
	}
	return x;
}

// Half of the largest gap between neighbouring codes in [lo, 1] of a map.
double half_gap_above(const uint32_t *code, double lo)
{
	double g = 0;
	for (int j = 0; j < 255; j++)
		if (std::fabs(flt(code[j])) >= lo || std::fabs(flt(code[j + 1])) >= lo)
			g = std::max(g, (double)flt(code[j + 1]) - flt(code[j]));
	return g / 2;
}

} // namespace

TEST(Q8, MapsAreSortedWithZeroAndOne)
{
	for (const uint32_t *code : {ckpt_q8_code_m, ckpt_q8_code_v}) {
		bool zero = false;
		for (int j = 0; j < 256; j++) {
			if (j) {
				ASSERT_LT(flt(code[j - 1]), flt(code[j])) << j;
			}
			zero |= code[j] == 0;
		}
		EXPECT_TRUE(zero);
		EXPECT_EQ(code[255], bits(1.0f));
	}
	EXPECT_EQ(ckpt_q8_code_v[0], 0u);	// exp_avg_sq's map is non-negative
}

// decode(encode(x)): the scale is the block's largest magnitude, exactly
// (and its extreme decodes to itself), except where exp_avg's largest
// negative magnitude is beyond 0.993 of its largest positive value: then it is
// the least scale at which the map's most negative code (-0.993) reaches that
// magnitude, which decodes to itself or an fp32 or two above; a zero block
// stays zero; each value is its
// nearest code times the scale, so within half the map's gap there (in
// [-1, 1]: at most 0.0072 of the scale for exp_avg, 0.0036 for exp_avg_sq;
// relative 7.1% and 3.6% from a tenth of the scale up).
TEST(Q8, RoundTripWithinTheMapsResolution)
{
	std::mt19937_64 rng(8);
	const uint64_t n = 64 * CKPT_Q8_BLOCK;
	const std::vector<uint32_t> m = spread(rng, n, false), v = spread(rng, n, true);
	Q8 q(n);
	const struct ckpt_q8_state s = q.state();
	ckpt_q8_encode(&s, m.data(), v.data(), n);
	std::vector<uint32_t> dm(n), dv(n);
	ckpt_q8_decode(&s, dm.data(), dv.data(), n);

	const double abs_m = half_gap_above(ckpt_q8_code_m, 0.0), abs_v = half_gap_above(ckpt_q8_code_v, 0.0);
	const double rel_m = half_gap_above(ckpt_q8_code_m, 0.1) / 0.1;
	const double rel_v = half_gap_above(ckpt_q8_code_v, 0.1) / 0.1;
	EXPECT_LT(abs_m, 0.0072);
	EXPECT_LT(abs_v, 0.0036);
	EXPECT_LT(rel_m, 0.071);
	EXPECT_LT(rel_v, 0.036);
	for (uint64_t b = 0; b < n; b += CKPT_Q8_BLOCK) {
		const std::vector<uint32_t> *xs[2] = {&m, &v};
		const std::vector<uint32_t> *ds[2] = {&dm, &dv};
		const uint32_t scales[2] = {q.ms[b / CKPT_Q8_BLOCK], q.vs[b / CKPT_Q8_BLOCK]};
		for (int k = 0; k < 2; k++) {
			float pmax = 0, nmax = 0;
			for (uint64_t i = b; i < b + CKPT_Q8_BLOCK; i++) {
				const float x = flt((*xs[k])[i]);
				pmax = std::max(pmax, x);
				nmax = std::max(nmax, -x);
			}
			const float amax = std::max(pmax, nmax), c0 = -flt(ckpt_q8_code_m[0]), sc = flt(scales[k]);
			// the least scale >= pmax at which c0 reaches nmax
			ASSERT_GE(sc, pmax) << "block " << b / CKPT_Q8_BLOCK;
			if (nmax > pmax) {
				ASSERT_EQ(k, 0);
			}
			if (k == 0 && sc > pmax) {
				ASSERT_GE(c0 * sc, nmax) << "block " << b / CKPT_Q8_BLOCK;
				ASSERT_LT(c0 * flt(scales[k] - 1), nmax) << "block " << b / CKPT_Q8_BLOCK;
			} else {
				ASSERT_EQ(scales[k], bits(amax)) << "block " << b / CKPT_Q8_BLOCK;
			}
			// (slack: the fp32 division and midpoints, a few ulps)
			const double ab = ((k ? abs_v : abs_m) + 1e-6) * sc + 1e-45;
			const double rel = (k ? rel_v : rel_m) + 1e-5;
			for (uint64_t i = b; i < b + CKPT_Q8_BLOCK; i++) {
				const double x = flt((*xs[k])[i]), d = flt((*ds[k])[i]);
				ASSERT_LE(std::fabs(d - x), ab) << k << " i=" << i << " x=" << x;
				if (std::fabs(x) >= 0.1 * amax) {
					ASSERT_LE(std::fabs(d - x), rel * std::fabs(x)) << k << " i=" << i;
				}
				if (x == 0) {
					ASSERT_EQ(d, 0.0) << k << " i=" << i;
				}
				if (x == amax && sc == amax) {	// the top code: the scale
					ASSERT_EQ(d, x) << k << " i=" << i;
				}
				if (x == -amax && amax > 0) {	// the least decodable value at or above it
					ASSERT_LE(d, x) << k << " i=" << i;
					ASSERT_LE(bits(d) - bits(x), 2u) << k << " i=" << i;
				}
			}
		}
	}
}

// The nearest code, by brute force, over values in [-1, 1] and just beside
// every code and midpoint.
TEST(Q8, EncodeTakesTheNearestCode)
{
	std::vector<uint32_t> x;
	for (const uint32_t *code : {ckpt_q8_code_m, ckpt_q8_code_v})
		for (int j = 0; j < 256; j++)
			for (uint32_t d : {0u, 1u, 2u})
				for (uint32_t u : {code[j] + d, code[j] - d})
					if (std::fabs(flt(u)) <= 1.0f)
						x.push_back(u);
	x.resize((x.size() + CKPT_Q8_BLOCK - 1) / CKPT_Q8_BLOCK * CKPT_Q8_BLOCK, 0);
	// one value 1.0 per block: the scale is 1, values are their own codes
	for (uint64_t b = 0; b < x.size(); b += CKPT_Q8_BLOCK)
		x[b] = bits(1.0f);
	std::vector<uint32_t> xv(x.size());
	for (size_t i = 0; i < x.size(); i++)
		xv[i] = x[i] & 0x7fffffffu;
	Q8 q(x.size());
	const struct ckpt_q8_state s = q.state();
	ckpt_q8_encode(&s, x.data(), xv.data(), x.size());
	for (size_t i = 0; i < x.size(); i++) {
		const uint8_t got[2] = {q.m[i], q.v[i]};
		const uint32_t *code[2] = {ckpt_q8_code_m, ckpt_q8_code_v};
		const float val[2] = {flt(x[i]), flt(xv[i])};
		for (int k = 0; k < 2; k++) {
			// a positive exp_avg_sq never takes code 0 (VarianceFarBelowItsBlockIsNotZero)
			double best = 1e9;
			for (int j = k == 1 && val[k] > 0 ? 1 : 0; j < 256; j++)
				best = std::min(best, std::fabs((double)val[k] - flt(code[k][j])));
			// a value within an ulp of a midpoint may take either side
			ASSERT_LE(std::fabs((double)val[k] - flt(code[k][got[k]])),
				  best + 3e-7 * std::fabs(val[k]) + 1e-40)
				<< k << " x=" << val[k];
		}
	}
}

namespace {

// The midpoints of a map as scripts/gen_q8_tables.py defines them: between
// neighbouring codes, rounded to fp32.
std::vector<float> midpoints(const uint32_t *code)
{
	std::vector<float> mid;
	for (int j = 0; j < 255; j++)
		mid.push_back(static_cast<float>(((double)flt(code[j]) + flt(code[j + 1])) / 2));
	return mid;
}

// The index the format defines: how many midpoints are below x (NaN: 0).
uint8_t index_by_count(const std::vector<float> &mid, uint32_t x)
{
	uint32_t i = 0;
	for (float m : mid)
		i += m < flt(x);
	return static_cast<uint8_t>(i);
}

} // namespace

// The bucket tables give exactly the count of midpoints below x, for x of
// both signs in both maps: at every bucket's edges, beside every midpoint,
// at +-0, +-1, NaN and 2^20 random values of [-1, 1]. The encode of a block
// whose scale is 1 is the index of each value, but a positive exp_avg_sq
// nearest to zero, which takes the least positive code.
TEST(Q8, BucketIndexIsTheMidpointCount)
{
	std::vector<uint32_t> x = {0u, 0x80000000u, bits(1.0f), bits(-1.0f), 0x7fc00000u, 0xffc00000u,
				   1u, 0x80000001u, 0x00800000u};
	for (const uint32_t *code : {ckpt_q8_code_m, ckpt_q8_code_v})
		for (float m : midpoints(code))
			for (uint32_t d = 0; d < 4; d++)
				for (uint32_t sign : {0u, 0x80000000u})
					for (uint32_t u : {bits(m) + d, bits(m) - d})
						x.push_back((u & 0x7fffffffu) | sign);
	for (uint32_t shift : {(uint32_t)CKPT_Q8_M_SHIFT, (uint32_t)CKPT_Q8_V_SHIFT})
		for (uint32_t k = 0x3000; k <= (0x3f800000u >> shift); k++)
			for (uint32_t sign : {0u, 0x80000000u})
				for (uint32_t r : {0u, 1u, (1u << shift) - 1})
					x.push_back(((k << shift) + r) | sign);
	std::mt19937_64 rng(11);
	for (int i = 0; i < (1 << 20); i++) {
		uint32_t u = static_cast<uint32_t>(rng());
		x.push_back((u & 0x80000000u) | (u & 0x7fffffffu) % 0x3f800001u);
	}
	std::erase_if(x, [](uint32_t u) { return (u & 0x7fffffffu) > 0x3f800000u && (u & 0x7fffffffu) <= 0x7f800000u; });
	// blocks of scale 1: a first value of 1. A negative value beyond the
	// signed map's -0.993 sets a larger scale for exp_avg (ckpt_q8_scale):
	// those go last, in blocks of their own, where exp_avg's index is that
	// of the value divided by the block's scale (as the encode divides)
	std::stable_partition(x.begin(), x.end(), [](uint32_t u) {
		return u < 0x80000000u || (u & 0x7fffffffu) <= (ckpt_q8_code_m[0] & 0x7fffffffu);
	});
	std::vector<uint32_t> blk;
	for (size_t i = 0; i < x.size(); i++) {
		if (blk.size() % CKPT_Q8_BLOCK == 0)
			blk.push_back(bits(1.0f));
		blk.push_back(x[i]);
	}
	blk.resize((blk.size() + CKPT_Q8_BLOCK - 1) / CKPT_Q8_BLOCK * CKPT_Q8_BLOCK, 0);
	// a NaN makes the block's scale NaN: take NaN's blocks without a scale of 1
	const std::vector<float> mid_m = midpoints(ckpt_q8_code_m), mid_v = midpoints(ckpt_q8_code_v);
	Q8 q(blk.size());
	const struct ckpt_q8_state s = q.state();
	ckpt_q8_encode(&s, blk.data(), blk.data(), blk.size());
	uint64_t checked = 0, unscaled = 0;
	for (size_t b = 0; b < blk.size(); b += CKPT_Q8_BLOCK) {
		const float ms = flt(q.ms[b / CKPT_Q8_BLOCK]);
		if (q.vs[b / CKPT_Q8_BLOCK] != bits(1.0f))
			continue;	// a NaN in the block: checked below
		for (size_t i = b; i < b + CKPT_Q8_BLOCK; i++) {
			ASSERT_EQ(q.m[i], index_by_count(mid_m, bits(flt(blk[i]) / ms))) << std::hex << blk[i];
			// a positive exp_avg_sq takes at least the least positive code
			const uint8_t v = index_by_count(mid_v, blk[i]);
			const bool positive = blk[i] - 1u < 0x7f7fffffu;
			ASSERT_EQ(q.v[i], positive && v == 0 ? 1 : v) << std::hex << blk[i];
			checked++;
			unscaled += ms == 1.0f;
		}
	}
	EXPECT_GT(checked, x.size() - 4 * CKPT_Q8_BLOCK);
	EXPECT_GT(unscaled, x.size() - 1024 * CKPT_Q8_BLOCK);
}

// A gradient far below its block's largest (an absent token's row of an
// output layer): its exp_avg_sq, the square, falls below exp_avg_sq's map
// while its exp_avg is still inside exp_avg's. Decoded to zero under a
// nonzero momentum it would step by m / eps; it keeps the least positive
// code, so the decoded ratio m / sqrt(v) stays at or below the fp32 one.
TEST(Q8, VarianceFarBelowItsBlockIsNotZero)
{
	std::vector<uint32_t> m(CKPT_Q8_BLOCK), v(CKPT_Q8_BLOCK);
	for (uint32_t i = 0; i < CKPT_Q8_BLOCK; i++) {
		const float g = i == 0 ? 1.0f : std::pow(10.0f, -1.0f - 6.0f * (float)i / CKPT_Q8_BLOCK);
		m[i] = bits(g);
		v[i] = bits(g * g);
	}
	Q8 q(CKPT_Q8_BLOCK);
	const struct ckpt_q8_state s = q.state();
	ckpt_q8_encode(&s, m.data(), v.data(), CKPT_Q8_BLOCK);
	const std::vector<float> mid_v = midpoints(ckpt_q8_code_v);
	uint32_t below = 0;
	for (uint32_t i = 0; i < CKPT_Q8_BLOCK; i++) {
		const float dm = flt(ckpt_q8_code_m[q.m[i]]) * flt(q.ms[0]);
		const float dv = flt(ckpt_q8_code_v[q.v[i]]) * flt(q.vs[0]);
		ASSERT_GT(dv, 0.0f) << i;
		if (index_by_count(mid_v, bits(flt(v[i]) / flt(q.vs[0]))) != 0 || dm == 0.0f)
			continue;
		// nearest code zero under a nonzero momentum: the least positive code,
		// above the variance, so the step is below fp32's
		below++;
		EXPECT_EQ(q.v[i], 1u) << i;
		EXPECT_LE(dm / std::sqrt(dv), flt(m[i]) / std::sqrt(flt(v[i]))) << i;
	}
	EXPECT_GT(below, 10u);	// the case is there
}

// A block with a NaN (a non-finite step, which is refused) is encoded
// without reading outside the tables: its scale is NaN's bits, every value
// divides to NaN and takes code 0.
TEST(Q8, NanBlockTakesCodeZero)
{
	std::vector<uint32_t> x(CKPT_Q8_BLOCK, bits(0.5f));
	x[7] = 0x7fc00000u;
	x[8] = bits(-0.25f);
	Q8 q(CKPT_Q8_BLOCK);
	const struct ckpt_q8_state s = q.state();
	ckpt_q8_encode(&s, x.data(), x.data(), CKPT_Q8_BLOCK);
	EXPECT_EQ(q.ms[0], 0x7fc00000u);
	for (uint32_t i = 0; i < CKPT_Q8_BLOCK; i++) {
		EXPECT_EQ(q.m[i], 0u) << i;
		EXPECT_EQ(q.v[i], 0u) << i;
	}
}

namespace {

// Encode m and v (a multiple of CKPT_Q8_BLOCK values), decode, encode the
// decoded values again: the second encode must give the first one's codes
// and scales, bit for bit (a load of exported state rewrites the same bytes).
// Counts in neg the blocks whose m extreme is negative.
void expect_reencode_identical(const std::vector<uint32_t> &m, const std::vector<uint32_t> &v, uint64_t &neg)
{
	const uint64_t n = m.size();
	Q8 a(n), b(n);
	const struct ckpt_q8_state sa = a.state(), sb = b.state();
	ckpt_q8_encode(&sa, m.data(), v.data(), n);
	std::vector<uint32_t> dm(n), dv(n);
	ckpt_q8_decode(&sa, dm.data(), dv.data(), n);
	ckpt_q8_encode(&sb, dm.data(), dv.data(), n);
	neg = 0;
	for (uint64_t k = 0; k < n / CKPT_Q8_BLOCK; k++) {
		const uint64_t b0 = k * CKPT_Q8_BLOCK;
		uint32_t ext = 0;
		for (uint64_t i = b0; i < b0 + CKPT_Q8_BLOCK; i++)
			if ((m[i] & 0x7fffffffu) > (ext & 0x7fffffffu))
				ext = m[i];
		neg += ext >> 31;
		const auto where = [&] {
			return ::testing::Message() << "block " << k << " extreme " << std::hex << ext << " scales "
						    << a.ms[k] << " " << a.vs[k];
		};
		ASSERT_EQ(b.ms[k], a.ms[k]) << where();
		ASSERT_EQ(b.vs[k], a.vs[k]) << where();
		for (uint64_t i = b0; i < b0 + CKPT_Q8_BLOCK; i++) {
			ASSERT_EQ(b.m[i], a.m[i]) << where() << " m[" << i - b0 << "] " << m[i];
			ASSERT_EQ(b.v[i], a.v[i]) << where() << " v[" << i - b0 << "] " << v[i];
		}
	}
}

std::vector<uint32_t> magnitudes(const std::vector<uint32_t> &x)
{
	std::vector<uint32_t> a(x.size());
	for (size_t i = 0; i < x.size(); i++)
		a[i] = x[i] & 0x7fffffffu;
	return a;
}

} // namespace

// Encode of a decoded block is the block's encode again: codes and scales,
// for random blocks over many decades (both signs: half of them have a
// negative extreme) and for the edge cases: a negative extreme alone, a
// positive and a negative extreme within the map's 0.7% of each other,
// zeros of both signs, subnormals (alone, whole blocks, beside normal
// values), the least normal, the largest finite values.
TEST(Q8, EncodeOfADecodedBlockIsItsEncode)
{
	std::mt19937_64 rng(9);
	const uint64_t n = 256 * CKPT_Q8_BLOCK;
	uint64_t neg = 0;
	ASSERT_NO_FATAL_FAILURE(expect_reencode_identical(spread(rng, n, false), spread(rng, n, true), neg));
	EXPECT_GT(neg, 64u);

	const float c0 = -flt(ckpt_q8_code_m[0]);	// 0.993
	const uint32_t edge[] = {1u, 2u, 3u, 7u, 0x00400000u, 0x007fffffu, 0x00800000u, 0x00800001u,
				 bits(flt(0x00800000u) / c0), bits(1e-30f), bits(1.0f), bits(c0),
				 bits(1.0f / c0), bits(3.3e38f), bits(c0 * flt(0x7f7fffffu)), 0x7f7ffffeu,
				 0x7f7fffffu};
	std::vector<uint32_t> x;
	const auto block = [&](std::initializer_list<uint32_t> head, uint32_t rest) {
		const size_t b = x.size();
		x.insert(x.end(), head);
		x.resize(b + CKPT_Q8_BLOCK, rest);
		return b;
	};
	for (uint32_t e : edge)
		for (uint32_t sign : {0u, 0x80000000u}) {
			block({e | sign}, 0);					// alone
			block({e | sign}, bits(flt(e) * 0.3f));		// beside a third of it
			const size_t b = block({e | sign}, 0);			// beside spread values
			for (size_t i = b + 1; i < b + CKPT_Q8_BLOCK; i++)
				x[i] = bits(flt(e) * static_cast<float>(std::pow(10.0, -7.0 * (rng() % 1000) / 1000.0))) |
				       static_cast<uint32_t>(rng() & 0x80000000u);
			// the other sign's extreme just above and just below the map's -0.993
			for (float r : {0.99f, 0.993f, 0.9931f, 0.996f, 1.0f})
				block({e | sign, bits(flt(e) * r) | (sign ^ 0x80000000u)}, bits(flt(e) * 0.01f));
		}
	block({}, 0);
	block({}, 0x80000000u);
	block({0x80000000u, 0, 0x80000000u}, 0);
	// at a subnormal scale (these extremes) the decode of these values' codes
	// would round to a value of the next code down
	block({0x58u, 0xau}, 0);
	block({0x92u, 0xfu}, 0);
	block({0xceu, 0x15u}, 0);
	for (int k = 0; k < 64; k++) {	// subnormal blocks
		const size_t b = block({}, 0);
		for (size_t i = b; i < b + CKPT_Q8_BLOCK; i++)
			x[i] = static_cast<uint32_t>(rng() % (0x00800000u >> (k % 23))) | static_cast<uint32_t>(rng() & 0x80000000u);
	}
	ASSERT_NO_FATAL_FAILURE(expect_reencode_identical(x, magnitudes(x), neg));
	EXPECT_GT(neg, 100u);

	// every code of each map decoded at one scale, subnormal (whose products
	// round far from their codes) to the largest finite
	std::vector<uint32_t> xm, xv;
	std::vector<uint32_t> scales = {1u, 2u, 3u, 0x001d884eu, 0x007fffffu, 0x00800000u, 0x00800001u, bits(1.0f),
					0x7f7fffffu};
	for (int k = 0; k < 64; k++) {
		scales.push_back(static_cast<uint32_t>(rng() % 0x00800000u));
		scales.push_back(static_cast<uint32_t>(rng() % 0x7f800000u));
	}
	for (uint32_t sc : scales)
		for (int j = 0; j < 256; j++) {
			xm.push_back(bits(flt(ckpt_q8_code_m[j]) * flt(sc)));
			xv.push_back(bits(flt(ckpt_q8_code_v[j]) * flt(sc)));
		}
	ASSERT_NO_FATAL_FAILURE(expect_reencode_identical(xm, xv, neg));
}

// The scale of a block whose extreme is negative, n: the least t (at least
// 2^-126) at which the map's most negative code decodes to at least n,
// fl(0.993 t) >= n; n beyond fl(0.993 FLT_MAX) takes that value's. The
// extreme takes that code. 2^15 random n over all binades.
TEST(Q8, NegativeExtremeTakesTheLeastScaleReachingIt)
{
	std::mt19937_64 rng(12);
	const uint64_t nb = 1u << 15, n = nb * CKPT_Q8_BLOCK;
	const float c0 = -flt(ckpt_q8_code_m[0]);
	const uint32_t ncap = bits(c0 * flt(0x7f7fffffu));
	std::vector<uint32_t> x(n), zeros(n);
	for (uint64_t k = 0; k < nb; k++) {
		x[k * CKPT_Q8_BLOCK] = 0x80000000u | static_cast<uint32_t>(1 + rng() % 0x7f7fffffu);
		x[k * CKPT_Q8_BLOCK + 1] = bits(flt(x[k * CKPT_Q8_BLOCK] & 0x7fffffffu) * 0.5f);
	}
	Q8 q(n);
	const struct ckpt_q8_state s = q.state();
	ckpt_q8_encode(&s, x.data(), zeros.data(), n);
	for (uint64_t k = 0; k < nb; k++) {
		const uint32_t nm = std::min(x[k * CKPT_Q8_BLOCK] & 0x7fffffffu, ncap), sc = q.ms[k];
		if (sc == 0x00800000u) {	// the least normal: the floor
			ASSERT_LE(nm, bits(c0 * flt(sc))) << std::hex << nm;
			continue;
		}
		ASSERT_EQ(q.m[k * CKPT_Q8_BLOCK], 0u) << std::hex << nm;
		ASSERT_GE(bits(c0 * flt(sc)), nm) << std::hex << nm << " scale " << sc;
		ASSERT_LT(bits(c0 * flt(sc - 1)), nm) << std::hex << nm << " scale " << sc;
	}
	uint64_t neg = 0;
	ASSERT_NO_FATAL_FAILURE(expect_reencode_identical(x, zeros, neg));
	EXPECT_EQ(neg, nb);
}

// The same for 2^20 values: 4096 blocks, whose extremes step through every
// binade of fp32, the other values of each its extreme times ratios from 1
// down to 10^-12 (into the subnormals), of random signs.
TEST(Q8, EncodeOfADecodedBlockIsItsEncodeOver2To20Values)
{
	std::mt19937_64 rng(10);
	const uint64_t nb = 4096, n = nb * CKPT_Q8_BLOCK;
	std::vector<uint32_t> x(n);
	for (uint64_t k = 0; k < nb; k++) {
		const uint32_t top = static_cast<uint32_t>(k * 0x7f7fffffull / (nb - 1));
		const uint32_t ext = top > 64 ? top - static_cast<uint32_t>(rng() % 64) : top;
		const float e = flt(ext);
		x[k * CKPT_Q8_BLOCK] = ext | static_cast<uint32_t>(k & 1u) << 31;
		for (uint64_t i = 1; i < CKPT_Q8_BLOCK; i++) {
			const double r = std::pow(10.0, -12.0 * static_cast<double>(rng() % 100000) / 100000.0);
			x[k * CKPT_Q8_BLOCK + i] = bits(e * static_cast<float>(r)) | static_cast<uint32_t>(rng() & 0x80000000u);
		}
	}
	uint64_t neg = 0;
	ASSERT_NO_FATAL_FAILURE(expect_reencode_identical(x, magnitudes(x), neg));
	EXPECT_GE(neg, nb / 2 - 1);
}

namespace {

ckpt_hparams hparams(std::mt19937_64 &rng, bool l2)
{
	std::uniform_real_distribution<double> u(0.0, 1.0);
	const double lr = std::pow(10.0, -5.0 + 3.0 * u(rng)), beta1 = 0.8 + 0.19 * u(rng);
	const double beta2 = 0.9 + 0.0999 * u(rng), eps = std::pow(10.0, -10.0 + 4.0 * u(rng));
	const double wd = 0.1 * u(rng);
	const int t = 1 + static_cast<int>(u(rng) * 2000);
	ckpt_hparams hp{};
	hp.lr = bits(static_cast<float>(lr));
	hp.beta1 = bits(static_cast<float>(beta1));
	hp.beta2 = bits(static_cast<float>(beta2));
	hp.eps = bits(static_cast<float>(eps));
	hp.weight_decay = bits(static_cast<float>(wd));
	hp.one_minus_beta1 = bits(static_cast<float>(1.0 - beta1));
	hp.one_minus_beta2 = bits(static_cast<float>(1.0 - beta2));
	hp.step_size = bits(static_cast<float>(lr / (1.0 - std::pow(beta1, t))));
	hp.bc2_sqrt = bits(static_cast<float>(std::sqrt(1.0 - std::pow(beta2, t))));
	hp.decay = bits(static_cast<float>(1.0 - lr * wd));
	hp.flags = l2 ? CKPT_GROUP_ADAM_L2 : 0;
	return hp;
}

struct State {
	std::vector<uint16_t> g, plo;
	std::vector<uint32_t> p;
	Q8 q;
	explicit State(uint64_t n) : g(n), plo(n), p(n), q(n) {}
};

State random_state(std::mt19937_64 &rng, uint64_t n, uint32_t dtype)
{
	State s(n);
	std::normal_distribution<float> nd(0.0f, 1.0f);
	for (uint64_t i = 0; i < n; i++) {
		s.p[i] = bits(nd(rng) * 0.05f);
		s.g[i] = dtype == CKPT_DTYPE_BF16 ? ckpt_f32_to_bf16(bits(nd(rng) * 1e-2f))
						  : ckpt_f32_to_f16(bits(nd(rng) * 1e-2f));
	}
	std::vector<uint32_t> m = spread(rng, n, false), v = spread(rng, n, true);
	const struct ckpt_q8_state st = s.q.state();
	ckpt_q8_encode(&st, m.data(), v.data(), n);
	return s;
}

uint32_t run(ckpt_update_q8_fn fn, const ckpt_hparams &hp, uint32_t dtype, State &s)
{
	std::vector<uint32_t> tmp(CKPT_Q8_TMP_WORDS);
	const struct ckpt_q8_state st = s.q.state();
	return fn(&hp, bits(1.0f), dtype, s.g.data(), s.p.data(), &st, tmp.data(), s.plo.data(),
		  s.p.size());
}

} // namespace

// The update's own encode: the state a step leaves, decoded and encoded
// again (as an export and import of it would), gives the same bytes.
TEST(Q8, UpdatedStateReencodesToTheSameBytes)
{
	std::mt19937_64 rng(6);
	const uint64_t n = 65536;
	for (uint32_t dtype : {(uint32_t)CKPT_DTYPE_FP16, (uint32_t)CKPT_DTYPE_BF16}) {
		const ckpt_hparams hp = hparams(rng, false);
		State s = random_state(rng, n, dtype);
		ASSERT_EQ(run(ckpt_update_chunk_q8, hp, dtype, s), 0u);
		std::vector<uint32_t> m(n), v(n);
		const struct ckpt_q8_state st = s.q.state();
		ckpt_q8_decode(&st, m.data(), v.data(), n);
		Q8 again(n);
		const struct ckpt_q8_state sa = again.state();
		ckpt_q8_encode(&sa, m.data(), v.data(), n);
		EXPECT_TRUE(again == s.q);
	}
}

// Every build (SSE2 is the kernel's baseline, AVX2 its other) gives the
// scalar build's bytes: params, codes, scales, low-precision params, flag.
TEST(Q8, UpdateBitIdenticalAcrossBuilds)
{
	ckpt_update_variant all[CKPT_UPDATE_VARIANTS_MAX];
	const unsigned nv = ckpt_update_variants(all);
	std::mt19937_64 rng(20261204);
	int runs = 0;
	for (uint32_t dtype : {(uint32_t)CKPT_DTYPE_FP16, (uint32_t)CKPT_DTYPE_BF16})
		for (bool l2 : {false, true})
			for (uint64_t n : {256u, 512u, 2048u, 4096u + 256u, 65536u}) {
				const ckpt_hparams hp = hparams(rng, l2);
				const State s0 = random_state(rng, n, dtype);
				State ref = s0;
				const uint32_t rf = run(ckpt_update_chunk_q8_scalar, hp, dtype, ref);
				for (unsigned i = 1; i < nv; i++) {
					if (!all[i].available)
						continue;
					SCOPED_TRACE(std::string(all[i].name) + " n=" + std::to_string(n));
					State s = s0;
					EXPECT_EQ(run(all[i].update_q8, hp, dtype, s), rf);
					EXPECT_EQ(s.p, ref.p);
					EXPECT_TRUE(s.q == ref.q);
					EXPECT_EQ(s.plo, ref.plo);
					runs++;
				}
			}
	EXPECT_GT(runs, 0);
}

// From zero moments (a new image) the first step gives exactly the fp32
// update's params: the update uses the new fp32 moments, and zero decodes
// to zero. The stored moments are those moments, encoded.
TEST(Q8, FirstStepEqualsTheFp32Update)
{
	std::mt19937_64 rng(3);
	const uint64_t n = 4096;
	const uint32_t dtype = CKPT_DTYPE_BF16;
	const ckpt_hparams hp = hparams(rng, false);
	State s = random_state(rng, n, dtype);
	const std::vector<uint32_t> zeros(n);
	const struct ckpt_q8_state st = s.q.state();
	ckpt_q8_encode(&st, zeros.data(), zeros.data(), n);
	std::vector<uint32_t> p = s.p, m(n), v(n);
	std::vector<uint16_t> plo(n);
	ASSERT_EQ(ckpt_update_chunk(&hp, bits(1.0f), dtype, s.g.data(), p.data(), m.data(), v.data(),
				    plo.data(), n),
		  0u);
	ASSERT_EQ(run(ckpt_update_chunk_q8, hp, dtype, s), 0u);
	EXPECT_EQ(s.p, p);
	EXPECT_EQ(s.plo, plo);
	Q8 want(n);
	const struct ckpt_q8_state ws = want.state();
	ckpt_q8_encode(&ws, m.data(), v.data(), n);
	EXPECT_TRUE(s.q == want);
}

// A non-finite gradient is flagged as in the fp32 update.
TEST(Q8, NonFiniteGradientIsFlagged)
{
	std::mt19937_64 rng(4);
	const ckpt_hparams hp = hparams(rng, false);
	State s = random_state(rng, 512, CKPT_DTYPE_FP16);
	s.g[300] = 0x7c00;	// +Inf
	EXPECT_NE(run(ckpt_update_chunk_q8, hp, CKPT_DTYPE_FP16, s), 0u);
}

// ---- bf16 masters with stochastic rounding (feature BF16M)

namespace {

std::vector<uint16_t> widen_to_bf16(const std::vector<uint32_t> &p)
{
	std::vector<uint16_t> out(p.size());
	for (size_t i = 0; i < p.size(); i++)
		out[i] = static_cast<uint16_t>(p[i] >> 16);
	return out;
}

uint32_t run_bf(ckpt_update_q8bf_fn fn, const ckpt_hparams &hp, State &s, std::vector<uint16_t> &p16,
		const ckpt_sr &sr)
{
	std::vector<uint32_t> tmp(CKPT_Q8_TMP_WORDS);
	const struct ckpt_q8_state st = s.q.state();
	return fn(&hp, bits(1.0f), s.g.data(), p16.data(), &st, tmp.data(), s.plo.data(), p16.size(), &sr);
}

} // namespace

// The rounding is unbiased: over N draws (other params, or other steps, of
// the same value) the mean of the bf16 results is the fp32 value within 5
// standard deviations of that mean, ulp * sqrt(f (1 - f) / N) for a value a
// fraction f of its bf16 ulp above the bf16 below it; every result is one of
// the two bf16 neighbours. Values: both signs, across a binade boundary, a
// subnormal, exact bf16 values (never moved).
TEST(BF16M, StochasticRoundingIsUnbiased)
{
	const uint64_t N = 1u << 16;
	const uint64_t seed = 0x0123456789abcdefull;
	for (float x : {1.0f + 0.3f / 128, -3.14159f, 0.999999f, 1e-3f, 7.1e-39f, 0.5f, -2.0f, 1234.567f}) {
		SCOPED_TRACE(x);
		const uint32_t xb = bits(x);
		const double lo = flt(xb & 0xffff0000u), hi = flt((xb & 0xffff0000u) + 0x10000u);
		const double ulp = std::fabs(hi - lo), f = std::fabs(x - lo) / ulp;
		const double bound = 5 * ulp * std::sqrt(f * (1 - f) / N) + 1e-12 * ulp;
		// over param indexes, one step
		const std::vector<uint32_t> xs(N, xb);
		std::vector<uint16_t> out(N);
		struct ckpt_sr sr;
		ckpt_sr_at(seed, 7, 1u << 20, &sr);
		ckpt_sr_round(&sr, xs.data(), out.data(), N);
		double sum = 0;
		for (uint16_t o : out) {
			const double y = flt(static_cast<uint32_t>(o) << 16);
			ASSERT_TRUE(y == lo || y == hi) << y;
			sum += y;
		}
		EXPECT_LE(std::fabs(sum / N - x), bound);
		// over steps, one param
		sum = 0;
		for (uint64_t t = 1; t <= N; t++) {
			ckpt_sr_at(seed, t, 12345, &sr);
			uint16_t o;
			ckpt_sr_round(&sr, &xb, &o, 1);
			sum += flt(static_cast<uint32_t>(o) << 16);
		}
		EXPECT_LE(std::fabs(sum / N - x), bound);
	}
}

// The noise is a fixed function of (seed, step, index): these values are
// part of the format (an image's kernel and engine must agree on them, and
// so must every later release); they were computed by an independent Python
// model of splitmix64 and lowbias32. The noise of a param is recovered from
// the rounding: a value L above a bf16 rounds up exactly when noise >= 2^16 - L.
TEST(BF16M, NoiseIsAFixedFunction)
{
	struct ckpt_sr sr;
	ckpt_sr_at(0x1122334455667788ull, 42, (3ull << 32) + 77, &sr);
	EXPECT_EQ(sr.key, 0x90817d51u);
	EXPECT_EQ(sr.first, 77u);
	const uint32_t want[8] = {0x6de5, 0x6d8f, 0x4d4b, 0x31a3, 0x45e8, 0x65e4, 0xd506, 0x7b5d};
	for (uint32_t i = 0; i < 8; i++) {
		struct ckpt_sr at = sr;
		at.first += i;
		uint32_t lo = 1, hi = 0x10000;	// the least L that rounds up
		while (lo < hi) {
			const uint32_t L = (lo + hi) / 2, x = bits(1.0f) + L;
			uint16_t o;
			ckpt_sr_round(&at, &x, &o, 1);
			if (o == 0x3f81u)
				hi = L;
			else
				lo = L + 1;
		}
		EXPECT_EQ(0x10000u - lo, want[i]) << i;
	}
}

// Every build (the kernel's SSE2 and AVX2 among them) gives the scalar
// build's bytes: masters, codes, scales, p_lo, flag.
TEST(BF16M, UpdateBitIdenticalAcrossBuilds)
{
	ckpt_update_variant all[CKPT_UPDATE_VARIANTS_MAX];
	const unsigned nv = ckpt_update_variants(all);
	std::mt19937_64 rng(20261205);
	int runs = 0;
	for (bool l2 : {false, true})
		for (uint64_t n : {256u, 512u, 2048u, 4096u + 256u, 65536u}) {
			const ckpt_hparams hp = hparams(rng, l2);
			const State s0 = random_state(rng, n, CKPT_DTYPE_BF16);
			const std::vector<uint16_t> p0 = widen_to_bf16(s0.p);
			struct ckpt_sr sr;
			ckpt_sr_at(rng(), rng() % 1000, (rng() % 64) << 16, &sr);
			State ref = s0;
			std::vector<uint16_t> pref = p0;
			const uint32_t rf = run_bf(ckpt_update_chunk_q8bf_scalar, hp, ref, pref, sr);
			for (unsigned i = 1; i < nv; i++) {
				if (!all[i].available)
					continue;
				SCOPED_TRACE(std::string(all[i].name) + " n=" + std::to_string(n));
				State s = s0;
				std::vector<uint16_t> p = p0;
				EXPECT_EQ(run_bf(all[i].update_q8bf, hp, s, p, sr), rf);
				EXPECT_EQ(p, pref);
				EXPECT_TRUE(s.q == ref.q);
				EXPECT_EQ(s.plo, ref.plo);
				runs++;
			}
		}
	EXPECT_GT(runs, 0);
}

// The update on bf16 masters is the Q8 update on the masters widened to
// fp32, then the new fp32 masters rounded with the noise of their index:
// the same moments, and p_lo is the new master.
TEST(BF16M, UpdateIsTheQ8UpdateThenStochasticRounding)
{
	std::mt19937_64 rng(5);
	const uint64_t n = 4096;
	const ckpt_hparams hp = hparams(rng, false);
	State s = random_state(rng, n, CKPT_DTYPE_BF16);
	std::vector<uint16_t> p16 = widen_to_bf16(s.p);
	for (uint64_t i = 0; i < n; i++)
		s.p[i] = static_cast<uint32_t>(p16[i]) << 16;
	State w = s;
	struct ckpt_sr sr;
	ckpt_sr_at(99, 3, 8192, &sr);
	ASSERT_EQ(run(ckpt_update_chunk_q8, hp, CKPT_DTYPE_BF16, w), 0u);
	ASSERT_EQ(run_bf(ckpt_update_chunk_q8bf, hp, s, p16, sr), 0u);
	std::vector<uint16_t> want(n);
	ckpt_sr_round(&sr, w.p.data(), want.data(), n);
	EXPECT_EQ(p16, want);
	EXPECT_EQ(s.plo, p16);
	EXPECT_TRUE(s.q == w.q);
	// and a non-finite gradient is flagged
	s.g[100] = 0x7f80;
	EXPECT_NE(run_bf(ckpt_update_chunk_q8bf, hp, s, p16, sr), 0u);
}

// The format has the one combination the update implements: with Q8 and
// dtype bf16. Anything else is refused (E_FEATURE), by the core's layout,
// which the kernel's constructor and every reader go through.
TEST(BF16M, OnlyWithQ8AndBf16)
{
	struct ckpt_geometry g{};
	g.n_chunks = 4;
	g.chunk_shift = 16;
	g.n_groups = 1;
	g.dtype = CKPT_DTYPE_BF16;
	g.optimizer = CKPT_OPT_ADAM;
	g.manifest_bytes = 4096;
	struct ckpt_regions l;
	const uint32_t base = CKPT_FEATURE_INCOMPAT_DEFAULT;
	EXPECT_EQ(ckpt_regions_compute_features(&g, base | CKPT_FEATURE_INCOMPAT_BF16M, &l), -CKPT_E_FEATURE);
	ASSERT_EQ(ckpt_regions_compute_features(&g, base | CKPT_FEATURE_INCOMPAT_Q8 | CKPT_FEATURE_INCOMPAT_BF16M,
					       &l),
		  0);
	// 4 KiB header + 4 B * 65536 + 2 * 4 B * 256 scales, in 4 KiB blocks
	EXPECT_EQ(l.record_bytes, 4096u + 266240u);
	g.dtype = CKPT_DTYPE_FP16;
	EXPECT_EQ(ckpt_regions_compute_features(&g, base | CKPT_FEATURE_INCOMPAT_Q8 | CKPT_FEATURE_INCOMPAT_BF16M,
					       &l),
		  -CKPT_E_FEATURE);
}

// Why the rounding is stochastic: updates of 1/78 of a bf16 ulp (lr 1e-4 on
// weights at 1.0, whose ulp is 2^-7) would all round back to 1.0 to nearest;
// stochastically the masters move by the fp32 update in the mean. 100 steps
// of a constant gradient: the expected master is 1 - 100 * 1e-4 = 0.99; the
// mean over 4096 params is within 5% of the distance moved.
TEST(BF16M, SmallUpdatesAccumulateInTheMean)
{
	const uint64_t n = 4096;
	const double lr = 1e-4, b1 = 0.9, b2 = 0.999;
	State s(n);
	std::vector<uint16_t> p16(n, 0x3f80);	// 1.0
	std::fill(s.g.begin(), s.g.end(), 0x3f80);
	const std::vector<uint32_t> zeros(n);
	const struct ckpt_q8_state st = s.q.state();
	ckpt_q8_encode(&st, zeros.data(), zeros.data(), n);
	for (int t = 1; t <= 100; t++) {
		ckpt_hparams hp{};
		hp.lr = bits(static_cast<float>(lr));
		hp.beta1 = bits(static_cast<float>(b1));
		hp.beta2 = bits(static_cast<float>(b2));
		hp.eps = bits(1e-8f);
		hp.one_minus_beta1 = bits(static_cast<float>(1 - b1));
		hp.one_minus_beta2 = bits(static_cast<float>(1 - b2));
		hp.step_size = bits(static_cast<float>(lr / (1 - std::pow(b1, t))));
		hp.bc2_sqrt = bits(static_cast<float>(std::sqrt(1 - std::pow(b2, t))));
		hp.decay = bits(1.0f);
		struct ckpt_sr sr;
		ckpt_sr_at(77, static_cast<uint64_t>(t), 0, &sr);
		ASSERT_EQ(run_bf(ckpt_update_chunk_q8bf, hp, s, p16, sr), 0u);
	}
	double sum = 0;
	for (uint16_t p : p16)
		sum += flt(static_cast<uint32_t>(p) << 16);
	EXPECT_NEAR(1.0 - sum / n, 100 * lr, 0.05 * 100 * lr);
}
