// SPDX-License-Identifier: GPL-2.0 OR MIT
//
// The fused AdamW update and the fp16/bf16 conversions:
//  - conversions against the CPU's own instructions (x86-64: F16C, vcvtph2ps
//    is exact, vcvtps2ph rounds to nearest even; aarch64: fcvt, the same) and
//    against reference code for bf16;
//  - every compiled variant of the one body bit-identical to the scalar build;
//  - the math is what ckpt_update.h says (a plain float reference);
//  - a long run's results hash to the value the x86-64 scalar build gives
//    (UpdateGolden), so every architecture computes the same bits.
//
// Built with -ffp-contract=off (CMakeLists.txt): on aarch64, where
// fused multiply-add is baseline, the float reference would otherwise be fused.
#include <gtest/gtest.h>

#if defined(__x86_64__)
#include <immintrin.h>
#elif defined(__aarch64__)
#include <arm_neon.h>
#endif

#include <cmath>
#include <cstdint>
#include <cstring>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "ckpt_update.h"
#include "ckpt_update_variants.h"

namespace {

uint32_t bits(float f)
{
	uint32_t u;
	std::memcpy(&u, &f, 4);
	return u;
}

float fl(uint32_t u)
{
	float f;
	std::memcpy(&f, &u, 4);
	return f;
}

#if defined(__x86_64__)
bool cpu_f16c()
{
	__builtin_cpu_init();
	return __builtin_cpu_supports("f16c");
}

__attribute__((target("f16c"))) uint32_t hw_f16_to_f32(uint16_t h)
{
	return bits(_cvtsh_ss(h));
}

__attribute__((target("f16c"))) uint16_t hw_f32_to_f16(uint32_t f)
{
	return (uint16_t)_cvtss_sh(fl(f), _MM_FROUND_TO_NEAREST_INT);
}

// 8 at a time, for the exhaustive sweep.
__attribute__((target("avx,f16c"))) void hw_f32_to_f16_x8(const uint32_t *f, uint16_t *h)
{
	__m256 x = _mm256_loadu_ps((const float *)f);
	__m128i r = _mm256_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT);
	_mm_storeu_si128((__m128i *)h, r);
}
#elif defined(__aarch64__)
// fp16 <-> fp32 conversions (fcvt) are baseline aarch64; FPCR is Linux's
// default, round to nearest even without flush-to-zero or default NaN.
bool cpu_f16c()
{
	return true;
}

uint32_t hw_f16_to_f32(uint16_t h)
{
	float16x4_t x = vreinterpret_f16_u16(vdup_n_u16(h));
	return vgetq_lane_u32(vreinterpretq_u32_f32(vcvt_f32_f16(x)), 0);
}

uint16_t hw_f32_to_f16(uint32_t f)
{
	float32x4_t x = vreinterpretq_f32_u32(vdupq_n_u32(f));
	return vget_lane_u16(vreinterpret_u16_f16(vcvt_f16_f32(x)), 0);
}

void hw_f32_to_f16_x8(const uint32_t *f, uint16_t *h)
{
	float16x4_t lo = vcvt_f16_f32(vreinterpretq_f32_u32(vld1q_u32(f)));
	float16x4_t hi = vcvt_f16_f32(vreinterpretq_f32_u32(vld1q_u32(f + 4)));
	vst1_u16(h, vreinterpret_u16_f16(lo));
	vst1_u16(h + 4, vreinterpret_u16_f16(hi));
}
#endif

// Reference fp32 -> bf16: round to nearest even on the dropped 16 bits, NaN quieted
// with its sign and top payload kept (what vcvtneps2bf16 does for NaN).
uint16_t ref_f32_to_bf16(uint32_t f)
{
	if ((f & 0x7fffffffu) > 0x7f800000u)
		return (uint16_t)((f >> 16) | 0x40u);
	uint32_t hi = f >> 16, lo = f & 0xffffu;
	if (lo > 0x8000u || (lo == 0x8000u && (hi & 1u)))
		hi++;
	return (uint16_t)hi;
}

// The values where fp32 -> fp16 rounding can go wrong: every fp16 value, the
// midpoints between neighbours (in the normal, subnormal and overflow ranges)
// and a few fp32 ulps either side, both signs, plus specials and a strided sweep.
std::vector<uint32_t> f16_boundary_inputs()
{
	std::vector<uint32_t> in;
	auto add_around = [&](uint32_t c) {
		for (int d = -3; d <= 3; d++) {
			uint32_t x = c + (uint32_t)d;
			in.push_back(x);
			in.push_back(x ^ 0x80000000u);
		}
	};
	for (uint32_t h = 0; h < 0x7c00u; h++) {
		uint32_t lo = hw_f16_to_f32((uint16_t)h);
		uint32_t hi = hw_f16_to_f32((uint16_t)(h + 1)); // 0x7c00: Inf
		add_around(lo);
		// midpoint: exact in fp32 (fp16 has 11 significant bits)
		float mid = (fl(lo) + (h + 1 == 0x7c00u ? 65536.0f : fl(hi))) * 0.5f;
		add_around(bits(mid));
	}
	// just below/at/above the fp16 range and the subnormal boundaries
	for (uint32_t c : {0x477fe000u, 0x477ff000u, 0x47800000u, 0x33000000u, 0x33800000u,
			   0x32ffffffu, 0x38800000u, 0x387fc000u, 0x387fe000u, 0x00000000u,
			   0x00000001u, 0x007fffffu, 0x00800000u, 0x7f7fffffu, 0x7f800000u,
			   0x7f800001u, 0x7fbfffffu, 0x7fc00000u, 0x7fc00001u, 0x7fffffffu,
			   0x7f802000u, 0x7f801fffu, 0x3f800000u})
		add_around(c);
	// strided sweep over all 2^32 patterns (prime stride, ~1M values)
	for (uint64_t x = 12345; x < (1ull << 32); x += 4093)
		in.push_back((uint32_t)x);
	return in;
}

struct Variant {
	const char *name;
	ckpt_update_fn fn;
	bool available;
};

// Every vectorized build of this architecture and the dispatched one.
std::vector<Variant> variants()
{
	ckpt_update_variant all[CKPT_UPDATE_VARIANTS_MAX];
	unsigned n = ckpt_update_variants(all);
	std::vector<Variant> out;
	for (unsigned i = 1; i < n; i++) // [0] is the scalar reference itself
		out.push_back({all[i].name, all[i].update, all[i].available != 0});
	return out;
}

struct RoundVariant {
	const char *name;
	ckpt_round_fn fn;
	bool available;
};

std::vector<RoundVariant> round_variants()
{
	ckpt_update_variant all[CKPT_UPDATE_VARIANTS_MAX];
	unsigned n = ckpt_update_variants(all);
	std::vector<RoundVariant> out;
	for (unsigned i = 0; i < n; i++)
		out.push_back({all[i].name, all[i].round, all[i].available != 0});
	return out;
}

// Hyperparameters as a client computes them (in double, like PyTorch).
ckpt_hparams make_hparams(std::mt19937_64 &rng, bool l2)
{
	std::uniform_real_distribution<double> u(0.0, 1.0);
	double lr = std::pow(10.0, -5.0 + 3.0 * u(rng));
	double beta1 = 0.8 + 0.19 * u(rng);
	double beta2 = 0.9 + 0.0999 * u(rng);
	double eps = std::pow(10.0, -10.0 + 4.0 * u(rng));
	double wd = u(rng) < 0.2 ? 0.0 : 0.1 * u(rng);
	int t = 1 + (int)(u(rng) * 2000);
	ckpt_hparams hp{};
	hp.lr = bits((float)lr);
	hp.beta1 = bits((float)beta1);
	hp.beta2 = bits((float)beta2);
	hp.eps = bits((float)eps);
	hp.weight_decay = bits((float)wd);
	hp.one_minus_beta1 = bits((float)(1.0 - beta1));
	hp.one_minus_beta2 = bits((float)(1.0 - beta2));
	hp.step_size = bits((float)(lr / (1.0 - std::pow(beta1, t))));
	hp.bc2_sqrt = bits((float)std::sqrt(1.0 - std::pow(beta2, t)));
	hp.decay = bits((float)(1.0 - lr * wd));
	hp.flags = l2 ? CKPT_GROUP_ADAM_L2 : 0;
	return hp;
}

enum class StateKind { Random, Zero, Denormal };

struct Chunk {
	std::vector<uint16_t> g, plo;
	std::vector<uint32_t> p, m, v;
};

// A finite random chunk: gradients are mostly ordinary values, with zeros,
// subnormals, large values and random finite bit patterns mixed in.
Chunk make_chunk(std::mt19937_64 &rng, size_t n, uint32_t dtype, StateKind sk)
{
	std::uniform_real_distribution<float> u(-1.0f, 1.0f);
	std::uniform_int_distribution<uint32_t> bitsd;
	Chunk c;
	c.g.resize(n);
	c.p.resize(n);
	c.m.resize(n);
	c.v.resize(n);
	c.plo.assign(n, 0xdeadu);
	for (size_t i = 0; i < n; i++) {
		uint32_t kind = bitsd(rng) % 16;
		uint16_t h;
		if (dtype == CKPT_DTYPE_FP16) {
			if (kind == 0)
				h = (uint16_t)(bitsd(rng) & 0x83ffu); // subnormal / zero
			else if (kind == 1)
				h = (uint16_t)(bitsd(rng) & 0x8000u);
			else if (kind == 2) {
				h = (uint16_t)bitsd(rng);
				if ((h & 0x7c00u) == 0x7c00u)
					h ^= 0x4000u;		// random finite pattern
			} else
				h = hw_f32_to_f16(bits(u(rng) * 1e-2f));
		} else {
			if (kind == 0)
				h = (uint16_t)(bitsd(rng) & 0x807fu);
			else if (kind == 1)
				h = (uint16_t)(bitsd(rng) & 0x8000u);
			else if (kind == 2) {
				h = (uint16_t)bitsd(rng);
				if ((h & 0x7f80u) == 0x7f80u)
					h ^= 0x4000u;
				// keep |g * scale| finite for the scales used (<= 2^4)
				if ((h & 0x7f80u) > 0x7a00u)
					h = (uint16_t)((h & 0x807fu) | 0x3f00u);
			} else
				h = ref_f32_to_bf16(bits(u(rng) * 1e-2f));
		}
		c.g[i] = h;
		switch (sk) {
		case StateKind::Random:
			c.p[i] = bits(u(rng) * 0.1f);
			c.m[i] = bits(u(rng) * 1e-3f);
			c.v[i] = bits(std::fabs(u(rng)) * 1e-6f);
			if (kind == 3) { // some fp16-subnormal-sized params
				c.p[i] = bits(u(rng) * 1e-6f);
			}
			break;
		case StateKind::Zero:
			c.p[i] = (kind & 1) ? 0x80000000u : 0u;
			c.m[i] = 0;
			c.v[i] = 0;
			break;
		case StateKind::Denormal:
			c.p[i] = (bitsd(rng) & 0x807fffffu);
			c.m[i] = (bitsd(rng) & 0x807fffffu);
			c.v[i] = (bitsd(rng) & 0x007fffffu);
			break;
		}
	}
	return c;
}

bool is_nan_bits(uint32_t u)
{
	return (u & 0x7fffffffu) > 0x7f800000u;
}

} // namespace

// ---------------------------------------------------------------- conversions

TEST(UpdateConv, F16ToF32ExhaustiveVsF16C)
{
	if (!cpu_f16c())
		GTEST_FAIL() << "this CPU has no F16C: the hardware reference for fp16 conversions is missing";
	std::vector<uint16_t> all(65536);
	std::vector<uint32_t> vec(65536);
	for (uint32_t h = 0; h < 65536; h++)
		all[h] = (uint16_t)h;
	ckpt_f16_to_f32_array(all.data(), vec.data(), all.size());
	for (uint32_t h = 0; h < 65536; h++) {
		uint32_t hw = hw_f16_to_f32((uint16_t)h);
		ASSERT_EQ(ckpt_f16_to_f32((uint16_t)h), hw) << std::hex << "h=" << h;
		ASSERT_EQ(vec[h], hw) << std::hex << "vector body, h=" << h;
	}
}

TEST(UpdateConv, Bf16ToF32Exhaustive)
{
	for (uint32_t h = 0; h < 65536; h++)
		ASSERT_EQ(ckpt_bf16_to_f32((uint16_t)h), h << 16);
}

TEST(UpdateConv, F32ToF16BoundariesVsF16C)
{
	if (!cpu_f16c())
		GTEST_FAIL() << "this CPU has no F16C: the hardware reference for fp16 conversions is missing";
	std::vector<uint32_t> in = f16_boundary_inputs();
	std::vector<uint16_t> out(in.size());
	for (size_t i = 0; i < in.size(); i++)
		ASSERT_EQ(ckpt_f32_to_f16(in[i]), hw_f32_to_f16(in[i]))
			<< std::hex << "f=" << in[i];
	for (const RoundVariant &rv : round_variants()) {
		if (!rv.available)
			continue;
		std::fill(out.begin(), out.end(), 0xdeadu);
		rv.fn(CKPT_DTYPE_FP16, in.data(), out.data(), in.size());
		for (size_t i = 0; i < in.size(); i++)
			ASSERT_EQ(out[i], hw_f32_to_f16(in[i]))
				<< rv.name << std::hex << " f=" << in[i];
	}
	RecordProperty("inputs", std::to_string(in.size()));
}

TEST(UpdateConv, F32ToBf16VsReference)
{
	std::vector<uint32_t> in;
	for (uint32_t h = 0; h < 65536; h++) {
		uint32_t c = h << 16;
		for (uint32_t lo : {0x0000u, 0x0001u, 0x7fffu, 0x8000u, 0x8001u, 0xffffu})
			in.push_back(c | lo);
		in.push_back(c - 1); // previous bf16 value's top half
	}
	for (uint64_t x = 777; x < (1ull << 32); x += 4093)
		in.push_back((uint32_t)x);
	std::vector<uint16_t> out(in.size());
	for (size_t i = 0; i < in.size(); i++)
		ASSERT_EQ(ckpt_f32_to_bf16(in[i]), ref_f32_to_bf16(in[i]))
			<< std::hex << "f=" << in[i];
	for (const RoundVariant &rv : round_variants()) {
		if (!rv.available)
			continue;
		rv.fn(CKPT_DTYPE_BF16, in.data(), out.data(), in.size());
		for (size_t i = 0; i < in.size(); i++)
			ASSERT_EQ(out[i], ref_f32_to_bf16(in[i]))
				<< rv.name << std::hex << " f=" << in[i];
	}
}

// All 2^32 fp32 patterns through the dispatched vector conversion, against
// vcvtps2ph (fp16) and the reference (bf16), and through every F16C build
// for fp16 (the one the dispatch does not pick). About 5 s with AVX-512.
TEST(UpdateConv, F32ToLowExhaustiveDispatched)
{
	if (!cpu_f16c())
		GTEST_FAIL() << "this CPU has no F16C: the hardware reference for fp16 conversions is missing";
	const size_t B = 1u << 20;
	std::vector<uint32_t> in(B);
	std::vector<uint16_t> out(B), hw(B), outb(B);
	std::vector<RoundVariant> f16c;
	for (const RoundVariant &rv : round_variants())
		if (rv.available && std::strstr(rv.name, "f16c"))
			f16c.push_back(rv);
	RecordProperty("f16c_builds", std::to_string(f16c.size()));
	for (uint64_t base = 0; base < (1ull << 32); base += B) {
		for (size_t i = 0; i < B; i++)
			in[i] = (uint32_t)(base + i);
		ckpt_round_params(CKPT_DTYPE_FP16, in.data(), out.data(), B);
		ckpt_round_params(CKPT_DTYPE_BF16, in.data(), outb.data(), B);
		for (size_t i = 0; i < B; i += 8)
			hw_f32_to_f16_x8(&in[i], &hw[i]);
		if (std::memcmp(out.data(), hw.data(), B * 2) != 0) {
			for (size_t i = 0; i < B; i++)
				ASSERT_EQ(out[i], hw[i]) << std::hex << "f=" << in[i];
		}
		for (const RoundVariant &rv : f16c) {
			rv.fn(CKPT_DTYPE_FP16, in.data(), out.data(), B);
			if (std::memcmp(out.data(), hw.data(), B * 2) != 0) {
				for (size_t i = 0; i < B; i++)
					ASSERT_EQ(out[i], hw[i]) << rv.name << std::hex << " f=" << in[i];
			}
		}
		for (size_t i = 0; i < B; i++) {
			if (outb[i] != ref_f32_to_bf16(in[i])) {
				ASSERT_EQ(outb[i], ref_f32_to_bf16(in[i])) << std::hex << "f=" << in[i];
			}
		}
	}
}

// ---------------------------------------------------------------- variants

namespace {

// expect_nf: the flag the scalar build must return; unset: either, as long
// as every variant agrees.
void expect_same_as_scalar(const char *name, ckpt_update_fn fn, const ckpt_hparams &hp,
			   uint32_t scale, uint32_t dtype, const Chunk &c, std::optional<bool> expect_nf,
			   bool allow_nan_payload)
{
	size_t n = c.g.size();
	Chunk a = c, b = c;
	uint32_t ra = ckpt_update_chunk_scalar(&hp, scale, dtype, a.g.data(), a.p.data(),
					       a.m.data(), a.v.data(), a.plo.data(), n);
	uint32_t rb = fn(&hp, scale, dtype, b.g.data(), b.p.data(), b.m.data(), b.v.data(),
			 b.plo.data(), n);
	if (expect_nf) {
		ASSERT_EQ(ra != 0, *expect_nf) << "scalar flag, n=" << n;
	}
	ASSERT_EQ(rb != 0, ra != 0) << name << " flag, n=" << n;
	for (size_t i = 0; i < n; i++) {
		const uint32_t *sa[3] = {&a.p[i], &a.m[i], &a.v[i]};
		const uint32_t *sb[3] = {&b.p[i], &b.m[i], &b.v[i]};
		for (int k = 0; k < 3; k++) {
			if (allow_nan_payload && is_nan_bits(*sa[k]) && is_nan_bits(*sb[k]))
				continue;
			ASSERT_EQ(*sb[k], *sa[k]) << name << " n=" << n << " i=" << i
						  << " state " << k << std::hex
						  << " g=" << c.g[i];
		}
		if (allow_nan_payload && is_nan_bits(a.p[i]))
			continue;
		ASSERT_EQ(b.plo[i], a.plo[i]) << name << " plo n=" << n << " i=" << i;
	}
}

const size_t kSizes[] = {0,  1,   2,   3,   5,   7,    8,    9,    15,   16,   17,  31,
			 32, 33,  47,  63,  64,  65,   100,  127,  128,  129,  255, 256,
			 257, 511, 513, 1000, 1023, 1024, 1025, 2048, 4097, 8191, 65536};

} // namespace

TEST(UpdateVariants, BitIdenticalToScalar)
{
	std::mt19937_64 rng(20240601);
	int runs = 0;
	for (uint32_t dtype : {(uint32_t)CKPT_DTYPE_FP16, (uint32_t)CKPT_DTYPE_BF16})
		for (bool l2 : {false, true})
			for (StateKind sk : {StateKind::Random, StateKind::Zero, StateKind::Denormal})
				for (size_t n : kSizes) {
					ckpt_hparams hp = make_hparams(rng, l2);
					uint32_t scale = bits(std::ldexp(1.0f, (int)(rng() % 21) - 16));
					if (rng() % 4 == 0)
						scale = bits(1.0f / 3.0f);
					Chunk c = make_chunk(rng, n, dtype, sk);
					for (const Variant &var : variants()) {
						if (!var.available)
							continue;
						SCOPED_TRACE(std::string(var.name) +
							     (dtype == CKPT_DTYPE_BF16 ? " bf16" : " fp16") +
							     (l2 ? " l2" : " adamw") + " n=" +
							     std::to_string(n));
						// random finite states may overflow a
						// result: flagged alike everywhere
						expect_same_as_scalar(var.name, var.fn, hp, scale, dtype, c,
								      std::nullopt, false);
						runs++;
					}
				}
	RecordProperty("runs", runs);
}

// The core's table of builds, which both hosts run (ckpt_update_builds.h):
// the pick rule (the last build whose needs the CPU has; the kernel masks a
// forced build's needs out), and every build this CPU runs gives the
// scalar's bits.
TEST(UpdateBuilds, OneTableOnePick)
{
	ASSERT_GE(ckpt_update_n_builds, 2u);
	EXPECT_EQ(ckpt_update_pick(0), &ckpt_update_builds[0]) << "the baseline needs nothing";
	EXPECT_EQ(ckpt_update_builds[0].needs, 0u);
	EXPECT_EQ(ckpt_update_pick(~0u), &ckpt_update_builds[ckpt_update_n_builds - 1]);
#if defined(__x86_64__)
	EXPECT_STREQ(ckpt_update_pick(CKPT_CPU_AVX2_F16C)->name, "avx2");
	EXPECT_STREQ(ckpt_update_pick(CKPT_CPU_AVX512)->name, "sse2") << "AVX-512 without AVX2";
	EXPECT_STREQ(ckpt_update_pick(CKPT_CPU_AVX2_F16C | CKPT_CPU_AVX512)->name, "avx512");
#endif
	std::mt19937_64 rng(77);
	const uint32_t cpu = ckpt_cpu_features();
	int runs = 0;
	for (unsigned i = 0; i < ckpt_update_n_builds; i++) {
		const ckpt_update_build &b = ckpt_update_builds[i];
		if (b.needs & ~cpu)
			continue;
		for (uint32_t dtype : {(uint32_t)CKPT_DTYPE_FP16, (uint32_t)CKPT_DTYPE_BF16})
			for (size_t n : {size_t(1), size_t(4097), size_t(65536)}) {
				SCOPED_TRACE(b.name);
				expect_same_as_scalar(b.name, b.update, make_hparams(rng, false),
						      bits(1.0f), dtype,
						      make_chunk(rng, n, dtype, StateKind::Random),
						      std::nullopt, false);
				runs++;
			}
	}
	EXPECT_GT(runs, 0);
	RecordProperty("runs", runs);
}

// Every fp16 gradient pattern (all 2^16, Inf and NaN included) through every
// build: the F16C builds convert them with vcvtph2ps, the others emulate it.
// Scaled by 1 and by 2^-20 (subnormal fp32 results of the scaling).
TEST(UpdateVariants, EveryFp16GradientSameAsScalar)
{
	std::mt19937_64 rng(65536);
	int runs = 0;
	for (bool l2 : {false, true})
		for (float sc : {1.0f, 0x1p-20f}) {
			Chunk c = make_chunk(rng, 65536, CKPT_DTYPE_FP16, StateKind::Random);
			for (uint32_t h = 0; h < 65536; h++)
				c.g[h] = (uint16_t)h;
			ckpt_hparams hp = make_hparams(rng, l2);
			for (const Variant &var : variants()) {
				if (!var.available)
					continue;
				SCOPED_TRACE(std::string(var.name) + (l2 ? " l2" : " adamw"));
				expect_same_as_scalar(var.name, var.fn, hp, bits(sc), CKPT_DTYPE_FP16, c, true,
						      true);
				runs++;
			}
		}
	RecordProperty("runs", runs);
}

// Unaligned starts: the vector code peels/uses unaligned accesses.
TEST(UpdateVariants, UnalignedOffsets)
{
	std::mt19937_64 rng(7);
	for (uint32_t dtype : {(uint32_t)CKPT_DTYPE_FP16, (uint32_t)CKPT_DTYPE_BF16})
		for (size_t off = 1; off < 17; off++) {
			ckpt_hparams hp = make_hparams(rng, off & 1);
			Chunk c = make_chunk(rng, 300 + off, dtype, StateKind::Random);
			Chunk a = c;
			uint32_t ra = ckpt_update_chunk_scalar(&hp, bits(1.0f), dtype, &a.g[off], &a.p[off],
							       &a.m[off], &a.v[off], &a.plo[off], 300 - off);
			for (const Variant &var : variants()) {
				if (!var.available)
					continue;
				Chunk b = c;
				uint32_t rb = var.fn(&hp, bits(1.0f), dtype, &b.g[off], &b.p[off], &b.m[off],
						     &b.v[off], &b.plo[off], 300 - off);
				ASSERT_EQ(ra, rb);
				ASSERT_EQ(a.p, b.p) << var.name << " off=" << off;
				ASSERT_EQ(a.m, b.m) << var.name << " off=" << off;
				ASSERT_EQ(a.v, b.v) << var.name << " off=" << off;
				ASSERT_EQ(a.plo, b.plo) << var.name << " off=" << off;
			}
		}
}

TEST(UpdateVariants, NonFiniteGradientFlag)
{
	std::mt19937_64 rng(99);
	int runs = 0;
	for (uint32_t dtype : {(uint32_t)CKPT_DTYPE_FP16, (uint32_t)CKPT_DTYPE_BF16})
		for (bool l2 : {false, true})
			for (size_t n : {1u, 7u, 16u, 17u, 33u, 64u, 100u, 1000u, 4097u}) {
				for (int what = 0; what < 5; what++) {
					ckpt_hparams hp = make_hparams(rng, l2);
					Chunk c = make_chunk(rng, n, dtype, StateKind::Random);
					size_t at = (what == 3) ? n - 1 : rng() % n; // the tail too
					uint32_t scale = bits(1.0f);
					bool f16 = dtype == CKPT_DTYPE_FP16;
					switch (what) {
					case 0: c.g[at] = f16 ? 0x7c00u : 0x7f80u; break; // +Inf
					case 1: c.g[at] = f16 ? 0xfc00u : 0xff80u; break; // -Inf
					case 2: c.g[at] = f16 ? 0x7e00u : 0x7fc0u; break; // qNaN
					case 3: c.g[at] = f16 ? 0xfd01u : 0xff81u; break; // sNaN
					case 4:	// finite grad, overflow by the scale
						c.g[at] = f16 ? 0x7bffu : 0x7f7fu;
						scale = bits(f16 ? 1e35f : 4.0f);
						break;
					}
					for (const Variant &var : variants()) {
						if (!var.available)
							continue;
						expect_same_as_scalar(var.name, var.fn, hp, scale, dtype, c,
								      true, true);
						runs++;
					}
				}
			}
	// and a finite chunk does not set it: 65504 * 2^-1 etc. (max finite values)
	ckpt_hparams hp = make_hparams(rng, false);
	Chunk c = make_chunk(rng, 64, CKPT_DTYPE_FP16, StateKind::Random);
	for (auto &g : c.g)
		g = 0x7bffu;
	for (const Variant &var : variants())
		if (var.available)
			expect_same_as_scalar(var.name, var.fn, hp, bits(1.0f), CKPT_DTYPE_FP16, c,
					      false, false);
	RecordProperty("runs", runs);
}

// A finite gradient whose update is not finite (eps = 0 with a zero gradient
// and zero moments gives 0/0; v or p overflowing) is flagged like a
// non-finite gradient, the same in every variant, so the step is skipped
// instead of committing NaN or Inf masters.
TEST(UpdateVariants, NonFiniteResultFlag)
{
	std::mt19937_64 rng(2026);
	const uint32_t kMax = 0x7f7fffffu;
	for (uint32_t dtype : {(uint32_t)CKPT_DTYPE_FP16, (uint32_t)CKPT_DTYPE_BF16})
		for (bool l2 : {false, true})
			for (size_t n : {1u, 7u, 16u, 17u, 64u, 100u, 4097u})
				for (int what = 0; what < 4; what++) {
					ckpt_hparams hp = make_hparams(rng, l2);
					Chunk c = make_chunk(rng, n, dtype, StateKind::Random);
					const size_t at = what == 3 ? n - 1 : rng() % n;
					const bool f16 = dtype == CKPT_DTYPE_FP16;
					uint32_t scale = bits(1.0f);
					switch (what) {
					case 0:		// eps = 0, zero gradient and moments: 0/0
					case 3:
						hp.eps = 0;
						hp.weight_decay = 0;	// Adam-L2: g stays 0
						c.g[at] = 0;
						c.m[at] = 0;
						c.v[at] = 0;
						break;
					case 1:		// g finite, g * g overflows v
						c.g[at] = f16 ? 0x7bffu : 0x7f7fu;	// 65504 / 3.4e38
						scale = bits(f16 ? 1e30f : 1.0f);
						break;
					case 2:		// p overflows: -FLT_MAX minus a huge step
						hp.eps = bits(1e-8f);
						hp.step_size = bits(1e38f);
						hp.decay = bits(1.0f);
						hp.weight_decay = 0;
						c.g[at] = f16 ? 0x3c00u : 0x3f80u;	// 1.0
						c.p[at] = kMax | 0x80000000u;
						c.m[at] = bits(1.0f);
						c.v[at] = bits(1.0f);
						break;
					}
					for (const Variant &var : variants()) {
						if (!var.available)
							continue;
						SCOPED_TRACE(std::string(var.name) + " case " + std::to_string(what) +
							     " n=" + std::to_string(n));
						expect_same_as_scalar(var.name, var.fn, hp, scale, dtype, c, true,
								      true);
					}
				}
}

// ---------------------------------------------------------------- the math

// Straightforward float reference, exactly the operation order of ckpt_update.h.
TEST(UpdateMath, MatchesHeaderFormula)
{
	if (!cpu_f16c())
		GTEST_FAIL() << "this CPU has no F16C: the hardware reference for fp16 conversions is missing";
	std::mt19937_64 rng(1234);
	for (uint32_t dtype : {(uint32_t)CKPT_DTYPE_FP16, (uint32_t)CKPT_DTYPE_BF16})
		for (bool l2 : {false, true}) {
			const size_t n = 37;
			ckpt_hparams hp = make_hparams(rng, l2);
			uint32_t scale_b = bits(0.5f);
			Chunk c = make_chunk(rng, n, dtype, StateKind::Random);
			Chunk out = c;
			uint32_t nf = ckpt_update_chunk(&hp, scale_b, dtype, out.g.data(), out.p.data(),
							out.m.data(), out.v.data(), out.plo.data(), n);
			bool any_nonfinite = false;
			const float scale = fl(scale_b), wd = fl(hp.weight_decay), decay = fl(hp.decay);
			const float beta1 = fl(hp.beta1), beta2 = fl(hp.beta2), eps = fl(hp.eps);
			const float omb1 = fl(hp.one_minus_beta1), omb2 = fl(hp.one_minus_beta2);
			const float step_size = fl(hp.step_size), bc2 = fl(hp.bc2_sqrt);
			for (size_t i = 0; i < n; i++) {
				float g = fl(dtype == CKPT_DTYPE_FP16 ? hw_f16_to_f32(c.g[i])
								      : (uint32_t)c.g[i] << 16);
				g = g * scale;
				float p = fl(c.p[i]), m = fl(c.m[i]), v = fl(c.v[i]);
				if (l2)
					g = g + wd * p;
				else
					p = p * decay;
				m = m * beta1 + g * omb1;
				v = v * beta2 + (g * g) * omb2;
				float denom = std::sqrt(v) / bc2 + eps;
				p = p - step_size * (m / denom);
				uint16_t lo = dtype == CKPT_DTYPE_FP16
						      ? hw_f32_to_f16(bits(p))
						      : ref_f32_to_bf16(bits(p));
				any_nonfinite |= !std::isfinite(p) || !std::isfinite(m) || !std::isfinite(v);
				EXPECT_EQ(out.p[i], bits(p)) << i;
				EXPECT_EQ(out.m[i], bits(m)) << i;
				EXPECT_EQ(out.v[i], bits(v)) << i;
				EXPECT_EQ(out.plo[i], lo) << i;
			}
			EXPECT_EQ(nf != 0, any_nonfinite);
		}
}

// One hand-checked element: first AdamW step, g = 1, p = 1.
TEST(UpdateMath, FirstStepByHand)
{
	ckpt_hparams hp{};
	hp.lr = bits(0.001f);
	hp.beta1 = bits(0.9f);
	hp.beta2 = bits(0.999f);
	hp.eps = bits(1e-8f);
	hp.weight_decay = bits(0.0f);
	hp.one_minus_beta1 = bits(0.1f);
	hp.one_minus_beta2 = bits(0.001f);
	hp.step_size = bits(0.001f / 0.1f);
	hp.bc2_sqrt = bits(std::sqrt(0.001f));
	hp.decay = bits(1.0f);
	uint16_t g = 0x3c00, plo = 0; // 1.0
	uint32_t p = bits(1.0f), m = 0, v = 0;
	EXPECT_EQ(ckpt_update_chunk(&hp, bits(1.0f), CKPT_DTYPE_FP16, &g, &p, &m, &v, &plo, 1), 0u);
	// m = 0.1, v = 0.001, m / (sqrt(v)/sqrt(0.001) + eps) ~ 0.1: the first
	// Adam step moves by lr, p ~ 1 - 0.001
	EXPECT_NEAR(fl(p), 0.999f, 1e-6f);
	EXPECT_EQ(plo, ckpt_f32_to_f16(p));
	EXPECT_EQ(fl(m), 0.1f);
	EXPECT_EQ(fl(v), 0.001f);
}

// ---------------------------------------------------------------- across arches

namespace {

uint64_t splitmix64(uint64_t &s)
{
	uint64_t z = (s += 0x9e3779b97f4a7c15ull);
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	return z ^ (z >> 31);
}

// FNV-1a over the bytes of an array.
void fnv1a(uint64_t &h, const void *p, size_t len)
{
	const unsigned char *b = static_cast<const unsigned char *>(p);
	for (size_t i = 0; i < len; i++)
		h = (h ^ b[i]) * 0x100000001b3ull;
}

// A float in [2^lo_exp, 2^(lo_exp + span)) with a random mantissa, as bits.
uint32_t rand_float(uint64_t &s, uint32_t lo_exp_biased, uint32_t span, bool sign)
{
	uint64_t r = splitmix64(s);
	uint32_t e = lo_exp_biased + (uint32_t)(r % span);
	uint32_t f = (e << 23) | (uint32_t)((r >> 8) & 0x7fffffu);
	return f | (sign && (r >> 63) ? 0x80000000u : 0u);
}

// A gradient: mostly ordinary values, with zeros and subnormals mixed in,
// built from integers only (no float arithmetic that could differ between
// the machine that computed the golden hash and this one).
uint16_t rand_grad(uint64_t &s, uint32_t dtype)
{
	uint64_t r = splitmix64(s);
	uint16_t sign = (r >> 63) ? 0x8000u : 0u;
	switch (r % 16) {
	case 0:
		return sign;
	case 1: // subnormal
		return (uint16_t)(sign | ((r >> 8) & (dtype == CKPT_DTYPE_FP16 ? 0x3ffu : 0x7fu)));
	default:
		if (dtype == CKPT_DTYPE_FP16) // 2^-14 .. 2^0
			return (uint16_t)(sign | (1 + (r >> 8) % 15) << 10 | ((r >> 16) & 0x3ffu));
		return (uint16_t)(sign | (113 + (r >> 8) % 15) << 7 | ((r >> 16) & 0x7fu));
	}
}

// Hyperparameters of a step: arbitrary finite bits in the ranges a training
// uses (the update takes them as bits; how a client computes them is not
// what this checks).
ckpt_hparams golden_hparams(uint64_t &s, bool l2)
{
	ckpt_hparams hp{};
	hp.lr = rand_float(s, 127 - 17, 8, false);		// 2^-17 .. 2^-9
	hp.beta1 = 0x3f666666u + (uint32_t)(splitmix64(s) % 0x100000u); // ~0.9
	hp.beta2 = 0x3f7fbe77u + (uint32_t)(splitmix64(s) % 0x4000u);	 // ~0.999
	hp.eps = rand_float(s, 127 - 30, 8, false);		// 2^-30 .. 2^-22
	hp.weight_decay = rand_float(s, 127 - 8, 5, false);	// 2^-8 .. 2^-3
	hp.one_minus_beta1 = rand_float(s, 127 - 4, 2, false);
	hp.one_minus_beta2 = rand_float(s, 127 - 11, 2, false);
	hp.step_size = rand_float(s, 127 - 14, 8, false);
	hp.bc2_sqrt = rand_float(s, 127 - 6, 6, false);	// 2^-6 .. 1
	hp.decay = 0x3f7f0000u + (uint32_t)(splitmix64(s) % 0x10000u);	// just below 1
	hp.flags = l2 ? CKPT_GROUP_ADAM_L2 : 0;
	return hp;
}

// kGoldenSteps steps of one chunk of kGoldenN params through fn, with an
// overflowed gradient now and then (the step is skipped: the state goes back
// to what it was, as the engine does); returns the hash of every step's flag
// and state.
constexpr size_t kGoldenN = 4099;	// not a multiple of any vector length
constexpr int kGoldenSteps = 40;

uint64_t golden_run(ckpt_update_fn fn, uint32_t dtype, bool l2)
{
	uint64_t s = 0x636b7074ull ^ (dtype << 8) ^ (l2 ? 1 : 0);
	std::vector<uint32_t> p(kGoldenN), m(kGoldenN), v(kGoldenN);
	std::vector<uint16_t> g(kGoldenN), plo(kGoldenN);
	for (size_t i = 0; i < kGoldenN; i++) {
		p[i] = rand_float(s, i % 64 ? 127 - 12 : 1, 12, true); // a few subnormal-range p
		m[i] = i % 7 ? rand_float(s, 127 - 20, 10, true) : 0;
		v[i] = i % 5 ? rand_float(s, 127 - 40, 20, false) : 0;
	}
	uint64_t h = 0xcbf29ce484222325ull;
	const uint32_t scales[] = {0x3f800000u, 0x3eaaaaabu /* 1/3 */, 0x37800000u /* 2^-16 */,
				   0x41800000u /* 16 */};
	for (int step = 0; step < kGoldenSteps; step++) {
		ckpt_hparams hp = golden_hparams(s, l2);
		uint32_t scale = scales[splitmix64(s) % 4];
		for (auto &x : g)
			x = rand_grad(s, dtype);
		if (step % 9 == 4) // Inf, then NaN: flagged, skipped
			g[splitmix64(s) % kGoldenN] = dtype == CKPT_DTYPE_FP16
							      ? (step % 2 ? 0x7e00u : 0xfc00u)
							      : (step % 2 ? 0x7fc0u : 0xff80u);
		std::vector<uint32_t> p0 = p, m0 = m, v0 = v;
		uint32_t nf = fn(&hp, scale, dtype, g.data(), p.data(), m.data(), v.data(), plo.data(),
				 kGoldenN);
		fnv1a(h, &nf, sizeof(nf));
		if (nf) {
			p = p0, m = m0, v = v0;
			continue;
		}
		fnv1a(h, p.data(), p.size() * 4);
		fnv1a(h, m.data(), m.size() * 4);
		fnv1a(h, v.data(), v.size() * 4);
		fnv1a(h, plo.data(), plo.size() * 2);
	}
	return h;
}

} // namespace

// What the x86-64 scalar build computes (tests/unit/test_update.cpp,
// UpdateGolden.LongRunSameBitsAsX86Scalar prints it): a change of the loop's
// arithmetic must change these on purpose, and every architecture's builds
// must give them.
TEST(UpdateGolden, LongRunSameBitsAsX86Scalar)
{
	struct Case {
		uint32_t dtype;
		bool l2;
		uint64_t golden;
	};
	const Case cases[] = {
		{CKPT_DTYPE_FP16, false, 0x336b30cf25078debull},
		{CKPT_DTYPE_FP16, true, 0x13fd9bbbda306175ull},
		{CKPT_DTYPE_BF16, false, 0x4b2224362b49b43aull},
		{CKPT_DTYPE_BF16, true, 0xb6c250305b803642ull},
	};
	ckpt_update_variant all[CKPT_UPDATE_VARIANTS_MAX];
	unsigned n = ckpt_update_variants(all);
	int runs = 0;
	for (const Case &c : cases)
		for (unsigned i = 0; i < n; i++) {
			if (!all[i].available)
				continue;
			uint64_t h = golden_run(all[i].update, c.dtype, c.l2);
			EXPECT_EQ(h, c.golden) << all[i].name << (c.dtype == CKPT_DTYPE_BF16 ? " bf16" : " fp16")
					       << (c.l2 ? " l2" : " adamw") << std::hex << ": hash 0x" << h;
			runs++;
		}
	RecordProperty("runs", runs);
}

// The gradients' sum of squares (the device's global gradient norm): the
// vectorized build gives the scalar build's bits, chaining over runs gives
// one call's, the order is the one ckpt_update.h fixes (so the kernel's SSE2
// build, chaining over its FPU slices, reports the same: the VM compares),
// and the value is the sum a long double gives, to fp64 rounding.
TEST(UpdateSumsq, VectorizedScalarChainedAndExact)
{
	std::mt19937 rng(7);
	const uint64_t n = 64 * CKPT_SUMSQ_BLOCK;
	for (uint32_t dtype : {CKPT_DTYPE_FP16, CKPT_DTYPE_BF16}) {
		std::vector<uint16_t> g(n);
		for (auto &h : g) {
			h = uint16_t(rng());
			const uint32_t e = dtype == CKPT_DTYPE_BF16 ? (h >> 7) & 0xff : (h >> 10) & 0x1f;
			if (e == (dtype == CKPT_DTYPE_BF16 ? 0xffu : 0x1fu))
				h &= 0xbfff;	// finite: Inf and NaN are the next test's
		}
		const uint64_t one = ckpt_grad_sumsq(dtype, g.data(), n, 0);
		EXPECT_EQ(one, ckpt_grad_sumsq_scalar(dtype, g.data(), n, 0));
		uint64_t chained = 0;
		for (uint64_t at = 0, k = CKPT_SUMSQ_BLOCK; at < n; at += k, k *= 2)
			chained = ckpt_grad_sumsq(dtype, g.data() + at, std::min(k, n - at), chained);
		EXPECT_EQ(one, chained);

		// The order by hand: lanes, folded in halves, block totals in order.
		double acc = 0;
		long double exact = 0;
		for (uint64_t b = 0; b < n; b += CKPT_SUMSQ_BLOCK) {
			double lane[CKPT_SUMSQ_LANES] = {};
			for (uint64_t i = 0; i < CKPT_SUMSQ_BLOCK; i++) {
				const uint16_t h = g[b + i];
				const double x = double(
					fl(dtype == CKPT_DTYPE_BF16 ? ckpt_bf16_to_f32(h) : ckpt_f16_to_f32(h)));
				lane[i % CKPT_SUMSQ_LANES] += x * x;
				exact += (long double)x * x;
			}
			for (uint32_t w = CKPT_SUMSQ_LANES / 2; w; w >>= 1)
				for (uint32_t j = 0; j < w; j++)
					lane[j] += lane[j + w];
			acc += lane[0];
		}
		double got;
		std::memcpy(&got, &one, 8);
		EXPECT_EQ(got, acc);
		EXPECT_NEAR(got, double(exact), 1e-12 * double(exact));
		EXPECT_GT(got, 0.0);
	}
}

TEST(UpdateSumsq, NonFinitePropagates)
{
	std::vector<uint16_t> g(CKPT_SUMSQ_BLOCK, 0x3c00);	// fp16 1.0
	double got;
	uint64_t r = ckpt_grad_sumsq(CKPT_DTYPE_FP16, g.data(), g.size(), 0);
	std::memcpy(&got, &r, 8);
	EXPECT_EQ(got, double(CKPT_SUMSQ_BLOCK));
	g[17] = 0x7c00;	// +Inf
	r = ckpt_grad_sumsq(CKPT_DTYPE_FP16, g.data(), g.size(), 0);
	std::memcpy(&got, &r, 8);
	EXPECT_TRUE(std::isinf(got));
	g[17] = 0x7e00;	// NaN
	r = ckpt_grad_sumsq(CKPT_DTYPE_FP16, g.data(), g.size(), 0);
	std::memcpy(&got, &r, 8);
	EXPECT_TRUE(std::isnan(got));
	const uint64_t v[3] = {r, 0, 0};
	uint64_t t = ckpt_sum_f64(v, 3);
	std::memcpy(&got, &t, 8);
	EXPECT_TRUE(std::isnan(got));
}
