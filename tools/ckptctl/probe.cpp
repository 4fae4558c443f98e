// SPDX-License-Identifier: MIT
#include "probe.hpp"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>

#include <fcntl.h>
#include <linux/fs.h>
#include <sys/ioctl.h>
#ifndef CKPT_NO_LIBNVME
#include <libnvme.h>
#endif
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include "ckpt.h"
#include "fail.hpp"

using nlohmann::json;

namespace ckptctl {

namespace {

[[maybe_unused]] std::string trimmed(const char *s, size_t n)
{
	std::string out(s, strnlen(s, n));
	while (!out.empty() && (out.back() == ' ' || out.back() == '\0'))
		out.pop_back();
	return out;
}

[[maybe_unused]] std::string sysfs(const std::string &dir, const char *file)
{
	std::ifstream in(dir + "/" + file);
	std::string v;
	std::getline(in, v);
	return v;
}

struct Fd {
	int fd;
	~Fd() { ::close(fd); }
};

} // namespace

#ifdef CKPT_NO_LIBNVME
// A cross build without the target's libnvme (tools/CMakeLists.txt).
json probe(const std::string &dev, uint32_t)
{
	fail(CKPT_E_INVAL, "cannot probe {}: this ckptctl was built without libnvme (a cross build); "
			   "build ckptctl natively to read NVMe identify data", dev);
}
#else
json probe(const std::string &dev, uint32_t want_chunk)
{
	struct stat st;
	if (stat(dev.c_str(), &st) < 0)
		fail(CKPT_E_IO, "cannot open {}: {}", dev, strerror(errno));
	if (S_ISREG(st.st_mode))
		fail(CKPT_E_INVAL, "{} is a regular file, not an NVMe namespace: probe identifies NVMe "
				   "devices (a file can be formatted and used with the userspace engine as it is)", dev);
	if (S_ISCHR(st.st_mode))
		fail(CKPT_E_INVAL, "{} is a character device, not an NVMe namespace block device: probe a "
				   "namespace such as /dev/nvme0n1", dev);
	if (!S_ISBLK(st.st_mode))
		fail(CKPT_E_INVAL, "{} is not a block device", dev);
	const std::string sys = fmt::format("/sys/dev/block/{}:{}", major(st.st_rdev), minor(st.st_rdev));
	std::string kname;
	{
		char buf[512];
		ssize_t n = readlink(sys.c_str(), buf, sizeof(buf) - 1);
		if (n > 0) {
			buf[n] = 0;
			kname = strrchr(buf, '/') ? strrchr(buf, '/') + 1 : buf;
		}
	}
	int fd = ::open(dev.c_str(), O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		fail(CKPT_E_IO, "cannot open {}: {}", dev, strerror(errno));
	const Fd guard{fd};
	__u32 nsid = 0;
	if (nvme_get_nsid(fd, &nsid) < 0 || nsid == 0)
		fail(CKPT_E_INVAL, "{}{} is not an NVMe namespace: it does not answer the NVMe ioctls ({}); "
				   "probe reads NVMe identify data (a loop, SCSI or dm device has none)",
			   dev, kname.empty() ? "" : " (" + kname + ")", strerror(errno ? errno : ENOTTY));

	struct nvme_id_ctrl ctrl;
	struct nvme_id_ns ns;
	std::memset(&ctrl, 0, sizeof(ctrl));
	std::memset(&ns, 0, sizeof(ns));
	int ret = nvme_identify_ctrl(fd, &ctrl);
	if (ret != 0)
		fail(CKPT_E_IO, "{}: identify controller failed: {}", dev,
			   ret < 0 ? strerror(errno) : fmt::format("NVMe status {:#x}", ret));
	ret = nvme_identify_ns(fd, nsid, &ns);
	if (ret != 0)
		fail(CKPT_E_IO, "{}: identify namespace {} failed: {}", dev, nsid,
			   ret < 0 ? strerror(errno) : fmt::format("NVMe status {:#x}", ret));

	const unsigned fmt_index = (ns.flbas & NVME_NS_FLBAS_LOWER_MASK) | ((ns.flbas & NVME_NS_FLBAS_HIGHER_MASK) >> 1);
	const struct nvme_lbaf &lbaf = ns.lbaf[fmt_index < 64 ? fmt_index : 0];
	const uint64_t lba = uint64_t{1} << lbaf.ds;
	const uint64_t nsze = le64toh(ns.nsze);
	uint64_t bytes = nsze * lba;
	uint64_t size = 0;
	if (ioctl(fd, BLKGETSIZE64, &size) == 0 && size && size < bytes)	// a partition
		bytes = size;

	const bool natomic = ns.nsfeat & NVME_NS_FEAT_NATOMIC;
	const uint64_t awun = le16toh(ctrl.awun) + 1ull, awupf = le16toh(ctrl.awupf) + 1ull;
	const uint64_t pf_lbas = natomic ? le16toh(ns.nawupf) + 1ull : awupf;
	const uint64_t atomic_bytes = pf_lbas * lba;
	const bool io_opt = ns.nsfeat & NVME_NS_FEAT_IO_OPT;
	const uint64_t npwg = io_opt ? (le16toh(ns.npwg) + 1ull) * lba : 0;
	const uint64_t nows = io_opt ? (le16toh(ns.nows) + 1ull) * lba : 0;
	const bool vwc = ctrl.vwc & 1;
	const std::string qdir = fmt::format("/sys/block/{}/queue", kname);

	// Chunk size: the default 65536 params (128 KiB of p_lo, 768 KiB of
	// fp32 state per chunk: large sequential I/O, bounded staging), raised
	// (by libckpt) so that a chunk's p_lo write covers whole preferred
	// write units of the namespace, and never below one LBA.
	const uint64_t unit = std::max({lba, npwg, nows});
	struct ckpt_fit fit, dflt;
	check(ckpt_fit(bytes, want_chunk, unit, &fit));
	check(ckpt_fit(0, 0, 0, &dflt));
	const uint32_t cp = fit.chunk_params;
	std::string reason;
	if (want_chunk)
		reason = "as asked (--chunk-params)";
	else if (cp == dflt.chunk_params)
		reason = "the default: 128 KiB of p_lo and 768 KiB of fp32 state per chunk";
	else
		reason = fmt::format("raised so that a chunk's p_lo ({} KiB) covers whole {}-byte preferred "
				     "write units of the namespace", 2ull * cp / 1024, unit);
	if (2ull * cp % lba)
		fail(CKPT_E_GEOMETRY, "{}: chunk_params {} gives p_lo chunks of {} bytes, not a multiple of "
				   "the {}-byte LBA", dev, cp, 2ull * cp, lba);
	const uint64_t block = static_cast<uint64_t>(ckpt_abi_constant("CKPT_BLOCK"));

	json j = {
		{"device", dev},
		{"kernel_name", kname},
		{"model", trimmed(ctrl.mn, sizeof(ctrl.mn))},
		{"serial", trimmed(ctrl.sn, sizeof(ctrl.sn))},
		{"firmware", trimmed(ctrl.fr, sizeof(ctrl.fr))},
		{"nsid", nsid},
		{"namespace_lbas", nsze},
		{"capacity_lbas", le64toh(ns.ncap)},
		{"used_lbas", le64toh(ns.nuse)},
		{"bytes", bytes},
		{"lba_format", fmt_index},
		{"lba_data_bytes", lba},
		{"lba_metadata_bytes", le16toh(lbaf.ms)},
		{"metadata_extended", (ns.flbas & NVME_NS_FLBAS_META_EXT) != 0},
		{"awun_lbas", awun},
		{"awupf_lbas", awupf},
		{"nawun_lbas", natomic ? json(le16toh(ns.nawun) + 1ull) : json(nullptr)},
		{"nawupf_lbas", natomic ? json(le16toh(ns.nawupf) + 1ull) : json(nullptr)},
		{"power_fail_atomic_bytes", atomic_bytes},
		{"superblock_write_atomic", atomic_bytes >= block},
		{"preferred_write_granularity_bytes", io_opt ? json(npwg) : json(nullptr)},
		{"optimal_write_size_bytes", io_opt ? json(nows) : json(nullptr)},
		{"volatile_write_cache", vwc},
		{"write_cache", sysfs(qdir, "write_cache")},
		{"fua", sysfs(qdir, "fua") == "1"},
		{"max_transfer_kb", sysfs(qdir, "max_hw_sectors_kb")},
		{"recommended", {
			{"chunk_params", cp},
			{"reason", reason},
			{"record_bytes", fit.record_bytes},
			{"n_chunks", fit.n_chunks},
			{"max_params", fit.n_params},
			{"backing_bytes", fit.backing_bytes},
			{"bytes_per_param", fit.n_params ? static_cast<double>(fit.backing_bytes) / fit.n_params : 0.0},
		}},
	};
	return j;
}
#endif

void print_probe(const json &j)
{
	const json &r = j["recommended"];
	auto lbas = [](const json &v) { return v.is_null() ? std::string("-") : std::to_string(v.get<uint64_t>()); };
	fmt::print("{}: NVMe namespace {} ({})\n", j["device"].get<std::string>(), j["nsid"].get<uint32_t>(),
		   j["kernel_name"].get<std::string>());
	fmt::print("  model            {}\n", j["model"].get<std::string>());
	fmt::print("  serial           {}\n", j["serial"].get<std::string>());
	fmt::print("  firmware         {}\n", j["firmware"].get<std::string>());
	fmt::print("  size             {} bytes ({:.1f} GiB), {} LBAs\n", j["bytes"].get<uint64_t>(),
		   j["bytes"].get<uint64_t>() / double(1ull << 30), j["namespace_lbas"].get<uint64_t>());
	fmt::print("  LBA format       #{}: {} B data + {} B metadata{}\n", j["lba_format"].get<unsigned>(),
		   j["lba_data_bytes"].get<uint64_t>(), j["lba_metadata_bytes"].get<unsigned>(),
		   j["metadata_extended"].get<bool>() ? " (extended LBA)" : "");
	fmt::print("  atomic writes    awun {} LBAs, awupf {} LBAs, nawun {}, nawupf {}: {} B power-fail atomic\n",
		   j["awun_lbas"].get<uint64_t>(), j["awupf_lbas"].get<uint64_t>(), lbas(j["nawun_lbas"]),
		   lbas(j["nawupf_lbas"]), j["power_fail_atomic_bytes"].get<uint64_t>());
	fmt::print("                   a 4 KiB superblock write {} (a torn one is caught by its checksum and\n"
		   "                   the other copy stays valid)\n",
		   j["superblock_write_atomic"].get<bool>() ? "cannot tear" : "can tear on power loss");
	if (!j["preferred_write_granularity_bytes"].is_null())
		fmt::print("  write hints      preferred granularity {} B, optimal write size {} B\n",
			   j["preferred_write_granularity_bytes"].get<uint64_t>(),
			   j["optimal_write_size_bytes"].get<uint64_t>());
	fmt::print("  write cache      {}{}, FUA {}\n", j["volatile_write_cache"].get<bool>() ? "volatile" : "none",
		   j["write_cache"].get<std::string>().empty() ? "" : " (" + j["write_cache"].get<std::string>() + ")",
		   j["fua"].get<bool>() ? "supported" : "not supported (flushes instead)");
	if (!j["max_transfer_kb"].get<std::string>().empty())
		fmt::print("  max transfer     {} KiB\n", j["max_transfer_kb"].get<std::string>());
	fmt::print("  recommended      chunk_params {} ({})\n", r["chunk_params"].get<uint32_t>(),
		   r["reason"].get<std::string>());
	fmt::print("  capacity         {} params in {} chunks ({:.1f} B/param on the device: 2 x (2 + 12) B\n"
		   "                   plus record headers and superblocks)\n",
		   r["max_params"].get<uint64_t>(), r["n_chunks"].get<uint32_t>(), r["bytes_per_param"].get<double>());
}

} // namespace ckptctl
