# SPDX-License-Identifier: GPL-2.0 OR MIT
# The core's sources, one list read by kmod/Kbuild (included) and by
# libckpt/CMakeLists.txt and tests/fuzz/CMakeLists.txt (parsed): what both
# targets compile (one line: CMake reads it). The update loop is each host's
# build of ckpt_update_impl.h, under the names of ckpt_update_builds.h:
# ckpt_update.c in userspace, kmod/dm-ckpt-fpu-*.c in the kernel.
CKPT_CORE_SOURCES := ckpt_codec.c ckpt_sm.c ckpt_status_line.c ckpt_step.c ckpt_range.c ckpt_route.c ckpt_load.c ckpt_rollback.c ckpt_chunk.c ckpt_table.c ckpt_q8_tables.c ckpt_update_builds.c
