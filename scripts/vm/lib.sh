# shellcheck shell=bash
# Shared helpers of the VM scripts (sourced by run, tests.sh, bench.sh,
# build-kmod.sh). Bash only.

VM_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(cd "$VM_DIR/../.." && pwd)
BUILD=${BUILD:-build}
case $BUILD in /*) BUILD_DIR=$BUILD ;; *) BUILD_DIR=$ROOT/$BUILD ;; esac
VM_CACHE=$BUILD_DIR/vm

# Modules every guest loads, in this order (dependencies and soft
# dependencies are resolved with `modprobe --show-depends` for the kernel).
# The first group is required; the rest are for fault tests and only warned
# about if they fail to load.
VM_REQUIRED_MODULES="nvme dm-mod"
VM_OPTIONAL_MODULES="dm-flakey dm-log-writes dm-delay dm-thin-pool"
# The output disk (--out) is virtio-blk, /dev/vda: a second NVMe namespace or
# controller would race the first for the name nvme0n1 (6.12 scans async).
VM_OUT_MODULES="virtio_pci virtio_blk"
# --hostfs: the host's / over virtio-9p (netfs/fscache come as dependencies;
# a kernel that builds them in, like make kernel-debug's, loads none)
VM_HOSTFS_MODULES="virtio_pci 9pnet_virtio 9p"
# --nvmeof: the kernel's NVMe-oF target and host over TCP (configfs is
# mounted at /sys/kernel/config by /init)
VM_NVMEOF_MODULES="configfs nvmet nvmet-tcp nvme-tcp"
# --net: a virtio-net interface (eth0) to another guest
VM_NET_MODULES="virtio_pci virtio_net"

die() { echo "vm: error: $*" >&2; exit 2; }
note() { echo "vm: $*" >&2; }

# A kernel is Debian's (6.1, 6.12 or a full version from /lib/modules, booted
# from /boot) or a kernel build directory like make kernel-debug's
# (build/kdebug/HASH): DIR/bzImage, DIR/kernelrelease (its version) and
# DIR/root/lib/modules/VERSION (modules.dep, modules.builtin and any .ko, as
# `make modules_install INSTALL_MOD_PATH=DIR/root` leaves them).
is_kernel_dir() {
	[ -d "$1" ] && [ -f "$1/bzImage" ] && [ -f "$1/kernelrelease" ] && [ -d "$1/root/lib/modules" ]
}

# Root directory of the modules of such a kernel (modprobe -d); empty for
# Debian's. Set by use_kernel.
MODPROBE_ROOT=""

# use_kernel SPEC -> sets KVER, VMLINUZ and MODPROBE_ROOT for SPEC (one of
# the two kinds above); fails if there is no such kernel.
use_kernel() {
	if is_kernel_dir "$1"; then
		KVER=$(cat "$1/kernelrelease")
		VMLINUZ=$(realpath "$1/bzImage")
		MODPROBE_ROOT=$(realpath "$1/root")
		[ -d "$MODPROBE_ROOT/lib/modules/$KVER" ] || return 1
	else
		KVER=$(resolve_kernel "$1") || return 1
		VMLINUZ=/boot/vmlinuz-$KVER
		MODPROBE_ROOT=""
	fi
}

# kernel_label SPEC -> a short name for logs and result directories
kernel_label() {
	if is_kernel_dir "$1"; then echo "$(basename "$(dirname "$(realpath "$1")")")-$(basename "$1")"; else echo "$1"; fi
}

# resolve_kernel 6.1|6.12|FULL-VERSION|DIR -> prints the full version (e.g.
# 6.1.0-57-amd64), the newest installed one that matches.
resolve_kernel() {
	local want=$1 v best=""
	if is_kernel_dir "$want"; then
		cat "$want/kernelrelease"; return 0
	fi
	if [ -e "/boot/vmlinuz-$want" ] && [ -d "/lib/modules/$want/kernel" ]; then
		echo "$want"; return 0
	fi
	for v in $(ls /lib/modules 2>/dev/null | sort -V); do
		case $v in "$want".*|"$want"-*) ;; *) continue ;; esac
		[ -e "/boot/vmlinuz-$v" ] && [ -d "/lib/modules/$v/kernel" ] && best=$v
	done
	[ -n "$best" ] || return 1
	echo "$best"
}

# installed_kernels: full versions with an image, modules and headers.
installed_kernels() {
	local v
	for v in $(ls /lib/modules 2>/dev/null | sort -V); do
		[ -e "/boot/vmlinuz-$v" ] && [ -d "/lib/modules/$v/kernel" ] &&
			[ -e "/lib/modules/$v/build/Makefile" ] && echo "$v"
	done
}

# The place of a host file in the guest: the guest has merged /usr like
# Debian 12 (/lib -> usr/lib ...), so files go under /usr.
guest_path() {
	case $1 in
	/lib/*|/lib64/*|/bin/*|/sbin/*) echo "/usr$1" ;;
	*) echo "$1" ;;
	esac
}

# ldd_libs FILE... -> the shared libraries (and the loader) they need, one
# path a line, as ldd resolves them on this host.
ldd_libs() {
	local f
	for f in "$@"; do
		# static binaries: ldd says "not a dynamic executable" (exit 1)
		LC_ALL=C ldd "$f" 2>/dev/null | awk '
			/=> not found/ { print "NOTFOUND " $1; next }
			/=>/ && $3 ~ /^\// { print $3; next }
			$1 ~ /^\// { print $1 }'
	done | sort -u
}

# spec_lib LIBPATH -> a cpio spec line for a library. Libraries outside the
# standard directories (the project's build tree) go to the multiarch dir.
spec_lib() {
	local l=$1
	case $l in
	NOTFOUND*) die "library ${l#NOTFOUND } not found by ldd (is the build complete?)" ;;
	/lib/*|/lib64/*|/usr/lib/*|/usr/lib64/*) echo "file $(guest_path "$l") $l" ;;
	*) echo "file /usr/lib/x86_64-linux-gnu/$(basename "$l") $l" ;;
	esac
}

# module_order KVER MOD... -> .ko paths on the host, dependencies first,
# each once. Built-in modules are skipped.
module_order() {
	local kver=$1; shift
	local m
	for m in "$@"; do
		modprobe ${MODPROBE_ROOT:+-d "$MODPROBE_ROOT"} -S "$kver" --show-depends "$m" 2>/dev/null ||
			die "module $m not found for kernel $kver"
	done | awk '$1 == "insmod" && !seen[$2]++ { print $2 }'
}

# module_file KVER HOSTKO -> a plain .ko (compressed modules are unpacked into
# the cache once; busybox insmod cannot read .ko.xz).
module_file() {
	local kver=$1 ko=$2 out
	case $ko in
	*.ko) echo "$ko" ;;
	*.ko.xz|*.ko.zst|*.ko.gz)
		out=$VM_CACHE/$kver/modules/$(basename "${ko%.*}")
		if [ ! -e "$out" ] || [ "$ko" -nt "$out" ]; then
			mkdir -p "$(dirname "$out")"
			case $ko in
			*.xz) xz -dc "$ko" >"$out.tmp" ;;
			*.zst) zstd -qdc "$ko" >"$out.tmp" ;;
			*.gz) gzip -dc "$ko" >"$out.tmp" ;;
			esac || die "cannot decompress $ko"
			mv "$out.tmp" "$out"
		fi
		echo "$out" ;;
	*) die "unknown module file $ko" ;;
	esac
}

# ko_name FILE -> module name as the guest's insmod list shows it
ko_name() { basename "$1" | sed -e 's/\.ko.*$//'; }

# find_ckpt_module KVER -> path of a dm-ckpt.ko built for KVER, or nothing.
find_ckpt_module() {
	local kver=$1 f
	for f in "$BUILD_DIR/kmod/$kver/dm-ckpt.ko" "$ROOT/kmod/dm-ckpt.ko"; do
		[ -e "$f" ] || continue
		if [ "$(modinfo -F vermagic "$f" 2>/dev/null | awk '{print $1}')" = "$kver" ]; then
			echo "$f"; return 0
		fi
	done
	return 1
}

# trace_reference DIR PARAMS STEPS SEED: DIR/base.img, a backing image
# formatted for the seeded ckpt-trace at step 0, and DIR/ref/S.st for S in
# 0..STEPS: masters, moments, blob and step (ckptctl export --with-optimizer)
# after the trace's step S on the userspace engine, never interrupted. The
# crash tests compare every state they find with these.
trace_reference() {
	local dir=$1 params=$2 steps=$3 seed=$4 s
	local trace=$BUILD_DIR/tools/ckpt-trace ctl=$BUILD_DIR/tools/ckptctl
	mkdir -p "$dir/ref"
	"$trace" "$dir/base.img" --format --force --params "$params" --steps 0 --seed "$seed" >/dev/null || return 1
	cp "$dir/base.img" "$dir/ref.img"
	"$ctl" export --with-optimizer "$dir/ref.img" --to "$dir/ref/0.st" >/dev/null || return 1
	for ((s = 1; s <= steps; s++)); do
		"$trace" "$dir/ref.img" --steps 1 --seed "$seed" >/dev/null &&
			"$ctl" export --with-optimizer "$dir/ref.img" --to "$dir/ref/$s.st" >/dev/null || return 1
	done
	rm -f "$dir/ref.img"
}
