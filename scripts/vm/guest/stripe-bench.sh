#!/bin/sh
# Guest side of scripts/vm/stripe-bench.sh: namespaces 1 to 4, each throttled
# to the same bandwidth by qemu; for WAYS in 1, 2, 4 a dm-stripe over the first
# WAYS of them (CHUNK sectors a stripe), an image of PARAMS params formatted on
# it, then STEPS steps of ckpt-trace through the kernel target over it and
# STEPS on the engine over its own stripe set of the same namespaces (ckptctl
# stripe: the same layout). Writes /out/times: "WAYS kernel|user T0 T1".
# Usage: stripe-bench.sh PARAMS STEPS CHUNK
params=$1 steps=$2 chunk=$3
fail() { echo "stripe-bench: FAIL: $*"; dmesg >/out/dmesg.txt; exit 1; }
up() { cut -d' ' -f1 /proc/uptime; }
ns() { # NSID: a node of its block device (by device numbers: the kernel names
	# namespaces in the order their scans end, /dev/nvme0nN need not be that name's)
	for b in /sys/block/nvme*n*; do
		case ${b##*/} in nvme*c*) continue ;; esac
		[ "$(cat "$b/nsid" 2>/dev/null)" = "$1" ] || continue
		[ -b "/dev/ckpt-ns$1" ] || mknod "/dev/ckpt-ns$1" b $(tr : ' ' <"$b/dev")
		echo "/dev/ckpt-ns$1"
		return
	done
}

for ways in 1 2 4; do
	devs="" per=""
	drives=""
	for n in $(seq 1 $ways); do
		dev=$(ns "$n")
		[ -b "$dev" ] || fail "no namespace $n"
		sectors=$(blockdev --getsz "$dev")
		{ [ -n "$per" ] && [ "$per" -le "$sectors" ]; } || per=$sectors
		devs="$devs $dev 0"
		drives="$drives $dev"
	done
	per=$((per / chunk * chunk))
	dmsetup create stripe --noudevsync --table "0 $((per * ways)) striped $ways $chunk$devs" ||
		fail "dmsetup create stripe ($ways ways) failed"
	dmsetup mknodes stripe
	ckpt-trace /dev/mapper/stripe --format --force --params "$params" --steps 0 >/out/format-$ways.txt 2>&1 ||
		fail "ckpt-trace --format on $ways ways: $(tail -1 /out/format-$ways.txt)"
	table=$(ckptctl info --table /dev/mapper/stripe) || fail "ckptctl info --table failed"
	dmsetup create ckpt --noudevsync --table "$table" || fail "dmsetup create ckpt failed"
	dmsetup mknodes ckpt
	echo "stripe-bench: $ways ways, kernel target"
	t0=$(up)
	ckpt-trace /dev/mapper/ckpt --steps "$steps" >/out/kernel-$ways.trace 2>&1 ||
		fail "ckpt-trace on the kernel target, $ways ways: $(tail -1 /out/kernel-$ways.trace)"
	echo "$ways kernel $t0 $(up)" >>/out/times
	dmsetup remove --noudevsync ckpt || fail "dmsetup remove ckpt failed"
	dmsetup remove --noudevsync stripe || fail "dmsetup remove stripe failed"
	echo "stripe-bench: $ways ways, userspace engine"
	# shellcheck disable=SC2086
	ckptctl stripe /tmp/set$ways.stripe $drives --stripe-kib $((chunk / 2)) >/dev/null ||
		fail "ckptctl stripe over$drives failed"
	t0=$(up)
	ckpt-trace /tmp/set$ways.stripe --steps "$steps" >/out/user-$ways.trace 2>&1 ||
		fail "ckpt-trace on the engine, $ways ways: $(tail -1 /out/user-$ways.trace)"
	echo "$ways user $t0 $(up)" >>/out/times
done
echo "stripe-bench: done"
