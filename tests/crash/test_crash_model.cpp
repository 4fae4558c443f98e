// SPDX-License-Identifier: MIT
// The crash model itself: the enumerator yields every image the model allows,
// each once, and the images are built as the model says.
#include <gtest/gtest.h>

#include <map>
#include <set>

#include "crash_model.hpp"

extern "C" {
#include "ckpt_codec.h"
}

namespace {

using crash::CrashState;
using crash::Event;

Event w(uint64_t off, uint8_t fill, size_t len = CKPT_SECTOR, Event::Kind k = Event::write)
{
	return {k, off, std::vector<uint8_t>(len, fill)};
}

Event flush() { return {Event::flush, 0, {}}; }

// Writes to distinct blocks (so different subsets give different images), a
// flush, the superblock forced, more writes.
std::vector<Event> sample_events()
{
	return {w(3 * CKPT_BLOCK, 1), w(4 * CKPT_BLOCK, 2), w(2 * CKPT_BLOCK, 3), flush(),
		w(CKPT_BLOCK, 4, CKPT_BLOCK, Event::durable_write), w(5 * CKPT_BLOCK, 5), w(6 * CKPT_BLOCK, 6),
		w(7 * CKPT_BLOCK, 7), flush(), w(0, 8, CKPT_BLOCK, Event::durable_write)};
}

// Every image the model allows, by brute force: at every point, every subset
// of the writes since the last flush.
std::set<std::vector<uint8_t>> allowed(const std::vector<Event> &ev, const std::vector<uint8_t> &initial)
{
	std::set<std::vector<uint8_t>> out;
	for (size_t k = 0; k <= ev.size(); k++) {
		std::vector<size_t> maybe;
		for (size_t i = 0; i < k; i++) {
			if (ev[i].kind == Event::flush)
				maybe.clear();
			else if (ev[i].kind == Event::write)
				maybe.push_back(i);
		}
		for (uint64_t bits = 0; bits < (uint64_t{1} << maybe.size()); bits++) {
			std::vector<uint8_t> img = initial;
			size_t first = maybe.empty() ? k : maybe.front();
			for (size_t i = 0; i < k; i++) {
				const Event &e = ev[i];
				if (!e.is_write())
					continue;
				bool in = i < first || e.kind == Event::durable_write;
				for (size_t j = 0; j < maybe.size(); j++)
					if (maybe[j] == i && ((bits >> j) & 1))
						in = true;
				if (in)
					std::copy(e.data.begin(), e.data.end(), img.begin() + static_cast<long>(e.off));
			}
			out.insert(img);
		}
	}
	return out;
}

TEST(CrashModel, EnumeratesEveryAllowedImageOnce)
{
	const std::vector<Event> ev = sample_events();
	const std::vector<uint8_t> initial(8 * CKPT_BLOCK, 0);
	crash::EnumerateOptions o;
	std::vector<CrashState> states = crash::enumerate(ev, o);
	crash::ImageBuilder b(initial, ev);
	std::map<std::vector<uint8_t>, size_t> seen;
	size_t untorn = 0;
	for (const CrashState &s : states) {
		const std::vector<uint8_t> img = b.build(s);
		if (s.torn.len)
			continue;
		untorn++;
		EXPECT_EQ(seen.count(img), 0u) << s.describe(ev) << " repeats state " << seen[img];
		seen[img] = untorn;
	}
	const std::set<std::vector<uint8_t>> want = allowed(ev, initial);
	EXPECT_EQ(seen.size(), want.size());
	for (const auto &img : want)
		EXPECT_EQ(seen.count(img), 1u);
	// 1 (nothing) + 1 + 2 + 4 (first epoch) + 1 (durable) + 1 + 2 + 4 + 1 (durable)
	EXPECT_EQ(untorn, 17u);
}

TEST(CrashModel, TearsTheWriteInFlightAt512AndAt4K)
{
	const std::vector<Event> ev = {w(0, 1), w(CKPT_BLOCK, 2, 2 * CKPT_BLOCK)};
	std::vector<CrashState> states = crash::enumerate(ev, {});
	std::set<std::pair<uint64_t, uint64_t>> cuts;
	for (const CrashState &s : states)
		if (s.torn.len && s.point == 1) {
			cuts.insert({s.torn.off, s.torn.len});
			EXPECT_EQ(s.in, std::vector<size_t>{0});	// earlier writes all in
		}
	const uint64_t n = 2 * CKPT_BLOCK;
	const std::set<std::pair<uint64_t, uint64_t>> want = {
		{0, 512}, {512, n - 512}, {0, n - 512}, {n - 512, 512}, {0, 4096}, {4096, 4096}};
	EXPECT_EQ(cuts, want);

	crash::EnumerateOptions all;
	all.torn_every_sector = true;
	size_t torn = 0;
	for (const CrashState &s : crash::enumerate(ev, all))
		torn += s.torn.len && s.point == 1;
	EXPECT_EQ(torn, 2 * (n / CKPT_SECTOR - 1));
}

TEST(CrashModel, SamplesBeyondTheLimitDeterministically)
{
	std::vector<Event> ev;
	for (uint8_t i = 0; i < 12; i++)
		ev.push_back(w(i * CKPT_BLOCK, i + 1));
	crash::EnumerateOptions o;
	o.exhaustive_max = 4;
	o.samples = 8;
	auto at_end = [&](const std::vector<CrashState> &all) {
		std::vector<std::vector<size_t>> in;
		for (const CrashState &s : all)
			if (s.point == ev.size() && !s.torn.len)
				in.push_back(s.in);
		return in;
	};
	const auto a = at_end(crash::enumerate(ev, o)), b = at_end(crash::enumerate(ev, o));
	EXPECT_EQ(a, b);
	ASSERT_GE(a.size(), 3u);
	EXPECT_LE(a.size(), 10u);
	EXPECT_EQ(a[0].size(), 12u);				// all in
	EXPECT_EQ(a[1], std::vector<size_t>{11});		// only the newest
	for (const auto &in : a)
		EXPECT_EQ(in.back(), 11u);
}

TEST(CrashModel, ATornSuperblockWriteCountsOnlyWhenWhole)
{
	// The second half of the new superblock equals what was there.
	std::vector<uint8_t> initial(4 * CKPT_BLOCK, 0);
	Event sb = w(CKPT_BLOCK, 0, CKPT_BLOCK, Event::durable_write);
	std::fill(sb.data.begin(), sb.data.begin() + 512, 0xaa);
	const std::vector<Event> ev = {sb};
	crash::ImageBuilder b(initial, ev);
	CrashState s;
	s.torn = {0, 512};
	EXPECT_EQ(crash::commits_in(ev, s, b.build(s)), 1u);
	s.torn = {512, CKPT_BLOCK - 512};
	EXPECT_EQ(crash::commits_in(ev, s, b.build(s)), 0u);
	s.torn = {};
	s.point = 1;
	EXPECT_EQ(crash::commits_in(ev, s, b.build(s)), 1u);
}

} // namespace
