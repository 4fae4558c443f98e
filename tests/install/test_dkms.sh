#!/bin/sh
# SPDX-License-Identifier: MIT
# DKMS builds dm-ckpt.ko from the package source that dkms.conf describes, in
# a scratch DKMS tree (--sourcetree/--dkmstree/--installtree: nothing under
# /usr/src, /var/lib/dkms or /lib/modules is touched), for each kernel given
# (default: the newest with headers installed), and the module carries the
# VERSION file's version. The scratch tree is removed afterwards.
#   test_dkms.sh [KVER...]
set -u
top=$(cd "$(dirname "$0")/../.." && pwd)
n=0; failed=0
ok() { n=$((n + 1)); d=$1; shift; if "$@"; then echo "ok $n - $d"; else echo "not ok $n - $d"; failed=1; fi; }
bail() { echo "Bail out! $*"; exit 1; }

command -v dkms >/dev/null || bail "dkms not installed (scripts/deps.sh installs it)"
command -v modinfo >/dev/null || bail "modinfo not installed (package kmod)"
version=$(cat "$top/VERSION")
[ -n "$version" ] || bail "$top/VERSION is empty"
if [ $# -eq 0 ]; then
	h=$(ls -d /usr/src/linux-headers-*-amd64 2>/dev/null | sort -V | tail -n 1)
	[ -n "$h" ] || bail "no /usr/src/linux-headers-*-amd64 installed"
	set -- "${h#/usr/src/linux-headers-}"
fi

scratch=$(mktemp -d "${TMPDIR:-/tmp}/ckpt-dkms.XXXXXX") || bail "mktemp"
trap 'rm -rf "$scratch"' EXIT INT TERM
src="$scratch/src/dm-ckpt-$version"
mkdir -p "$src" "$scratch/dkms" "$scratch/modules"
# the package source: what git tracks of the files DKMS builds from
(cd "$top" && tar -cf - --exclude='*.o' --exclude='.*.cmd' --exclude='*.ko' \
	--exclude='ckpt_config.h' dkms.conf VERSION kmod libckpt/core) | (cd "$src" && tar -xf -) || bail "copying the source"

# every dkms command in the scratch tree, its output in $scratch/dkms.log
dk() {
	dkms "$@" --sourcetree "$scratch/src" --dkmstree "$scratch/dkms" \
		--installtree "$scratch/modules" >>"$scratch/dkms.log" 2>&1
}

ok "dkms.conf's PACKAGE_VERSION is VERSION's ($version)" \
	grep -qx "PACKAGE_VERSION=\"$version\"" "$top/dkms.conf"
ok "dkms add dm-ckpt/$version" dk add -m dm-ckpt -v "$version"
for kver in "$@"; do
	if ! dk build -m dm-ckpt -v "$version" -k "$kver"; then
		ok "dkms build for $kver" false
		sed 's/^/# /' "$scratch/dkms.log"
		find "$scratch/dkms" -name make.log -exec sed 's/^/# /' {} \;
		continue
	fi
	ok "dkms build for $kver" true
	ko=$(find "$scratch/dkms/dm-ckpt/$version/$kver" -name 'dm-ckpt.ko*' | head -n 1)
	ok "dm-ckpt.ko built for $kver" test -n "$ko"
	ok "its vermagic is $kver" sh -c '[ "$(modinfo -F vermagic "$1" | cut -d" " -f1)" = "$2" ]' sh "$ko" "$kver"
	ok "its version is $version" sh -c '[ "$(modinfo -F version "$1")" = "$2" ]' sh "$ko" "$version"
done
ok "dkms remove" dk remove -m dm-ckpt -v "$version" --all
echo "1..$n"
exit $failed
