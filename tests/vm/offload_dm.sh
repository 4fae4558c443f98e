#!/bin/sh
# vm: hostfs
# vm: once
# A PyTorch training loop with ckpt.torch.OffloadAdamW on the kernel target
# (/dev/mapper/NAME), inside the test VM, against the userspace engine:
#
#   scripts/vm/run [--kernel 6.1|6.12] tests/vm/offload_dm.sh
#
# "# vm: once": scripts/vm/tests.sh runs it in one kernel of its matrix.
# The "# vm: hostfs" line above makes the runner share the host's / read-only
# at /host: the host's /usr/bin/python3 with torch and numpy, and the ckpt
# package of the host's build (build/python), run chrooted there (`hostrun`).
# The Python half is offload_dm.py next to this file (the host's copy, found
# through CKPT_HOST_REPO). On a blank /dev/nvme0n1:
#   1. reference runs: 8 steps (bf16; fp16 with LossScaler, overflows
#      included) with the userspace engine on files in /tmp; then ckpt.format
#      /dev/nvme0n1 (bf16) and 3 steps with the userspace engine on it;
#   2. ckptctl create ckpt0 /dev/nvme0n1;
#   3. a new process: OffloadAdamW on /dev/mapper/ckpt0 resumes at step 3 and
#      trains 5 more steps, all committed, blobs round-trip, losses and fp32
#      state bit-identical to the reference; Device.rollback() through the
#      target (the ROLLBACK command) goes back to step 7, a second one is
#      refused, and step 8 done again gives the reference's state again;
#   4. ckptctl remove ckpt0; ckptctl verify;
#   5. a new process: the userspace engine on /dev/nvme0n1 is at step 8 with
#      the reference's fp32 masters and moments, bit for bit; then the fp16
#      variant of 1-5 in the same process (it calls ckptctl create/remove).
# TAP output; the exit status is 0 when all passed, else 1.
set -u
dev=/dev/nvme0n1
name=ckpt0
map=/dev/mapper/$name
TAP_OUT=/tmp/offload_dm.out
. /ckpt/lib/tap.sh
t_start=$(date +%s)

# py PHASE ARGS...: offload_dm.py in the host's Python; each of its PASS/FAIL
# lines is a TAP line, then one more for the process's exit status.
py() {
	checks "offload_dm.py $1" hostrun /usr/bin/python3 "$pyfile" "$@"
}

finish() {
	# never leave the target behind (a failed phase may)
	dmsetup info $name >/dev/null 2>&1 && ckptctl remove $name >/dev/null 2>&1
	echo "# offload_dm: $(($(date +%s) - t_start)) s in the guest"
	echo "1..$n"
	echo "$((n - failed)) passed, $failed failed"
	exit $((failed > 0))	# 0 or 1: 2 and up are the runner's own failures
}

cd /tmp || exit 1
echo "# kernel $(uname -r); host repo ${CKPT_HOST_REPO:-unknown}, build ${CKPT_HOST_BUILD:-unknown}"
pyfile=${CKPT_HOST_REPO:-/nonexistent}/tests/vm/offload_dm.py
if ! command -v hostrun >/dev/null 2>&1; then
	ok "the host's / is shared into the guest (the runner's --hostfs)" false
	finish
fi
ok "offload_dm.py is in the host's repository ($pyfile)" test -f "/host$pyfile"
ok "the ckpt package is built (${CKPT_HOST_BUILD:-}/python/ckpt/libckpt.so)" \
	test -f "/host${CKPT_HOST_BUILD:-}/python/ckpt/libckpt.so"
[ $failed = 0 ] || finish

# ---- 1. references, format, 3 steps with the userspace engine on the NVMe
dd if=/dev/zero of=$dev bs=4096 count=4 conv=fsync 2>/dev/null
py prep $dev
ok "ckptctl info: $dev at committed step 3" has "committed step *3" ckptctl info $dev

# ---- 2. the kernel target
ok "create $name on $dev" has "created $map" ckptctl create $name $dev
ok "status: idle at committed step 3" has "idle, committed step 3" ckptctl status $name

# ---- 3. OffloadAdamW on /dev/mapper: resume, 5 steps (a new process)
py resume $map
ok "status: committed step 8, 6 steps committed by the target (one done again after the rollback)" sh -c \
	"ckptctl status $name | grep -q 'committed step 8' && ckptctl status --json $name | grep -q '\"steps_committed\": 6'"
ckptctl status $name | sed 's/^/# /'

# ---- 4. remove the target
ok "remove $name" has "removed" ckptctl remove $name
ok "verify $dev after the kernel target" has "verify: ok" ckptctl verify $dev

# ---- 5. the userspace engine on the backing device; the fp16 variant
py check $dev $map
ok "no dm device left behind" sh -c "! dmsetup info $name"
ok "verify $dev after the fp16 run" has "verify: ok" ckptctl verify $dev
ok "ckptctl info: an fp16 device at committed step 8" sh -c \
	"ckptctl info $dev | grep -q 'committed step *8' && ckptctl info $dev | grep -qi 'fp16'"

finish
