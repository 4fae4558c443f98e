// SPDX-License-Identifier: MIT
// The commands of ckptctl, behind main.cpp's command line. Each returns the
// process exit status or throws ckptctl::Error (exit 1).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "dm.hpp"
#include "report.hpp"

namespace ckptctl {

// Exit statuses.
constexpr int exit_ok = 0;
constexpr int exit_error = 1;		// could not do what was asked
constexpr int exit_corrupt = 2;		// verify/restore found damage or no rollback
constexpr int exit_degraded = 3;	// verify: state intact, but a superblock or metadata copy is damaged
constexpr int exit_usage = 64;		// a command line that cannot be parsed (sysexits.h EX_USAGE)

struct FormatArgs {
	std::string device, manifest, safetensors, dtype, state, master;
	std::vector<std::string> groups;	// "G:glob,glob"
	std::vector<std::string> include, exclude;
	uint32_t chunk_params = 0;
	uint64_t size = 0;
	bool json = false, force = false;
};
int cmd_format(const FormatArgs &a);

int cmd_info(const std::string &device, bool json, bool table);
int cmd_probe(const std::string &device, uint32_t chunk_params, bool json);

struct CreateArgs {
	std::string name, device;
	uint32_t queue_depth = 0, staging_kb = 0;
	bool read_only = false, json = false;
	std::string image_uuid;	// if set, the image on device must have this uuid
};
int cmd_create(const CreateArgs &a);

// The device-mapper uuid of the target of an image: "CKPT-" and the image's
// uuid (the superblock's), so that one image has at most one target and a
// target is found by its image whatever the kernel names its backing device.
inline std::string dm_uuid(const std::string &image_uuid) { return "CKPT-" + image_uuid; }

// What cmd_create and cmd_activate do: checks the image on a.device, refuses
// an image that has a target already, creates the target.
struct Created {
	std::string node, uuid, image_uuid, table;
	uint64_t step = 0;
	dm::Info info;
};
Created create_target(const CreateArgs &a);

// ckptctl activate / deactivate: the devices of a ckpttab (ckpttab.hpp).
struct ActivateArgs {
	std::string ckpttab = "/etc/ckpttab";
	std::string uuid, device, name;	// one of these, or all
	bool all = false, read_only = false;
};
int cmd_activate(const ActivateArgs &a);
int cmd_deactivate(const ActivateArgs &a);
int cmd_remove(const std::string &name, bool retry, bool force);
// as_json, or prometheus: the status in Prometheus' text format
int cmd_status(const std::string &name, bool json, bool prometheus, const ReportArgs &r);
// The fields of status -o and list -o (kernel targets, or images).
ReportKind status_kind();
ReportKind list_kind(bool images);

struct ListArgs {
	std::vector<std::string> paths, image_dirs;
	ReportArgs report;
	bool json = false;
	bool prometheus = false;	// the targets' status in Prometheus' text format
};
int cmd_list(const ListArgs &a);
int cmd_message(const std::string &name, const std::vector<std::string> &words);

struct ImportArgs {
	std::string device, from;
	bool with_optimizer = false, partial = false;
	std::optional<uint64_t> step;
};
int cmd_import(const ImportArgs &a);
int cmd_export(const std::string &device, const std::string &to, bool with_optimizer, bool force);
int cmd_verify(const std::string &device, bool json, bool repair);

struct ReshardArgs {
	std::vector<std::string> from, to;	// to: M paths, or one holding {rank}
	uint32_t world = 0;			// with a {rank} path
	std::string params;			// a manifest file: the whole layout (pre-0.4 images)
	bool json = false;
};
int cmd_reshard(const ReshardArgs &a);

struct StripeArgs {
	std::string path;
	std::vector<std::string> drives;
	uint64_t stripe_kib = 64;
	uint64_t drive_bytes = 0;	// size of the drive files to create
	bool json = false;
};
int cmd_stripe(const StripeArgs &a);
int cmd_restore(const std::string &device, bool rollback, bool json);

} // namespace ckptctl
