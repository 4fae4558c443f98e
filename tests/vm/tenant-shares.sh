#!/bin/sh
# vm: once
# ckptctl tenant's bandwidth shares in the test VM. The tenant table gives
# the drive (/dev/nvme0n1) a model of 1 MB/s each way, and iocost holds
# the drive to it: to the jobs it is a drive of that bandwidth, which they
# saturate even on the emulated CPU. (qemu's own throttling does not make a
# drive of a bandwidth: its wait after each request leaves a job that reads
# and writes one chunk at a time most of it unused.) Job a trains through
# the kernel target; job b trains on the userspace engine and reads its own
# device flat out beside it (a job exporting its checkpoint as it trains).
# With equal weights each job's cgroup moves at least 40% of the drive's
# bytes, and job a keeps committing: its target's record I/O counts as its
# job's (charged to the cgroup of the gradient writes). Without the shares
# (every job in one cgroup) the readers take most of the drive (printed,
# for contrast).
#
#   scripts/vm/run [--kernel 6.1|6.12] tests/vm/tenant-shares.sh
# TAP output; the exit status is 0 when all passed, else 1.
set -u
drive=/dev/nvme0n1
bps=1000000
window=30
params=10000
TAP_OUT=/tmp/tenant-shares.out
. /ckpt/lib/tap.sh
cd /tmp || exit 1

dev=$(cat /sys/block/nvme0n1/dev)

ok "init with the drive's bandwidth" has "shares by iocost on a drive of $bps B/s" \
	ckptctl tenant init $drive --force --read-bps $bps --write-bps $bps
ok "... turns iocost on for the drive, with that model" sh -c \
	"grep -q '^$dev enable=1 ctrl=user' /sys/fs/cgroup/io.cost.qos &&
	 grep -q '^$dev ctrl=user model=linear rbps=$bps ' /sys/fs/cgroup/io.cost.model"
ok "create a (job1)" has "weight 100" ckptctl tenant create $drive a --size 50331648 --owner job1
ok "create b (job2), capped" has "weight 100, at most 100000000 B/s each way" \
	ckptctl tenant create $drive b --size 50331648 --owner job2 --max-bps 100000000
ok "each tenant's cgroup has its weight and cap on the drive" sh -c \
	"grep -qx '$dev 100' /sys/fs/cgroup/dm-ckpt/a/io.weight &&
	 grep -q '^$dev rbps=100000000 wbps=100000000' /sys/fs/cgroup/dm-ckpt/b/io.max"
fails_with "a weight out of range" any "" ckptctl tenant set $drive a --weight 0
ok "set a's weight" has "weight 300" ckptctl tenant set $drive a --weight 300
ok "... in its cgroup" grep -qx "$dev 300" /sys/fs/cgroup/dm-ckpt/a/io.weight
ok "set it back" has "weight 100" ckptctl tenant set $drive a --weight 100
ok "exec runs the job as its owner in its cgroup" sh -c \
	"[ \"\$(ckptctl tenant exec $drive b -- sh -c 'id -u; cat /proc/self/cgroup')\" = \"\$(printf '1002\n0::/dm-ckpt/b')\" ]"

ok "format a and b (10k params) and put the kernel target over a" sh -c \
	"ckpt-trace /dev/mapper/ckpt-tenant-a --format --force --params $params --steps 0 >/dev/null &&
	 ckpt-trace /dev/mapper/ckpt-tenant-b --format --force --params $params --steps 0 >/dev/null &&
	 ckptctl create ka /dev/mapper/ckpt-tenant-a >/dev/null && chown job1:job1 /dev/mapper/ka"

# moved TENANT: bytes read and written through its device (the block
# layer's own count, whoever is charged for them)
moved() {
	awk '{ print ($3 + $7) * 512 }' \
		/sys/dev/block/$(dmsetup info -c --noheadings -o major,minor --separator : ckpt-tenant-$1)/stat
}
# charged CGROUP KEY: KEY of its io.stat on the drive (rbytes, wbytes)
charged() {
	awk -v d="$dev" -v k="$2" '$1 == d { for (i = 2; i <= NF; i++) { split($i, kv, "=");
		if (kv[1] == k) s += kv[2] } } END { print s + 0 }' /sys/fs/cgroup/dm-ckpt/$1/io.stat
}
# contend LABEL [CGROUP]: both jobs for $window seconds, a on a fresh target
# (the last run's trainer was killed mid-step), each in its tenant's cgroup
# or all in CGROUP; sets share_a, share_b (% of the drive's bandwidth over
# the window), frac_a (% of the bytes both moved), steps_a (steps a
# committed), steps_b and written_a (bytes charged to a's cgroup as written)
contend() {
	ckptctl remove ka >/dev/null 2>&1
	ckptctl create ka /dev/mapper/ckpt-tenant-a >/dev/null && chown job1:job1 /dev/mapper/ka
	ckptctl tenant exec $drive a -- ckpt-trace /dev/mapper/ka --steps 100000 --seed 1 >/tmp/a.$1 2>&1 &
	pids=$!
	ckptctl tenant exec $drive b -- ckpt-trace /dev/mapper/ckpt-tenant-b --steps 100000 --seed 2 >/tmp/b.$1 2>&1 &
	pids="$pids $!"
	ckptctl tenant exec $drive b -- sh -c 'while :; do
		dd if=/dev/mapper/ckpt-tenant-b of=/dev/null bs=256k iflag=direct 2>/dev/null
	done' &
	pids="$pids $!"
	sleep 1
	if [ $# -gt 1 ]; then
		mkdir -p /sys/fs/cgroup/dm-ckpt/$2
		for p in $(cat /sys/fs/cgroup/dm-ckpt/a/cgroup.procs /sys/fs/cgroup/dm-ckpt/b/cgroup.procs); do
			echo $p >/sys/fs/cgroup/dm-ckpt/$2/cgroup.procs
		done
	fi
	sleep 4
	a0=$(moved a) b0=$(moved b) ca0=$(committed) wa0=$(charged a wbytes) cb0=$(committed_b)
	sleep $window
	a1=$(moved a) b1=$(moved b) ca1=$(committed) wa1=$(charged a wbytes) cb1=$(committed_b)
	kill -9 $pids 2>/dev/null
	wait 2>/dev/null
	share_a=$(( (a1 - a0) * 100 / (bps * window) )) share_b=$(( (b1 - b0) * 100 / (bps * window) ))
	frac_a=$(( (a1 - a0) * 100 / (a1 - a0 + b1 - b0 + 1) )) steps_a=$((ca1 - ca0)) written_a=$((wa1 - wa0))
	steps_b=$((cb1 - cb0))
	echo "# $1: a moved $((a1 - a0)) bytes ($share_a% of the drive's bandwidth, $frac_a% of the bytes moved), $steps_a steps; b $((b1 - b0)) bytes ($share_b%), $steps_b steps"
	[ "$steps_a" -gt 0 ] || sed 's/^/# a: /' /tmp/a.$1 | tail -3
}
committed() { ckptctl status ka | sed -n 's/.*committed step \([0-9]*\).*/\1/p'; }
# the engine's, from its superblock (a killed trainer's stdout is lost)
committed_b() { ckptctl info /dev/mapper/ckpt-tenant-b | sed -n 's/^ *committed step *\([0-9]*\).*/\1/p'; }

contend shares
ok "job a (kernel target) moved at least 40% of the drive's bytes" [ "$share_a" -ge 40 ]
ok "job b (engine and a reader) moved at least 40%" [ "$share_b" -ge 40 ]
ok "both jobs committed steps meanwhile" [ "$steps_a" -ge 1 -a "$steps_b" -ge 1 ]
# each step writes every chunk's state record (12 B a param) from the
# target's workers: charged to job a, not to the root cgroup
ok "the target's record writes are job a's" [ "$written_a" -ge $((steps_a * 12 * params)) ]
ok "the scrape shows each tenant's quota, weight and bytes" sh -c \
	"ckptctl list --prometheus >/tmp/prom && grep 'tenant=' /tmp/prom &&
	 grep -q 'dm_ckpt_tenant_quota_bytes{tenant=\"a\",drive=\"/dev/nvme0n1\"} 50331648' /tmp/prom &&
	 grep -q 'dm_ckpt_tenant_weight{tenant=\"b\",drive=\"/dev/nvme0n1\"} 100' /tmp/prom &&
	 grep -qE 'dm_ckpt_tenant_read_bytes_total\\{tenant=\"b\",drive=\"/dev/nvme0n1\"\\} [1-9]' /tmp/prom &&
	 grep -qE 'dm_ckpt_tenant_written_bytes_total\\{tenant=\"a\",drive=\"/dev/nvme0n1\"\\} [1-9]' /tmp/prom &&
	 grep -qE 'dm_ckpt_steps_committed_total\\{.*name=\"ka\".*tenant=\"a\".*\\} [1-9]' /tmp/prom"

# a weight three times b's: three quarters of the drive when both want it
ckptctl tenant set $drive a --weight 300 >/dev/null
contend weighted
ok "with weight 300 against 100, job a moved at least 60%" [ "$share_a" -ge 60 ]
ckptctl tenant set $drive a --weight 100 >/dev/null

# the contrast: the same jobs on the same drive, all in one cgroup (no
# shares between them)
contend unshared shared
ckptctl remove ka >/dev/null
rmdir /sys/fs/cgroup/dm-ckpt/shared

# at boot: every drive's tenants, then the images on them (ckpttab by uuid)
uuid=$(ckptctl info /dev/mapper/ckpt-tenant-a | sed -n "s/.*, uuid \([0-9a-f-]*\).*/\1/p" | head -1)
echo "ka UUID=$uuid" >/etc/ckpttab
dmsetup remove ckpt-tenant-a && dmsetup remove ckpt-tenant-b && rmdir /sys/fs/cgroup/dm-ckpt/a /sys/fs/cgroup/dm-ckpt/b
echo "$dev enable=0" >/sys/fs/cgroup/io.cost.qos
ok "activate --all makes the tenants, their cgroups and shares, then the target on a" sh -c \
	"ckptctl activate --all >/tmp/act 2>&1 && [ -b /dev/mapper/ka ] && [ -b /dev/mapper/ckpt-tenant-b ] &&
	 grep -qx '$dev 100' /sys/fs/cgroup/dm-ckpt/b/io.weight && grep -q '^$dev enable=1' /sys/fs/cgroup/io.cost.qos &&
	 [ \"\$(stat -c '%u %a' /dev/mapper/ckpt-tenant-a)\" = '1001 600' ]"
ok "... and the target verifies" sh -c "ckptctl remove ka >/dev/null && ckptctl verify /dev/mapper/ckpt-tenant-a | grep -q 'verify: ok'"

# a tenant table on a partition: the shares are the whole disk's (iocost,
# io.weight and io.max take disks); a device-mapper drive has no iocost
ok "the tenants removed, the drive partitioned" sh -c \
	"ckptctl tenant remove $drive a >/dev/null && ckptctl tenant remove $drive b >/dev/null &&
	 dd if=/dev/zero of=$drive bs=1M count=1 2>/dev/null &&
	 printf 'n\np\n1\n\n+200M\nn\np\n2\n\n+100M\nw\n' | fdisk $drive >/dev/null 2>&1;
	 [ -b ${drive}p1 ] && [ -b ${drive}p2 ]"
echo "$dev enable=0" >/sys/fs/cgroup/io.cost.qos
ok "init on a partition turns iocost on for its disk" sh -c \
	"ckptctl tenant init ${drive}p1 >/dev/null && grep -q '^$dev enable=1' /sys/fs/cgroup/io.cost.qos"
ok "... and a tenant there gets its weight on the disk" sh -c \
	"ckptctl tenant create ${drive}p1 p --size 16777216 --owner job1 >/dev/null &&
	 grep -qx '$dev 100' /sys/fs/cgroup/dm-ckpt/p/io.weight"
ok "the scrape names the partition as the tenant's drive" sh -c \
	"ckptctl list --prometheus | grep -q 'dm_ckpt_tenant_quota_bytes{tenant=\"p\",drive=\"${drive}p1\"} 16777216'"
dmsetup create lin --table "0 204800 linear ${drive}p2 0"
fails_with "init on a device-mapper drive: no iocost there" 1 "need a blk-mq disk for iocost" \
	ckptctl tenant init /dev/mapper/lin
ok "... and it wrote no table" sh -c "! ckptctl tenant list /dev/mapper/lin >/dev/null 2>&1"

echo "1..$n"
echo "$((n - failed)) passed, $failed failed"
exit $((failed > 0))
