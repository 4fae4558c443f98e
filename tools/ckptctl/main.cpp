// SPDX-License-Identifier: MIT
// ckptctl: prepare and inspect dm-ckpt backing devices.
#include <cstdio>
#include <fstream>
#include <iostream>
#include <sstream>

#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "error.hpp"
#include "format.hpp"
#include "image.hpp"

using nlohmann::json;

namespace {

// A tensor manifest from a user: {"dtype": "bf16", "chunk_params": 65536,
// "tensors": [{"name": "w", "shape": [4, 4], "group": 0}, ...]}.
struct ManifestFile {
	ckpt::Layout layout;
	std::string dtype = "bf16";
	uint32_t chunk_params = 1u << CKPT_DEFAULT_CHUNK_SHIFT;
};

ManifestFile read_manifest(const std::string &path)
{
	std::ifstream in(path);
	if (!in)
		ckpt::fail(CKPT_E_IO, "cannot read manifest {}", path);
	std::stringstream text;
	text << in.rdbuf();
	json j = json::parse(text.str(), nullptr, false);
	if (j.is_discarded() || !j.is_object())
		ckpt::fail(CKPT_E_MANIFEST, "{}: not a JSON object", path);
	ManifestFile m;
	try {
		if (j.contains("dtype"))
			m.dtype = j["dtype"].get<std::string>();
		if (j.contains("chunk_params"))
			m.chunk_params = j["chunk_params"].get<uint32_t>();
		const json &ts = j.at("tensors");
		if (!ts.is_array() || ts.empty())
			ckpt::fail(CKPT_E_MANIFEST, "{}: \"tensors\" must be a non-empty array", path);
		for (const json &t : ts)
			m.layout.add(t.at("name").get<std::string>(), t.at("shape").get<std::vector<uint64_t>>(),
				     t.value("group", 0u));
	} catch (const json::exception &e) {
		ckpt::fail(CKPT_E_MANIFEST, "{}: {}", path, e.what());
	}
	return m;
}

std::string uuid_string(const uint8_t *u)
{
	std::string s;
	for (int i = 0; i < 16; i++) {
		if (i == 4 || i == 6 || i == 8 || i == 10)
			s += '-';
		s += fmt::format("{:02x}", u[i]);
	}
	return s;
}

json image_json(const ckpt::Image &img)
{
	const struct ckpt_sb &sb = img.sb;
	const struct ckpt_layout &l = sb.layout;
	json tensors = json::array();
	for (const ckpt::Tensor &t : img.manifest.tensors())
		tensors.push_back({{"name", t.name}, {"shape", t.shape}, {"group", t.group},
				   {"numel", t.numel}, {"offset", t.offset}});
	return {
		{"path", img.file.path},
		{"uuid", uuid_string(sb.uuid)},
		{"format_version", CKPT_FORMAT_VERSION},
		{"sequence", sb.sequence},
		{"dtype", ckpt::dtype_name(sb.geo.dtype)},
		{"chunk_params", l.chunk_params},
		{"n_chunks", sb.geo.n_chunks},
		{"n_params", l.n_params},
		{"n_groups", sb.geo.n_groups},
		{"committed_step", sb.committed_step},
		{"committed_slot", sb.committed_slot},
		{"blob_bytes", sb.blob_len},
		{"backing_bytes", l.dev_bytes},
		{"device_bytes", img.file.size},
		{"virtual_sectors", l.virt_bytes / CKPT_SECTOR},
		{"tensors", tensors},
	};
}

void print_info(const json &j)
{
	fmt::print("{}: dm-ckpt format v{}, uuid {}\n", j["path"].get<std::string>(),
		   j["format_version"].get<int>(), j["uuid"].get<std::string>());
	fmt::print("  committed step  {} (slot {}, superblock sequence {}, blob {} bytes)\n",
		   j["committed_step"].get<uint64_t>(), j["committed_slot"].get<int>(),
		   j["sequence"].get<uint64_t>(), j["blob_bytes"].get<int>());
	fmt::print("  params          {} in {} chunks of {}, {} groups, {}\n",
		   j["n_params"].get<uint64_t>(), j["n_chunks"].get<uint64_t>(),
		   j["chunk_params"].get<uint64_t>(), j["n_groups"].get<int>(), j["dtype"].get<std::string>());
	fmt::print("  backing         {} bytes used of {}\n", j["backing_bytes"].get<uint64_t>(),
		   j["device_bytes"].get<uint64_t>());
	fmt::print("  virtual device  {} sectors\n", j["virtual_sectors"].get<uint64_t>());
	fmt::print("  tensors         {}\n", j["tensors"].size());
	for (const json &t : j["tensors"])
		fmt::print("    {:<40} group {:<2} offset {:>12} numel {:>12} shape {}\n",
			   t["name"].get<std::string>(), t["group"].get<int>(), t["offset"].get<uint64_t>(),
			   t["numel"].get<uint64_t>(), t["shape"].dump());
}

} // namespace

int main(int argc, char **argv)
{
	CLI::App app{"ckptctl: prepare and inspect dm-ckpt backing devices.\n\n"
		     "A dm-ckpt device keeps the fp32 AdamW state of a model on storage; a\n"
		     "training step writes fp16/bf16 gradients and reads back updated params.",
		     "ckptctl"};
	app.require_subcommand(1);

	std::string dev, manifest, dtype;
	uint32_t chunk_params = 0;
	uint64_t size = 0;
	auto *fmt_cmd = app.add_subcommand("format",
		"Create or format a backing file or block device for the tensors of a manifest.\n"
		"Everything on it is lost. The manifest is JSON: {\"dtype\": \"bf16\",\n"
		"\"chunk_params\": 65536, \"tensors\": [{\"name\": \"w\", \"shape\": [4096, 4096],\n"
		"\"group\": 0}, ...]}; tensors of different groups never share a chunk.");
	fmt_cmd->add_option("device", dev, "backing file (created if missing) or block device")->required();
	fmt_cmd->add_option("-m,--manifest", manifest, "tensor manifest (JSON)")->required();
	fmt_cmd->add_option("--dtype", dtype, "gradient/param dtype, overrides the manifest")
		->check(CLI::IsMember({"bf16", "fp16"}));
	fmt_cmd->add_option("--chunk-params", chunk_params,
			    "params per chunk, a power of two from 2048 to 4194304 (default 65536)");
	fmt_cmd->add_option("--size", size, "size of a file in bytes (default: what the layout needs)");

	bool as_json = false;
	auto *info_cmd = app.add_subcommand("info",
		"Show geometry, committed step and tensors of a backing device or image.");
	info_cmd->add_option("device", dev, "backing file or block device")->required();
	info_cmd->add_flag("--json", as_json, "print JSON");
	bool as_table = false;
	info_cmd->add_flag("--table", as_table,
			   "print the device-mapper table line for the kernel target, for\n"
			   "  dmsetup create NAME --table \"$(ckptctl info --table DEV)\"")
		->excludes("--json");

	CLI11_PARSE(app, argc, argv);

	try {
		if (*fmt_cmd) {
			ManifestFile m = read_manifest(manifest);
			ckpt::FormatOptions opts;
			opts.dtype = ckpt::parse_dtype(dtype.empty() ? m.dtype : dtype);
			opts.chunk_params = chunk_params ? chunk_params : m.chunk_params;
			opts.size = size;
			ckpt::format(dev, m.layout, opts);
			print_info(image_json(ckpt::Image::open(dev, false)));
		} else if (*info_cmd) {
			ckpt::Image img = ckpt::Image::open(dev, false);
			json j = image_json(img);
			if (as_table)
				fmt::print("0 {} ckpt {}\n", img.sb.layout.virt_bytes / CKPT_SECTOR, dev);
			else if (as_json)
				std::cout << j.dump(2) << "\n";
			else
				print_info(j);
		}
	} catch (const ckpt::Error &e) {
		fmt::print(stderr, "ckptctl: {}\n", e.what());
		return 1;
	}
	return 0;
}
