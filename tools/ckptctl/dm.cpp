// SPDX-License-Identifier: MIT
#include "dm.hpp"

#include <cerrno>
#include <cstdarg>
#include <cstring>

#include <libdevmapper.h>
#include <linux/dm-ioctl.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include "fail.hpp"

namespace ckptctl::dm {

namespace {

// libdevmapper's messages, kept for the error we report instead of printed.
std::vector<std::string> g_log;

void collect_log(int level, const char *, int, int, const char *f, ...) __attribute__((format(printf, 5, 6)));
void collect_log(int level, const char *, int, int, const char *f, ...)
{
	if ((level & 0xf) > 4)	// errors and warnings only (_LOG_WARN is 4)
		return;
	char buf[1024];
	va_list ap;
	va_start(ap, f);
	vsnprintf(buf, sizeof(buf), f, ap);
	va_end(ap);
	g_log.emplace_back(buf);
}

std::string control() { return fmt::format("{}/control", dm_dir()); }

// Whether the kernel has registered device-mapper's misc device.
bool dm_registered()
{
	FILE *f = fopen("/proc/misc", "re");
	if (!f)
		return false;
	char line[128];
	bool found = false;
	while (!found && fgets(line, sizeof(line), f))
		found = strstr(line, " device-mapper\n") != nullptr;
	fclose(f);
	return found;
}

// Once per process: our log function, the device directory (DM_DEV_DIR, as
// dmsetup takes it; default /dev), and no udev synchronisation when no udev
// is running (then libdevmapper makes the nodes itself, in dm_udev_wait).
void setup()
{
	static bool done = false;
	if (done)
		return;
	done = true;
	dm_log_with_errno_init(collect_log);
	if (const char *dir = getenv("DM_DEV_DIR"); dir && *dir && !dm_set_dev_dir(dir))
		fail(CKPT_E_INVAL, "DM_DEV_DIR={} is not a usable device directory", dir);
	if (access("/run/udev/control", F_OK) != 0)
		dm_udev_set_sync_support(0);
	std::atexit(dm_lib_release);
}

std::string logged()
{
	std::string s;
	for (const std::string &l : g_log)
		s += (s.empty() ? "" : "; ") + l;
	g_log.clear();
	return s;
}

// No control node: without device-mapper in the kernel, one clear line
// instead of libdevmapper's messages; with it, the node could not be made.
[[noreturn]] void unavailable()
{
	const std::string log = logged();
	if (!dm_registered())
		fail(CKPT_E_IO, "device-mapper is not available: load it with 'modprobe dm-mod'");
	fail(CKPT_E_IO, "device-mapper is loaded, but its control node {} is missing and could not be made{}",
	     control(), log.empty() ? "" : " (" + log + ")");
}

class Task {
public:
	Task(int type, const std::string &name) : t_(nullptr)
	{
		setup();
		if (access(control().c_str(), F_OK) != 0 && !dm_registered())
			unavailable();
		g_log.clear();
		t_ = dm_task_create(type);
		if (!t_)
			fail(CKPT_E_NOMEM, "device-mapper: cannot create a task: {}", logged());
		if (!name.empty() && !dm_task_set_name(t_, name.c_str()))
			fail(CKPT_E_INVAL, "device-mapper: bad device name '{}'", name);
	}
	Task(const Task &) = delete;
	Task &operator=(const Task &) = delete;
	~Task()
	{
		if (t_)
			dm_task_destroy(t_);
	}
	dm_task *get() const { return t_; }

	// Runs the task; with a cookie, waits for (or does the work of) udev.
	void run(const std::string &what, bool with_cookie)
	{
		uint32_t cookie = 0;
		if (with_cookie && !dm_task_set_cookie(t_, &cookie, 0))
			fail(CKPT_E_IO, "{}: cannot set a udev cookie: {}", what, logged());
		const int ok = dm_task_run(t_);
		const int err = dm_task_get_errno(t_);
		// Always wait when a cookie was set, even on failure: it releases
		// the cookie's semaphore and applies the queued node operations.
		if (with_cookie)
			dm_udev_wait(cookie);
		if (!ok) {
			// libdevmapper could not open or make the control node
			if (access(control().c_str(), F_OK) != 0)
				unavailable();
			std::string log = logged();
			fail(err == ENXIO || err == ENODEV ? CKPT_E_NAME : CKPT_E_IO, "{} failed: {}{}", what,
				   err ? strerror(err) : "error", log.empty() ? "" : " (" + log + ")");
		}
	}

private:
	dm_task *t_;
};

std::vector<Target> targets(Task &t)
{
	std::vector<Target> out;
	void *next = nullptr;
	do {
		uint64_t start = 0, length = 0;
		char *type = nullptr, *params = nullptr;
		next = dm_get_next_target(t.get(), next, &start, &length, &type, &params);
		if (!type)
			break;
		out.push_back({start, length, type, params ? params : ""});
	} while (next);
	return out;
}

std::vector<Target> query(int type, const std::string &name, const char *what)
{
	check_name(name);
	Info i = info(name);
	if (!i.exists)
		fail(CKPT_E_NAME, "no device-mapper device named '{}'", name);
	Task t(type, name);
	t.run(fmt::format("device-mapper {} of {}", what, name), false);
	return targets(t);
}

} // namespace

void check_name(const std::string &name)
{
	if (name.empty() || name.size() >= DM_NAME_LEN || name.find('/') != std::string::npos || name == "." ||
	    name == "..")
		fail(CKPT_E_INVAL, "'{}' is not a device-mapper name (1..{} bytes, no '/')", name,
			   DM_NAME_LEN - 1);
}

namespace {

Info info_of(Task &t, const std::string &what)
{
	t.run(fmt::format("device-mapper info of {}", what), false);
	struct dm_info di {};
	if (!dm_task_get_info(t.get(), &di))
		fail(CKPT_E_IO, "device-mapper info of {}: no answer", what);
	Info i;
	i.exists = di.exists;
	if (!i.exists)
		return i;
	i.suspended = di.suspended;
	i.live_table = di.live_table;
	i.open_count = di.open_count;
	i.major = di.major;
	i.minor = di.minor;
	i.target_count = di.target_count;
	if (const char *n = dm_task_get_name(t.get()))
		i.name = n;
	if (const char *u = dm_task_get_uuid(t.get()))
		i.uuid = u;
	return i;
}

} // namespace

Info info(const std::string &name)
{
	check_name(name);
	Task t(DM_DEVICE_INFO, name);
	return info_of(t, name);
}

Info info_by_uuid(const std::string &uuid)
{
	if (uuid.empty() || uuid.size() >= DM_UUID_LEN)
		fail(CKPT_E_INVAL, "'{}' is not a device-mapper uuid (1..{} bytes)", uuid, DM_UUID_LEN - 1);
	Task t(DM_DEVICE_INFO, "");
	if (!dm_task_set_uuid(t.get(), uuid.c_str()))
		fail(CKPT_E_INVAL, "device-mapper: bad uuid '{}'", uuid);
	return info_of(t, "uuid " + uuid);
}

std::vector<std::string> names()
{
	Task t(DM_DEVICE_LIST, "");
	t.run("device-mapper device list", false);
	std::vector<std::string> out;
	const struct dm_names *n = dm_task_get_names(t.get());
	if (!n || !n->dev)
		return out;
	for (;;) {
		out.emplace_back(n->name);
		if (!n->next)
			break;
		n = reinterpret_cast<const struct dm_names *>(reinterpret_cast<const char *>(n) + n->next);
	}
	return out;
}

std::vector<Target> table(const std::string &name) { return query(DM_DEVICE_TABLE, name, "table"); }

std::vector<Target> status(const std::string &name) { return query(DM_DEVICE_STATUS, name, "status"); }

std::string node(const std::string &name, const Info &i)
{
	struct stat st;
	std::string p = fmt::format("{}/{}", dm_dir(), name);
	if (stat(p.c_str(), &st) == 0 && S_ISBLK(st.st_mode))
		return p;
	std::string alt = fmt::format("/dev/dm-{}", i.minor);
	if (stat(alt.c_str(), &st) == 0 && S_ISBLK(st.st_mode) && major(st.st_rdev) == i.major &&
	    minor(st.st_rdev) == i.minor)
		return alt;
	return p;
}

std::string create(const std::string &name, const Target &tgt, const std::string &uuid, bool read_only)
{
	check_name(name);
	if (info(name).exists)
		fail(CKPT_E_STATE, "a device-mapper device named '{}' exists already", name);
	Task t(DM_DEVICE_CREATE, name);
	if (!uuid.empty() && !dm_task_set_uuid(t.get(), uuid.c_str()))
		fail(CKPT_E_INVAL, "device-mapper: bad uuid '{}'", uuid);
	if (read_only && !dm_task_set_ro(t.get()))
		fail(CKPT_E_NOMEM, "device-mapper: cannot make the table read-only");
	if (!dm_task_add_target(t.get(), tgt.start, tgt.length, tgt.type.c_str(), tgt.params.c_str()))
		fail(CKPT_E_NOMEM, "device-mapper: cannot add the table line");
	t.run(fmt::format("creating device-mapper device {} with table '{} {} {} {}' (the kernel log "
			  "says why: dmesg | tail)", name, tgt.start, tgt.length, tgt.type, tgt.params),
	      true);
	Info i = info(name);
	if (!i.exists)
		fail(CKPT_E_IO, "device-mapper device {} vanished right after creation", name);
	std::string p = node(name, i);
	if (access(p.c_str(), F_OK) != 0)
		fail(CKPT_E_IO, "device {} ({}:{}) was created but has no node {}", name, i.major, i.minor, p);
	return p;
}

void remove(const std::string &name, bool retry)
{
	check_name(name);
	Info i = info(name);
	if (!i.exists)
		fail(CKPT_E_NAME, "no device-mapper device named '{}'", name);
	if (i.open_count > 0 && !retry)
		fail(CKPT_E_STATE, "device {} is open ({} users): close it first, or use --retry", name,
			   i.open_count);
	Task t(DM_DEVICE_REMOVE, name);
	if (retry)
		dm_task_retry_remove(t.get());
	t.run(fmt::format("removing device-mapper device {}", name), true);
}

std::string message(const std::string &name, const std::string &text)
{
	check_name(name);
	if (!info(name).exists)
		fail(CKPT_E_NAME, "no device-mapper device named '{}'", name);
	Task t(DM_DEVICE_TARGET_MSG, name);
	if (!dm_task_set_sector(t.get(), 0) || !dm_task_set_message(t.get(), text.c_str()))
		fail(CKPT_E_NOMEM, "device-mapper: cannot set the message");
	t.run(fmt::format("message '{}' to {} (the kernel log says why: dmesg | tail)", text, name), false);
	const char *r = dm_task_get_message_response(t.get());
	return r ? r : "";
}

} // namespace ckptctl::dm
