// SPDX-License-Identifier: MIT
#include "crash_model.hpp"

#include <algorithm>
#include <cstring>
#include <random>
#include <set>
#include <stdexcept>

#include <fmt/format.h>

extern "C" {
#include "ckpt_codec.h"
}

namespace crash {

void Recorder::written(uint64_t off, const void *buf, size_t len, bool durable) noexcept
{
	const auto *p = static_cast<const uint8_t *>(buf);
	std::lock_guard lk(mu_);
	events_.push_back({durable ? Event::durable_write : Event::write, off, {p, p + len}});
}

void Recorder::flushed() noexcept
{
	std::lock_guard lk(mu_);
	events_.push_back({Event::flush, 0, {}});
}

std::vector<Event> Recorder::events() const
{
	std::lock_guard lk(mu_);
	return events_;
}

size_t Recorder::size() const
{
	std::lock_guard lk(mu_);
	return events_.size();
}

bool is_superblock_write(const Event &e)
{
	return e.is_write() && e.off < 2 * CKPT_BLOCK;
}

std::string CrashState::describe(const std::vector<Event> &ev) const
{
	auto name = [&](size_t i) {
		const Event &e = ev[i];
		if (e.kind == Event::flush)
			return fmt::format("#{} flush", i);
		return fmt::format("#{} {}write {}+{}", i, e.kind == Event::durable_write ? "durable " : "", e.off,
				   e.data.size());
	};
	std::string s = fmt::format("crash before event {} of {}", point, ev.size());
	if (point < ev.size())
		s += fmt::format(" ({})", name(point));
	s += ", not yet durable but in: ";
	if (in.empty())
		s += "none";
	for (size_t k = 0; k < in.size(); k++)
		s += fmt::format("{}{}", k ? ", " : "", name(in[k]));
	if (torn.len)
		s += fmt::format("; torn: only bytes [{}, {}) of the write in flight", torn.off, torn.off + torn.len);
	return s;
}

namespace {

// The undurable writes before point: since the last flush, not forced.
std::vector<size_t> maybe_writes(const std::vector<Event> &ev, size_t point)
{
	std::vector<size_t> m;
	for (size_t i = 0; i < point; i++) {
		if (ev[i].kind == Event::flush)
			m.clear();
		else if (ev[i].kind == Event::write)
			m.push_back(i);
	}
	return m;
}

void subsets_at(const std::vector<Event> &ev, size_t k, const EnumerateOptions &o, std::vector<CrashState> &out)
{
	const std::vector<size_t> m = maybe_writes(ev, k);
	// Write k-1 must be in: without it the state is one of point k-1's.
	const bool forced = k > 0 && ev[k - 1].kind == Event::write;
	const size_t free = m.size() - (forced ? 1 : 0);
	auto push = [&](const std::vector<bool> &take) {
		CrashState s;
		s.point = k;
		for (size_t i = 0; i < free; i++)
			if (take[i])
				s.in.push_back(m[i]);
		if (forced)
			s.in.push_back(m.back());
		out.push_back(std::move(s));
	};
	if (free <= o.exhaustive_max) {
		for (uint64_t bits = 0; bits < (uint64_t{1} << free); bits++) {
			std::vector<bool> take(free);
			for (size_t i = 0; i < free; i++)
				take[i] = (bits >> i) & 1;
			push(take);
		}
		return;
	}
	std::set<std::vector<bool>> seen = {std::vector<bool>(free, true), std::vector<bool>(free, false)};
	push(std::vector<bool>(free, true));
	push(std::vector<bool>(free, false));
	std::mt19937_64 rng(o.seed * 0x9e3779b97f4a7c15ull + k);
	for (unsigned n = 0; n < o.samples; n++) {
		std::vector<bool> take(free);
		for (size_t i = 0; i < free; i++)
			take[i] = rng() & 1;
		if (seen.insert(take).second)
			push(take);
	}
}

void torn_at(const std::vector<Event> &ev, size_t k, const EnumerateOptions &o, std::vector<CrashState> &out)
{
	const uint64_t len = ev[k].data.size();
	std::set<std::pair<uint64_t, uint64_t>> cuts;	// [off, off + len) of the write that landed
	auto cut = [&](uint64_t c) {
		if (c > 0 && c < len) {
			cuts.insert({0, c});
			cuts.insert({c, len - c});
		}
	};
	if (o.torn_every_sector) {
		for (uint64_t c = CKPT_SECTOR; c < len; c += CKPT_SECTOR)
			cut(c);
	} else {
		for (uint64_t unit : {uint64_t{CKPT_SECTOR}, uint64_t{CKPT_BLOCK}}) {
			if (len <= unit)
				continue;
			cut(unit);
			cut(len - unit);
		}
	}
	const std::vector<size_t> m = maybe_writes(ev, k);
	for (auto [off, n] : cuts) {
		CrashState s;
		s.point = k;
		s.in = m;
		s.torn.off = off;
		s.torn.len = n;
		out.push_back(std::move(s));
	}
}

void apply(std::vector<uint8_t> &img, const Event &e, uint64_t from = 0, uint64_t len = UINT64_MAX)
{
	len = std::min<uint64_t>(len, e.data.size() - from);
	if (e.off + from + len > img.size())
		throw std::runtime_error(fmt::format("recorded write {}+{} beyond the image ({} bytes)", e.off,
						     e.data.size(), img.size()));
	std::memcpy(img.data() + e.off + from, e.data.data() + from, len);
}

} // namespace

std::vector<CrashState> enumerate(const std::vector<Event> &ev, const EnumerateOptions &o)
{
	std::vector<CrashState> out;
	for (size_t k = 0; k <= ev.size(); k++) {
		// Right after a flush: the same as everything before it in.
		if (k == 0 || ev[k - 1].kind != Event::flush)
			subsets_at(ev, k, o, out);
		if (k < ev.size() && ev[k].is_write())
			torn_at(ev, k, o, out);
	}
	return out;
}

ImageBuilder::ImageBuilder(std::vector<uint8_t> initial, const std::vector<Event> &ev)
	: ev_(ev), durable_(std::move(initial))
{
}

void ImageBuilder::advance(size_t point)
{
	size_t last = 0;	// events before it are durable at point
	for (size_t i = 0; i < point; i++)
		if (ev_[i].kind == Event::flush)
			last = i + 1;
	if (last < flushed_)
		throw std::logic_error("crash states must come in order of their last flush");
	for (; flushed_ < last; flushed_++)
		if (ev_[flushed_].is_write())
			apply(durable_, ev_[flushed_]);
}

std::vector<uint8_t> ImageBuilder::build(const CrashState &s)
{
	advance(s.point);
	std::vector<uint8_t> img = durable_;
	size_t next = 0;
	for (size_t i = flushed_; i < s.point; i++) {
		while (next < s.in.size() && s.in[next] < i)
			next++;
		const bool in = next < s.in.size() && s.in[next] == i;
		if (ev_[i].kind == Event::durable_write || (ev_[i].kind == Event::write && in))
			apply(img, ev_[i]);
	}
	if (s.torn.len)
		apply(img, ev_[s.point], s.torn.off, s.torn.len);
	return img;
}

std::vector<uint8_t> ImageBuilder::final_image()
{
	CrashState s;
	s.point = ev_.size();
	s.in = maybe_writes(ev_, s.point);
	return build(s);
}

size_t commits_in(const std::vector<Event> &ev, const CrashState &s, const std::vector<uint8_t> &img)
{
	size_t n = 0;
	for (size_t i = 0; i < s.point; i++) {
		if (!is_superblock_write(ev[i]))
			continue;
		if (ev[i].kind == Event::durable_write || std::binary_search(s.in.begin(), s.in.end(), i) ||
		    std::find_if(ev.begin() + static_cast<long>(i), ev.begin() + static_cast<long>(s.point),
				 [](const Event &e) { return e.kind == Event::flush; }) !=
			    ev.begin() + static_cast<long>(s.point))
			n++;
	}
	// The superblock write in flight counts when what landed of it is all
	// that differed: its block is whole.
	if (s.torn.len && is_superblock_write(ev[s.point])) {
		const Event &e = ev[s.point];
		if (std::equal(e.data.begin(), e.data.end(), img.begin() + static_cast<long>(e.off)))
			n++;
	}
	return n;
}

} // namespace crash
