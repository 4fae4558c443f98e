#!/bin/bash
# Build the debug kernel of make kernel-debug: Debian's linux-source-6.12,
# `make tinyconfig` plus scripts/vm/kdebug.config (KASAN, lockdep, KFENCE,
# DEBUG_OBJECTS, DEBUG_ATOMIC_SLEEP, and the VM's devices and 9p built in),
# merged with the kernel's scripts/kconfig/merge_config.sh.
#
#   scripts/vm/kdebug.sh
#
# The kernel is cached in BUILD/kdebug/HASH/ (HASH: of the fragment and the
# source package's version), which holds
#   bzImage         the kernel scripts/vm/run boots (--kernel BUILD/kdebug/HASH)
#   kernelrelease   its `uname -r`: 6.12.N-kdebug-HASH
#   root/lib/modules/KVER   modules.builtin and modules.dep (modprobe -d root)
#   obj/            the O= build tree: the headers dm-ckpt.ko builds against
#                   (make -C kmod KDIR=BUILD/kdebug/HASH/obj)
# A finished build is not built again. A new HASH (a changed fragment) starts
# from a copy of the obj/ of the newest finished build of the same source,
# not from nothing: kbuild's fixdep dependencies on include/config/ rebuild
# only what the changed options touch (minutes for a few drivers; an option
# that common headers test, like CONFIG_NET, reaches nearly every object). The last line of output is the directory.
# KDEBUG_SRC_TAR: another linux-source tarball; KDEBUG_JOBS: make -j
# (default 2).
set -euo pipefail
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
{

SRC_TAR=${KDEBUG_SRC_TAR:-/usr/src/linux-source-6.12.tar.xz}
FRAGMENT=$VM_DIR/kdebug.config

[ -r "$SRC_TAR" ] || die "$SRC_TAR missing: install linux-source-6.12 (scripts/deps.sh --kernel-debug)"
for t in flex bison bc make gcc; do
	command -v $t >/dev/null || die "$t missing (scripts/deps.sh --kernel-debug)"
done
[ -e /usr/include/libelf.h ] || die "libelf-dev missing (scripts/deps.sh --kernel-debug)"
[ -e /usr/include/openssl/ssl.h ] || die "libssl-dev missing (scripts/deps.sh --kernel-debug)"

# the source's identity: its checksum (the package version is in the name of
# no file of it)
srcver=$(sha256sum <"$SRC_TAR" | cut -c1-12)
hash=$( { cat "$FRAGMENT"; echo "$srcver"; } | sha256sum | cut -c1-12)
top=$BUILD_DIR/kdebug
dir=$top/$hash
if [ -e "$dir/done" ]; then
	echo "kdebug: $(cat "$dir/kernelrelease") is built: $dir"
	echo "$dir"
	exit 0
fi

mkdir -p "$top"
exec 9>"$top/.lock"
flock 9
if [ -e "$dir/done" ]; then	# built while we waited for the lock
	echo "$dir"
	exit 0
fi

# the source, unpacked once per tarball
src=$top/src/$srcver
if [ ! -e "$src/done" ]; then
	note "kdebug: unpacking $SRC_TAR into $src"
	rm -rf "$src"
	mkdir -p "$src"
	tar -xf "$SRC_TAR" -C "$src" --strip-components=1
	touch "$src/done"
fi

t0=$SECONDS
obj=$dir/obj
mkdir -p "$dir"
if [ ! -e "$obj" ]; then
	# the newest finished build whose tree's Makefile names this source
	seed=""
	for d in "$top"/*/; do
		d=${d%/}
		[ -e "$d/done" ] || continue
		grep -qxF "include $src/Makefile" "$d/obj/Makefile" 2>/dev/null || continue
		if [ -z "$seed" ] || [ "$d/done" -nt "$seed/done" ]; then seed=$d; fi
	done
	if [ -n "$seed" ]; then
		note "kdebug: starting from a copy of $seed/obj"
		rm -rf "$obj.tmp"
		cp -a "$seed/obj" "$obj.tmp"
		# objtool's own build records absolute paths: left as they are,
		# it is rebuilt, and every object depends on its mtime
		grep -rlF --include="*.cmd" "$seed/obj" "$obj.tmp/tools" |
			xargs -r sed -i "s|$seed/obj|$obj|g"
		mv "$obj.tmp" "$obj"
	fi
fi
mkdir -p "$obj"
kmake() { nice -n 10 make -C "$src" O="$obj" ARCH=x86_64 "$@"; }
kmake -s tinyconfig
"$src/scripts/kconfig/merge_config.sh" -m -O "$obj" "$obj/.config" "$FRAGMENT" >"$dir/merge.log"
echo "CONFIG_LOCALVERSION=\"-kdebug-$hash\"" >>"$obj/.config"
kmake -s olddefconfig
# every line of the fragment must have survived olddefconfig (a dependency
# it lacks drops an option silently)
missing=""
while IFS= read -r line; do
	case $line in
	CONFIG_*=n) ! grep -q "^${line%=n}=" "$obj/.config" || missing="$missing $line" ;;
	CONFIG_*) grep -qxF -- "$line" "$obj/.config" || missing="$missing $line" ;;
	esac
done <"$FRAGMENT"
[ -z "$missing" ] || die "the kernel config lacks:$missing (see $obj/.config)"

kmake -j"${KDEBUG_JOBS:-2}" bzImage modules
rm -rf "$dir/root"
kmake -s INSTALL_MOD_PATH="$dir/root" modules_install
cp "$obj/arch/x86/boot/bzImage" "$dir/bzImage"
cp "$obj/include/config/kernel.release" "$dir/kernelrelease"
kver=$(cat "$dir/kernelrelease")
[ -e "$dir/root/lib/modules/$kver/modules.builtin" ] || die "modules_install made no $dir/root/lib/modules/$kver"
echo "$((SECONDS - t0))" >"$dir/build-seconds"
touch "$dir/done"
echo "kdebug: built $kver in $((SECONDS - t0)) s: $dir"
echo "$dir"
exit
}
