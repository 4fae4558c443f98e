// SPDX-License-Identifier: MIT
// ckptctl: prepare, inspect, move and repair dm-ckpt backing devices, and
// manage the kernel target. The command line; the commands are in
// commands.cpp, device-mapper in dm.cpp, NVMe identify in probe.cpp.
#include <cstdio>
#include <memory>
#include <optional>
#include <sstream>

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include "ckpttab.hpp"
#include "commands.hpp"
#include "fail.hpp"
#include "plan.hpp"
#include "progress.hpp"
#include "serve.hpp"
#include "tenant.hpp"

using namespace ckptctl;

namespace {

const char *top_help =
	"ckptctl: prepare, inspect and manage dm-ckpt devices.\n\n"
	"A dm-ckpt device keeps the fp32 AdamW state of a model (master params,\n"
	"exp_avg, exp_avg_sq: 12 B/param, twice, plus 2 B/param of fp16/bf16 params,\n"
	"twice: 28 B/param) on a backing file or NVMe device. A training step writes\n"
	"fp16/bf16 gradients to the device and reads the updated params back; every\n"
	"committed step is durable, and the previous one stays readable until the\n"
	"next step starts (one-step rollback).\n\n"
	"A DEVICE argument is a backing file or block device. Read-only commands\n"
	"(info, export, verify, restore without --rollback) also take a dm-ckpt\n"
	"device (/dev/mapper/NAME) and read its backing device. Commands that write\n"
	"a backing device (format, import, restore --rollback, verify --repair)\n"
	"refuse one that a kernel target holds, and, like a trainer, take an\n"
	"exclusive lock on it (flock on a file, O_EXCL on a block device): one\n"
	"writer at a time, and the second one is told which process holds it.\n"
	"Readers take no lock: verify and export repeat a check that a trainer's\n"
	"commit overtook, and give up (in use) rather than report damage that is\n"
	"not there. A child forked from a trainer cannot use its device.\n\n"
	"The superblock has two copies; images formatted since the META2 feature\n"
	"also keep two copies of the group table and manifest. Every command uses\n"
	"the first intact copy and warns (on stderr; info also in its output) when\n"
	"it had to skip a damaged one.";

const char *top_footer =
	"\nEXIT STATUS\n"
	"  0   success\n"
	"  1   error: unreadable or invalid input, device errors, refused operations\n"
	"  2   verify or restore found damage; restore --rollback found no usable previous step\n"
	"  3   verify: DEGRADED: the committed state is intact, but a superblock copy\n"
	"      or a copy of the group table or manifest is damaged (verify --repair\n"
	"      rewrites a damaged metadata copy; the next commit, a superblock copy)\n"
	"  64  usage: unknown command or option, missing or bad argument (EX_USAGE;\n"
	"      not 2, which a script checking verify must not mistake for damage)\n"
	"\nEXAMPLES\n"
	"  ckptctl probe /dev/nvme0n1\n"
	"  ckptctl format /dev/nvme0n1 --from-safetensors model.safetensors --group 1:'*.bias,*norm*'\n"
	"  ckptctl import /dev/nvme0n1 --from model.safetensors\n"
	"  ckptctl create ckpt0 /dev/nvme0n1 --queue-depth 8\n"
	"  ckptctl status ckpt0\n"
	"  ckptctl list -o name,backing,committed_step,state\n"
	"  ckptctl remove ckpt0\n"
	"  ckptctl activate --all                        # the devices of /etc/ckpttab\n"
	"  ckptctl verify /dev/nvme0n1\n"
	"  ckptctl export /dev/nvme0n1 --to step.safetensors --with-optimizer\n"
	"  ckptctl plan --params 7e9 --gpus 8 --nodes 4\n"
	"\nRun 'ckptctl COMMAND --help' for a command's options and examples.";

// The command list shows each command's first description line; its own
// --help shows all of it.
class Formatter : public CLI::Formatter {
public:
	std::string make_subcommand(const CLI::App *sub) const override
	{
		std::stringstream out;
		std::string d = sub->get_description();
		CLI::detail::format_help(out, sub->get_display_name(true), d.substr(0, d.find('\n')), column_width_);
		return out.str();
	}
	std::string make_description(const CLI::App *app) const override
	{
		return CLI::Formatter::make_description(app) + "\n";
	}
};

// The command a command line names: its first word that is not an option.
std::string command_word(int argc, char **argv)
{
	for (int i = 1; i < argc; i++)
		if (argv[i][0] != '-')
			return argv[i];
	return "";
}

// A command line CLI11 refused: one line that names the problem and where
// help is, exit status 64.
int usage_error(const CLI::App &app, const CLI::ParseError &e, int argc, char **argv)
{
	const std::string word = command_word(argc, argv);
	const auto subs = app.get_subcommands([&](const CLI::App *s) { return s->get_name() == word; });
	if (word.empty())
		fmt::print(stderr, "ckptctl: a command is required; see ckptctl --help\n");
	else if (subs.empty())
		fmt::print(stderr, "ckptctl: unknown command '{}'; see ckptctl --help\n", word);
	else
		fmt::print(stderr, "ckptctl {}: {}; see ckptctl {} --help\n", word, e.what(), word);
	return exit_usage;
}

// --progress and --no-progress of a long command.
void add_progress_options(CLI::App *cmd, Progress::Mode &mode)
{
	auto *on = cmd->add_flag_callback("--progress", [&mode] { mode = Progress::Mode::always; },
					  "show progress from the start, even when stderr is not a terminal\n"
					  "(default: on a terminal, once the work takes a second)");
	cmd->add_flag_callback("--no-progress", [&mode] { mode = Progress::Mode::off; }, "show no progress")
		->excludes(on);
}

void add_report_options(CLI::App *cmd, ReportArgs &r)
{
	cmd->add_option("-o,--options", r.fields, "FIELD[,FIELD...]: the fields to show ('+F,...' adds to the\n"
						   "defaults); an unknown one lists the valid ones");
	cmd->add_flag("--noheadings", r.noheadings, "no heading line");
	cmd->add_option("--separator", r.separator, "join the fields with this string instead of aligning them");
}

// A report's -o names only fields it has (before any device is touched).
bool bad_fields(const char *cmd, const ReportKind &kind, const std::string &spec)
{
	try {
		report_fields(kind, spec);
		return false;
	} catch (const Error &e) {
		fmt::print(stderr, "ckptctl {}: {}\n", cmd, e.what());
		return true;
	}
}

} // namespace

int main(int argc, char **argv)
{
	CLI::App app{top_help, "ckptctl"};
	Progress::Mode progress = Progress::Mode::tty;
	app.footer(top_footer);
	app.require_subcommand(1);
	app.set_version_flag("--version", fmt::format("ckptctl {}", ckpt_version()), "print 'ckptctl VERSION' and exit");
	auto formatter = std::make_shared<Formatter>();
	formatter->column_width(34);
	app.formatter(formatter);

	// ---- format
	FormatArgs fa;
	auto *format = app.add_subcommand("format",
		"Lay out tensors on a backing file or block device and write step 0.\n\n"
		"Writes the superblock, group table, tensor manifest and all-zero state\n"
		"(step 0) for the tensors of a manifest or of a safetensors file. Everything\n"
		"on the device is lost: a device or file that holds a dm-ckpt image or any\n"
		"signature blkid knows (a file system, a partition table) is refused unless\n"
		"--force. A file gets all the space the layout needs (or --size) reserved\n"
		"up front, so a full file system fails the format, not a later step; it is\n"
		"built beside the old file and renamed over it only when complete, so a\n"
		"failed format leaves the old file as it was and nothing new behind. A\n"
		"block device is written in place. Each tensor starts at a multiple of\n"
		"2048 params; tensors of different hyperparameter groups never share a\n"
		"chunk. Load initial weights afterwards with 'ckptctl import'.\n\n"
		"The manifest is JSON: {\"dtype\": \"bf16\", \"chunk_params\": 65536,\n"
		"\"tensors\": [{\"name\": \"w\", \"shape\": [4096, 4096], \"group\": 0}, ...]}.\n"
		"The manifest may record each group's hyperparameters for export:\n"
		"\"groups\": [{\"lr\": 1e-3, \"betas\": [0.9, 0.999], \"eps\": 1e-8,\n"
		"\"weight_decay\": 0.01, \"adam_l2\": false}, ...] (each step's begin still\n"
		"gives the ones it applies).\n"
		"From a safetensors checkpoint (a file, a sharded checkpoint's\n"
		"model.safetensors.index.json, or a Hugging Face model folder holding\n"
		"either), its floating-point tensors (F32, F16, BF16, F64) are laid out in\n"
		"file order, grouped by --group; integer tensors, empty ones and\n"
		"'<name>.exp_avg[_sq]' entries written by 'ckptctl export' are skipped.\n"
		"The dtype is fp16 if every tensor is F16, else bf16 (--dtype overrides).\n"
		"A file written by 'ckptctl export' (dm-ckpt.* metadata) gives the layout of\n"
		"the image it came from: tensor order, groups, dtype, chunk size, state and\n"
		"master formats and the groups' hyperparameters; --dtype, --chunk-params,\n"
		"--state, --master and --group override them, and the summary says so.");
	format->add_option("device", fa.device, "backing file (created if missing) or block device")->required();
	auto *src_m = format->add_option("-m,--manifest", fa.manifest, "tensor manifest (JSON)");
	auto *src_s = format->add_option("--from-safetensors", fa.safetensors,
					 "take the tensors (names, shapes) of this safetensors\nfile, index (.json) or model folder");
	src_m->excludes(src_s);
	format->add_option("--group", fa.groups,
			   "G:GLOB[,GLOB...]: tensors whose names match a glob go to\n"
			   "hyperparameter group G (0..63); repeatable, the first\n"
			   "matching rule wins; unmatched tensors are in group 0.\n"
			   "Only with --from-safetensors")
		->needs(src_s);
	format->add_option("--include", fa.include, "only tensors matching this glob (repeatable)")->needs(src_s);
	format->add_option("--exclude", fa.exclude, "leave out tensors matching this glob (repeatable)")->needs(src_s);
	format->add_option("--dtype", fa.dtype, "gradient/param dtype: bf16 or fp16 (overrides the input)")
		->check(CLI::IsMember({"bf16", "fp16"}));
	format->add_option("--chunk-params", fa.chunk_params,
			   "params per chunk, a power of two from 2048 to 4194304\n(default: the manifest's, else 65536)");
	format->add_option("--size", fa.size, "size of a file in bytes (default: what the layout needs)");
	format->add_option("--state", fa.state,
			   "optimizer state: fp32 (default; from an export, its\n"
			   "image's) or 8bit (exp_avg and exp_avg_sq as block-wise\n"
			   "8-bit codes: 6 B of state per param instead of 12; an\n"
			   "image older tools refuse)")
		->check(CLI::IsMember({"fp32", "8bit"}));
	format->add_option("--master", fa.master,
			   "master params: fp32 (default; from an export, its image's)\n"
			   "or bf16 (rounded stochastically at every step; needs\n"
			   "--state 8bit and dtype bf16: 4 B of state per param)")
		->check(CLI::IsMember({"fp32", "bf16"}));
	format->add_flag("--force", fa.force, "format over an existing dm-ckpt image or signature");
	format->add_flag("--json", fa.json, "print the resulting geometry as JSON (as info --json)");
	add_progress_options(format, progress);
	format->footer(
		"\nEXAMPLES\n"
		"  ckptctl format model.img -m manifest.json\n"
		"  ckptctl format /dev/nvme0n1 --from-safetensors model.safetensors \\\n"
		"      --group 1:'*.bias,*norm*'          # no weight decay for biases and norms\n"
		"  ckptctl format /dev/nvme0n1 --from-safetensors model.safetensors --exclude '*.running_*'");

	// ---- info
	std::string dev;
	bool as_json = false, as_table = false, prometheus = false;
	auto *info = app.add_subcommand("info",
		"Show the geometry, committed step and tensors of a device.\n\n"
		"Reads the superblock, group table and manifest (all validated) of a\n"
		"backing file or device, or of the backing device of /dev/mapper/NAME.\n"
		"Shows which superblock copy is in use and a WARNING for each damaged\n"
		"copy of the superblock, group table or manifest that was skipped (with\n"
		"--json: \"warnings\"; a damaged newer superblock copy may mean that the\n"
		"last commit was lost). 'ckptctl verify' checks everything.");
	info->add_option("device", dev, "backing file or block device, or a dm-ckpt device")->required();
	info->add_flag("--json", as_json, "print JSON");
	info->add_flag("--table", as_table,
		       "print the device-mapper table line of the kernel target:\n"
		       "dmsetup create NAME --table \"$(ckptctl info --table DEV)\"")
		->excludes("--json");
	info->footer("\nEXAMPLES\n  ckptctl info model.img\n  ckptctl info --json /dev/nvme0n1 | jq .committed_step");

	// ---- probe
	uint32_t probe_chunk = 0;
	auto *probe = app.add_subcommand("probe",
		"Identify an NVMe namespace and size a dm-ckpt layout for it.\n\n"
		"Reports model, serial, firmware, namespace size, LBA format (data and\n"
		"metadata bytes), atomic write units (awun/awupf, and nawun/nawupf when the\n"
		"namespace defines them), preferred write sizes, the volatile write cache\n"
		"and FUA; then the recommended chunk size and how many params fit (28 B per\n"
		"param plus record headers and metadata). Fails with exit status 1 on\n"
		"anything that is not an NVMe namespace (a file, loop, SCSI or dm device).\n"
		"Needs root (NVMe admin commands).");
	probe->add_option("device", dev, "NVMe namespace block device, e.g. /dev/nvme0n1")->required();
	probe->add_option("--chunk-params", probe_chunk, "size the layout for this chunk size instead");
	probe->add_flag("--json", as_json, "print JSON");
	probe->footer("\nEXAMPLES\n  ckptctl probe /dev/nvme0n1\n  ckptctl probe --json /dev/nvme0n1");

	// ---- create / remove / status / message
	CreateArgs ca;
	auto *create = app.add_subcommand("create",
		"Create a dm-ckpt kernel target on a formatted block device.\n\n"
		"Validates the device's superblock, group table and manifest first and\n"
		"refuses a device without a valid dm-ckpt image; computes the table line\n"
		"'0 SECTORS ckpt DEV [#opts] [queue_depth N] [staging_kb K]' itself and\n"
		"creates /dev/mapper/NAME through libdevmapper (without udev, libdevmapper\n"
		"makes the node). Needs the dm-ckpt module loaded. The device-mapper uuid\n"
		"of the target is CKPT-<image uuid> (the superblock's; 'ckptctl info' and\n"
		"'status' show it): an image that has a target already is refused, under\n"
		"any name or path.");
	create->add_option("name", ca.name, "device-mapper name (/dev/mapper/NAME)")->required();
	create->add_option("device", ca.device, "formatted backing block device")->required();
	create->add_option("--queue-depth", ca.queue_depth, "chunks in flight in the target (1..128; default: the target's)")
		->check(CLI::Range(1, 128));
	create->add_option("--staging-kb", ca.staging_kb,
			   "memory for partially written chunks, KiB (1..4194304;\ndefault: the target's)")
		->check(CLI::Range(1, 4194304));
	create->add_flag("--readonly", ca.read_only, "load the table read-only: params can be read, no step taken");
	create->add_flag("--json", ca.json, "print the result as JSON");
	create->footer("\nEXAMPLES\n  ckptctl create ckpt0 /dev/nvme0n1\n"
		       "  ckptctl create ckpt0 /dev/nvme0n1 --queue-depth 16 --staging-kb 131072");

	std::string name;
	bool retry = false, force = false;
	auto *remove = app.add_subcommand("remove",
		"Remove a dm-ckpt kernel target.\n\n"
		"The backing device keeps the last committed step; an open step is lost\n"
		"(as after a crash). Refuses a device that is open unless --retry, and a\n"
		"device that is not dm-ckpt unless --force.");
	remove->add_option("name", name, "device-mapper name")->required();
	remove->add_flag("--retry", retry, "retry while the device is briefly busy (e.g. udev probing it)");
	remove->add_flag("--force", force, "remove it even if it is not a dm-ckpt device");
	remove->footer("\nEXAMPLES\n  ckptctl remove ckpt0");

	ReportArgs status_report;
	auto *status = app.add_subcommand("status",
		"Show the state and counters of a dm-ckpt kernel target.\n\n"
		"Parses the target's status line: state (idle/open/failed), committed and\n"
		"open step, chunks applied, overflow, last result and error, step counts,\n"
		"rejected commands, traffic and I/O errors; plus its table line. With -o,\n"
		"--noheadings or --separator: one report row of the chosen fields, as\n"
		"'ckptctl list' prints them (as lvs -o). --prometheus prints the counters\n"
		"in Prometheus' text format, as 'ckptctl list --prometheus' does for every\n"
		"target.");
	status->add_option("name", name, "device-mapper name")->required();
	auto *status_json = status->add_flag("--json", as_json, "print JSON (the raw status line is in status.raw)");
	status->add_flag("--prometheus", prometheus, "print the status in Prometheus' text format")
		->excludes(status_json);
	add_report_options(status, status_report);
	status->footer("\nEXAMPLES\n  ckptctl status ckpt0\n  ckptctl status --json ckpt0\n"
		       "  ckptctl status ckpt0 -o state,committed_step --noheadings");

	ListArgs la;
	auto *list = app.add_subcommand("list",
		"List dm-ckpt kernel targets, or images.\n\n"
		"Without arguments: every device-mapper device with a dm-ckpt table, with\n"
		"its backing device, committed step and state (needs device-mapper). With\n"
		"paths or --images DIR: those files or block devices, and the regular files\n"
		"and block devices in DIR, that carry a dm-ckpt image (others in DIR are\n"
		"skipped; a given path that is not an image is an error, exit 1, after the\n"
		"list). -o FIELDS chooses the columns ('+F' adds to the defaults),\n"
		"--noheadings drops the heading, --separator S joins the fields with S\n"
		"instead of aligning them (as lvs). --prometheus prints every target's\n"
		"status in Prometheus' text format (version 0.0.4): one family per field\n"
		"of the status line, dm_ckpt_FIELD (counters dm_ckpt_FIELD_total), each\n"
		"sample labelled name, backing and uuid; for node_exporter's textfile\n"
		"collector, write it to a .prom file from a timer.");
	list->add_option("paths", la.paths, "image files or block devices");
	list->add_option("--images", la.image_dirs, "list the images in this directory (repeatable)")
		->check(CLI::ExistingDirectory);
	auto *list_json = list->add_flag("--json", la.json, "print the rows (every field) as a JSON array");
	list->add_flag("--prometheus", la.prometheus, "print the targets' status in Prometheus' text format")
		->excludes(list_json);
	add_report_options(list, la.report);
	list->footer("\nEXAMPLES\n  ckptctl list\n  ckptctl list -o name,committed_step --noheadings --separator :\n"
		     "  ckptctl list --images /srv/ckpt -o +tensors\n  ckptctl list /dev/nvme0n1 /dev/nvme1n1\n"
		     "  ckptctl list --prometheus > /var/lib/prometheus/node-exporter/dm-ckpt.prom.$$ &&\n"
		     "    mv /var/lib/prometheus/node-exporter/dm-ckpt.prom.$$ /var/lib/prometheus/node-exporter/dm-ckpt.prom");

	std::vector<std::string> words;
	auto *message = app.add_subcommand("message",
		"Send a message to a dm-ckpt kernel target (as dmsetup message NAME 0 ...).\n\n"
		"The target's verbs: stats; begin STEP GRAD_SCALE_HEX GROUP...; commit STEP\n"
		"[BLOB_HEX]; abort [STEP]. Prints the target's answer. A refused message\n"
		"exits 1; the kernel log says why.");
	message->add_option("name", name, "device-mapper name")->required();
	message->add_option("words", words, "the message")->required();
	message->footer("\nEXAMPLES\n  ckptctl message ckpt0 stats\n  ckptctl message ckpt0 abort");

	// ---- serve / unserve
	ServeArgs sa;
	auto *serve = app.add_subcommand("serve",
		"Export a dm-ckpt kernel target over NVMe-oF (the kernel's nvmet).\n\n"
		"Makes, in configfs (/sys/kernel/config/nvmet), the subsystem NQN with one\n"
		"namespace, the dm-ckpt device (a trainer's client reads the image's\n"
		"manifest, step counts and state through its read-only IMAGE window; the\n"
		"backing device is not served), a port on --addr (one that exists with the same\n"
		"address is shared) and the hosts allowed to connect (--host, repeatable;\n"
		"--any-host, explicitly, for every host, unauthenticated). Each named host\n"
		"authenticates with DH-HMAC-CHAP both ways (the kernel's in-band\n"
		"authentication, CONFIG_NVME_TARGET_AUTH): its host and controller secrets\n"
		"come from --key-file or are made with nvme-cli (nvme gen-dhchap-key) and\n"
		"printed with the host's nvme connect line; a host entry that has keys\n"
		"already (another serve's) keeps them. --no-auth serves named hosts\n"
		"without keys. Needs configfs, nvmet and nvmet-tcp. What it made, the\n"
		"secrets included, is recorded in /run/ckpt/nvmet/NQN.json (mode 0600);\n"
		"'ckptctl unserve' removes exactly that. A failure undoes what was made.");
	serve->add_option("device", sa.device, "device-mapper name or /dev/mapper/NAME of a dm-ckpt device")->required();
	serve->add_option("--nqn", sa.nqn, "the subsystem's NQN (nqn.YYYY-MM.reverse.domain:...)")->required();
	serve->add_option("--addr", sa.addr, "IP[:PORT] or [IPv6]:PORT to listen on (port default 4420)")->required();
	serve->add_option("--transport", sa.transport, "NVMe-oF transport (tcp, the default)")
		->check(CLI::IsMember({"tcp"}));
	serve->add_option("--host", sa.hosts, "host NQN allowed to connect (repeatable; one or --any-host needed)");
	serve->add_flag("--any-host", sa.any_host, "let every host connect, unauthenticated");
	serve->add_flag("--no-auth", sa.no_auth, "named hosts connect without DH-HMAC-CHAP keys");
	serve->add_option("--key-file", sa.key_file,
			  "lines 'HOSTNQN HOST_KEY CTRL_KEY' (DHHC-1 secrets) for every --host; default: made");
	serve->add_flag("--json", sa.json, "print what was made as JSON");
	serve->footer("\nEXAMPLES\n  ckptctl serve ckpt0 --nqn nqn.2024-01.org.example:ckpt0 --addr 10.0.0.1 \\\n"
		      "      --host nqn.2014-08.org.nvmexpress:uuid:0f4c...\n"
		      "  ckptctl serve /dev/mapper/ckpt0 --nqn nqn.2024-01.org.example:ckpt0 --addr 10.0.0.1:4420 \\\n"
		      "      --host nqn.2014-08.org.nvmexpress:uuid:0f4c... --key-file /etc/dm-ckpt/keys");

	std::string unserve_what;
	auto *unserve = app.add_subcommand("unserve",
		"Stop serving a dm-ckpt device over NVMe-oF.\n\n"
		"Removes what 'ckptctl serve' made for it (its record in /run/ckpt/nvmet):\n"
		"the port link, the namespaces, the allowed hosts and host entries it made,\n"
		"the subsystem, and the port if serve made it and no other subsystem uses\n"
		"it. Connected hosts lose the device.");
	unserve->add_option("what", unserve_what, "the subsystem's NQN, or the device-mapper name")->required();
	unserve->footer("\nEXAMPLES\n  ckptctl unserve ckpt0\n  ckptctl unserve nqn.2024-01.org.example:ckpt0");

	// ---- activate / deactivate
	ActivateArgs aa;
	auto *activate = app.add_subcommand("activate",
		"Create the kernel targets listed in /etc/ckpttab (assembly at boot).\n\n"
		"Kernel names of block devices (/dev/nvme0n1) change between boots, so\n"
		"ckpttab names a backing device by the uuid of its image (the superblock's,\n"
		"'ckptctl info' shows it), or by a stable path such as /dev/disk/by-id/...\n"
		"activate finds each image by reading the superblock of every block device\n"
		"(/sys/class/block) and creates its target as 'ckptctl create' does, with\n"
		"the device-mapper uuid CKPT-<image uuid>. A target that is active already\n"
		"is left as it is (ok): running it again is harmless. The whole file is\n"
		"checked first; a bad line is an error naming it (FILE:LINE) and nothing is\n"
		"created. With several entries, each is tried; the exit status is 1 if any\n"
		"failed (each failure is printed with its line).\n\n"
		"ckpttab: one device a line, fields separated by blanks:\n"
		"  NAME  DEVICE  [OPTIONS]\n"
		"NAME is the device-mapper name (/dev/mapper/NAME). DEVICE is UUID=<image\n"
		"uuid> or an absolute path. OPTIONS is '-' or 'defaults', or a comma-separated\n"
		"list of: ro (read-only table), noauto (not activated by --all),\n"
		"queue_depth=N (1..128), staging_kb=K (1..4194304). Lines starting with '#'\n"
		"and blank lines are ignored. Names, uuids and paths must be unique.");
	activate->add_flag("--all", aa.all, "every entry except those marked noauto");
	// a uuid that is not one is a usage error (exit 64), found before ckpttab is read
	const CLI::Validator uuid_check(
		[](std::string &u) { return canonical_uuid(u).empty() ? "not a uuid (xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx)" : ""; },
		"UUID");
	activate->add_option("--uuid", aa.uuid, "the entry of this image uuid")->check(uuid_check);
	activate->add_option("--device", aa.device,
					     "the entries whose image is on this block device (for udev:\n"
					     "a device without a listed image is not an error)");
	activate->add_flag("--readonly", aa.read_only, "load every table read-only (as option ro)");
	activate->add_option("--ckpttab", aa.ckpttab, "the table to read (default /etc/ckpttab)");
	activate->footer(
		"\nEXAMPLES\n"
		"  ckptctl info /dev/nvme0n1 | head -1          # the image uuid\n"
		"  echo 'ckpt0 UUID=0f3c2a5e-7d41-4b8e-9a10-2c6f1e0d9b77 queue_depth=16' >>/etc/ckpttab\n"
		"  ckptctl activate --all\n"
		"  ckptctl activate --uuid 0f3c2a5e-7d41-4b8e-9a10-2c6f1e0d9b77 --readonly");

	auto *deactivate = app.add_subcommand("deactivate",
		"Remove the kernel targets of /etc/ckpttab (or one by name or image uuid).\n\n"
		"With --all, the target of every entry of ckpttab; with --uuid, the target\n"
		"of that image; with NAME, that target. A target that is not active is fine\n"
		"(ok). A device that is open, or is not dm-ckpt, is left alone (exit 1).\n"
		"The backing device keeps the last committed step.");
	deactivate->add_option("name", aa.name, "device-mapper name");
	deactivate->add_flag("--all", aa.all, "the targets of every entry of ckpttab");
	deactivate->add_option("--uuid", aa.uuid, "the target of this image uuid")->check(uuid_check);
	deactivate->add_option("--ckpttab", aa.ckpttab, "the table to read (default /etc/ckpttab)");
	deactivate->footer("\nEXAMPLES\n  ckptctl deactivate --all\n  ckptctl deactivate ckpt0");

	// ---- import / export
	ImportArgs ia;
	uint64_t import_step = 0;
	auto *import = app.add_subcommand("import",
		"Load weights (and optimizer state) from a safetensors checkpoint: a file,\n"
		"a sharded checkpoint's model.safetensors.index.json (every tensor in the\n"
		"shard its weight_map names, shards in the index's folder only), or a\n"
		"Hugging Face model folder holding either.\n\n"
		"Every tensor of the device is read from the file tensor of the same name\n"
		"and shape (F32, F16, BF16 exactly; F64 rounded) into the fp32 master copy;\n"
		"moments are zero. With --with-optimizer, '<name>.exp_avg' and\n"
		"'<name>.exp_avg_sq' are loaded too, and the device's committed step becomes\n"
		"the file's \"step\" metadata (as 'ckptctl export --with-optimizer' writes\n"
		"it), with its trainer blob. Only into a device before its first step; the\n"
		"load commits like a step (a crash keeps the old or the new state). The file\n"
		"is validated completely before anything is read or written; values must be\n"
		"finite (exp_avg_sq not negative).");
	import->add_option("device", ia.device, "backing file or block device (not a dm-ckpt device)")->required();
	import->add_option("--from", ia.from, "safetensors file, index (.json) or model folder")->required();
	import->add_flag("--with-optimizer", ia.with_optimizer, "also load exp_avg/exp_avg_sq and the step");
	auto *step_opt = import->add_option("--step", import_step,
					    "optimizer step of the moments (default: the file's \"step\")")
				 ->needs("--with-optimizer");
	import->add_flag("--partial", ia.partial,
			 "allow device tensors missing from the file (they keep their\n"
			 "values) and skip file tensors the device lacks");
	add_progress_options(import, progress);
	import->footer("\nEXAMPLES\n  ckptctl import /dev/nvme0n1 --from model.safetensors\n"
		       "  ckptctl import /dev/nvme0n1 --from ./Llama-3.2-1B      # a model folder\n"
		       "  ckptctl import new.img --from step1000.safetensors --with-optimizer");

	std::string to;
	bool with_opt = false, export_force = false;
	auto *exportc = app.add_subcommand("export",
		"Write the committed state to a safetensors file.\n\n"
		"The fp32 master params of every tensor at the committed step, as F32 with\n"
		"the manifest's shapes; with --with-optimizer also '<name>.exp_avg' and\n"
		"'<name>.exp_avg_sq'. __metadata__ holds format=pt, step, ckpt.dtype,\n"
		"ckpt.uuid and (with --with-optimizer) ckpt.trainer_blob in hex, and the\n"
		"image's layout for 'format --from-safetensors': dm-ckpt.format_version,\n"
		"dtype, chunk_params, step, n_groups, tensor_group.NAME and, when the image\n"
		"records them, group.G.lr, .beta1, .beta2, .eps, .weight_decay, .flags.\n"
		"Every record read is checked (header and checksum). The file appears only\n"
		"when complete:\n"
		"it is written under a temporary name beside it, removed on any failure.\n"
		"--to must be a new path or a regular file (which is replaced); a directory,\n"
		"device node or FIFO is refused, and so is a file a trainer has open (even\n"
		"with --force) and a dm-ckpt image (unless --force): an argument typo never\n"
		"replaces a device's state. A backing file shorter than its layout is\n"
		"read as far as it goes (with a warning naming the missing bytes): the\n"
		"export works if the committed state is all there.");
	exportc->add_option("device", dev, "backing file or block device, or a dm-ckpt device")->required();
	exportc->add_option("--to", to, "output safetensors file (new, or a regular file to replace)")->required();
	exportc->add_flag("--with-optimizer", with_opt, "also write exp_avg and exp_avg_sq");
	exportc->add_flag("--force", export_force, "replace --to even if it is a dm-ckpt image (not one in use)");
	add_progress_options(exportc, progress);
	exportc->footer("\nEXAMPLES\n  ckptctl export /dev/nvme0n1 --to weights.safetensors\n"
			"  ckptctl export /dev/mapper/ckpt0 --to step.safetensors --with-optimizer");

	// ---- reshard
	ReshardArgs ra;
	auto *reshard = app.add_subcommand("reshard",
		"Make a sharded run's optimizer state a run on another number of ranks.\n\n"
		"The images of every rank of a sharded OffloadAdamW run (in any order), or\n"
		"one unsharded image, become M new images: rank r's share of the same\n"
		"params over M ranks (M = 1: one unsharded image), at their committed step\n"
		"with their trainer blob. Masters, moments (8-bit ones in whole blocks,\n"
		"codes and scales unchanged) and per-tensor step counts are kept bit for\n"
		"bit: each new image is read back and compared before it is kept. The old\n"
		"images are only read, and must all be at one committed step (open the run\n"
		"once on its own ranks if one is a step ahead). The new images are made\n"
		"under temporary names and renamed to --to only when all are complete; a\n"
		"reshard stopped among the renames leaves a partial set, which a resume\n"
		"refuses: remove it and reshard again. Images of dm-ckpt before 0.4 record\n"
		"no shape of a param they cut into pieces: give the model's whole layout\n"
		"with --params (a manifest as 'ckptctl format --manifest' takes).");
	reshard->add_option("images", ra.from, "every rank's image (backing files or devices)")->required();
	reshard->add_option("--to", ra.to, "the new images' paths, one per new rank, or one with {rank}")
		->required();
	reshard->add_option("--world", ra.world, "the number of new ranks, with a --to path holding {rank}")
		->check(CLI::Range(1u, 65536u));
	reshard->add_option("--params", ra.params, "JSON tensor manifest of the whole model (pre-0.4 images)");
	reshard->add_flag("--json", ra.json, "print the new images as JSON");
	reshard->footer("\nEXAMPLES\n  ckptctl reshard state-0.img state-1.img --to 'new-{rank}.img' --world 3\n"
			"  ckptctl reshard state-*.img --to single.img");

	// ---- stripe
	StripeArgs sta;
	auto *stripe = app.add_subcommand("stripe",
		"Make a stripe set: one image over several drives.\n\n"
		"Writes a descriptor file naming the drives (files or block devices, in\n"
		"stripe order) and the stripe size. Every command and library call that\n"
		"takes an image takes the descriptor (format, info, verify, export,\n"
		"reshard, a trainer's OffloadAdamW): the userspace engine lays the image\n"
		"over the drives as dm-stripe lays a device over them (stripe k on drive\n"
		"k mod n), reading and writing them in parallel. The kernel target serves\n"
		"the same drives through a dm-stripe table of them, printed when every\n"
		"drive is a block device. A drive file that does not exist is created\n"
		"with --drive-size bytes; the set holds the drives' common size in whole\n"
		"stripes, times their count.");
	stripe->add_option("path", sta.path, "the descriptor to write (a new path)")->required();
	stripe->add_option("drives", sta.drives, "the drives, in stripe order")->required();
	stripe->add_option("--stripe-kib", sta.stripe_kib, "stripe size in KiB, a power of two (default 64)")
		->check(CLI::Range(uint64_t{4}, uint64_t{1} << 20));
	stripe->add_option("--drive-size", sta.drive_bytes, "size in bytes of each drive file to create");
	stripe->add_flag("--json", sta.json, "print the report as JSON");
	stripe->footer("\nEXAMPLES\n  ckptctl stripe /etc/opt.stripe /dev/nvme0n1 /dev/nvme1n1 /dev/nvme2n1 /dev/nvme3n1\n"
		       "  ckptctl stripe opt.stripe /mnt/a/opt.drive /mnt/b/opt.drive --drive-size 20000000000\n"
		       "  ckptctl format opt.stripe --manifest model.json");

	// ---- tenant
	TenantArgs ta;
	auto *tenant = app.add_subcommand("tenant",
		"Carve per-job optimizer devices out of one drive.\n\n"
		"init DRIVE writes the drive's tenant table (its first MiB) and turns on iocost\n"
		"on it (--read-bps/--write-bps: the drive's bandwidth, its model); create DRIVE\n"
		"NAME --size BYTES --owner USER[:GROUP] hands out an extent of the drive as\n"
		"/dev/mapper/ckpt-tenant-NAME (dm-linear), owned by the job's user, mode 0600:\n"
		"its size is the tenant's quota; its cgroup /sys/fs/cgroup/dm-ckpt/NAME gets\n"
		"--weight (io.weight on the drive: its share under contention) and --max-bps\n"
		"(io.max); exec DRIVE NAME -- COMMAND runs a job in that cgroup as the owner;\n"
		"set changes shares; remove DRIVE NAME zeroes the extent and frees it; list\n"
		"DRIVE; activate DRIVE makes every tenant's device and cgroup (at boot,\n"
		"ckptctl activate does it for every drive with a table).");
	tenant->add_option("verb", ta.verb, "init, create, remove, set, list, activate or exec")->required()
		->check(CLI::IsMember({"init", "create", "remove", "set", "list", "activate", "exec"}));
	tenant->add_option("drive", ta.drive, "the drive (a block device)")->required();
	tenant->add_option("name", ta.name, "the tenant (create, remove, set, exec)");
	tenant->add_option("command", ta.command, "exec: the job's command and its arguments (after --)");
	tenant->add_option("--size", ta.bytes, "create: the tenant's bytes, a multiple of 1 MiB");
	tenant->add_option("--owner", ta.owner, "create: USER[:GROUP] the device is given to");
	tenant->add_option("--weight", ta.weight, "create, set: the tenant's io.weight on the drive (default 100)")
		->check(CLI::Range(kMinWeight, kMaxWeight));
	tenant->add_option("--max-bps", ta.max_bps, "create, set: cap its reads and its writes at BPS bytes/s (0: none)")
		->check(CLI::Range(uint64_t{0}, kMaxBps));
	tenant->add_option("--read-bps", ta.read_bps, "init, set DRIVE: the drive's read bandwidth, bytes/s")
		->check(CLI::Range(uint64_t{1}, kMaxBps));
	tenant->add_option("--write-bps", ta.write_bps, "init, set DRIVE: the drive's write bandwidth, bytes/s")
		->check(CLI::Range(uint64_t{1}, kMaxBps));
	tenant->add_flag("--force", ta.force, "init: over a drive that is not blank at its start");
	tenant->add_flag("--json", ta.json, "list: as JSON");
	tenant->footer("\nEXAMPLES\n  ckptctl tenant init /dev/nvme1n1 --read-bps 6800000000 --write-bps 4000000000\n"
		       "  ckptctl tenant create /dev/nvme1n1 job42 --size 68719476736 --owner alice\n"
		       "  ckptctl tenant exec /dev/nvme1n1 job42 -- torchrun train.py\n"
		       "  ckptctl tenant set /dev/nvme1n1 job42 --weight 200\n"
		       "  ckptctl tenant list /dev/nvme1n1\n  ckptctl tenant remove /dev/nvme1n1 job42");

	// ---- verify / restore
	auto *verify = app.add_subcommand("verify",
		"Check a backing device's integrity.\n\n"
		"Checks both superblock copies and their checksums, the group table and\n"
		"manifest checksum, and every record of the committed slot: header checksum,\n"
		"chunk, slot, step and sequence equal to the superblock's, data checksum of\n"
		"fp32 p, m, v, checksum of p_lo (images formatted with the p_lo checksum\n"
		"feature), and p_lo == round-to-nearest-even(p) for every param. Damage\n"
		"is reported with its byte offset and the tensors it holds. Also reports\n"
		"whether the previous step (the other slot) is still readable for a rollback;\n"
		"that is information, not an error. Checks both copies of the group table\n"
		"and manifest (images with two) against their checksums.\n\n"
		"The last line is 'verify: ok' (exit 0), 'verify: CORRUPT ...' (exit 2:\n"
		"the committed state or all copies of something are damaged) or\n"
		"'verify: DEGRADED ...' (exit 3: the committed state is intact and usable,\n"
		"but a superblock copy or one copy of the group table or manifest is\n"
		"damaged; a damaged newer superblock copy may mean the last commit was lost,\n"
		"or was torn by a crash). --repair rewrites each damaged copy of the group\n"
		"table or manifest from the intact one (only those bytes, flushed) and\n"
		"verifies again; a damaged superblock copy is rewritten by the next commit.\n"
		"A backing file shorter than its layout is checked as far as it goes.");
	verify->add_option("device", dev, "backing file or block device, or a dm-ckpt device\n"
					  "(with --repair: not a dm-ckpt device)")
		->required();
	verify->add_flag("--json", as_json, "print JSON");
	bool repair = false;
	verify->add_flag("--repair", repair,
			 "rewrite damaged group table/manifest copies from the\n"
			 "intact ones; refused while a kernel target holds the device");
	add_progress_options(verify, progress);
	verify->footer("\nEXAMPLES\n  ckptctl verify /dev/nvme0n1\n  ckptctl verify --json model.img\n"
		       "  ckptctl verify --repair model.img");

	bool do_rollback = false;
	auto *restore = app.add_subcommand("restore",
		"Show what a restart resumes from; optionally roll back one step.\n\n"
		"Reports the committed step, its trainer blob (hex and printable), whether\n"
		"its state is intact, and whether the previous step is still readable: the\n"
		"older superblock copy commits it and every record of the other slot is at\n"
		"that step and sequence with intact data (and p_lo). With --rollback, makes that\n"
		"previous step the committed one (only when fully verified): its record\n"
		"headers are stamped with a new sequence, the device is flushed, and a\n"
		"superblock with the previous step and its blob is written with FUA over the\n"
		"older copy. Use it when ranks must agree on the minimum committed step.\n"
		"Exit status 2 when the state is damaged or --rollback is not possible.");
	restore->add_option("device", dev, "backing file or block device (a dm-ckpt device without --rollback)")
		->required();
	restore->add_flag("--rollback", do_rollback, "roll back to the previous step");
	restore->add_flag("--json", as_json, "print JSON");
	restore->footer("\nEXAMPLES\n  ckptctl restore /dev/nvme0n1\n  ckptctl restore --rollback /dev/nvme0n1");

	// ---- plan
	std::string plan_params, plan_gpus = "1", plan_nodes = "1", plan_state = "fp32", plan_master = "fp32", plan_output = "table";
	auto *plan = app.add_subcommand("plan",
		"Size a training run: memory per rank and bytes per step, with and without dm-ckpt.\n\n"
		"For a model of --params params trained with mixed-precision AdamW on\n"
		"--gpus GPUs (ranks) on each of --nodes nodes, prints per rank the GPU\n"
		"and host memory, the PCIe bytes per step, the backing device's reads\n"
		"and writes per step and capacity, and the bytes one checkpoint writes,\n"
		"and the network bytes each node sends per step; for three ways to keep\n"
		"the optimizer state: in GPU memory (sharded over the ranks), offloaded\n"
		"to host memory (the update on the CPU, ZeRO-Offload style), and on a\n"
		"dm-ckpt device. Every case keeps the fp16/bf16 params and gradients of\n"
		"the whole model on each GPU; activations, workspace and the framework's\n"
		"own memory are not counted. Bytes are decimal (1 GB = 10^9 B). The model\n"
		"and its assumptions are written in docs/performance.md (\"Capacity\n"
		"model\"). Touches no device.");
	plan->add_option("--params", plan_params, "the model's params: a whole number, e.g. 7e9 (1 to 1e14)")->required();
	plan->add_option("--gpus", plan_gpus, "GPUs (ranks) per node (1 to 65536; default 1)");
	plan->add_option("--nodes", plan_nodes, "nodes (1 to 65536; default 1)");
	plan->add_option("--state", plan_state, "optimizer state: fp32 moments, or 8bit (blockwise-quantized\nmoments, fp32 masters); default fp32")
		->check(CLI::IsMember({"fp32", "8bit"}));
	plan->add_option("--master", plan_master, "master params: fp32 (default) or bf16 (with --state 8bit)")
		->check(CLI::IsMember({"fp32", "bf16"}));
	auto *plan_fmt = plan->add_option("-o,--output", plan_output, "table (default) or json")
				 ->check(CLI::IsMember({"table", "json"}));
	bool plan_json_flag = false;
	plan->add_flag("--json", plan_json_flag, "print JSON (as -o json)")->excludes(plan_fmt);
	plan->footer("\nEXAMPLES\n  ckptctl plan --params 7e9\n  ckptctl plan --params 70e9 --gpus 8 --nodes 4 --state 8bit\n"
		     "  ckptctl plan --params 7e9 --state 8bit --master bf16\n"
		     "  ckptctl plan --params 7e9 --gpus 8 -o json | jq .dm_ckpt.host_bytes");

	try {
		app.parse(argc, argv);
	} catch (const CLI::ParseError &e) {
		return e.get_exit_code() == 0 ? app.exit(e) : usage_error(app, e, argc, argv);
	}
	if (*format && fa.manifest.empty() && fa.safetensors.empty()) {
		fmt::print(stderr, "ckptctl format: give --manifest FILE or --from-safetensors FILE; see ckptctl "
				   "format --help\n");
		return exit_usage;
	}
	if (*step_opt)
		ia.step = import_step;
	if ((*status && bad_fields("status", status_kind(), status_report.fields)) ||
	    (*list && bad_fields("list", list_kind(!la.paths.empty() || !la.image_dirs.empty()), la.report.fields)))
		return exit_usage;
	if (*plan) {
		try {
			PlanArgs pa;
			pa.params = parse_params(plan_params);
			pa.gpus = parse_ranks("--gpus", plan_gpus);
			pa.nodes = parse_ranks("--nodes", plan_nodes);
			pa.state_8bit = plan_state == "8bit";
			pa.master_bf16 = plan_master == "bf16";
			const Plan p = plan_model(pa);
			if (plan_json_flag || plan_output == "json")
				fmt::print("{}\n", plan_json(p).dump(2));
			else
				fmt::print("{}", plan_text(p));
			return exit_ok;
		} catch (const Error &e) {
			fmt::print(stderr, "ckptctl plan: {}; see ckptctl plan --help\n", e.what());
			return exit_usage;
		}
	}
	if (*activate && aa.all + !aa.uuid.empty() + !aa.device.empty() != 1) {
		fmt::print(stderr, "ckptctl activate: give one of --all, --uuid UUID, --device DEV; see ckptctl "
				   "activate --help\n");
		return exit_usage;
	}
	if (*deactivate && aa.all + !aa.uuid.empty() + !aa.name.empty() != 1) {
		fmt::print(stderr, "ckptctl deactivate: give one of --all, --uuid UUID, NAME; see ckptctl "
				   "deactivate --help\n");
		return exit_usage;
	}

	try {
		std::optional<Progress> shown;
		for (CLI::App *sub : {format, import, exportc, verify})
			if (*sub)
				shown.emplace(sub->get_name(), progress);
		if (*format)
			return cmd_format(fa);
		if (*info)
			return cmd_info(dev, as_json, as_table);
		if (*probe)
			return cmd_probe(dev, probe_chunk, as_json);
		if (*create)
			return cmd_create(ca);
		if (*remove)
			return cmd_remove(name, retry, force);
		if (*activate)
			return cmd_activate(aa);
		if (*deactivate)
			return cmd_deactivate(aa);
		if (*status)
			return cmd_status(name, as_json, prometheus, status_report);
		if (*list)
			return cmd_list(la);
		if (*message)
			return cmd_message(name, words);
		if (*serve)
			return cmd_serve(sa);
		if (*unserve)
			return cmd_unserve(unserve_what);
		if (*import)
			return cmd_import(ia);
		if (*exportc)
			return cmd_export(dev, to, with_opt, export_force);
		if (*verify)
			return cmd_verify(dev, as_json, repair);
		if (*reshard)
			return cmd_reshard(ra);
		if (*stripe)
			return cmd_stripe(sta);
		if (*tenant)
			return cmd_tenant(ta);
		if (*restore)
			return cmd_restore(dev, do_rollback, as_json);
	} catch (const Error &e) {
		fmt::print(stderr, "ckptctl: {}\n", e.what());
		return exit_error;
	} catch (const std::exception &e) {
		fmt::print(stderr, "ckptctl: {}\n", e.what());
		return exit_error;
	}
	return exit_error;
}
