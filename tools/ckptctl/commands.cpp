// SPDX-License-Identifier: MIT
// ckptctl's commands. What they do with an image is libckpt's (the tool
// operations of ckpt.h, which answer in JSON); here they are printed.
#include "commands.hpp"

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>

#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "ckpt_admin.h"
#include "dm.hpp"
#include "fail.hpp"
#include "probe.hpp"
#include "tenant.hpp"

using nlohmann::json;

namespace ckptctl {

namespace {

void print_json(const json &j) { std::cout << j.dump(2) << "\n"; }

// Damaged copies the image was opened around, on stderr (the output stays
// what it was for scripts).
void print_warnings(const std::string &path, const json &warnings)
{
	for (const json &w : warnings)
		fmt::print(stderr, "ckptctl: warning: {}: {}\n", path, w.get<std::string>());
}

std::string list(const json &v)
{
	std::string s;
	for (size_t i = 0; i < v.size() && i < 8; i++)
		s += (i ? ", " : "") + v[i].get<std::string>();
	return v.size() > 8 ? s + fmt::format(", ... ({} in all)", v.size()) : s;
}

void print_info(const json &j)
{
	fmt::print("{}: dm-ckpt format v{}, uuid {}\n", j["path"].get<std::string>(),
		   j["format_version"].get<int>(), j["uuid"].get<std::string>());
	if (j.contains("dm_uuid"))
		fmt::print("  dm uuid         {}{}\n", j["dm_uuid"].get<std::string>(),
			   !j.contains("dm_name")	 ? ""
			   : j["dm_name"].is_null() ? " (no kernel target)"
						    : " (kernel target " + j["dm_name"].get<std::string>() + ")");
	fmt::print("  committed step  {} (slot {}, superblock sequence {}, blob {} bytes)\n",
		   j["committed_step"].get<uint64_t>(), j["committed_slot"].get<int>(),
		   j["sequence"].get<uint64_t>(), j["blob_bytes"].get<int>());
	fmt::print("  params          {} in {} chunks of {}, {} groups, {}, {} moments, {} masters\n",
		   j["n_params"].get<uint64_t>(), j["n_chunks"].get<uint64_t>(),
		   j["chunk_params"].get<uint64_t>(), j["n_groups"].get<int>(), j["dtype"].get<std::string>(),
		   j.value("state", "fp32"), j.value("master", "fp32"));
	fmt::print("  backing         {} bytes used of {}\n", j["backing_bytes"].get<uint64_t>(),
		   j["device_bytes"].get<uint64_t>());
	fmt::print("  virtual device  {} sectors\n", j["virtual_sectors"].get<uint64_t>());
	fmt::print("  metadata        superblock copy {}, {} cop{} of group table and manifest\n",
		   j["superblock_copy"].get<int>(), j["metadata_copies"].get<int>(),
		   j["metadata_copies"].get<int>() == 1 ? "y" : "ies");
	for (const json &w : j["warnings"])
		fmt::print("  WARNING         {}\n", w.get<std::string>());
	uint64_t held = 0;
	for (const json &t : j["tensors"])
		held += t["numel"].get<uint64_t>();
	if (const json &s = j["shard"]; !s.is_null())
		fmt::print("  shard           rank {} of {} ({} of {} params; cut at {})\n", s["rank"].get<uint32_t>(),
			   s["world"].get<uint32_t>(), held, s["params"].get<uint64_t>(),
			   s["rule"].get<uint32_t>() == CKPT_SHARD_RULE_Q8 ? "8-bit blocks" : "n r / world");
	fmt::print("  tensors         {}\n", j["tensors"].size());
	for (const json &t : j["tensors"])
		fmt::print("    {:<40} group {:<2} offset {:>12} numel {:>12} shape {}{}\n",
			   t["name"].get<std::string>(), t["group"].get<int>(), t["offset"].get<uint64_t>(),
			   t["numel"].get<uint64_t>(), t["shape"].dump(),
			   t.contains("piece") ? fmt::format(" (of {})", t["piece"]["shape"].dump()) : "");
}

} // namespace

int cmd_format(const FormatArgs &a)
{
	json opts = {{"force", a.force}};
	if (a.safetensors.empty())
		opts["manifest"] = a.manifest;
	else
		opts.update({{"safetensors", a.safetensors}, {"groups", a.groups}, {"include", a.include},
			     {"exclude", a.exclude}});
	if (!a.dtype.empty())
		opts["dtype"] = a.dtype;
	if (a.chunk_params)
		opts["chunk_params"] = a.chunk_params;
	if (a.size)
		opts["size"] = a.size;
	if (!a.state.empty())
		opts["state"] = a.state;
	if (!a.master.empty())
		opts["master"] = a.master;
	json j = report([&](char **out) { return ckpt_format_manifest(a.device.c_str(), opts.dump().c_str(), out); });
	if (!a.json)
		for (const json &line : j["summary"])
			fmt::print(stderr, "{}\n", line.get<std::string>());
	j.erase("summary");
	if (a.json)
		print_json(j);
	else
		print_info(j);
	return exit_ok;
}

int cmd_info(const std::string &device, bool as_json, bool table)
{
	json j = report([&](char **out) { return ckpt_image_info(device.c_str(), out); });
	// The target's uuid, and its name when device-mapper can be asked (root).
	j["dm_uuid"] = dm_uuid(j["uuid"]);
	if (!table && access("/dev/mapper/control", R_OK | W_OK) == 0) {
		try {
			const dm::Info i = dm::info_by_uuid(j["dm_uuid"]);
			j["dm_name"] = i.exists ? json(i.name) : json(nullptr);
		} catch (const Error &) {
			// no device-mapper in this kernel: say nothing about a target
		}
	}
	const std::string path = j["path"].get<std::string>();
	if (table || as_json)
		print_warnings(path, j["warnings"]);
	if (table)
		fmt::print("0 {} ckpt {}\n", j["virtual_sectors"].get<uint64_t>(), path);
	else if (as_json)
		print_json(j);
	else
		print_info(j);
	return exit_ok;
}

int cmd_probe(const std::string &device, uint32_t chunk_params, bool as_json)
{
	struct ckpt_fit f;
	check(ckpt_fit(0, chunk_params, 0, &f));	// refuses a bad chunk_params first
	json j = probe(device, chunk_params);
	if (as_json)
		print_json(j);
	else
		print_probe(j);
	return exit_ok;
}

// ------------------------------------------------------------ import/export

int cmd_import(const ImportArgs &a)
{
	json opts = {{"with_optimizer", a.with_optimizer}, {"partial", a.partial}};
	if (a.step)
		opts["step"] = *a.step;
	const json r = report(
		[&](char **out) { return ckpt_import(a.device.c_str(), a.from.c_str(), opts.dump().c_str(), out); });
	const uint64_t step = r["step"], blob = r["blob_bytes"];
	fmt::print("{}: imported {} tensors ({} params) from {}{}\n", a.device, r["tensors"].get<uint64_t>(),
		   r["params"].get<uint64_t>(), a.from,
		   a.with_optimizer ? fmt::format(" with exp_avg and exp_avg_sq; committed step {}{}", step,
						  blob ? fmt::format(", trainer blob {} bytes", blob) : "")
				    : "; moments zero");
	if (!r["missing"].empty())
		fmt::print("  kept {} tensors not in the file: {}\n", r["missing"].size(), list(r["missing"]));
	if (!r["unknown"].empty())
		fmt::print("  skipped {} tensors the device lacks: {}\n", r["unknown"].size(), list(r["unknown"]));
	if (r["moments_ignored"].get<unsigned>())
		fmt::print("  ignored {} exp_avg/exp_avg_sq tensors (import them with --with-optimizer)\n",
			   r["moments_ignored"].get<unsigned>());
	if (r["buffers_ignored"].get<unsigned>())
		fmt::print("  ignored {} tensors that are not floating point\n", r["buffers_ignored"].get<unsigned>());
	return exit_ok;
}

int cmd_export(const std::string &device, const std::string &to, bool with_optimizer, bool force)
{
	const uint32_t flags = (with_optimizer ? CKPT_EXPORT_OPTIMIZER : 0) | (force ? CKPT_EXPORT_FORCE : 0);
	const json r = report([&](char **out) { return ckpt_export_image(device.c_str(), to.c_str(), flags, out); });
	const std::string path = r["path"];
	print_warnings(path, r["warnings"]);
	fmt::print("{}: exported {} tensors ({} params{}) at committed step {} to {}\n", path,
		   r["tensors"].get<uint64_t>(), r["params"].get<uint64_t>(),
		   with_optimizer ? " with exp_avg, exp_avg_sq" : "", r["step"].get<uint64_t>(), to);
	return exit_ok;
}

// ------------------------------------------------------------------ reshard

namespace {

// The M new paths: --to's list, or its one path with {rank} for 0..world-1.
std::vector<std::string> reshard_targets(const ReshardArgs &a)
{
	const bool templ = a.to.size() == 1 && a.to[0].find("{rank}") != std::string::npos;
	if (templ != (a.world != 0))
		fail(CKPT_E_INVAL, "reshard: give --world with one --to path holding {{rank}}, or one --to path per "
				   "new rank without --world");
	std::vector<std::string> to = a.to;
	if (templ) {
		to.clear();
		for (uint32_t r = 0; r < a.world; r++) {
			std::string p = a.to[0];
			for (size_t at; (at = p.find("{rank}")) != std::string::npos;)
				p.replace(at, 6, std::to_string(r));
			to.push_back(p);
		}
	}
	auto real = [](const std::string &p) {
		std::error_code ec;
		const auto abs = std::filesystem::weakly_canonical(p, ec);
		return ec ? p : abs.string();
	};
	std::vector<std::string> seen;
	for (const std::string &p : a.from)
		seen.push_back(real(p));
	for (const std::string &p : to) {
		struct stat st;
		if (lstat(p.c_str(), &st) == 0)
			fail(CKPT_E_STATE, "reshard: {} exists: the new images go to new paths (the old ones stay "
					   "as they are)", p);
		if (std::find(seen.begin(), seen.end(), real(p)) != seen.end())
			fail(CKPT_E_INVAL, "reshard: {} is given twice", p);
		seen.push_back(real(p));
	}
	return to;
}

} // namespace

int cmd_reshard(const ReshardArgs &a)
{
	const std::vector<std::string> to = reshard_targets(a);
	json opts = json::object();
	if (!a.params.empty()) {
		std::ifstream in(a.params);
		if (!in)
			fail(CKPT_E_IO, "reshard: cannot read {}", a.params);
		const json m = json::parse(in, nullptr, false);
		if (m.is_discarded() || !m.is_object() || !m.contains("tensors"))
			fail(CKPT_E_MANIFEST, "{}: not a tensor manifest (a JSON object with \"tensors\")", a.params);
		opts["params"] = m["tensors"];
	}
	std::vector<const char *> from;
	for (const std::string &p : a.from)
		from.push_back(p.c_str());
	// Every new image is made under a temporary name beside its path; only
	// when all are complete are they renamed, one by one, to their paths. A
	// reshard stopped before leaves the old images alone and no new path; one
	// stopped among the renames leaves some new paths, which a resume on the
	// new ranks refuses (a rank's image missing) until they are removed.
	std::vector<std::string> tmp;
	std::vector<json> made;
	auto clean = [&](size_t renamed) {
		for (size_t r = 0; r < tmp.size(); r++)
			unlink((r < renamed ? to[r] : tmp[r]).c_str());
	};
	try {
		for (uint32_t r = 0; r < to.size(); r++) {
			const std::filesystem::path p(to[r]);
			tmp.push_back((p.parent_path() / fmt::format(".{}.reshard-{}", p.filename().string(), getpid()))
					      .string());
			made.push_back(report([&](char **out) {
				return ckpt_reshard(from.data(), static_cast<uint32_t>(from.size()), tmp[r].c_str(), r,
						    static_cast<uint32_t>(to.size()), opts.dump().c_str(), out);
			}));
		}
	} catch (...) {
		tmp.pop_back();	// ckpt_reshard leaves nothing at the path it failed on
		clean(0);
		throw;
	}
	for (size_t r = 0; r < to.size(); r++) {
		if (ckpt_rename_new(tmp[r].c_str(), to[r].c_str()) != 0) {
			const std::string why = ckpt_last_error();
			clean(r);
			fail(CKPT_E_STATE, "reshard: {}; the new images renamed before it were removed, the old ones "
					   "are as they were", why);
		}
	}
	if (a.json) {
		json j = json::array();
		for (size_t r = 0; r < to.size(); r++) {
			made[r]["path"] = to[r];
			j.push_back(made[r]);
		}
		print_json(j);
		return exit_ok;
	}
	for (size_t r = 0; r < to.size(); r++)
		fmt::print("{}: rank {} of {}: {} tensors ({} params) at committed step {}\n", to[r], r, to.size(),
			   made[r]["tensors"].get<uint64_t>(), made[r]["params"].get<uint64_t>(),
			   made[r]["step"].get<uint64_t>());
	fmt::print("resharded {} images of {} onto {} ranks; the old images are unchanged\n", a.from.size(),
		   made[0]["from"].size() == 1 ? "one device" : "a sharded run", to.size());
	return exit_ok;
}

// ------------------------------------------------------------------- stripe

int cmd_stripe(const StripeArgs &a)
{
	std::vector<const char *> drives;
	for (const std::string &d : a.drives)
		drives.push_back(d.c_str());
	const json r = report([&](char **out) {
		return ckpt_stripe_create(a.path.c_str(), a.stripe_kib << 10, drives.data(),
					  static_cast<uint32_t>(drives.size()), a.drive_bytes, out);
	});
	if (a.json) {
		print_json(r);
		return exit_ok;
	}
	fmt::print("{}: a stripe set of {} drives, {} KiB stripes, {} bytes\n", a.path, r["drives"].size(),
		   r["stripe_bytes"].get<uint64_t>() >> 10, r["bytes"].get<uint64_t>());
	for (const json &d : r["drives"])
		fmt::print("  {}\n", d.get<std::string>());
	if (r.contains("dm_table"))
		fmt::print("the kernel target serves the same drives over this dm-stripe table:\n  dmsetup create NAME "
			   "--table '{}'\n", r["dm_table"].get<std::string>());
	return exit_ok;
}

// ----------------------------------------------------------- verify/restore

namespace {

void print_damage(const json &d, size_t limit = 20)
{
	for (size_t i = 0; i < d.size() && i < limit; i++) {
		fmt::print("    at byte {}: {}\n", d[i]["offset"].get<uint64_t>(), d[i]["what"].get<std::string>());
		const json &t = d[i]["tensors"];
		std::string names;
		for (size_t k = 0; k < t.size() && k < 10; k++)
			names += (k ? ", " : "") + t[k].get<std::string>();
		if (t.size() > 10)
			names += fmt::format(", ... ({} in all)", t.size());
		fmt::print("      tensors: {}\n", names.empty() ? "-" : names);
	}
	if (d.size() > limit)
		fmt::print("    ... {} more\n", d.size() - limit);
}

void print_copies(const json &copies)
{
	for (const json &x : copies) {
		const auto index = x["index"].get<unsigned>();
		const auto offset = x["offset"].get<uint64_t>();
		if (x["valid"].get<bool>())
			fmt::print("  superblock {} (byte {}): valid, sequence {}, step {}, slot {}{}\n", index, offset,
				   x["sequence"].get<uint64_t>(), x["committed_step"].get<uint64_t>(),
				   x["committed_slot"].get<unsigned>(), x["current"].get<bool>() ? " (current)" : "");
		else if (x["blank"].get<bool>())
			fmt::print("  superblock {} (byte {}): blank (never written)\n", index, offset);
		else
			fmt::print("  superblock {} (byte {}): INVALID: {}\n", index, offset, x["error"].get<std::string>());
	}
}

void print_meta(const json &meta)
{
	for (const json &m : meta) {
		fmt::print("  group table {} (byte {}): {}\n", m["index"].get<unsigned>(), m["group_offset"].get<uint64_t>(),
			   m["group_ok"].get<bool>() ? "ok" : "DAMAGED: " + m["group_error"].get<std::string>());
		fmt::print("  manifest {} (byte {}): {}\n", m["index"].get<unsigned>(), m["manifest_offset"].get<uint64_t>(),
			   m["manifest_ok"].get<bool>() ? "ok" : "DAMAGED: " + m["manifest_error"].get<std::string>());
	}
}

} // namespace

int cmd_verify(const std::string &device, bool as_json, bool repair)
{
	const json r = report([&](char **out) { return ckpt_verify(device.c_str(), repair ? CKPT_VERIFY_REPAIR : 0, out); });
	const json &j = r["report"], &x = r["extra"];
	const std::string status = j["status"];
	const int rc = status == "corrupt" ? exit_corrupt : status == "degraded" ? exit_degraded : exit_ok;
	if (as_json) {
		print_json(j);
		return rc;
	}
	const json &warnings = j["warnings"];
	fmt::print("{}:\n", j["path"].get<std::string>());
	if (repair) {
		const auto repaired = j["repaired"].get<unsigned>();
		fmt::print("  repair: {}\n", repaired ? fmt::format("rewrote {} damaged metadata cop{} from the intact "
								      "one (flushed)", repaired, repaired == 1 ? "y" : "ies")
						      : "no damaged metadata copy to rewrite");
	}
	print_copies(j["superblocks"]);
	if (j.contains("error")) {
		for (const json &w : warnings)
			fmt::print("  WARNING: {}\n", w.get<std::string>());
		fmt::print("  image: {}\nverify: CORRUPT\n", j["error"].get<std::string>());
		return exit_corrupt;
	}
	print_meta(j["metadata"]);
	fmt::print("  group table, manifest: in use: copies {} and {} ({} tensors, {} groups)\n",
		   x["group_copy"].get<unsigned>(), x["manifest_copy"].get<unsigned>(), j["tensors"].get<uint64_t>(),
		   x["n_groups"].get<unsigned>());
	const json &damage = j["damage"];
	fmt::print("  committed step {}: slot {}, {} records (headers, data checksums, p_lo): {}\n",
		   j["committed_step"].get<uint64_t>(), j["committed_slot"].get<unsigned>(),
		   j["records_checked"].get<uint64_t>(), damage.empty() ? "ok" : fmt::format("{} DAMAGED", damage.size()));
	print_damage(damage);
	const json &rb = j["rollback"];
	if (rb["available"].get<bool>())
		fmt::print("  rollback: step {} is readable in slot {}\n", rb["step"].get<uint64_t>(),
			   rb["slot"].get<unsigned>());
	else
		fmt::print("  rollback: not available: {}\n", rb["reason"].get<std::string>());
	for (const json &w : warnings)
		fmt::print("  WARNING: {}\n", w.get<std::string>());
	if (status == "corrupt") {
		fmt::print("verify: CORRUPT ({} problems)\n", damage.size());
	} else if (status == "degraded") {
		std::string hint;
		if (x["short"].get<bool>())
			hint += "; the file is short: extend it, then verify --repair";
		else if (x["meta_damaged"].get<bool>())
			hint += "; ckptctl verify --repair rewrites the damaged metadata copies";
		if (x["superblock_damaged"].get<bool>())
			hint += "; the next commit rewrites the damaged superblock copy";
		fmt::print("verify: DEGRADED ({} warning{}; the committed state is intact and readable{})\n",
			   warnings.size(), warnings.size() == 1 ? "" : "s", hint);
	} else {
		fmt::print("verify: ok\n");
	}
	return rc;
}

int cmd_restore(const std::string &device, bool do_rollback, bool as_json)
{
	const json r = report(
		[&](char **out) { return ckpt_restore(device.c_str(), do_rollback ? CKPT_RESTORE_ROLLBACK : 0, out); });
	const json &j = r["report"];
	const std::string path = j["path"];
	print_warnings(path, r["warnings"]);
	const uint64_t before = r["before_step"];
	if (r["refused"].get<bool>()) {
		if (as_json)
			print_json(j);
		else
			fmt::print(stderr, "ckptctl: {}: cannot roll back to step {}: {}\n", path, before ? before - 1 : 0,
				   j["rollback"]["reason"].get<std::string>());
		return exit_corrupt;
	}
	const bool ok = j["committed_ok"].get<bool>();
	if (as_json) {
		print_json(j);
		return ok ? exit_ok : exit_corrupt;
	}
	const uint64_t step = j["committed_step"];
	const uint64_t blob = r["blob_bytes"];
	if (j["rolled_back"].get<bool>())
		fmt::print("{}: rolled back from step {} to step {}\n", path, before, step);
	fmt::print("{}: committed step {} (slot {}, superblock sequence {})\n", path, step,
		   j["committed_slot"].get<unsigned>(), j["sequence"].get<uint64_t>());
	if (blob)
		fmt::print("  trainer blob    {} bytes\n    hex           {}\n    printable     {}\n", blob,
			   j["blob_hex"].get<std::string>(), j["blob_printable"].get<std::string>());
	else
		fmt::print("  trainer blob    none\n");
	const json &damage = j["damage"];
	fmt::print("  state           {} ({} records checked)\n",
		   ok ? "intact" : fmt::format("DAMAGED in {} places", damage.size()), r["records_checked"].get<uint64_t>());
	print_damage(damage);
	const json &rb = j["rollback"];
	if (rb["available"].get<bool>())
		fmt::print("  previous step   {} is readable (slot {}, blob {} bytes){}\n", rb["step"].get<uint64_t>(),
			   rb["slot"].get<unsigned>(), r["rollback_blob_bytes"].get<unsigned>(),
			   j["rolled_back"].get<bool>() ? "" : ": ckptctl restore --rollback makes it the committed step");
	else
		fmt::print("  previous step   not readable: {}\n", rb["reason"].get<std::string>());
	return ok ? exit_ok : exit_corrupt;
}

// ------------------------------------------------------------ device-mapper

Created create_target(const CreateArgs &a)
{
	dm::check_name(a.name);
	char *backing = nullptr;
	if (check(ckpt_backing_of(a.device.c_str(), &backing))) {
		ckpt_free(backing);
		fail(CKPT_E_INVAL, "refusing to create {} on {}: it is a dm-ckpt device itself; give the backing device",
		     a.name, a.device);
	}
	json info;
	try {
		info = report([&](char **out) { return ckpt_image_info(a.device.c_str(), out); });
	} catch (const Error &e) {
		fail(e.code(), "refusing to create {} on {}: no valid dm-ckpt superblock ({}); format it first: "
			       "ckptctl format {} -m MANIFEST", a.name, a.device, e.what(), a.device);
	}
	struct stat st;
	if (stat(a.device.c_str(), &st) != 0 || !S_ISBLK(st.st_mode))
		fail(CKPT_E_INVAL, "refusing to create {} on {}: a regular file; the kernel target needs a block "
				   "device (losetup --find --show {} gives one), or use the file directly with the "
				   "userspace engine", a.name, a.device, a.device);
	Created c;
	c.image_uuid = info["uuid"];
	c.uuid = dm_uuid(c.image_uuid);
	if (!a.image_uuid.empty() && a.image_uuid != c.image_uuid)
		fail(CKPT_E_STATE, "refusing to create {} on {}: it holds the image {}, not {}", a.name, a.device,
		     c.image_uuid, a.image_uuid);
	const dm::Info other = dm::info_by_uuid(c.uuid);
	if (other.exists)
		fail(CKPT_E_STATE, "refusing to create {} on {}: its image {} is active already as {}", a.name,
		     a.device, c.image_uuid, dm::node(other.name, other));
	std::string params = a.device;
	std::vector<std::string> opts;
	if (a.queue_depth)
		opts.push_back(fmt::format("queue_depth {}", a.queue_depth));
	if (a.staging_kb)
		opts.push_back(fmt::format("staging_kb {}", a.staging_kb));
	if (!opts.empty()) {
		params += fmt::format(" {}", 2 * opts.size());
		for (const std::string &o : opts)
			params += " " + o;
	}
	const dm::Target t{0, info["virtual_sectors"].get<uint64_t>(), "ckpt", params};
	c.table = fmt::format("{} {} {} {}", t.start, t.length, t.type, t.params);
	c.step = info["committed_step"];
	c.node = dm::create(a.name, t, c.uuid, a.read_only);
	c.info = dm::info(a.name);
	return c;
}

int cmd_create(const CreateArgs &a)
{
	const Created c = create_target(a);
	if (a.json)
		print_json({{"name", a.name}, {"node", c.node}, {"major", c.info.major}, {"minor", c.info.minor},
			    {"uuid", c.uuid}, {"read_only", a.read_only}, {"table", c.table}, {"committed_step", c.step}});
	else
		fmt::print("{}: created {} ({}:{}{}), uuid {}, table '{}', committed step {}\n", a.name, c.node,
			   c.info.major, c.info.minor, a.read_only ? ", read-only" : "", c.uuid, c.table, c.step);
	return exit_ok;
}

int cmd_remove(const std::string &name, bool retry, bool force)
{
	if (!force) {
		auto tt = dm::table(name);
		if (tt.size() != 1 || tt[0].type != "ckpt")
			fail(CKPT_E_INVAL, "{} is not a dm-ckpt device (its table has {} targets{}): --force removes it "
					   "anyway", name, tt.size(), tt.empty() ? "" : ", the first of type " + tt[0].type);
	}
	dm::remove(name, retry);
	fmt::print("{}: removed\n", name);
	return exit_ok;
}

namespace {

// The kernel target's STATUSTYPE_INFO line, field by field, as libckpt
// parses it (the fields of CKPT_STATUS_FIELDS).
json parse_status(const std::string &line, struct ckpt_device_status &st)
{
	json j = {{"raw", line}};
	if (ckpt_dm_status_parse(line.c_str(), &st) < 0) {
		j["parse_error"] = ckpt_last_error();
		return j;
	}
	j.update(report([&](char **out) { return ckpt_status_json(&st, out); }));
	return j;
}

} // namespace

namespace {

// A kernel target as status --json shows it; throws when name is not a
// dm-ckpt device.
struct TargetState {
	dm::Info info;
	dm::Target table, status;
	struct ckpt_device_status s = {};
	json j;
};

TargetState target_state(const std::string &name)
{
	TargetState t;
	t.info = dm::info(name);
	if (!t.info.exists)
		fail(CKPT_E_NAME, "no device-mapper device named '{}'", name);
	const auto tt = dm::table(name);
	const auto ss = dm::status(name);
	if (tt.size() != 1 || tt[0].type != "ckpt" || ss.size() != 1)
		fail(CKPT_E_INVAL, "{} is not a dm-ckpt device (its table has {} targets{})", name, tt.size(),
		     tt.empty() ? "" : ", the first of type " + tt[0].type);
	t.table = tt[0];
	t.status = ss[0];
	const dm::Info &i = t.info;
	t.j = {{"name", name},
	       {"node", dm::node(name, i)},
	       {"major", i.major},
	       {"minor", i.minor},
	       {"uuid", i.uuid},
	       {"open_count", i.open_count},
	       {"suspended", i.suspended},
	       {"sectors", t.table.length},
	       {"table", t.table.params},
	       {"status", parse_status(t.status.params, t.s)}};
	return t;
}

// The backing device of a table line ("MAJ:MIN ..."), as /dev/NAME when
// sysfs names it NAME and /dev/NAME is that device, else as MAJ:MIN.
std::string backing_of(const std::string &params)
{
	const std::string dev = params.substr(0, params.find(' '));
	char buf[4096];
	const ssize_t n = readlink(fmt::format("/sys/dev/block/{}", dev).c_str(), buf, sizeof(buf) - 1);
	if (n <= 0)
		return dev;
	const std::string link(buf, static_cast<size_t>(n));
	const std::string node = "/dev/" + link.substr(link.rfind('/') + 1);
	struct stat st;
	if (::stat(node.c_str(), &st) != 0 || !S_ISBLK(st.st_mode) ||
	    fmt::format("{}:{}", major(st.st_rdev), minor(st.st_rdev)) != dev)
		return dev;
	return node;
}

// status --json's object as one report row: the status fields beside the
// device's.
json target_row(const json &j)
{
	json row = j;
	row.erase("status");
	row["backing"] = backing_of(j["table"].get<std::string>());
	for (const auto &[k, v] : j["status"].items())
		row[k] = v;
	return row;
}

const std::vector<std::string> image_fields = {
	"path", "uuid", "committed_step", "dtype", "n_params", "n_chunks", "chunk_params", "n_groups",
	"tensors", "device_bytes", "backing_bytes", "virtual_sectors", "format_version", "warnings"};

json image_row(const json &info)
{
	json row;
	for (const std::string &f : image_fields)
		row[f] = info[f];
	row["tensors"] = info["tensors"].size();
	row["warnings"] = info["warnings"].size();
	return row;
}

// Kernel targets' status in Prometheus' text format (ckpt_status_prometheus),
// each labelled with its device-mapper name, backing device and uuid (when it
// has one). A target whose status line does not parse is left out, and said
// on stderr: a scrape still gets the others.
void print_prometheus(const std::vector<TargetState> &targets)
{
	std::vector<struct ckpt_device_status> st;
	json labels = json::array();
	for (const TargetState &t : targets) {
		const json &status = t.j["status"];
		if (status.contains("parse_error")) {
			fmt::print(stderr, "ckptctl: {}: status line left out: {}\n", t.j["name"].get<std::string>(),
				   status["parse_error"].get<std::string>());
			continue;
		}
		st.push_back(t.s);
		json l = {{"name", t.j["name"]}, {"backing", backing_of(t.table.params)}};
		if (!t.info.uuid.empty())
			l["uuid"] = t.info.uuid;
		if (const std::string tenant = tenant_of(t.table.params); !tenant.empty())
			l["tenant"] = tenant;
		labels.push_back(l);
	}
	char *text = nullptr;
	check(ckpt_status_prometheus(st.data(), static_cast<uint32_t>(st.size()), labels.dump().c_str(), &text));
	const std::unique_ptr<char, decltype(&ckpt_free)> guard(text, ckpt_free);
	fmt::print("{}", text);
}

} // namespace

ReportKind status_kind()
{
	std::vector<std::string> valid = {"name", "node", "backing", "major", "minor", "uuid", "open_count",
					  "suspended", "sectors", "table", "raw"};
	struct ckpt_device_status zero = {};
	const json fields = report([&](char **out) { return ckpt_status_json(&zero, out); });
	for (const auto &[k, v] : fields.items())
		valid.push_back(k);
	valid.push_back("first_io_error_name");
	return {valid, "name,state,committed_step,open_step,chunks_done,n_chunks"};
}

ReportKind list_kind(bool images)
{
	if (images)
		return {image_fields, "path,committed_step,dtype,n_params,uuid"};
	return {status_kind().valid, "name,backing,committed_step,state"};
}

int cmd_status(const std::string &name, bool as_json, bool prometheus, const ReportArgs &r)
{
	const std::vector<std::string> fields = report_fields(status_kind(), r.fields);
	const TargetState t = target_state(name);
	const json &j = t.j, &st = j["status"];
	const dm::Info &i = t.info;
	const struct ckpt_device_status &s = t.s;
	if (as_json) {
		print_json(j);
		return exit_ok;
	}
	if (prometheus) {
		print_prometheus({t});
		return exit_ok;
	}
	if (r.given()) {
		print_report({target_row(j)}, fields, r);
		return exit_ok;
	}
	fmt::print("{}: dm-ckpt device {} ({}:{}), {} sectors, {}, open count {}\n", name,
		   j["node"].get<std::string>(), i.major, i.minor, t.table.length, i.suspended ? "SUSPENDED" : "active",
		   i.open_count);
	fmt::print("  uuid            {}\n", i.uuid.empty() ? "none (not created by ckptctl)" : i.uuid);
	fmt::print("  table           {}\n", t.table.params);
	if (st.contains("parse_error")) {
		fmt::print("  status          {} (unexpected format: {})\n", t.status.params,
			   st["parse_error"].get<std::string>());
		return exit_ok;
	}
	fmt::print("  state           {}, committed step {}", ckpt_state_name(static_cast<uint32_t>(s.state)),
		   s.committed_step);
	if (s.state == CKPT_STATE_OPEN)
		fmt::print(", open step {}: {}/{} chunks applied{}", s.open_step, s.chunks_done, s.n_chunks,
			   s.overflow ? ", OVERFLOW" : "");
	fmt::print("\n  last result     {}, last error {} ({})\n", ckpt_result_name(static_cast<uint32_t>(s.last_result)),
		   s.last_error, st["last_error_name"].get<std::string>());
	fmt::print("  steps           {} committed, {} skipped (overflow), {} aborted; {} commands rejected\n",
		   s.steps_committed, s.steps_skipped, s.steps_aborted, s.commands_rejected);
	fmt::print("  traffic         {} gradient bytes in, {} param bytes out\n", s.grad_bytes, s.param_bytes);
	fmt::print("  I/O errors      {}{}\n", s.io_errors,
		   s.first_io_error ? fmt::format(" (first: {})", st["first_io_error_name"].get<std::string>()) : "");
	return exit_ok;
}

int cmd_list(const ListArgs &a)
{
	const bool images = !a.paths.empty() || !a.image_dirs.empty();
	const std::vector<std::string> fields = report_fields(list_kind(images), a.report.fields);
	std::vector<json> rows;
	int rc = exit_ok;
	if (a.prometheus && images)
		fail(CKPT_E_INVAL, "list --prometheus reports kernel targets: an image has no live status");
	if (!images) {
		std::vector<TargetState> targets;
		for (const std::string &name : dm::names()) {
			try {
				targets.push_back(target_state(name));
			} catch (const Error &) {
				// not a dm-ckpt device, or gone since the list
			}
		}
		if (a.prometheus) {
			print_prometheus(targets);
			fmt::print("{}", tenants_prometheus());
			return exit_ok;
		}
		for (const TargetState &t : targets)
			rows.push_back(target_row(t.j));
	}
	auto add_image = [&](const std::string &path, bool quiet) {
		try {
			rows.push_back(image_row(report([&](char **out) { return ckpt_image_info(path.c_str(), out); })));
		} catch (const Error &e) {
			const bool no_image = e.code() == CKPT_E_NO_SB || e.code() == CKPT_E_MAGIC ||
					      e.code() == CKPT_E_TOO_SMALL;
			if (!quiet || !no_image) {
				const std::string what = e.what();
				fmt::print(stderr, "ckptctl: {}{}\n", what.find(path) == std::string::npos ? path + ": " : "",
					   what);
				rc = exit_error;
			}
		}
	};
	for (const std::string &path : a.paths)
		add_image(path, false);
	for (const std::string &dir : a.image_dirs) {
		namespace fs = std::filesystem;
		std::error_code ec, ignored;
		std::vector<std::string> entries;
		for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec))
			if (it->is_regular_file(ignored) || it->is_block_file(ignored))
				entries.push_back(it->path().string());
		if (ec)
			fail(CKPT_E_IO, "cannot list {}: {}", dir, ec.message());
		std::sort(entries.begin(), entries.end());
		for (const std::string &p : entries)
			add_image(p, true);
	}
	if (a.json)
		print_json(rows);
	else
		print_report(rows, fields, a.report);
	return rc;
}

int cmd_message(const std::string &name, const std::vector<std::string> &words)
{
	std::string text;
	for (const std::string &w : words)
		text += (text.empty() ? "" : " ") + w;
	std::string r = dm::message(name, text);
	if (!r.empty())
		fmt::print("{}{}", r, r.back() == '\n' ? "" : "\n");
	return exit_ok;
}

} // namespace ckptctl
