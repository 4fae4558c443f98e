// SPDX-License-Identifier: MIT
// The kernel target's dm status INFO line parser (ckpt_status_line_parse_at,
// ckpt_status_line.c), which libckpt's ckpt_dm_status_parse and ckptctl call on
// text from the kernel: strict, and what it accepts prints back the same.
#include <string>

#include "fuzz_util.hpp"

extern "C" {
#include "ckpt_step.h"
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	if (size > 4096)
		return 0;
	// Its own allocation, so ASan sees a read past len.
	std::unique_ptr<char[]> s(new char[size ? size : 1]);
	std::memcpy(s.get(), data, size);
	ckpt_counters k;
	std::memset(&k, 0x5a, sizeof(k));
	const ckpt_counters before = k;
	uint32_t n_chunks = 7, field = ~0u;
	const int r = ckpt_status_line_parse_at(s.get(), static_cast<uint32_t>(size), &k, &n_chunks, &field);
	if (r) {
		FUZZ_ASSERT(r == -CKPT_E_INVAL);
		FUZZ_ASSERT(field <= CKPT_STATUS_N);
		FUZZ_ASSERT(std::memcmp(&k, &before, sizeof(k)) == 0 && n_chunks == 7);
		return 0;
	}
	char line[CKPT_STATUS_LINE_MAX];
	const int n = ckpt_status_line(&k, n_chunks, line, sizeof(line));
	FUZZ_ASSERT(n > 0);
	// the input up to a NUL, without one trailing newline
	std::string in(s.get(), strnlen(s.get(), size));
	if (!in.empty() && in.back() == '\n')
		in.pop_back();
	FUZZ_ASSERT(in == std::string(line, static_cast<size_t>(n)));
	return 0;
}
