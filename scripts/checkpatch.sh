#!/bin/sh
# The kernel's checkpatch.pl over the module and the core it compiles.
# Debian ships checkpatch only inside linux-source-6.1's tarball: the script
# and the data files it reads are extracted once into BUILD/checkpatch.
#   scripts/checkpatch.sh [BUILD]
set -eu
top=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-$top/build}
tarball=/usr/src/linux-source-6.1.tar.xz
dir=$build/checkpatch
if [ ! -f "$dir/scripts/checkpatch.pl" ]; then
	[ -f "$tarball" ] || { echo "checkpatch: $tarball missing (scripts/deps.sh installs linux-source-6.1)" >&2; exit 1; }
	mkdir -p "$dir"
	tar -xJf "$tarball" -C "$dir" --strip-components=1 \
		linux-source-6.1/scripts/checkpatch.pl \
		linux-source-6.1/scripts/spelling.txt \
		linux-source-6.1/scripts/const_structs.checkpatch
fi
cd "$top"
# --no-tree: an out-of-tree module. --strict's CHECKs are printed, not
# counted: they flag user-visible strings kept on one line (kernel style) and
# shifts that are counts, not bits. The core's _Static_assert trips the
# CamelCase check, which cannot know it is a C11 keyword. ckpt_platform.h is
# not checked: beyond its kernel includes it is the userspace shim that spells
# out what the kernel's headers provide.
out=$(perl "$dir/scripts/checkpatch.pl" --no-tree --strict --show-types --ignore CAMELCASE \
	-f kmod/dm-ckpt-target.c kmod/dm-ckpt-io.h kmod/dm-ckpt-metadata.c kmod/dm-ckpt-metadata.h \
	kmod/dm-ckpt-update.c kmod/dm-ckpt-update.h \
	kmod/dm-ckpt-fpu-sse2.c kmod/dm-ckpt-fpu-avx2.c kmod/dm-ckpt-fpu-avx512.c \
	libckpt/core/ckpt_codec.c libckpt/core/ckpt_codec.h libckpt/core/ckpt_sm.c \
	libckpt/core/ckpt_status_line.c libckpt/core/ckpt_step.c libckpt/core/ckpt_range.c \
	libckpt/core/ckpt_route.c libckpt/core/ckpt_load.c libckpt/core/ckpt_rollback.c \
	libckpt/core/ckpt_step_impl.h \
	libckpt/core/ckpt_chunk.c libckpt/core/ckpt_update_builds.c \
	libckpt/core/ckpt_update_builds.h libckpt/core/ckpt_step.h libckpt/core/ckpt_update.h \
	libckpt/core/ckpt_update_impl.h \
	libckpt/core/ckpt_q8_tables.h libckpt/core/ckpt_q8_tables.c) || true
# ckpt_abi.h is X-macro lists: each list and each expander is a bare
# sequence by design, which COMPLEX_MACRO cannot tell from a badly wrapped
# expression, and the expanders that declare or copy a struct's members end
# in ';' (one member or assignment per list entry, as bcachefs's x() do), so
# those checks alone are off for this file.
out="$out
$(perl "$dir/scripts/checkpatch.pl" --no-tree --strict --show-types \
	--ignore CAMELCASE,COMPLEX_MACRO,TRAILING_SEMICOLON,MULTISTATEMENT_MACRO_USE_DO_WHILE \
	-f libckpt/core/ckpt_abi.h)" || true
echo "$out"
bad=$(echo "$out" | grep -cE '^(ERROR|WARNING):' || true)
echo "checkpatch: $bad errors and warnings"
[ "$bad" -eq 0 ]
