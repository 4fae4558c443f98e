#!/bin/sh
# vm: once
# ckptctl tenant in the test VM: two jobs' optimizer devices carved out of
# one drive (/dev/nvme0n1), each its user's alone; both train at once through
# the kernel target; one job killed mid-step leaves the other's commits; a
# quota too small is refused; removing a tenant zeroes its extent before a
# new tenant gets it.
#
#   scripts/vm/run [--kernel 6.1|6.12] tests/vm/tenant.sh
# TAP output; the exit status is 0 when all passed, else 1.
set -u
drive=/dev/nvme0n1
TAP_OUT=/tmp/tenant.out
. /ckpt/lib/tap.sh
cd /tmp || exit 1

dd if=/dev/urandom of=$drive bs=1M count=300 conv=fsync 2>/dev/null	# old data everywhere

fails_with "init refuses a drive that is not blank at its start" 1 "not blank" ckptctl tenant init $drive
ok "init --force writes the tenant table" has "a tenant table" ckptctl tenant init $drive --force
fails_with "a second init is refused" 1 "has a tenant table already" ckptctl tenant init $drive
ok "create a: 96 MiB for job1" has "owned by 1001:1001" \
	ckptctl tenant create $drive a --size 100663296 --owner job1
ok "create b: 96 MiB for job2" has "owned by 1002:1002" \
	ckptctl tenant create $drive b --size 100663296 --owner job2
fails_with "a tenant twice" 1 "has a tenant 'b' already" ckptctl tenant create $drive b --size 1048576 --owner job2
fails_with "a size that is no whole MiB" 1 "multiple of 1 MiB" ckptctl tenant create $drive c --size 1000 --owner job1
fails_with "more than the drive has free" 1 "no 1073741824 free bytes" \
	ckptctl tenant create $drive c --size 1073741824 --owner job1
ok "each device is its user's alone (mode 0600)" sh -c \
	"[ \"\$(stat -c '%u %g %a' /dev/mapper/ckpt-tenant-a)\" = '1001 1001 600' ] &&
	 [ \"\$(stat -c '%u %g %a' /dev/mapper/ckpt-tenant-b)\" = '1002 1002 600' ]"
ok "job1 cannot open job2's device" sh -c "! su job1 -c 'dd if=/dev/mapper/ckpt-tenant-b of=/dev/null bs=4096 count=1' 2>/dev/null"
ok "job1 opens its own" su job1 -c 'dd if=/dev/mapper/ckpt-tenant-a of=/dev/null bs=4096 count=1 2>/dev/null'
ok "list shows both" sh -c "ckptctl tenant list $drive | grep -q '^a ' && ckptctl tenant list $drive | grep -q '^b '"

# the quota: an image larger than the tenant does not fit
fails_with "a format larger than the quota is refused" any "this layout needs" \
	ckpt-trace /dev/mapper/ckpt-tenant-a --format --force --params 8000000 --steps 0
for t in a b; do
	ok "format tenant $t (2M params) and create its kernel target" sh -c \
		"ckpt-trace /dev/mapper/ckpt-tenant-$t --format --force --params 2000000 --steps 0 >/dev/null &&
		 ckptctl create k$t /dev/mapper/ckpt-tenant-$t >/dev/null"
done
# both train at once; job a is killed mid-run
ckpt-trace /dev/mapper/ka --steps 400 --seed 1 >/tmp/a.trace 2>&1 &
apid=$!
ckpt-trace /dev/mapper/kb --steps 8 --seed 2 >/tmp/b.trace 2>&1 &
bpid=$!
sleep 3
kill -9 $apid
wait $apid
ok "job b trains to its end beside a (killed)" wait $bpid
ok "... and committed its 8 steps" sh -c "ckptctl status kb | grep -q 'committed step 8'"
ok "a's device still verifies after its kill (its last commit stands)" sh -c \
	"ckptctl remove ka >/dev/null && ckptctl verify /dev/mapper/ckpt-tenant-a | grep -q 'verify: ok'"
ok "b verifies" sh -c "ckptctl remove kb >/dev/null && ckptctl verify /dev/mapper/ckpt-tenant-b | grep -q 'verify: ok'"

# removal zeroes before it frees; the next tenant there reads zeros
start=$(ckptctl tenant list $drive --json | sed -n '/"name": "a"/,/}/s/.*"start": \([0-9]*\).*/\1/p')
ok "remove a" has "zeroed and free" ckptctl tenant remove $drive a
ok "... its extent is zeros on the drive" sh -c \
	"[ \"\$(dd if=$drive bs=1M skip=$((start >> 20)) count=96 2>/dev/null | od -An -v -tx1 | tr -d ' 0\n' | wc -c)\" = 0 ]"
ok "a new tenant c gets the space, and reads zeros" sh -c \
	"ckptctl tenant create $drive c --size 100663296 --owner job1 >/dev/null &&
	 ckptctl tenant list $drive --json | grep -q '\"start\": $start' &&
	 [ \"\$(dd if=/dev/mapper/ckpt-tenant-c bs=1M count=96 2>/dev/null | od -An -v -tx1 | tr -d ' 0\n' | wc -c)\" = 0 ]"
ok "b is untouched by all that" sh -c "ckptctl verify /dev/mapper/ckpt-tenant-b | grep -q 'committed step 8'"
fails_with "a tenant in use is not removed" 1 "in use" sh -c \
	"ckptctl create kb /dev/mapper/ckpt-tenant-b >/dev/null && ckptctl tenant remove $drive b"
ckptctl remove kb >/dev/null 2>&1

echo "1..$n"
echo "$((n - failed)) passed, $failed failed"
exit $((failed > 0))
