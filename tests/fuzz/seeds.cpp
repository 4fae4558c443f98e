// SPDX-License-Identifier: MIT
// Writes the seed corpus of every fuzz target (tests/fuzz/corpus/NAME/
// seed-*) with the project's own encoders: the core's superblock, record,
// status and command encoders, the status line printer, Layout::place and
// Manifest::encode, and safetensors::Writer. `make fuzz-corpus` runs it.
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>

#include "manifest.hpp"
#include "interchange.hpp"
#include "safetensors.hpp"
#include "tenant_table.hpp"

extern "C" {
#include "ckpt_codec.h"
#include "ckpt_step.h"
}

namespace fs = std::filesystem;

namespace {

fs::path root;

void put(const std::string &target, const std::string &name, const void *p, size_t n)
{
	fs::create_directories(root / target);
	std::ofstream(root / target / ("seed-" + name), std::ios::binary)
		.write(static_cast<const char *>(p), static_cast<std::streamsize>(n));
}

void put(const std::string &target, const std::string &name, const std::string &s)
{
	put(target, name, s.data(), s.size());
}

ckpt::Layout::Placed small_layout(uint32_t groups)
{
	ckpt::Layout lay;
	lay.add("embed.weight", {64, 32}, 0);
	lay.add("layer.0.weight", {48, 48}, groups > 1 ? 1 : 0);
	lay.add("layer.0.bias", {48}, groups > 1 ? 1 : 0);
	return lay.place(CKPT_MIN_CHUNK_SHIFT, CKPT_DTYPE_BF16);
}

void superblocks()
{
	for (uint32_t incompat : {0u, uint32_t{CKPT_FEATURE_INCOMPAT_DEFAULT}}) {
		const ckpt::Layout::Placed p = small_layout(2);
		ckpt_regions l;
		ckpt_regions_compute_features(&p.geo, incompat, &l);
		const uint8_t uuid[16] = {0xd1, 0x5c, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13};
		static ckpt_sb sb, next;
		ckpt_sb_first(&sb, uuid, &p.geo, &l, incompat, 100, 0x1234, ckpt_crc32c(p.group_table.data(), p.group_table.size()));
		// flags, device size, copy 0, copy 1, record, status, group table
		std::vector<uint8_t> in(9 + 4 * CKPT_BLOCK, 0);
		const uint64_t dev = l.dev_bytes;
		std::memcpy(in.data() + 1, &dev, 8);
		ckpt_sb_encode(&sb, in.data() + 9 + CKPT_BLOCK);	// sequence 1: copy 1
		ckpt_rec id;
		ckpt_rec_committed(&sb, 0, &id);
		std::vector<uint8_t> zeros(12u << CKPT_MIN_CHUNK_SHIFT, 0);
		ckpt_rec_seal(in.data() + 9 + 2 * CKPT_BLOCK, zeros.data(), zeros.data(), &id, incompat);
		static ckpt_status st;
		st.state = CKPT_STATE_IDLE;
		st.geo = p.geo;
		ckpt_status_encode(&st, in.data() + 9 + 3 * CKPT_BLOCK);
		in.insert(in.end(), p.group_table.begin(), p.group_table.end());
		const std::string tag = incompat ? "meta2" : "v1";
		put("superblock", tag + "-first", in.data(), in.size());

		// after a commit: step 1 in slot 1, sequence 2 in copy 0, with a blob
		const char blob[] = "trainer state";
		ckpt_sb_next(&sb, 1, 1, blob, sizeof(blob), &next);
		ckpt_sb_encode(&next, in.data() + 9);
		ckpt_rec_next(&sb, 0, 1, &id);
		ckpt_rec_seal(in.data() + 9 + 2 * CKPT_BLOCK, zeros.data(), zeros.data(), &id, incompat);
		st.committed_step = 1;
		st.committed_slot = 1;
		st.blob_len = sizeof(blob);
		std::memcpy(st.blob, blob, sizeof(blob));
		ckpt_status_encode(&st, in.data() + 9 + 3 * CKPT_BLOCK);
		put("superblock", tag + "-step1", in.data(), in.size());
	}
}

void commands()
{
	static ckpt_cmd cmd;
	uint8_t block[1 + CKPT_BLOCK];
	const auto put_cmd = [&](const std::string &name) {
		block[0] = 0;
		const int n = ckpt_cmd_encode(&cmd, block + 1);
		put("command", name, block, static_cast<size_t>(n) + 1);
	};
	cmd = {};
	cmd.opcode = CKPT_OP_BEGIN;
	cmd.step = 1;
	cmd.grad_scale = 0x3f800000;	// 1.0f
	cmd.n_groups = 2;
	for (uint32_t g = 0; g < 2; g++) {
		ckpt_hparams &h = cmd.groups[g];
		h.lr = 0x3a83126f;		// 1e-3
		h.beta1 = 0x3f666666;		// 0.9
		h.beta2 = 0x3f7fbe77;		// 0.999
		h.eps = 0x322bcc77;		// 1e-8
		h.weight_decay = g ? 0 : 0x3c23d70a;	// 0.01
		h.one_minus_beta1 = 0x3dcccccd;
		h.one_minus_beta2 = 0x3a83126f;
		h.step_size = 0x3c23d70a;
		h.bc2_sqrt = 0x3d01b8c5;
		h.decay = 0x3f7fff58;
		h.flags = g ? CKPT_GROUP_ADAM_L2 : 0;
	}
	put_cmd("begin");
	cmd = {};
	cmd.opcode = CKPT_OP_COMMIT;
	cmd.step = 1;
	cmd.blob_len = 32;
	std::memset(cmd.blob, 0x42, 32);
	put_cmd("commit");
	cmd = {};
	cmd.opcode = CKPT_OP_ABORT;
	cmd.step = 2;
	put_cmd("abort");
	cmd = {};
	cmd.opcode = CKPT_OP_ROLLBACK;
	cmd.step = 2;
	put_cmd("rollback");
}

void status_lines()
{
	ckpt_counters k{};
	char line[CKPT_STATUS_LINE_MAX];
	int n = ckpt_status_line(&k, 8, line, sizeof(line));
	put("status_line", "idle", line, static_cast<size_t>(n));
	k.state = CKPT_STATE_OPEN;
	k.committed_step = 41;
	k.open_step = 42;
	k.chunks_done = 3;
	k.steps_committed = 41;
	k.grad_bytes = 1u << 20;
	n = ckpt_status_line(&k, 8, line, sizeof(line));
	put("status_line", "open", std::string(line, static_cast<size_t>(n)) + "\n");
}

void tables()
{
	put("table", "dev", "/dev/nvme0n1");
	put("table", "count0", "/dev/nvme0n1 0");
	put("table", "queue_depth", "253:0 2 queue_depth 16");
	put("table", "both", "/dev/nvme0n1 4 staging_kb 65536 queue_depth 3");
}

void manifests()
{
	for (uint32_t groups : {1u, 2u}) {
		const ckpt::Layout::Placed p = small_layout(groups);
		put("manifest", "placed-" + std::to_string(groups),
		    ckpt::Manifest::encode(p.tensors, p.geo.dtype, uint64_t{1} << p.geo.chunk_shift, {}));
	}
	// a rank's share: pieces of a cut param and the share's record
	ckpt::Layout whole;
	whole.add("embed.weight", {64, 32}, 0);
	whole.add("layer.0.weight", {48, 48}, 0);
	const ckpt::Layout share = whole.shard(1, 3, 2 /* CKPT_SHARD_RULE_Q8 */);
	const ckpt::Layout::Placed p = share.place(CKPT_MIN_CHUNK_SHIFT, CKPT_DTYPE_BF16);
	put("manifest", "share", ckpt::Manifest::encode(p.tensors, p.geo.dtype, uint64_t{1} << p.geo.chunk_shift, {},
							share.shard_record()));
	put("manifest", "user", R"({"dtype": "fp16", "chunk_params": 4096, "tensors": [)"
				R"({"name": "w", "shape": [64, 64], "group": 0}, {"name": "b", "shape": [64], "group": 1}]})");
	put("manifest", "user-hparams", R"({"dtype": "fp16", "chunk_params": 4096, "tensors": [)"
					R"({"name": "w", "shape": [64, 64], "group": 0}, {"name": "b", "shape": [64], "group": 1}],)"
					R"("groups": [{"lr": 0.001, "betas": [0.9, 0.999], "eps": 1e-8, "weight_decay": 0.1,)"
					R"("adam_l2": false}, {"lr": 0.002, "betas": [0.8, 0.95], "eps": 1e-6,)"
					R"("weight_decay": 0, "adam_l2": true}]})");
}

void safetensors_files()
{
	const fs::path dir = root / "safetensors";
	fs::create_directories(dir);
	ckpt::safetensors::Writer w((dir / "seed-mixed").string(),
				    {{"w", "F32", {4, 4}}, {"h", "F16", {8}}, {"b", "BF16", {2, 3}},
				     {"d", "F64", {2}}, {"i", "I32", {3}}},
				    {{"format", "pt"}}, false);
	std::vector<uint8_t> buf(64);
	for (size_t i = 0; i < buf.size(); i++)
		buf[i] = static_cast<uint8_t>(i * 37);
	for (uint64_t bytes : {64u, 16u, 12u, 16u, 12u})
		w.write(buf.data(), bytes);
	w.finish();
	ckpt::safetensors::Writer e((dir / "seed-empty-tensor").string(), {{"z", "F32", {0, 4}}}, {}, false);
	e.write(nullptr, 0);
	e.finish();
	// What export writes: the dm-ckpt.* metadata of two groups.
	ckpt::interchange::Metadata ix;
	ix.dtype = CKPT_DTYPE_BF16;
	ix.chunk_params = 4096;
	ix.step = 3;
	ix.n_groups = 2;
	ix.tensor_group = {{"w", 0}, {"b", 1}};
	ix.hparams = {ckpt::GroupHparams{}, ckpt::GroupHparams{2e-3, 0.8, 0.95, 1e-6, 0, true}};
	std::map<std::string, std::string> meta = {{"format", "pt"}};
	ckpt::interchange::write(ix, meta);
	ckpt::safetensors::Writer x((dir / "seed-dm-ckpt").string(), {{"w", "F32", {4, 4}}, {"b", "F32", {4}}},
				    meta, false);
	x.write(buf.data(), 64);
	x.write(buf.data(), 16);
	x.finish();
	put("safetensors", "index", R"({"metadata": {"total_size": 80}, "weight_map": )"
				    R"({"w": "model-00001-of-00002.safetensors", "b": "model-00002-of-00002.safetensors"}})");
}

// ckptctl's tenant tables: the drive's size (8 bytes, little-endian), then
// the JSON of a copy, as ckptctl writes it.
void tenant_tables()
{
	const auto put_table = [](const std::string &name, uint64_t drive, const ckptctl::Table &t) {
		std::string in(8, '\0');
		for (int i = 0; i < 8; i++)
			in[i] = static_cast<char>(drive >> (8 * i));
		put("tenant_table", name, in + ckptctl::table_json(t));
	};
	ckptctl::Table t;
	t.uuid = "0f1e2d3c-4b5a-4968-8776-a5b4c3d2e1f0";
	put_table("empty", 64 * ckptctl::kMiB, t);
	t.read_bps = 3000000000;
	t.write_bps = 2000000000;
	t.tenants.push_back({"job-42", "11111111-2222-4333-8444-555555555555", ckptctl::kMiB, 8 * ckptctl::kMiB,
			     1001, 1001, 300, 0});
	t.tenants.push_back({"job_43", "66666666-7777-4888-9999-aaaaaaaaaaaa", 20 * ckptctl::kMiB,
			     44 * ckptctl::kMiB, 1002, 100, 100, 500000000});
	put_table("two", 64 * ckptctl::kMiB + 4096, t);
}

} // namespace

int main(int argc, char **argv)
{
	if (argc != 2) {
		std::fprintf(stderr, "usage: %s CORPUS_DIR (tests/fuzz/corpus)\n", argv[0]);
		return 2;
	}
	root = argv[1];
	superblocks();
	commands();
	status_lines();
	tables();
	manifests();
	safetensors_files();
	tenant_tables();
	return 0;
}
