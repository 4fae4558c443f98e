// SPDX-License-Identifier: MIT
// ckptctl serve / unserve. The kernel's NVMe-oF target (nvmet) is set up
// through its configfs tree, as nvmetcli does:
//
//   hosts/HOST                            dhchap_key, dhchap_ctrl_key, dhchap_hash,
//                                         dhchap_dhgroup (DH-HMAC-CHAP, by default)
//   subsystems/NQN                        attr_allow_any_host 0, and
//   subsystems/NQN/allowed_hosts/HOST  -> hosts/HOST (or, --any-host, 1)
//   subsystems/NQN/namespaces/1           device_path /dev/mapper/NAME, enable
//   ports/P                               addr_trtype, addr_adrfam, addr_traddr, addr_trsvcid
//   ports/P/subsystems/NQN             -> subsystems/NQN
//
// The one namespace is the virtual device: a trainer on another node reads
// the image's manifest, step counts and committed state through its
// read-only IMAGE window, and nothing it is served writes the backing device
// behind the target. What serve made is recorded in /run/ckpt/nvmet/NQN.json (run
// and configfs both end with the boot), so that unserve removes exactly that:
// a port or a host entry that existed before is left as it was.
#include "serve.hpp"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iostream>
#include <map>
#include <memory>
#include <sstream>

#include <arpa/inet.h>
#include <fcntl.h>
#include <spawn.h>
#include <sys/wait.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include "dm.hpp"
#include "fail.hpp"

namespace fs = std::filesystem;
using nlohmann::json;

namespace ckptctl {

namespace {

const fs::path configfs = "/sys/kernel/config";
const fs::path nvmet = configfs / "nvmet";
const fs::path state_dir = "/run/ckpt/nvmet";

std::string read_attr(const fs::path &p)
{
	std::ifstream in(p);
	std::string s;
	std::getline(in, s);
	return s;
}

void write_attr(const fs::path &p, const std::string &value)
{
	const int fd = ::open(p.c_str(), O_WRONLY | O_CLOEXEC);
	if (fd < 0)
		fail(CKPT_E_IO, "cannot open {}: {}", p.string(), strerror(errno));
	const ssize_t w = ::write(fd, value.data(), value.size());
	const int err = errno;
	::close(fd);
	if (w != static_cast<ssize_t>(value.size()))
		fail(CKPT_E_IO, "nvmet refused '{}' in {}: {} (the kernel log may say more)", value, p.string(),
		     w < 0 ? strerror(err) : "short write");
}

void make_dir(const fs::path &p)
{
	if (::mkdir(p.c_str(), 0755) < 0)
		fail(CKPT_E_IO, "cannot create {}: {}", p.string(), strerror(errno));
}

void make_link(const fs::path &target, const fs::path &link)
{
	if (::symlink(target.c_str(), link.c_str()) < 0)
		fail(CKPT_E_IO, "cannot link {} to {}: {}", link.string(), target.string(), strerror(errno));
}

// Undo steps, run in reverse unless kept: serve's partial work on failure,
// and unserve's whole list. A step that fails is reported and the rest run.
class Undo {
public:
	Undo() = default;
	Undo(const Undo &) = delete;
	Undo &operator=(const Undo &) = delete;
	~Undo() { run(); }
	void add(std::function<void()> f) { steps_.push_back(std::move(f)); }
	void keep() { steps_.clear(); }
	// Runs every step; false if one failed (each failure is printed).
	bool run() noexcept
	{
		bool ok = true;
		for (auto it = steps_.rbegin(); it != steps_.rend(); ++it) {
			try {
				(*it)();
			} catch (const std::exception &e) {
				fmt::print(stderr, "ckptctl: {}\n", e.what());
				ok = false;
			}
		}
		steps_.clear();
		return ok;
	}

private:
	std::vector<std::function<void()>> steps_;
};

void remove_entry(const fs::path &p)
{
	// rmdir for a configfs directory, unlink for a link
	struct stat st;
	if (::lstat(p.c_str(), &st) < 0) {
		if (errno == ENOENT)
			return;
		fail(CKPT_E_IO, "cannot stat {}: {}", p.string(), strerror(errno));
	}
	const int r = S_ISLNK(st.st_mode) ? ::unlink(p.c_str()) : ::rmdir(p.c_str());
	if (r < 0)
		fail(CKPT_E_IO, "cannot remove {}: {}", p.string(), strerror(errno));
}

bool mounted_configfs()
{
	std::ifstream m("/proc/mounts");
	std::string dev, dir, type;
	while (m >> dev >> dir >> type) {
		if (dir == configfs.string() && type == "configfs")
			return true;
		m.ignore(4096, '\n');
	}
	return false;
}

void check_nvmet(const std::string &transport)
{
	std::error_code ec;
	if (!mounted_configfs())
		fail(CKPT_E_STATE, "configfs is not mounted at {} (mount -t configfs none {})", configfs.string(),
		     configfs.string());
	if (!fs::is_directory(nvmet, ec))
		fail(CKPT_E_STATE, "the kernel's NVMe-oF target is not loaded: no {} (modprobe nvmet nvmet-{})",
		     nvmet.string(), transport);
	const std::string mod = "/sys/module/nvmet_" + transport;
	if (!fs::is_directory(mod, ec))
		fail(CKPT_E_STATE, "the NVMe-oF {} transport is not loaded: no {} (modprobe nvmet-{})", transport,
		     mod, transport);
}

// An NQN as the NVMe base specification allows (at most 223 bytes, "nqn."
// and no '/' so that it is one configfs name).
void check_nqn(const std::string &nqn, const char *what)
{
	if (nqn.size() < 5 || nqn.size() > 223 || nqn.rfind("nqn.", 0) != 0 || nqn.find('/') != std::string::npos ||
	    std::any_of(nqn.begin(), nqn.end(), [](char c) { return c <= ' ' || c == 0x7f; }))
		fail(CKPT_E_INVAL, "{} '{}' is not an NQN (\"nqn.\" then up to 219 printable bytes, no '/' or blank)",
		     what, nqn);
}

struct Address {
	std::string family, traddr, port;
};

// IP[:PORT] or [IPv6]:PORT; the port defaults to 4420 (NVMe/TCP's).
Address parse_addr(const std::string &s)
{
	Address a;
	std::string host = s, port = "4420";
	if (!s.empty() && s[0] == '[') {
		const auto close = s.find(']');
		if (close == std::string::npos)
			fail(CKPT_E_INVAL, "--addr '{}': no ']' after the IPv6 address", s);
		host = s.substr(1, close - 1);
		if (close + 1 < s.size()) {
			if (s[close + 1] != ':')
				fail(CKPT_E_INVAL, "--addr '{}': ':PORT' must follow ']'", s);
			port = s.substr(close + 2);
		}
	} else if (std::count(s.begin(), s.end(), ':') == 1) {
		host = s.substr(0, s.find(':'));
		port = s.substr(s.find(':') + 1);
	}
	unsigned char buf[16];
	if (inet_pton(AF_INET, host.c_str(), buf) == 1)
		a.family = "ipv4";
	else if (inet_pton(AF_INET6, host.c_str(), buf) == 1)
		a.family = "ipv6";
	else
		fail(CKPT_E_INVAL, "--addr '{}': '{}' is not an IPv4 or IPv6 address", s, host);
	if (port.empty() || port.size() > 5 || !std::all_of(port.begin(), port.end(), ::isdigit) ||
	    std::stoul(port) < 1 || std::stoul(port) > 65535)
		fail(CKPT_E_INVAL, "--addr '{}': port '{}' is not 1..65535", s, port);
	a.traddr = host;
	a.port = port;
	return a;
}

// The dm name of NAME, /dev/mapper/NAME or another node of a dm device.
std::string dm_name_of(const std::string &dev)
{
	if (dev.find('/') == std::string::npos)
		return dev;
	struct stat st;
	if (::stat(dev.c_str(), &st) < 0)
		fail(CKPT_E_INVAL, "{}: {}", dev, strerror(errno));
	if (!S_ISBLK(st.st_mode))
		fail(CKPT_E_INVAL, "{} is not a block device", dev);
	const std::string name =
		read_attr(fmt::format("/sys/dev/block/{}:{}/dm/name", major(st.st_rdev), minor(st.st_rdev)));
	if (name.empty())
		fail(CKPT_E_INVAL, "{} is not a device-mapper device, so not a dm-ckpt device", dev);
	return name;
}

// The backing device of the dm-ckpt device at node, as libckpt finds it (a
// node of the one slave's numbers, whatever /dev/SLAVE names).
std::string backing_of(const std::string &node)
{
	char *backing = nullptr;
	if (!check(ckpt_backing_of(node.c_str(), &backing)))
		fail(CKPT_E_STATE, "{} does not answer as a dm-ckpt device", node);
	const std::unique_ptr<char, decltype(&ckpt_free)> guard(backing, ckpt_free);
	return backing;
}

// The block device a path names (0 if it names none): one device has many
// names (/dev/nvme0n1, /dev/block/259:0, /dev/disk/by-id/...).
dev_t block_device(const std::string &path)
{
	struct stat st;
	return stat(path.c_str(), &st) == 0 && S_ISBLK(st.st_mode) ? st.st_rdev : 0;
}

// The subsystem whose namespace has path's device as its device_path, under
// whatever name, if any.
std::string served_by(const std::string &path)
{
	const dev_t dev = block_device(path);
	std::error_code ec;
	for (const auto &s : fs::directory_iterator(nvmet / "subsystems", ec))
		for (const auto &n : fs::directory_iterator(s.path() / "namespaces", ec)) {
			const std::string other = read_attr(n.path() / "device_path");
			if (other == path || (dev != 0 && block_device(other) == dev))
				return s.path().filename().string();
		}
	return "";
}

// A port of these transport and address, if one exists.
std::string find_port(const std::string &transport, const Address &a)
{
	std::error_code ec;
	for (const auto &p : fs::directory_iterator(nvmet / "ports", ec))
		if (read_attr(p.path() / "addr_trtype") == transport &&
		    read_attr(p.path() / "addr_adrfam") == a.family &&
		    read_attr(p.path() / "addr_traddr") == a.traddr && read_attr(p.path() / "addr_trsvcid") == a.port)
			return p.path().filename().string();
	return "";
}

std::string free_port_id()
{
	for (unsigned id = 1; id < 65535; id++)
		if (!fs::exists(nvmet / "ports" / std::to_string(id)))
			return std::to_string(id);
	fail(CKPT_E_STATE, "no free nvmet port number");
}

fs::path state_file(const std::string &nqn) { return state_dir / (nqn + ".json"); }

// A host's DH-HMAC-CHAP secrets: the one it answers with (dhchap_key) and
// the one the controller answers with (dhchap_ctrl_key: both sides proved).
struct Keys {
	std::string host, ctrl;
};

// The stdout of argv run to its end (exit 0), else a failure naming it.
std::string output_of(const std::vector<std::string> &argv)
{
	int fds[2];
	if (pipe2(fds, O_CLOEXEC) < 0)
		fail(CKPT_E_IO, "pipe: {}", strerror(errno));
	posix_spawn_file_actions_t fa;
	posix_spawn_file_actions_init(&fa);
	posix_spawn_file_actions_adddup2(&fa, fds[1], 1);
	std::vector<char *> args;
	for (const std::string &a : argv)
		args.push_back(const_cast<char *>(a.c_str()));
	args.push_back(nullptr);
	pid_t pid;
	const int err = posix_spawnp(&pid, args[0], &fa, nullptr, args.data(), environ);
	posix_spawn_file_actions_destroy(&fa);
	::close(fds[1]);
	std::string out;
	char buf[512];
	for (ssize_t n; err == 0 && (n = ::read(fds[0], buf, sizeof(buf))) != 0;)
		if (n > 0)
			out.append(buf, static_cast<size_t>(n));
		else if (errno != EINTR)
			break;
	::close(fds[0]);
	if (err)
		fail(CKPT_E_STATE, "cannot run {}: {} (nvme-cli makes the DH-HMAC-CHAP keys: apt install nvme-cli, or "
				   "give them with --key-file)", argv[0], strerror(err));
	int status = 0;
	while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
	}
	if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
		fail(CKPT_E_IO, "{} failed (status {})", fmt::join(argv, " "), status);
	return out;
}

// A secret as nvme gen-dhchap-key writes it: DHHC-1:NN:BASE64:
void check_key(const std::string &key, const std::string &what)
{
	if (key.rfind("DHHC-1:", 0) != 0 || key.size() < 12 || key.back() != ':' ||
	    std::any_of(key.begin(), key.end(), [](char c) { return c <= ' ' || c == 0x7f; }))
		fail(CKPT_E_INVAL, "{}: '{}' is not a DH-HMAC-CHAP secret (DHHC-1:NN:BASE64:, as nvme gen-dhchap-key "
				   "makes them)", what, key);
}

Keys make_keys(const std::string &host)
{
	Keys k;
	for (std::string *key : {&k.host, &k.ctrl}) {
		*key = output_of({"nvme", "gen-dhchap-key", "--nqn=" + host, "--hmac=0", "--key-length=32"});
		while (!key->empty() && std::isspace(static_cast<unsigned char>(key->back())))
			key->pop_back();
		check_key(*key, "nvme gen-dhchap-key");
	}
	return k;
}

// --key-file: a line "HOSTNQN HOST_KEY CTRL_KEY" for every host named, no other.
std::map<std::string, Keys> read_key_file(const std::string &path, const std::vector<std::string> &hosts)
{
	std::ifstream in(path);
	if (!in)
		fail(CKPT_E_IO, "cannot read --key-file {}", path);
	std::map<std::string, Keys> keys;
	std::string line;
	for (unsigned no = 1; std::getline(in, line); no++) {
		std::istringstream w(line);
		std::string host, hk, ck, extra;
		if (!(w >> host))
			continue;
		if (!(w >> hk >> ck) || (w >> extra))
			fail(CKPT_E_INVAL, "{}:{}: not 'HOSTNQN HOST_KEY CTRL_KEY'", path, no);
		check_nqn(host, "--key-file host");
		check_key(hk, fmt::format("{}:{}", path, no));
		check_key(ck, fmt::format("{}:{}", path, no));
		if (std::find(hosts.begin(), hosts.end(), host) == hosts.end())
			fail(CKPT_E_INVAL, "{}:{}: {} is not a --host", path, no, host);
		if (!keys.emplace(host, Keys{hk, ck}).second)
			fail(CKPT_E_INVAL, "{}:{}: {} has keys twice", path, no, host);
	}
	for (const auto &h : hosts)
		if (!keys.count(h))
			fail(CKPT_E_INVAL, "--key-file {} has no keys for --host {}", path, h);
	return keys;
}

// A port or host entry serve made goes with the last subsystem that uses
// it. While other subsystems (users) still do, it stays: the record of one
// that serve made takes it over (take), else it is left to whoever made them.
void remove_shared(const fs::path &entry, const std::vector<std::string> &users,
		   const std::function<void(json &)> &take)
{
	if (users.empty())
		return remove_entry(entry);
	for (const auto &u : users) {
		const fs::path sf = state_file(u);
		std::ifstream in(sf);
		json s = json::parse(in, nullptr, false);
		if (s.is_discarded() || !s.is_object())
			continue;
		take(s);
		std::ofstream out(sf);
		out << s.dump(2) << "\n";
		if (!out.flush())
			fail(CKPT_E_IO, "cannot write {}", sf.string());
		return;
	}
	fmt::print(stderr, "ckptctl: {} is left: subsystem {} uses it\n", entry.string(), users[0]);
}

std::vector<std::string> port_users(const fs::path &port)
{
	std::vector<std::string> users;
	std::error_code ec;
	for (const auto &e : fs::directory_iterator(port / "subsystems", ec))
		users.push_back(e.path().filename().string());
	return users;
}

std::vector<std::string> host_users(const std::string &host)
{
	std::vector<std::string> users;
	std::error_code ec;
	for (const auto &e : fs::directory_iterator(nvmet / "subsystems", ec))
		if (fs::is_symlink(e.path() / "allowed_hosts" / host, ec))
			users.push_back(e.path().filename().string());
	return users;
}

// What serve made, as recorded: the undo list of unserve.
void undo_of(const json &s, Undo &undo)
{
	const fs::path sub = nvmet / "subsystems" / s.at("nqn").get<std::string>();
	const fs::path port = nvmet / "ports" / s.at("port").get<std::string>();
	if (s.at("port_created").get<bool>())
		undo.add([port] {
			remove_shared(port, port_users(port), [](json &other) { other["port_created"] = true; });
		});
	undo.add([sub] { remove_entry(sub); });
	for (const auto &h : s.at("hosts_created"))
		undo.add([h = h.get<std::string>()] {
			remove_shared(nvmet / "hosts" / h, host_users(h),
				      [&h](json &other) { other["hosts_created"].push_back(h); });
		});
	for (const auto &h : s.at("hosts"))
		undo.add([sub, h = h.get<std::string>()] { remove_entry(sub / "allowed_hosts" / h); });
	for (const auto &n : s.at("namespaces")) {
		const fs::path ns = sub / "namespaces" / std::to_string(n.get<int>());
		undo.add([ns] { remove_entry(ns); });
		undo.add([ns] {
			if (fs::exists(ns / "enable") && read_attr(ns / "enable") == "1")
				write_attr(ns / "enable", "0");
		});
	}
	undo.add([port, nqn = s.at("nqn").get<std::string>()] { remove_entry(port / "subsystems" / nqn); });
}

} // namespace

int cmd_serve(const ServeArgs &a)
{
	if (a.transport != "tcp")
		fail(CKPT_E_INVAL, "transport '{}' is not supported (tcp)", a.transport);
	check_nqn(a.nqn, "--nqn");
	for (const auto &h : a.hosts)
		check_nqn(h, "--host");
	if (a.any_host && (!a.hosts.empty() || !a.key_file.empty()))
		fail(CKPT_E_INVAL, "--any-host serves every host that connects: it takes no --host or --key-file");
	if (!a.any_host && a.hosts.empty())
		fail(CKPT_E_INVAL, "name the hosts that may connect (--host NQN, repeatable); --any-host serves "
				   "every host that connects, unauthenticated");
	if (a.no_auth && !a.key_file.empty())
		fail(CKPT_E_INVAL, "--no-auth and --key-file: keys or none");
	const bool auth = !a.any_host && !a.no_auth;
	std::map<std::string, Keys> keys;
	if (!a.key_file.empty())
		keys = read_key_file(a.key_file, a.hosts);
	const Address addr = parse_addr(a.addr);
	const std::string name = dm_name_of(a.device);
	const dm::Info info = dm::info(name);
	if (!info.exists)
		fail(CKPT_E_INVAL, "no device-mapper device named '{}'", name);
	const auto tt = dm::table(name);
	if (tt.size() != 1 || tt[0].type != "ckpt")
		fail(CKPT_E_INVAL, "{} is not a dm-ckpt device (its table has {} targets{})", name, tt.size(),
		     tt.empty() ? "" : ", the first of type " + tt[0].type);
	const std::string node = dm::node(name, info);
	const std::string backing = backing_of(node);
	check_nvmet(a.transport);

	const fs::path sub = nvmet / "subsystems" / a.nqn;
	if (fs::exists(sub))
		fail(CKPT_E_STATE, "subsystem {} exists already (ckptctl unserve {} removes one that serve made)",
		     a.nqn, a.nqn);
	for (const std::string &p : {node, backing})
		if (const std::string by = served_by(p); !by.empty())
			fail(CKPT_E_STATE, "{} is served already, by subsystem {}", p, by);

	json s = {{"nqn", a.nqn}, {"name", name}, {"device", node}, {"backing", backing},
		  {"transport", a.transport}, {"addr", addr.traddr}, {"adrfam", addr.family},
		  {"trsvcid", addr.port}, {"hosts", json::array()}, {"hosts_created", json::array()},
		  {"namespaces", json::array()}};
	Undo undo;
	make_dir(sub);
	undo.add([sub] { remove_entry(sub); });
	s["auth"] = auth;
	if (a.any_host) {
		write_attr(sub / "attr_allow_any_host", "1");
	} else {
		write_attr(sub / "attr_allow_any_host", "0");
		for (const auto &h : a.hosts) {
			const fs::path host = nvmet / "hosts" / h;
			const bool made = !fs::exists(host);
			if (made) {
				make_dir(host);
				undo.add([host] { remove_entry(host); });
				s["hosts_created"].push_back(h);
			}
			if (auth) {
				if (!fs::exists(host / "dhchap_key"))
					fail(CKPT_E_STATE, "this kernel's nvmet has no in-band authentication "
							   "(CONFIG_NVME_TARGET_AUTH): serve with --no-auth, or on a "
							   "kernel that has it");
				// A host entry is every subsystem's: one that has keys (another
				// serve's) keeps them, and this subsystem uses them too.
				Keys k{read_attr(host / "dhchap_key"), read_attr(host / "dhchap_ctrl_key")};
				if (!made && !k.host.empty()) {
					if (keys.count(h) && (keys[h].host != k.host || keys[h].ctrl != k.ctrl))
						fail(CKPT_E_STATE, "host {} has other DH-HMAC-CHAP keys in nvmet already "
								   "(another subsystem's): give those, or none", h);
				} else {
					if (!keys.count(h))
						keys[h] = make_keys(h);
					k = keys[h];
					write_attr(host / "dhchap_hash", "hmac(sha256)");
					write_attr(host / "dhchap_dhgroup", "ffdhe2048");
					write_attr(host / "dhchap_key", k.host);
					write_attr(host / "dhchap_ctrl_key", k.ctrl);
				}
				s["keys"][h] = {{"host_key", k.host}, {"ctrl_key", k.ctrl}};
			}
			make_link(host, sub / "allowed_hosts" / h);
			undo.add([sub, h] { remove_entry(sub / "allowed_hosts" / h); });
			s["hosts"].push_back(h);
		}
	}
	// namespace 1, the one: the virtual device (the image through its window)
	const fs::path ns = sub / "namespaces" / "1";
	make_dir(ns);
	undo.add([ns] { remove_entry(ns); });
	write_attr(ns / "device_path", node);
	write_attr(ns / "enable", "1");
	undo.add([ns] { write_attr(ns / "enable", "0"); });
	s["namespaces"].push_back(1);
	std::string port = find_port(a.transport, addr);
	s["port_created"] = port.empty();
	if (port.empty()) {
		port = free_port_id();
		const fs::path p = nvmet / "ports" / port;
		make_dir(p);
		undo.add([p] { remove_entry(p); });
		write_attr(p / "addr_trtype", a.transport);
		write_attr(p / "addr_adrfam", addr.family);
		write_attr(p / "addr_traddr", addr.traddr);
		write_attr(p / "addr_trsvcid", addr.port);
	}
	s["port"] = port;
	const fs::path link = nvmet / "ports" / port / "subsystems" / a.nqn;
	make_link(sub, link);	// the port listens from here on
	undo.add([link] { remove_entry(link); });

	std::error_code ec;
	fs::create_directories(state_dir, ec);
	const fs::path sf = state_file(a.nqn);
	{
		// it holds the hosts' secrets: root's alone
		const std::string text = s.dump(2) + "\n";
		const int fd = ::open(sf.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
		const bool ok = fd >= 0 && fchmod(fd, 0600) == 0 &&
				::write(fd, text.data(), text.size()) == static_cast<ssize_t>(text.size());
		if (fd >= 0)
			::close(fd);
		if (!ok)
			fail(CKPT_E_IO, "cannot write {}: unserve needs it", sf.string());
	}
	undo.keep();
	if (a.json) {
		std::cout << s.dump(2) << "\n";
	} else {
		fmt::print("{}: served as {} on {} {}:{} (port {}{}), namespace 1 {} (its backing device {} is not "
			   "served)\n",
			   name, a.nqn, a.transport, addr.traddr, addr.port, port,
			   s["port_created"].get<bool>() ? "" : ", shared", node, backing);
		if (a.any_host)
			fmt::print("  hosts: any, unauthenticated (--any-host)\n");
		for (const auto &h : a.hosts) {
			fmt::print("  host {}{}\n", h, auth ? ", DH-HMAC-CHAP; it connects with" : ", no authentication");
			if (auth)
				fmt::print("    nvme connect -t {} -a {} -s {} -n {} --hostnqn={} --dhchap-secret={} "
					   "--dhchap-ctrl-secret={}\n",
					   a.transport, addr.traddr, addr.port, a.nqn, h,
					   s["keys"][h]["host_key"].get<std::string>(),
					   s["keys"][h]["ctrl_key"].get<std::string>());
		}
	}
	return 0;
}

int cmd_unserve(const std::string &what)
{
	std::error_code ec;
	fs::path sf;
	if (what.rfind("nqn.", 0) == 0) {
		check_nqn(what, "NQN");
		sf = state_file(what);
	} else {
		for (const auto &e : fs::directory_iterator(state_dir, ec)) {
			std::ifstream in(e.path());
			const json s = json::parse(in, nullptr, false);
			if (!s.is_discarded() && s.is_object() && s.value("name", "") == what)
				sf = e.path();
		}
	}
	if (sf.empty() || !fs::exists(sf))
		fail(CKPT_E_STATE, "{} is not served by ckptctl serve (no record in {})", what, state_dir.string());
	std::ifstream in(sf);
	const json s = json::parse(in, nullptr, false);
	if (s.is_discarded() || !s.is_object())
		fail(CKPT_E_STATE, "{}: not a record of ckptctl serve", sf.string());
	Undo undo;
	try {
		undo_of(s, undo);
	} catch (const json::exception &e) {
		undo.keep();
		fail(CKPT_E_STATE, "{}: not a record of ckptctl serve: {}", sf.string(), e.what());
	}
	if (!undo.run())
		fail(CKPT_E_IO, "{}: unserve left something behind (above); the record {} is kept",
		     s["nqn"].get<std::string>(), sf.string());
	fs::remove(sf, ec);
	fmt::print("{}: no longer served ({})\n", s["name"].get<std::string>(), s["nqn"].get<std::string>());
	return 0;
}

} // namespace ckptctl
