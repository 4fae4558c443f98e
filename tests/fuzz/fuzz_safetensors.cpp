// SPDX-License-Identifier: MIT
// The safetensors reader ckptctl import and format --from-safetensors use
// (safetensors::Reader, safetensors.cpp): the whole file as input, read
// through the reader's own open (a memfd), then every float tensor
// converted to fp32, and its __metadata__'s dm-ckpt.* keys parsed
// (interchange.cpp). The same bytes are also parsed as a sharded
// checkpoint's index (safetensors::parse_index).
#include <string>

#include <sys/mman.h>
#include <unistd.h>

#include "error.hpp"
#include "fuzz_util.hpp"
#include "interchange.hpp"
#include "safetensors.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	if (size > (1u << 20))
		return 0;
	static const int fd = memfd_create("fuzz.safetensors", 0);
	static const std::string path = "/proc/self/fd/" + std::to_string(fd);
	FUZZ_ASSERT(fd >= 0);
	FUZZ_ASSERT(ftruncate(fd, 0) == 0);
	FUZZ_ASSERT(pwrite(fd, data, size, 0) == static_cast<ssize_t>(size));
	try {
		const auto r = ckpt::safetensors::Reader::open(path);
		const auto &h = r.header();
		FUZZ_ASSERT(h.data_offset + h.data_bytes == size);
		uint64_t at = 0;
		for (const auto &t : h.tensors) {
			FUZZ_ASSERT(t.begin == at && t.end >= t.begin && t.end <= h.data_bytes);
			FUZZ_ASSERT(t.numel * t.dtype_bytes == t.end - t.begin);
			FUZZ_ASSERT(h.find(t.name) != nullptr);
			at = t.end;
			if (ckpt::safetensors::is_float(t.dtype)) {
				const std::vector<float> v = r.read_f32(t);
				FUZZ_ASSERT(v.size() == t.numel);
			}
		}
		FUZZ_ASSERT(at == h.data_bytes);
		if (const auto ix = ckpt::interchange::read(h.metadata, path)) {
			FUZZ_ASSERT(ix->chunk_params && ix->n_groups && (ix->hparams.empty() ||
									  ix->hparams.size() == ix->n_groups));
			for (const auto &[name, g] : ix->tensor_group)
				FUZZ_ASSERT(g < ix->n_groups);
		}
	} catch (const ckpt::Error &e) {
		FUZZ_ASSERT(e.code() == CKPT_E_INVAL || e.code() == CKPT_E_IO);
	}
	try {
		for (const auto &[name, shard] :
		     ckpt::safetensors::parse_index({reinterpret_cast<const char *>(data), size}, "index"))
			FUZZ_ASSERT(!name.empty() && !shard.empty() && shard.find('/') == std::string::npos &&
				    shard != "." && shard != "..");
	} catch (const ckpt::Error &e) {
		FUZZ_ASSERT(e.code() == CKPT_E_INVAL || e.code() == CKPT_E_IO);
	}
	return 0;
}
