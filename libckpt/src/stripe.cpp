// SPDX-License-Identifier: MIT
#include "stripe.hpp"

#include <cstring>
#include <filesystem>

#include <fcntl.h>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include "error.hpp"
#include "io.hpp"

namespace ckpt {

namespace {

constexpr char kMagic[] = "{\"dm-ckpt-stripe-set\"";
constexpr size_t kMaxBytes = 64 << 10;

} // namespace

std::optional<StripeSet> read_stripe_set(int fd, const std::string &path)
{
	char head[sizeof(kMagic) - 1];
	if (::pread(fd, head, sizeof(head), 0) != static_cast<ssize_t>(sizeof(head)) ||
	    std::memcmp(head, kMagic, sizeof(head)) != 0)
		return std::nullopt;
	std::string text(kMaxBytes + 1, '\0');
	const ssize_t n = ::pread(fd, text.data(), text.size(), 0);
	if (n < 0)
		fail(CKPT_E_IO, "cannot read the stripe set {}: {}", path, strerror(errno));
	if (static_cast<size_t>(n) > kMaxBytes)
		fail(CKPT_E_INVAL, "stripe set {}: more than {} bytes", path, kMaxBytes);
	text.resize(static_cast<size_t>(n));
	const nlohmann::json j = nlohmann::json::parse(text, nullptr, false);
	auto bad = [&](const std::string &why) { fail(CKPT_E_INVAL, "stripe set {}: {}", path, why); };
	if (j.is_discarded() || !j.is_object())
		bad("not a JSON object");
	for (const auto &[k, v] : j.items())
		if (k != "dm-ckpt-stripe-set" && k != "stripe_bytes" && k != "drives")
			bad("unknown key '" + k + "'");
	if (!j.contains("stripe_bytes") || !j.contains("drives") || j["dm-ckpt-stripe-set"] != 1)
		bad("needs \"dm-ckpt-stripe-set\": 1, \"stripe_bytes\" and \"drives\"");
	StripeSet s;
	const auto &b = j["stripe_bytes"];
	if (!b.is_number_unsigned() || b.get<uint64_t>() < 4096 || b.get<uint64_t>() > (1u << 30) ||
	    (b.get<uint64_t>() & (b.get<uint64_t>() - 1)))
		bad("stripe_bytes must be a power of two from 4096 to 2^30");
	s.stripe_bytes = b.get<uint64_t>();
	const auto &d = j["drives"];
	if (!d.is_array() || d.empty() || d.size() > kMaxStripeDrives)
		bad("drives must be a list of 1 to 64 paths");
	const std::filesystem::path dir = std::filesystem::absolute(path).parent_path();
	for (const auto &e : d) {
		if (!e.is_string() || e.get<std::string>().empty())
			bad("a drive is not a path");
		std::filesystem::path p = e.get<std::string>();
		s.drives.push_back((p.is_absolute() ? p : dir / p).lexically_normal().string());
	}
	return s;
}

void write_stripe_set(const std::string &path, const StripeSet &set)
{
	const std::string text = nlohmann::json{{"dm-ckpt-stripe-set", 1}, {"stripe_bytes", set.stripe_bytes},
						{"drives", set.drives}}.dump(1) + "\n";
	TempFile tmp(path, "stripe", O_WRONLY);
	if (::write(tmp.fd(), text.data(), text.size()) != static_cast<ssize_t>(text.size()) || fsync(tmp.fd()) < 0)
		fail(CKPT_E_IO, "cannot write {}: {}", tmp.path(), strerror(errno));
	tmp.link_new(path, true);
}

} // namespace ckpt
