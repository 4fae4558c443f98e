#!/bin/sh
# Installs every Debian package dm-ckpt needs to build, test and benchmark.
# Idempotent: packages already installed are not touched, so it is cheap to run
# before every build.
set -eu

PACKAGES="
build-essential cmake pkg-config
liburing-dev libblkid-dev libcli11-dev libfmt-dev nlohmann-json3-dev
libgtest-dev libgmock-dev libbenchmark-dev
libdevmapper-dev libnvme-dev
python3 python3-numpy python3-torch python3-matplotlib python3-tqdm
libjemalloc2 fio
linux-image-amd64 linux-headers-amd64
linux-image-6.12-amd64 linux-headers-6.12-amd64
linux-source-6.1 dkms
qemu-system-x86 busybox-static dmsetup cpio kmod xz-utils
systemd
clang libclang-rt-14-dev
"

missing=""
for p in $PACKAGES; do
	if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
		missing="$missing $p"
	fi
done

if [ -z "$missing" ]; then
	echo "deps: all packages present"
	exit 0
fi
if [ "$(id -u)" -ne 0 ]; then
	echo "deps: missing packages:$missing" >&2
	echo "deps: run as root (or: sudo $0)" >&2
	exit 1
fi
echo "deps: installing$missing"
export DEBIAN_FRONTEND=noninteractive
apt-get update -q
# shellcheck disable=SC2086
apt-get install -y -q --no-install-recommends $missing
