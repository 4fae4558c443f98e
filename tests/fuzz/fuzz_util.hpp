// SPDX-License-Identifier: MIT
// Shared by the libFuzzer targets: the input as a byte cursor, and the one
// way a target says an invariant broke (an abort libFuzzer reports as a
// crash, with the message).
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <algorithm>
#include <memory>
#include <vector>

#define FUZZ_ASSERT(cond)                                                                    \
	do {                                                                                 \
		if (!(cond)) {                                                               \
			std::fprintf(stderr, "%s:%d: invariant broken: %s\n", __FILE__, __LINE__, #cond); \
			std::abort();                                                        \
		}                                                                            \
	} while (0)

namespace fuzz {

// The input's bytes from pos, n of them, zero-padded where it ends.
inline std::vector<uint8_t> take(const uint8_t *data, size_t size, size_t &pos, size_t n)
{
	std::vector<uint8_t> out(n, 0);
	if (pos < size)
		std::memcpy(out.data(), data + pos, std::min(n, size - pos));
	pos += n;
	return out;
}

} // namespace fuzz
