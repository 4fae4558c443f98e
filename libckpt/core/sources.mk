# SPDX-License-Identifier: GPL-2.0 OR MIT
# The core's sources, one list read by kmod/Kbuild (included) and by
# libckpt/CMakeLists.txt and tests/fuzz/CMakeLists.txt (parsed): what both
# targets compile. The update loop is each host's build of ckpt_update_impl.h:
# ckpt_update.c in userspace (target_clones), kmod/dm-ckpt-fpu-*.c in the
# kernel.
CKPT_CORE_SOURCES := ckpt_format.c ckpt_step.c ckpt_chunk.c ckpt_table.c ckpt_q8_tables.c
