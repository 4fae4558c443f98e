#!/bin/bash
# Build dm-ckpt.ko for each kernel (default: every installed kernel with
# headers) with `make -C kmod KVER=...` and keep a copy per kernel in
# build/kmod/KVER/dm-ckpt.ko, where scripts/vm/run looks first (kmod/dm-ckpt.ko
# is overwritten by the next kernel's build).
#
#   scripts/vm/build-kmod.sh [6.1|6.12|FULL-VERSION|DIR ...]
#
# DIR: a kernel build directory (make kernel-debug's build/kdebug/HASH); the
# module builds against its O= tree, DIR/obj.
set -euo pipefail
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
# All of the script is one compound command, parsed before it runs: editing
# the file while a run is under way cannot derail that run.
{

[ -f "$ROOT/kmod/Makefile" ] || die "kmod/Makefile missing: the kernel module is not in the tree"
declare -A kdir=()
if [ $# -gt 0 ]; then
	kvers=""
	for k in "$@"; do
		v=$(resolve_kernel "$k") || die "no installed kernel matches '$k'"
		if is_kernel_dir "$k"; then
			[ -f "$k/obj/Makefile" ] || die "$k has no kernel build tree (obj/)"
			kdir[$v]=$(realpath "$k/obj")
		fi
		kvers="$kvers $v"
	done
else
	kvers=$(installed_kernels)
	[ -n "$kvers" ] || die "no kernel with image, modules and headers in /lib/modules"
fi

mkdir -p "$BUILD_DIR/kmod"
# one build at a time in kmod/ (make check-vm and bench-vm may overlap)
exec 9>"$BUILD_DIR/kmod/.lock"
flock 9
# A module whose sources, kernel tree and make options have not changed
# since its last build is not built again: kmod/ is one in-place tree for
# every kernel (Kbuild), so each build redoes the whole module, ~25 s per
# kernel, and make check asks for it before each of its VM parts.
# sources_id KVER: a hash of all of those
sources_id() {
	local tree=${kdir[$1]:-/lib/modules/$1/build}
	{
		echo "$1 $tree"
		cat "$tree/.config" 2>/dev/null
		find "$ROOT/kmod" "$ROOT/libckpt/core" -type f \( -name '*.[ch]' -o -name Kbuild -o -name '*.mk' -o \
			-name Makefile -o -name configure \) ! -name '*.mod.c' ! -name ckpt_config.h -print0 |
			sort -z | xargs -0 cat
		cat "$ROOT/VERSION"
	} | sha256sum | cut -d' ' -f1
}
for v in $kvers; do
	id=$(sources_id "$v")
	if [ -f "$BUILD_DIR/kmod/$v/dm-ckpt.ko" ] && [ "$(cat "$BUILD_DIR/kmod/$v/sources" 2>/dev/null)" = "$id" ]; then
		echo "build-kmod: $BUILD_DIR/kmod/$v/dm-ckpt.ko is up to date"
		continue
	fi
	if [ -n "${kdir[$v]:-}" ]; then
		echo "build-kmod: dm-ckpt.ko for $v (${kdir[$v]})"
		make -C "$ROOT/kmod" KVER="$v" KDIR="${kdir[$v]}"
	else
		[ -e "/lib/modules/$v/build/Makefile" ] || die "no headers for $v (/lib/modules/$v/build)"
		echo "build-kmod: dm-ckpt.ko for $v"
		make -C "$ROOT/kmod" KVER="$v"
	fi
	ko=$ROOT/kmod/dm-ckpt.ko
	[ -f "$ko" ] || die "make -C kmod KVER=$v made no kmod/dm-ckpt.ko"
	got=$(modinfo -F vermagic "$ko" | awk '{print $1}')
	[ "$got" = "$v" ] || die "kmod/dm-ckpt.ko has vermagic '$got' after building for $v"
	mkdir -p "$BUILD_DIR/kmod/$v"
	cp "$ko" "$BUILD_DIR/kmod/$v/dm-ckpt.ko.tmp"
	mv "$BUILD_DIR/kmod/$v/dm-ckpt.ko.tmp" "$BUILD_DIR/kmod/$v/dm-ckpt.ko"
	echo "$id" >"$BUILD_DIR/kmod/$v/sources"
	echo "build-kmod: $BUILD_DIR/kmod/$v/dm-ckpt.ko"
done
exit
}
