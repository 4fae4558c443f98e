#!/bin/sh
# Installs the Debian packages dm-ckpt needs.
#   scripts/deps.sh              everything: build, test, benchmark, the kernel
#                                target in VMs, the aarch64 cross build, and
#                                the torch 2 virtual environment of
#                                requirements.txt (scripts/venv.sh) (make check)
#   scripts/deps.sh --userspace  the library, tools, Python package and their
#                                tests and install (make demo): no kernels,
#                                no qemu, no fuzzing toolchain
#   scripts/deps.sh --kernel-debug  everything, and what make kernel-debug
#                                needs to build a kernel from Debian's
#                                linux-source-6.12
# Idempotent: packages already installed are not touched, so it is cheap to run
# before every build.
set -eu

USERSPACE="
build-essential cmake pkg-config
liburing-dev libblkid-dev libcli11-dev libfmt-dev nlohmann-json3-dev libisal-dev
libgtest-dev libgmock-dev libbenchmark-dev
libdevmapper-dev libnvme-dev
python3 python3-numpy python3-torch python3-matplotlib python3-tqdm
python3-pip python3-venv python3-setuptools python3-wheel python3-docutils
libjemalloc2 fio linux-perf
"
# make check also: the kernels the module is built and tested against, qemu and
# the VM tools, DKMS, the fuzzing toolchain, Python's headers and libaio's
# (DeepSpeed in the torch 2 venv compiles its ops, torch extensions: CPU Adam
# and the async I/O that ZeRO-Infinity swaps with, the benchmark's contender),
# Prometheus' own parser of the text format the status metrics are checked with,
# nvme-cli (the DH-HMAC-CHAP keys of ckptctl serve, in the NVMe-oF VM test)
CHECK="
linux-image-amd64 linux-headers-amd64
linux-image-6.12-amd64 linux-headers-6.12-amd64
linux-source-6.1 dkms
qemu-system-x86 busybox-static dmsetup cpio kmod xz-utils nvme-cli
systemd
clang libclang-rt-14-dev
python3-dev libaio-dev
python3-prometheus-client
"
# make kernel-debug (scripts/vm/kdebug.sh): a 6.12 kernel with KASAN and lockdep
KDEBUG_PACKAGES="linux-source-6.12 flex bison bc libelf-dev libssl-dev"
# The aarch64 cross build: Debian's cross toolchain and qemu-user, and the
# arm64 -dev packages of the libraries through multiarch (dpkg architecture
# arm64, added below); CLI11 and nlohmann-json are headers (Architecture: all).
# libnvme-dev and libisal-dev are not Multi-Arch: same in Debian 12
# (installing their arm64 builds would remove the host's), so ckptctl's NVMe
# code is left out of the cross build (tools/CMakeLists.txt) and its crc32c
# is the project's own (libckpt/src/crc32c.c); a native aarch64 build has both.
AARCH64_PACKAGES="
gcc-aarch64-linux-gnu g++-aarch64-linux-gnu qemu-user
libc6:arm64 libstdc++6:arm64
liburing-dev:arm64 libblkid-dev:arm64 libfmt-dev:arm64 libgtest-dev:arm64 libdevmapper-dev:arm64
"
aarch64=1
venv=1
case "${1:-}" in
--userspace) PACKAGES=$USERSPACE; aarch64=0; venv=0 ;;
"") PACKAGES="$USERSPACE $CHECK $AARCH64_PACKAGES" ;;
--kernel-debug) PACKAGES="$USERSPACE $CHECK $AARCH64_PACKAGES $KDEBUG_PACKAGES" ;;
*) echo "usage: $0 [--userspace | --kernel-debug]" >&2; exit 2 ;;
esac

missing=""
for p in $PACKAGES; do
	if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
		missing="$missing $p"
	fi
done

if [ -z "$missing" ]; then
	echo "deps: all packages present"
elif [ "$(id -u)" -ne 0 ]; then
	echo "deps: missing packages:$missing" >&2
	echo "deps: run as root (or: sudo $0)" >&2
	exit 1
else
	echo "deps: installing$missing"
	export DEBIAN_FRONTEND=noninteractive
	if [ $aarch64 = 1 ] && ! dpkg --print-foreign-architectures | grep -qx arm64; then
		dpkg --add-architecture arm64
	fi
	apt-get update -q
	# shellcheck disable=SC2086
	apt-get install -y -q --no-install-recommends $missing
fi

[ $venv = 0 ] || "$(dirname "$0")/venv.sh"
