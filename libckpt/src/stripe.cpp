// SPDX-License-Identifier: MIT
#include "stripe.hpp"

#include <cstring>
#include <filesystem>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <fmt/format.h>

#include <nlohmann/json.hpp>

#include "error.hpp"
#include "io.hpp"

namespace ckpt {

namespace {

constexpr char kMagic[] = "{\"dm-ckpt-stripe-set\"";
constexpr size_t kMaxBytes = 64 << 10;

// A descriptor's text: compact, so that it starts with kMagic.
std::string descriptor_text(const StripeSet &set)
{
	return nlohmann::json{{"dm-ckpt-stripe-set", 1}, {"stripe_bytes", set.stripe_bytes},
			      {"drives", set.drives}}.dump() + "\n";
}

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
	const std::string text = descriptor_text(set);
	TempFile tmp(path, "stripe", O_WRONLY);
	if (::write(tmp.fd(), text.data(), text.size()) != static_cast<ssize_t>(text.size()) || fsync(tmp.fd()) < 0)
		fail(CKPT_E_IO, "cannot write {}: {}", tmp.path(), strerror(errno));
	tmp.link_new(path, true);
}

std::string create_stripe_set(const std::string &path, uint64_t stripe_bytes, const std::vector<std::string> &drives,
			      uint64_t drive_bytes)
{
	StripeSet set{stripe_bytes ? stripe_bytes : 65536, drives};
	struct stat st;
	if (lstat(path.c_str(), &st) == 0)
		fail(CKPT_E_STATE, "{} exists: a stripe set's descriptor goes to a new path", path);
	// Checked as an open will check it (a descriptor beside it, not yet named).
	const std::string text = descriptor_text(set);
	TempFile probe(path, "check", O_RDWR);
	if (::write(probe.fd(), text.data(), text.size()) != static_cast<ssize_t>(text.size()))
		fail(CKPT_E_IO, "cannot write {}: {}", probe.path(), strerror(errno));
	const StripeSet checked = *read_stripe_set(probe.fd(), path);
	std::vector<std::string> made;
	try {
		for (const std::string &d : checked.drives) {
			if (lstat(d.c_str(), &st) == 0)
				continue;
			if (!drive_bytes)
				fail(CKPT_E_INVAL, "stripe set {}: drive {} does not exist (give a size to create it)", path, d);
			TempFile f(d, "drive", O_RDWR);
			if (int ret = posix_fallocate(f.fd(), 0, static_cast<off_t>(drive_bytes)); ret)
				if ((ret != EOPNOTSUPP && ret != EINVAL) || ftruncate(f.fd(), static_cast<off_t>(drive_bytes)) < 0)
					fail(CKPT_E_IO, "cannot size {} to {} bytes: {}", d, drive_bytes, strerror(ret));
			f.link_new(d, true);
			made.push_back(d);
		}
		const BackingFile b = BackingFile::open(probe.path(), false);	// every drive opens, no duplicates
		if (b.size < 2 * b.stripe_bytes * b.drives.size())
			fail(CKPT_E_TOO_SMALL, "stripe set {}: the drives hold {} bytes together: too small", path, b.size);
		write_stripe_set(path, set);
		nlohmann::json report{{"path", path}, {"stripe_bytes", set.stripe_bytes}, {"drives", checked.drives},
				      {"bytes", b.size}};
		std::string table = fmt::format("0 {} striped {} {}", b.size / 512, b.drives.size(), set.stripe_bytes / 512);
		bool blocks = true;
		for (const std::string &d : checked.drives) {
			blocks = blocks && stat(d.c_str(), &st) == 0 && S_ISBLK(st.st_mode);
			table += fmt::format(" {} 0", d);
		}
		if (blocks)
			report["dm_table"] = table;
		return report.dump();
	} catch (...) {
		for (const std::string &d : made)
			::unlink(d.c_str());
		throw;
	}
}

} // namespace ckpt
