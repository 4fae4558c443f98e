#!/bin/sh
# Guest side of the byte-identity check (scripts/vm/tests.sh): map the
# pre-formatted /dev/nvme0n1 through dm-ckpt and replay the seeded trace on
# /dev/mapper/ckpt. Usage: byte-identity.sh [--stripe WAYS:CHUNK] STEPS
# ROLLBACK_EVERY [SEED]. With --stripe the image lies over namespaces 1 to
# WAYS (the drives of the engine's stripe set) and dm-ckpt goes over a
# dm-stripe of them (CHUNK sectors per stripe), as over several NVMe drives.
# The trace's output goes to /out/trace.txt for the host to diff.
stripe=""
if [ "${1:-}" = --stripe ]; then stripe=$2; shift 2; fi
steps=${1:?steps}
rollback_every=${2:?rollback_every}
seed=${3:-}
fail() { echo "byte-identity: FAIL: $*"; dmesg >/out/dmesg.txt; exit 1; }

backing=/dev/nvme0n1
if [ -n "$stripe" ]; then
	ways=${stripe%%:*} chunk=${stripe#*:} devs="" per=""
	for n in $(seq 1 "$ways"); do
		# by nsid and device numbers: the kernel names namespaces in the
		# order their scans end, and /dev/nvme0nN need not be that name's
		dev=""
		for b in /sys/block/nvme*n*; do
			case ${b##*/} in nvme*c*) continue ;; esac	# a multipath path
			[ "$(cat "$b/nsid" 2>/dev/null)" = "$n" ] || continue
			dev=/dev/ckpt-ns$n
			[ -b "$dev" ] || mknod "$dev" b $(tr : ' ' <"$b/dev")
		done
		[ -b "$dev" ] || fail "no namespace $n"
		sectors=$(blockdev --getsz "$dev")
		[ -z "$per" ] || [ "$sectors" -ge "$per" ] || per=$sectors
		[ -n "$per" ] || per=$sectors
		devs="$devs $dev 0"
	done
	per=$((per / chunk * chunk))
	echo "byte-identity: stripe: 0 $((per * ways)) striped $ways $chunk$devs"
	dmsetup create stripe --noudevsync --table "0 $((per * ways)) striped $ways $chunk$devs" ||
		fail "dmsetup create stripe failed"
	dmsetup mknodes stripe
	backing=/dev/mapper/stripe
fi
table=$(ckptctl info --table $backing) || fail "ckptctl info --table $backing failed (exit $?)"
[ -n "$table" ] || fail "ckptctl info --table printed nothing"
echo "byte-identity: table: $table"
echo "$table" >/out/table.txt
dmsetup create ckpt --noudevsync --table "$table" || fail "dmsetup create failed"
dmsetup mknodes ckpt
[ -b /dev/mapper/ckpt ] || fail "/dev/mapper/ckpt missing after dmsetup create"
dmsetup table ckpt
start=$(cut -d' ' -f1 /proc/uptime)
cpu0=$(head -1 /proc/stat)
ckpt-trace /dev/mapper/ckpt --steps "$steps" --rollback-every "$rollback_every" ${seed:+--seed "$seed"} >/out/trace.txt 2>/out/trace.err
rc=$?
end=$(cut -d' ' -f1 /proc/uptime)
cpu1=$(head -1 /proc/stat)
tail -n 3 /out/trace.txt
# where the time went (all CPUs, in seconds): user is mostly ckpt-trace's own
# work (trace generation, CRCs), system mostly dm-ckpt's kworkers
echo "$cpu0
$cpu1" | awk '{ for (i = 2; i <= 8; i++) v[NR, i] = $i }
	END { hz = 100; printf "byte-identity: guest cpu time: user %.1f s, system %.1f s, softirq %.1f s, idle %.1f s, iowait %.1f s\n",
		(v[2,2] + v[2,3] - v[1,2] - v[1,3]) / hz, (v[2,4] - v[1,4]) / hz, (v[2,8] - v[1,8]) / hz,
		(v[2,5] - v[1,5]) / hz, (v[2,6] - v[1,6]) / hz }'
cat /out/trace.err
echo "byte-identity: ckpt-trace exit $rc, $(awk -v a="$start" -v b="$end" 'BEGIN { printf "%.1f", b - a }') s"
dmsetup status ckpt
dmsetup remove --noudevsync ckpt || fail "dmsetup remove failed"
[ -z "$stripe" ] || dmsetup remove --noudevsync stripe || fail "dmsetup remove stripe failed"
sync
echo 3 >/proc/sys/vm/drop_caches
dmesg >/out/dmesg.txt
[ $rc = 0 ] || fail "ckpt-trace on /dev/mapper/ckpt exited $rc"
