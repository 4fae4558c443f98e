// SPDX-License-Identifier: MIT
// The C ABI: exceptions stop here and become a code plus a thread-local message.
#include "ckpt_admin.h"

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <new>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include <nlohmann/json.hpp>

#include <pthread.h>
#include <unistd.h>

#include "block_target.hpp"
#include "device.hpp"
#include "error.hpp"
#include "export.hpp"
#include "format.hpp"
#include "image.hpp"
#include "io.hpp"
#include "progress.hpp"
#include "admin.hpp"
#include "reshard.hpp"
#include "stripe.hpp"

extern "C" {
#include "ckpt_step.h"
#include "ckpt_update.h"
}

struct ckpt_layout_builder {
	ckpt::Layout layout;
};

// No struct ckpt_device is ever made: a device handle is an id into the
// table below, so a closed (or made-up) handle is looked up and refused, never
// dereferenced, and ids are not reused.

namespace {

// One open device. Calls are serialized: Device keeps one command page and a
// step's status read and command must not interleave with another thread's.
//
// A device belongs to the process that opened it. A child forked from it
// (multiprocessing, a data loader's workers) has a copy of the handle but
// none of the engine's worker threads, and shares its io_uring rings and
// the writer's lock with the parent: using the copy would hang or race the
// parent, destroying it would join threads that are not there. So the fork
// handler closes the child's copy of every device's file descriptor (the
// lock stays the parent's alone), calls in the child are refused, and
// ckpt_close there forgets the device without tearing it down.
struct OpenDevice {
	std::mutex mu;
	std::unique_ptr<ckpt::Device> dev;	// null once closed
	std::vector<std::string> warnings;	// as of ckpt_open
	std::string path;
	pid_t owner = getpid();
};

class Handles {
public:
	ckpt_device *add(std::unique_ptr<ckpt::Device> dev, const char *path)
	{
		auto od = std::make_shared<OpenDevice>();
		od->path = path;
		od->warnings = dev->warnings();
		od->dev = std::move(dev);
		std::lock_guard lock(mu_);
		const uintptr_t id = next_++;
		open_.emplace(id, std::move(od));
		return reinterpret_cast<ckpt_device *>(id);
	}

	// The device of h; a closed one still answers (with CKPT_E_STATE) while
	// a call that found it before ckpt_close holds it.
	std::shared_ptr<OpenDevice> find(ckpt_device *h)
	{
		const auto id = reinterpret_cast<uintptr_t>(h);
		std::lock_guard lock(mu_);
		if (auto it = open_.find(id); it != open_.end())
			return it->second;
		if (id && id < next_)
			ckpt::fail(CKPT_E_STATE, "device is closed");
		ckpt::fail(CKPT_E_INVAL, "{} is not a device handle", static_cast<const void *>(h));
	}

	// In the child of a fork (pthread_atfork): only this thread runs. A
	// table that another thread of the parent was changing is left alone;
	// its devices are still refused (their owner is the parent).
	void forsake_all() noexcept
	{
		std::unique_lock lock(mu_, std::try_to_lock);
		if (!lock)
			return;
		for (auto &[id, od] : open_)
			if (od->dev)
				od->dev->forsake();
	}

	std::shared_ptr<OpenDevice> remove(ckpt_device *h) noexcept
	{
		std::lock_guard lock(mu_);
		auto it = open_.find(reinterpret_cast<uintptr_t>(h));
		if (it == open_.end())
			return nullptr;
		auto od = std::move(it->second);
		open_.erase(it);
		return od;
	}

private:
	std::mutex mu_;
	uintptr_t next_ = 1;
	std::unordered_map<uintptr_t, std::shared_ptr<OpenDevice>> open_;
};

// Never destroyed: a thread may still call while the process exits.
Handles &handles()
{
	static auto *h = [] {
		auto *t = new Handles;
		pthread_atfork(nullptr, nullptr, [] { handles().forsake_all(); });
		return t;
	}();
	return *h;
}

// A device of the parent, in a forked child: refused, see OpenDevice.
void need_owner(const OpenDevice &od)
{
	if (od.owner != getpid())
		ckpt::fail(CKPT_E_STATE, "{} was opened by process {}, which this process was forked from: "
					 "a device serves the process that opened it (a child has none of its "
					 "threads); open the image here once the parent has closed it", od.path,
			   od.owner);
}

thread_local std::string last_error;

// ckpt_set_progress's hook, for ckpt::progress.
thread_local struct {
	ckpt_progress_fn fn;
	void *ctx;
} progress_hook;

template <typename F> int guarded(F &&f)
{
	try {
		return f();
	} catch (const ckpt::Error &e) {
		last_error = e.what();
		return -e.code();
	} catch (const std::bad_alloc &) {
		last_error = "out of memory";
		return -CKPT_E_NOMEM;
	} catch (const std::exception &e) {
		last_error = e.what();
		return -CKPT_E_INVAL;
	}
}

void need(const void *p, const char *what)
{
	if (!p)
		ckpt::fail(CKPT_E_INVAL, "{} is NULL", what);
}

// A count of the caller's arrays, checked against what it can be before a
// single entry is read: a name may appear once, so no call names more
// tensors than the device has.
void need_count(const ckpt::Device &dev, uint32_t count, const char *call)
{
	const size_t n = dev.manifest().tensors().size();
	if (count > n)
		ckpt::fail(CKPT_E_RANGE, "{}: {} tensors given, the device has {}", call, count, n);
}

// guarded(f(open device)) with d's open device, as the only call on it.
template <typename F> int with_open(ckpt_device *d, F &&f)
{
	return guarded([&] {
		need(d, "device");
		const auto od = handles().find(d);
		need_owner(*od);	// before the lock: a parent's thread may have held it
		std::lock_guard lock(od->mu);
		if (!od->dev)
			ckpt::fail(CKPT_E_STATE, "device is closed");
		return f(*od);
	});
}

template <typename F> int with_device(ckpt_device *d, F &&f)
{
	return with_open(d, [&](OpenDevice &od) { return f(*od.dev); });
}

// *out = a malloc'ed copy of text, for the caller's ckpt_free.
void give(const std::string &text, char **out)
{
	char *p = static_cast<char *>(std::malloc(text.size() + 1));
	if (!p)
		throw std::bad_alloc();
	std::memcpy(p, text.data(), text.size() + 1);
	*out = p;
}

// ---- struct ckpt_device_status, member by member (all uint64_t)

enum class Kind { STATE, RESULT, FRACTION, U32, U64, PAGE };	// PAGE: not on the dm line

struct StatusField {
	const char *name;
	Kind kind;
	uint64_t ckpt_device_status::*member;
};

#define CKPT_CAPI_FIELD(field, kind) {#field, Kind::kind, &ckpt_device_status::field},
#define CKPT_CAPI_PAGE(field) {#field, Kind::PAGE, &ckpt_device_status::field},
constexpr StatusField status_fields[] = {
	CKPT_STATUS_FIELDS(CKPT_CAPI_FIELD)
	CKPT_STATUS_GEOMETRY(CKPT_CAPI_PAGE)
	CKPT_STATUS_GRADIENTS(CKPT_CAPI_PAGE)
};
constexpr uint32_t n_line_fields = CKPT_STATUS_N;
static_assert(sizeof(ckpt_device_status) == sizeof(status_fields) / sizeof(status_fields[0]) * sizeof(uint64_t),
	      "struct ckpt_device_status is all uint64_t, one per field");
// Its layout is ABI (the Python package mirrors it, checking its size through
// ckpt_abi_sizeof): 15 counters, 5 geometry members, 2 of the gradients, each
// list in order.
static_assert(sizeof(ckpt_device_status) == 22 * sizeof(uint64_t) && CKPT_STATUS_N == 15,
	      "struct ckpt_device_status changed size: append only, and mirror it in Python");
#define CKPT_CAPI_AT(field, kind) offsetof(ckpt_device_status, field) == CKPT_SF_##field * sizeof(uint64_t) &&
static_assert(CKPT_STATUS_FIELDS(CKPT_CAPI_AT) true, "struct ckpt_device_status out of list order");
#undef CKPT_CAPI_AT

#define CKPT_CAPI_DTYPE_CODE(name, code, s, st) code,
constexpr uint32_t dtype_codes[] = {CKPT_DTYPES(CKPT_CAPI_DTYPE_CODE)};

// What a field of each kind must be, for the message naming a bad one.
const char *field_expects(Kind kind)
{
	switch (kind) {
	case Kind::STATE:
		return "a device state name";
	case Kind::RESULT:
		return "a step result name";
	case Kind::FRACTION:
		return "DONE/TOTAL, decimal, DONE <= TOTAL < 2^32";
	case Kind::U32:
		return "a decimal number below 2^32";
	default:
		return "a decimal number below 2^64";
	}
}

// The kernel target's status line, parsed by the core (ckpt_status_line_parse_at),
// which prints it. The kernel separates the fields by single spaces; a line
// copied from dmsetup or by hand may carry other blanks, so they are folded
// first; the message of a refused line names the field.
struct ckpt_device_status parse_status_line(const char *line)
{
	std::vector<std::string> w;
	for (const char *p = line; *p;) {
		while (*p == ' ' || *p == '\t' || *p == '\n')
			p++;
		const char *b = p;
		while (*p && *p != ' ' && *p != '\t' && *p != '\n')
			p++;
		if (p != b)
			w.emplace_back(b, p);
	}
	std::string folded;
	for (const auto &word : w)
		folded += (folded.empty() ? "" : " ") + word;
	if (folded.size() > CKPT_STATUS_LINE_MAX)
		ckpt::fail(CKPT_E_INVAL, "status line of {} bytes, longer than any the target prints",
			   folded.size());
	struct ckpt_counters k;
	uint32_t n_chunks = 0, field = CKPT_STATUS_N;
	if (ckpt_status_line_parse_at(folded.c_str(), static_cast<uint32_t>(folded.size()), &k,
				      &n_chunks, &field) < 0) {
		if (field >= w.size() || field >= n_line_fields)
			ckpt::fail(CKPT_E_INVAL, "{} fields, expected {}", w.size(), n_line_fields);
		const StatusField &f = status_fields[field];
		ckpt::fail(CKPT_E_INVAL, "status field {} ('{}') is not {}", f.name, w[field],
			   field_expects(f.kind));
	}
	struct ckpt_device_status st = {};
	{
		struct ckpt_device_status *dst = &st;
		const struct ckpt_counters *src = &k;
		CKPT_STATUS_FIELDS(CKPT_ABI_COPY)
	}
	st.n_chunks = n_chunks;
	return st;
}

// A tool operation: its report as a malloc'ed string in *json.
template <typename F> int report(char **json, F &&f)
{
	return guarded([&] {
		need(json, "json");
		give(f(), json);
		return 0;
	});
}

} // namespace

void ckpt::progress(const char *what, uint64_t done, uint64_t total)
{
	if (progress_hook.fn)
		progress_hook.fn(progress_hook.ctx, what, done, total);
}

extern "C" {

const char *ckpt_version(void) { return CKPT_VERSION; }

void ckpt_set_progress(ckpt_progress_fn fn, void *ctx)
{
	progress_hook = {fn, ctx};
}

const char *ckpt_last_error(void) { return last_error.c_str(); }

void ckpt_free(void *p) { std::free(p); }

uint32_t ckpt_abi_count(const char *list)
{
	const std::string l = list ? list : "";
	if (l == "errors")
		return CKPT_E_MAX;
	if (l == "dtypes")
		return std::size(dtype_codes);
	if (l == "states")
		return CKPT_STATE_MAX;
	if (l == "results")
		return CKPT_RESULT_MAX;
	if (l == "status_fields")
		return n_line_fields;
	if (l == "status")
		return std::size(status_fields);
	return 0;
}

int ckpt_dtype_code(uint32_t index)
{
	if (index >= std::size(dtype_codes))
		return -CKPT_E_RANGE;
	return static_cast<int>(dtype_codes[index]);
}

size_t ckpt_abi_sizeof(const char *name)
{
	const std::string n = name ? name : "";
	if (n == "ckpt_info")
		return sizeof(struct ckpt_info);
	if (n == "ckpt_tensor_info")
		return sizeof(struct ckpt_tensor_info);
	if (n == "ckpt_group_hparams")
		return sizeof(struct ckpt_group_hparams);
	if (n == "ckpt_device_status")
		return sizeof(struct ckpt_device_status);
	if (n == "ckpt_traffic")
		return sizeof(struct ckpt_traffic);
	return 0;
}

int64_t ckpt_abi_constant(const char *name)
{
	static const std::pair<const char *, int64_t> constants[] = {
		{"CKPT_EXPORT_LOWP", CKPT_EXPORT_LOWP},
		{"CKPT_EXPORT_OPTIMIZER", CKPT_EXPORT_OPTIMIZER},
		{"CKPT_EXPORT_FORCE", CKPT_EXPORT_FORCE},
		{"CKPT_RESTORE_ROLLBACK", CKPT_RESTORE_ROLLBACK},
		{"CKPT_SHARD_RULE_EVEN", CKPT_SHARD_RULE_EVEN},
		{"CKPT_SHARD_RULE_Q8", CKPT_SHARD_RULE_Q8},
		{"CKPT_BLOCK", CKPT_BLOCK},
		{"CKPT_SECTOR", CKPT_SECTOR},
		{"CKPT_MAX_DIMS", CKPT_MAX_DIMS},
	};
	for (const auto &[n, v] : constants)
		if (name && !std::strcmp(name, n))
			return v;
	return -1;
}

const char *ckpt_status_field(uint32_t index)
{
	return index < std::size(status_fields) ? status_fields[index].name : nullptr;
}

int ckpt_dm_status_parse(const char *line, struct ckpt_device_status *st)
{
	return guarded([&] {
		need(line, "line");
		need(st, "status");
		*st = parse_status_line(line);
		return 0;
	});
}

int ckpt_status_json(const struct ckpt_device_status *st, char **out)
{
	return guarded([&] {
		need(st, "status");
		need(out, "json");
		nlohmann::json j = nlohmann::json::object();
		for (uint32_t i = 0; i < n_line_fields; i++) {
			const StatusField &f = status_fields[i];
			const uint64_t v = st->*f.member;
			if (f.kind == Kind::STATE)
				j[f.name] = ckpt_state_name(static_cast<uint32_t>(v));
			else if (f.kind == Kind::RESULT)
				j[f.name] = ckpt_result_name(static_cast<uint32_t>(v));
			else
				j[f.name] = v;
		}
		j["n_chunks"] = st->n_chunks;
		j["last_error_name"] = st->last_error ? ckpt_strerror(static_cast<int>(st->last_error)) : "-";
		if (st->first_io_error)
			j["first_io_error_name"] = std::strerror(static_cast<int>(st->first_io_error));
		give(j.dump(), out);
		return 0;
	});
}

namespace {

// What each field of the dm status line says, for Prometheus' HELP lines;
// the counters among them (they only grow while a table lives, and start
// again from 0 on a reload, which Prometheus takes as a counter reset).
struct MetricHelp {
	const char *field;
	bool counter;
	const char *help;
};
constexpr MetricHelp metric_help[] = {
	{"state", false, "The step state machine's state: 1 for the device's, 0 for the others."},
	{"committed_step", false, "The step the device commits."},
	{"open_step", false, "The open step, 0 when none is open."},
	{"chunks_done", false, "Chunks the open step has applied."},
	{"overflow", false, "1 when the open step saw a non-finite gradient (it will be skipped)."},
	{"last_result", false, "The last COMMIT's result: 1 for it, 0 for the others."},
	{"last_error", false, "The last refused command's enum ckpt_err code, 0 for none."},
	{"first_io_error", false, "The first backing device error (an errno), 0 for none: the device has failed."},
	{"steps_committed", true, "Steps committed since the table was loaded."},
	{"steps_skipped", true, "Steps skipped for a non-finite gradient since the table was loaded."},
	{"steps_aborted", true, "Steps aborted since the table was loaded."},
	{"commands_rejected", true, "Commands and writes refused since the table was loaded."},
	{"grad_bytes", true, "Gradient bytes written since the table was loaded."},
	{"param_bytes", true, "Param bytes read since the table was loaded."},
	{"io_errors", true, "Backing device errors since the table was loaded."},
};
constexpr bool metric_help_in_line_order()
{
	for (uint32_t i = 0; i < CKPT_STATUS_N; i++)
		if (std::string_view(metric_help[i].field) != status_fields[i].name)
			return false;
	return std::size(metric_help) == CKPT_STATUS_N;
}
static_assert(metric_help_in_line_order(), "a HELP line for every field of the dm status line, in its order");

// A label value in the text format: backslash, double quote and newline escaped.
std::string prometheus_escape(const std::string &v)
{
	std::string out;
	for (char c : v) {
		if (c == '\\' || c == '"')
			out += '\\';
		if (c == '\n') {
			out += "\\n";
			continue;
		}
		out += c;
	}
	return out;
}

// The label sets of n devices, "name=\"value\",...", from a JSON array of objects.
std::vector<std::string> prometheus_labels(const char *labels_json, uint32_t n)
{
	// ordered: the labels in the order given
	const nlohmann::ordered_json j = nlohmann::ordered_json::parse(labels_json, nullptr, false);
	if (!j.is_array() || j.size() != n)
		ckpt::fail(CKPT_E_INVAL, "labels: a JSON array of {} objects expected", n);
	std::vector<std::string> sets;
	for (const nlohmann::ordered_json &o : j) {
		if (!o.is_object())
			ckpt::fail(CKPT_E_INVAL, "labels: {} is not an object", o.dump());
		std::string set;
		for (const auto &[k, v] : o.items()) {
			const bool ok = !k.empty() && k.rfind("__", 0) != 0 &&
					(std::isalpha(static_cast<unsigned char>(k[0])) || k[0] == '_') &&
					std::all_of(k.begin(), k.end(), [](char c) {
						return std::isalnum(static_cast<unsigned char>(c)) || c == '_';
					});
			if (!ok)
				ckpt::fail(CKPT_E_INVAL, "labels: '{}' is not a Prometheus label name", k);
			if (!v.is_string())
				ckpt::fail(CKPT_E_INVAL, "labels: the value of '{}' is not a string", k);
			set += fmt::format("{}{}=\"{}\"", set.empty() ? "" : ",", k,
					   prometheus_escape(v.get<std::string>()));
		}
		sets.push_back(set);
	}
	return sets;
}

} // namespace

int ckpt_status_prometheus(const struct ckpt_device_status *st, uint32_t n, const char *labels_json,
			   char **text)
{
	return guarded([&] {
		if (n)
			need(st, "status");
		need(labels_json, "labels");
		need(text, "text");
		const std::vector<std::string> labels = prometheus_labels(labels_json, n);
		const auto with = [&](uint32_t d, const std::string &more) {
			const std::string all = labels[d] + (labels[d].empty() || more.empty() ? "" : ",") + more;
			return all.empty() ? std::string() : "{" + all + "}";
		};
		std::string out;
		const auto family = [&](const std::string &name, const char *type, const char *help) {
			out += fmt::format("# HELP {} {}\n# TYPE {} {}\n", name, help, name, type);
		};
		for (uint32_t i = 0; i < n_line_fields; i++) {
			const StatusField &f = status_fields[i];
			const MetricHelp &h = metric_help[i];
			const std::string name = fmt::format("dm_ckpt_{}{}", f.name, h.counter ? "_total" : "");
			family(name, h.counter ? "counter" : "gauge", h.help);
			for (uint32_t d = 0; d < n; d++) {
				const uint64_t v = st[d].*f.member;
				if (f.kind == Kind::STATE || f.kind == Kind::RESULT) {
					const bool state = f.kind == Kind::STATE;
					const uint32_t values = state ? uint32_t{CKPT_STATE_MAX} : uint32_t{CKPT_RESULT_MAX};
					for (uint32_t k = 0; k < values; k++)
						out += fmt::format("{}{} {}\n", name,
								   with(d, fmt::format("{}=\"{}\"", state ? "state" : "result",
										       state ? ckpt_state_name(k)
											     : ckpt_result_name(k))),
								   v == k ? 1 : 0);
				} else {
					out += fmt::format("{}{} {}\n", name, with(d, ""), v);
				}
			}
		}
		family("dm_ckpt_chunks", "gauge", "Chunks of the device's image (the parallel units of a step).");
		for (uint32_t d = 0; d < n; d++)
			out += fmt::format("dm_ckpt_chunks{} {}\n", with(d, ""), st[d].n_chunks);
		give(out, text);
		return 0;
	});
}

void ckpt_uuid_string(const uint8_t uuid[16], char out[37])
{
	if (!uuid || !out)
		return;
	const std::string s = ckpt::uuid_string(uuid);
	std::memcpy(out, s.c_str(), s.size() + 1);
}

int ckpt_image_uuid(const char *path, uint8_t uuid[16])
{
	return guarded([&] {
		need(path, "path");
		need(uuid, "uuid");
		const std::string backing = ckpt::BlockTarget::backing_of(path).value_or(path);
		const ckpt::Image img = ckpt::Image::open(backing, false, true);
		std::memcpy(uuid, img.sb.uuid, 16);
		return 0;
	});
}

ckpt_layout_builder *ckpt_layout_new(void) { return new (std::nothrow) ckpt_layout_builder; }

void ckpt_layout_free(ckpt_layout_builder *l) { delete l; }

int ckpt_layout_add(ckpt_layout_builder *l, const char *name, const uint64_t *shape, uint32_t ndim,
		    uint32_t group)
{
	return guarded([&] {
		need(l, "layout");
		need(name, "name");
		// before the copy: ndim is the length of the caller's array
		if (ndim > CKPT_MAX_DIMS)
			ckpt::fail(CKPT_E_INVAL, "tensor '{}': {} dimensions, at most {}", name, ndim,
				   CKPT_MAX_DIMS);
		if (ndim)
			need(shape, "shape");
		l->layout.add(name, std::vector<uint64_t>(shape, shape + ndim), group);
		return 0;
	});
}

int ckpt_layout_shard(const ckpt_layout_builder *whole, uint32_t rank, uint32_t world, uint32_t rule,
		      ckpt_layout_builder **out)
{
	return guarded([&] {
		need(whole, "layout");
		need(out, "out");
		auto l = std::make_unique<ckpt_layout_builder>();
		l->layout = whole->layout.shard(rank, world, rule ? rule : CKPT_SHARD_RULE_Q8);
		*out = l.release();
		return 0;
	});
}

int ckpt_layout_json(const ckpt_layout_builder *l, char **json)
{
	return report(json, [&] {
		need(l, "layout");
		nlohmann::json ts = nlohmann::json::array();
		for (const ckpt::Tensor &t : l->layout.tensors()) {
			ts.push_back({{"name", t.name}, {"shape", t.shape}, {"group", t.group}});
			if (t.piece)
				ts.back()["piece"] = {{"param", t.piece->param}, {"shape", t.piece->shape},
						      {"begin", t.piece->begin}};
		}
		nlohmann::json j{{"tensors", ts}};
		if (const auto &s = l->layout.shard_record())
			j["shard"] = {{"rank", s->rank}, {"world", s->world}, {"rule", s->rule}, {"params", s->params},
				      {"digest", s->digest}, {"bounds", l->layout.bounds()}};
		return j.dump();
	});
}

int ckpt_format_opts(const char *path, const ckpt_layout_builder *l, int dtype, uint32_t chunk_params,
		     uint64_t size, uint32_t flags)
{
	return guarded([&] {
		need(path, "path");
		need(l, "layout");
		if (flags & ~(CKPT_FORMAT_STATE_8BIT | CKPT_FORMAT_MASTER_BF16 | CKPT_FORMAT_KEEP))
			ckpt::fail(CKPT_E_INVAL, "format: unknown flags {:#x}", flags);
		ckpt::FormatOptions opts;
		opts.dtype = static_cast<uint32_t>(dtype);
		opts.chunk_params = chunk_params;
		opts.size = size;
		opts.q8 = flags & CKPT_FORMAT_STATE_8BIT;
		opts.bf16_master = flags & CKPT_FORMAT_MASTER_BF16;
		// Without CKPT_FORMAT_KEEP the ABI formats what it is given, as it always did.
		opts.force = !(flags & CKPT_FORMAT_KEEP);
		ckpt::format(path, l->layout, opts);
		return 0;
	});
}

int ckpt_format(const char *path, const ckpt_layout_builder *l, int dtype, uint32_t chunk_params,
		uint64_t size)
{
	return ckpt_format_opts(path, l, dtype, chunk_params, size, 0);
}

int ckpt_rename_new(const char *from, const char *path)
{
	return guarded([&] {
		need(from, "from");
		need(path, "path");
		ckpt::rename_new(from, path, true);
		return 0;
	});
}

int ckpt_open(const char *path, ckpt_device **out)
{
	return guarded([&] {
		need(path, "path");
		need(out, "out");
		*out = handles().add(ckpt::Device::open(path), path);
		return 0;
	});
}

int ckpt_open_engine(const char *path, uint32_t workers, uint32_t depth, ckpt_device **out)
{
	return ckpt_open_engine_flags(path, workers, depth, 0, out);
}

int ckpt_open_engine_flags(const char *path, uint32_t workers, uint32_t depth, uint32_t flags,
			   ckpt_device **out)
{
	return guarded([&] {
		need(path, "path");
		need(out, "out");
		if (flags & ~CKPT_OPEN_PARAM_CACHE)
			ckpt::fail(CKPT_E_INVAL, "unknown open flags {:#x}", flags & ~CKPT_OPEN_PARAM_CACHE);
		ckpt::EngineOptions opts;
		opts.workers = workers;
		if (depth)
			opts.depth = depth;
		opts.param_cache = flags & CKPT_OPEN_PARAM_CACHE;
		*out = handles().add(ckpt::Device::open(path, opts), path);
		return 0;
	});
}

void ckpt_close(ckpt_device *d)
{
	// new calls now fail; wait for the one in flight, then close
	if (const auto od = handles().remove(d)) {
		if (od->owner != getpid()) {
			// the parent's: its threads are not here to join, and its
			// mutexes may be held by threads that are not here either
			if (od->dev)
				od->dev.release()->forsake();
			return;
		}
		std::lock_guard lock(od->mu);
		od->dev.reset();
	}
}

int ckpt_warning(ckpt_device *d, uint32_t index, const char **msg)
{
	return with_open(d, [&](OpenDevice &od) {
		if (msg && index < od.warnings.size())
			*msg = od.warnings[index].c_str();
		return static_cast<int>(od.warnings.size());
	});
}

int ckpt_info(ckpt_device *d, struct ckpt_info *info)
{
	return with_device(d, [&](ckpt::Device &dev) {
		need(info, "info");
		const struct ckpt_status st = dev.status();
		*info = {};
		info->committed_step = st.committed_step;
		info->open_step = st.state == CKPT_STATE_OPEN ? st.open_step : 0;
		info->state = st.state;
		info->dtype = st.geo.dtype;
		info->chunk_params = 1u << st.geo.chunk_shift;
		info->n_chunks = st.geo.n_chunks;
		info->n_params = static_cast<uint64_t>(st.geo.n_chunks) << st.geo.chunk_shift;
		info->n_groups = st.geo.n_groups;
		info->n_tensors = static_cast<uint32_t>(dev.manifest().tensors().size());
		info->steps_committed = st.steps_committed;
		info->steps_skipped = st.steps_skipped;
		return 0;
	});
}

int ckpt_status(ckpt_device *d, struct ckpt_device_status *out)
{
	return with_device(d, [&](ckpt::Device &dev) {
		need(out, "status");
		const struct ckpt_status st = dev.status();
		struct ckpt_device_status s = {};
#define CKPT_CAPI_COPY(field, kind) s.field = st.field;
		CKPT_STATUS_FIELDS(CKPT_CAPI_COPY)
		s.n_chunks = st.geo.n_chunks;
		s.chunk_params = 1ull << st.geo.chunk_shift;
		s.n_params = s.n_chunks * s.chunk_params;
		s.n_groups = st.geo.n_groups;
		s.dtype = st.geo.dtype;
		s.grad_sumsq = st.grad_sumsq;
		s.grad_sumsq_step = st.grad_sumsq_step;
		*out = s;
		return 0;
	});
}

int ckpt_uuid(ckpt_device *d, uint8_t uuid[16])
{
	return with_device(d, [&](ckpt::Device &dev) {
		need(uuid, "uuid");
		std::memcpy(uuid, dev.image().sb.uuid, 16);
		return 0;
	});
}

int ckpt_tensor(ckpt_device *d, uint32_t index, struct ckpt_tensor_info *info)
{
	return with_device(d, [&](ckpt::Device &dev) {
		need(info, "info");
		const auto &ts = dev.manifest().tensors();
		if (index >= ts.size())
			ckpt::fail(CKPT_E_RANGE, "tensor index {} out of range ({} tensors)", index, ts.size());
		const ckpt::Tensor &t = ts[index];
		*info = {};
		info->name = t.name.c_str();
		info->ndim = static_cast<uint32_t>(t.shape.size());
		info->group = t.group;
		std::copy(t.shape.begin(), t.shape.end(), info->shape);
		info->numel = t.numel;
		info->offset = t.offset;
		return 0;
	});
}

int ckpt_load_params(ckpt_device *d, const char *name, const float *values, uint64_t n)
{
	return with_device(d, [&](ckpt::Device &dev) {
		need(name, "name");
		need(values, "values");
		dev.load_params({{name, std::span<const float>(values, n)}});
		return 0;
	});
}

int ckpt_load_params_multi(ckpt_device *d, uint32_t count, const char *const *names,
			   const float *const *values, const uint64_t *ns)
{
	return with_device(d, [&](ckpt::Device &dev) {
		need_count(dev, count, "load_params_multi");
		if (count) {
			need(names, "names");
			need(values, "values");
			need(ns, "ns");
		}
		std::vector<std::pair<std::string, std::span<const float>>> v;
		for (uint32_t i = 0; i < count; i++) {
			need(names[i], "name");
			need(values[i], "values");
			v.emplace_back(names[i], std::span<const float>(values[i], ns[i]));
		}
		dev.load_params(v);
		return 0;
	});
}

int ckpt_load_state(ckpt_device *d, uint32_t count, const char *const *names, const float *const *p,
		    const float *const *m, const float *const *v, const uint64_t *ns, const uint64_t *steps,
		    const void *blob, size_t blob_len)
{
	return with_device(d, [&](ckpt::Device &dev) {
		need_count(dev, count, "load_state");
		if (count) {
			need(names, "names");
			need(p, "p");
			need(m, "m");
			need(v, "v");
			need(ns, "ns");
			need(steps, "steps");
		}
		if (blob_len)
			need(blob, "blob");
		std::vector<ckpt::TensorState> tensors;
		for (uint32_t i = 0; i < count; i++) {
			need(names[i], "name");
			need(p[i], "p");
			need(m[i], "m");
			need(v[i], "v");
			tensors.push_back({names[i], {p[i], ns[i]}, {m[i], ns[i]}, {v[i], ns[i]}, steps[i]});
		}
		dev.load_state(tensors, {static_cast<const uint8_t *>(blob), blob_len});
		return 0;
	});
}

int ckpt_begin(ckpt_device *d, const struct ckpt_group_hparams *groups, uint32_t n_groups,
	       double grad_scale)
{
	return with_device(d, [&](ckpt::Device &dev) {
		// the caller's array has n_groups entries: check the count before
		// reading (or allocating) that many
		const uint32_t want = dev.geometry().n_groups;
		if (n_groups != want)
			ckpt::fail(CKPT_E_GROUPS, "begin: {} hyperparameter groups given, the device has {}",
				   n_groups, want);
		need(groups, "groups");
		std::vector<ckpt::GroupHparams> g(n_groups);
		for (uint32_t i = 0; i < n_groups; i++)
			g[i] = {groups[i].lr, groups[i].beta1, groups[i].beta2, groups[i].eps,
				groups[i].weight_decay, groups[i].adam_l2 != 0};
		dev.begin(g, grad_scale);
		return 0;
	});
}

int ckpt_write_grad(ckpt_device *d, const char *name, const uint16_t *grad, uint64_t n)
{
	return with_device(d, [&](ckpt::Device &dev) {
		need(name, "name");
		need(grad, "gradient");
		dev.write_grad(name, grad, n);
		return 0;
	});
}

int ckpt_skip(ckpt_device *d, const char *name)
{
	return with_device(d, [&](ckpt::Device &dev) {
		need(name, "name");
		dev.skip(name);
		return 0;
	});
}

int ckpt_tensor_step(ckpt_device *d, const char *name, uint64_t *step)
{
	return with_device(d, [&](ckpt::Device &dev) {
		need(name, "name");
		need(step, "step");
		*step = dev.tensor_step(name);
		return 0;
	});
}

int ckpt_write_grad_window(ckpt_device *d, uint64_t off, const void *buf, uint64_t len)
{
	return with_device(d, [&](ckpt::Device &dev) {
		if (len)
			need(buf, "buf");
		dev.write_grad_window(off, buf, len);
		return 0;
	});
}

int ckpt_block_size(ckpt_device *d)
{
	return with_device(d, [&](ckpt::Device &dev) { return static_cast<int>(dev.block_size()); });
}

int ckpt_to_lowp(uint32_t dtype, const float *in, uint16_t *out, uint64_t n)
{
	return guarded([&] {
		if (n) {
			need(in, "in");
			need(out, "out");
		}
		if (dtype != CKPT_DTYPE_FP16 && dtype != CKPT_DTYPE_BF16)
			ckpt::fail(CKPT_E_DTYPE, "dtype {} is not a low-precision dtype", dtype);
		for (uint64_t i = 0; i < n; i++) {
			uint32_t u;
			std::memcpy(&u, &in[i], 4);
			out[i] = dtype == CKPT_DTYPE_FP16 ? ckpt_f32_to_f16(u) : ckpt_f32_to_bf16(u);
		}
		return 0;
	});
}

uint32_t ckpt_crc32c_update(uint32_t crc, const void *p, size_t len)
{
	return ~ckpt_crc32c_raw(~crc, p, len);
}

int ckpt_commit(ckpt_device *d, const void *blob, size_t blob_len)
{
	return with_device(d, [&](ckpt::Device &dev) {
		if (blob_len)
			need(blob, "blob");
		auto r = dev.commit({static_cast<const uint8_t *>(blob), blob_len});
		return static_cast<int>(r);
	});
}

int ckpt_last_grad_sumsq(ckpt_device *d, double *sumsq)
{
	return with_device(d, [&](ckpt::Device &dev) {
		need(sumsq, "sumsq");
		const std::optional<uint64_t> bits = dev.grad_sumsq();
		if (!bits)
			return 0;
		std::memcpy(sumsq, &*bits, sizeof(*sumsq));
		return 1;
	});
}

int ckpt_abort(ckpt_device *d)
{
	return with_device(d, [&](ckpt::Device &dev) {
		dev.abort();
		return 0;
	});
}

int ckpt_rollback(ckpt_device *d, uint64_t *step)
{
	return with_device(d, [&](ckpt::Device &dev) {
		const uint64_t s = dev.rollback();
		if (step)
			*step = s;
		return 0;
	});
}

int ckpt_read_params(ckpt_device *d, const char *name, uint16_t *out, uint64_t n)
{
	return with_device(d, [&](ckpt::Device &dev) {
		need(name, "name");
		need(out, "out");
		dev.read_params(name, out, n);
		return 0;
	});
}

int ckpt_read_params_multi(ckpt_device *d, uint32_t count, const char *const *names,
			   uint16_t *const *outs, const uint64_t *ns)
{
	return with_device(d, [&](ckpt::Device &dev) {
		need_count(dev, count, "read_params_multi");
		if (count) {
			need(names, "names");
			need(outs, "outs");
			need(ns, "ns");
		}
		std::vector<ckpt::ParamsOut> v;
		for (uint32_t i = 0; i < count; i++) {
			need(names[i], "name");
			need(outs[i], "out");
			v.push_back({names[i], outs[i], ns[i]});
		}
		dev.read_params_multi(v);
		return 0;
	});
}

int ckpt_traffic(ckpt_device *d, struct ckpt_traffic *out)
{
	return with_device(d, [&](ckpt::Device &dev) {
		need(out, "traffic");
		const ckpt::Traffic &t = dev.traffic();
		*out = {t.grad_bytes, t.param_bytes, t.control_bytes, t.commands, t.status_reads};
		return 0;
	});
}

int ckpt_read_state(ckpt_device *d, const char *name, float *p, float *m, float *v, uint64_t n)
{
	return with_device(d, [&](ckpt::Device &dev) {
		need(name, "name");
		need(p, "p");
		need(m, "m");
		need(v, "v");
		dev.read_state(name, p, m, v, n);
		return 0;
	});
}

int ckpt_blob(ckpt_device *d, void *buf, size_t cap)
{
	return with_device(d, [&](ckpt::Device &dev) {
		const struct ckpt_status st = dev.status();
		if (cap) {
			need(buf, "buf");
			std::memcpy(buf, st.blob, std::min<size_t>(cap, st.blob_len));
		}
		return static_cast<int>(st.blob_len);
	});
}

int ckpt_export(ckpt_device *d, const char *out, uint32_t flags, const char *meta_json)
{
	return with_device(d, [&](ckpt::Device &dev) {
		need(out, "out");
		ckpt::export_device(dev, out, flags, meta_json ? meta_json : "");
		return 0;
	});
}

int ckpt_backing_of(const char *path, char **backing)
{
	return guarded([&] {
		need(path, "path");
		need(backing, "backing");
		const auto b = ckpt::backing_of(path);
		if (!b)
			return 0;
		give(*b, backing);
		return 1;
	});
}

int ckpt_reshard(const char *const *from, uint32_t n, const char *path, uint32_t rank, uint32_t world,
		 const char *opts_json, char **json)
{
	return report(json, [&] {
		need(from, "from");
		need(path, "path");
		std::vector<std::string> in;
		for (uint32_t i = 0; i < n; i++) {
			need(from[i], "from[i]");
			in.emplace_back(from[i]);
		}
		return ckpt::reshard(in, path, rank, world, opts_json ? opts_json : "");
	});
}

int ckpt_stripe_create(const char *path, uint64_t stripe_bytes, const char *const *drives, uint32_t n,
		       uint64_t drive_bytes, char **json)
{
	return report(json, [&] {
		need(path, "path");
		need(drives, "drives");
		std::vector<std::string> d;
		for (uint32_t i = 0; i < n; i++) {
			need(drives[i], "drives[i]");
			d.emplace_back(drives[i]);
		}
		return ckpt::create_stripe_set(path, stripe_bytes, d, drive_bytes);
	});
}

int ckpt_image_info(const char *path, char **json)
{
	return report(json, [&] {
		need(path, "path");
		return ckpt::image_info(path);
	});
}

int ckpt_format_manifest(const char *device, const char *opts_json, char **json)
{
	return report(json, [&] {
		need(device, "device");
		return ckpt::format_manifest(device, opts_json ? opts_json : "");
	});
}

int ckpt_import(const char *device, const char *from, const char *opts_json, char **json)
{
	return report(json, [&] {
		need(device, "device");
		need(from, "from");
		return ckpt::import_safetensors(device, from, opts_json ? opts_json : "");
	});
}

int ckpt_safetensors_header(const char *path, char **json)
{
	return report(json, [&] {
		need(path, "path");
		return ckpt::safetensors_header(path);
	});
}

int ckpt_export_image(const char *path, const char *out, uint32_t flags, char **json)
{
	return report(json, [&] {
		need(path, "path");
		need(out, "out");
		return ckpt::export_image_report(path, out, flags);
	});
}

int ckpt_verify(const char *path, uint32_t flags, char **json)
{
	return report(json, [&] {
		need(path, "path");
		if (flags & ~CKPT_VERIFY_REPAIR)
			ckpt::fail(CKPT_E_INVAL, "verify: unknown flags {:#x}", flags);
		return ckpt::verify_report(path, flags & CKPT_VERIFY_REPAIR);
	});
}

int ckpt_restore(const char *path, uint32_t flags, char **json)
{
	return report(json, [&] {
		need(path, "path");
		if (flags & ~CKPT_RESTORE_ROLLBACK)
			ckpt::fail(CKPT_E_INVAL, "restore: unknown flags {:#x}", flags);
		return ckpt::restore_report(path, flags & CKPT_RESTORE_ROLLBACK);
	});
}

int ckpt_fit(uint64_t bytes, uint32_t chunk_params, uint64_t write_unit, struct ckpt_fit *fit)
{
	return guarded([&] {
		need(fit, "fit");
		*fit = ckpt::fit(bytes, chunk_params, write_unit);
		return 0;
	});
}

} // extern "C"
