// SPDX-License-Identifier: MIT
// Progress of the long operations (format, import, export, verify), to the
// hook the calling thread set with ckpt_set_progress (ckpt.h); nothing when
// it set none.
#pragma once

#include <cstdint>

namespace ckpt {

void progress(const char *what, uint64_t done, uint64_t total);

} // namespace ckpt
