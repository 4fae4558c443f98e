#!/bin/sh
# vm: hostfs
# Guest side of the kernel crash-state replay (scripts/vm/logreplay.sh).
# /dev/nvme0n1 holds four regions of DATA or LOG sectors:
#   data (the formatted image) | log | scratch | scratch2
# 1. The kernel target runs STEPS steps of the seeded trace over
#    dm-log-writes over data, logging to log; after each COMMIT returns, a
#    mark "step-N" goes into the log.
# 2. Starting from a copy of data made before step 1, the log is replayed
#    onto scratch up to every flush and FUA entry: each is a state a power
#    cut could leave. For each: the engine's verify passes; the kernel target
#    accepts it and resumes at the last step reported before that point or
#    the next; masters, moments and blob equal the host's reference at that
#    step (REFDIR on the host, read through /host); and the kernel target
#    builds the next step on a copy of it (scratch2) equal to the reference.
# Usage: logreplay.sh DATA LOG STEPS SEED REFDIR. TAP on the console.
d=${1:?} l=${2:?} steps=${3:?} seed=${4:?} ref=/host${5:?}
pass=0 fail=0
ok() { pass=$((pass + 1)); echo "ok $((pass + fail)) - $*"; }
not_ok() { fail=$((fail + 1)); echo "not ok $((pass + fail)) - $*"; }
die() { echo "logreplay: FAIL: $*"; dmesg | tail -30; exit 1; }
dm() { dmsetup "$@" --noudevsync >/dev/null || die "dmsetup $*"; }
linear() { dm create "$1" --table "0 $d linear /dev/nvme0n1 $2"; }

[ -d "$ref" ] || die "no reference at $ref"
linear data 0
dm create lwlog --table "0 $l linear /dev/nvme0n1 $d"
linear scratch $((d + l))
linear scratch2 $((2 * d + l))
dmsetup mknodes
dd if=/dev/mapper/data of=/dev/mapper/scratch bs=1M 2>/dev/null || die "cannot copy the base"
dd if=/dev/zero of=/dev/mapper/lwlog bs=4096 count=1 2>/dev/null
dm create lw --table "0 $d log-writes /dev/mapper/data /dev/mapper/lwlog"
dmsetup mknodes
dm create ckpt --table "$(ckptctl info --table /dev/mapper/lw)"
dmsetup mknodes
s=1
while [ $s -le "$steps" ]; do
	ckpt-trace /dev/mapper/ckpt --steps 1 --seed "$seed" >/dev/null || die "step $s failed"
	dmsetup message lw 0 mark "step-$s" || die "cannot mark step $s in the log"
	s=$((s + 1))
done
dm remove ckpt
dm remove lw
ckpt-log-replay /dev/mapper/lwlog --list >/tmp/entries || die "cannot read the log"
echo "logreplay: $(head -1 /tmp/entries | tr -d '#')"

# check WHAT LO HI: the state on scratch
check() {
	at=""
	ckptctl verify /dev/mapper/scratch >/tmp/verify 2>&1 || { not_ok "$1: verify: $(tail -1 /tmp/verify)"; return; }
	dmsetup create st --noudevsync --table "$(ckptctl info --table /dev/mapper/scratch)" >/tmp/ctr 2>&1 ||
		{ not_ok "$1: the kernel target refuses it: $(cat /tmp/ctr)"; return; }
	dmsetup mknodes
	at=$(ckpt-trace /dev/mapper/st --steps 0 | sed -n 's/^committed step //p')
	dmsetup remove --noudevsync st
	if [ -z "$at" ] || [ "$at" -lt "$2" ] || [ "$at" -gt "$3" ]; then
		not_ok "$1: the kernel target resumes at step ${at:-?}, expected $2..$3"
		return
	fi
	rm -f /tmp/state.st
	ckptctl export --with-optimizer /dev/mapper/scratch --to /tmp/state.st >/dev/null 2>&1 &&
		cmp -s /tmp/state.st "$ref/$at.st" || { not_ok "$1: the state at step $at differs from the reference"; return; }
	if [ "$at" -lt "$steps" ]; then
		dd if=/dev/mapper/scratch of=/dev/mapper/scratch2 bs=1M 2>/dev/null
		dmsetup create st2 --noudevsync --table "$(ckptctl info --table /dev/mapper/scratch2)" &&
			dmsetup mknodes && ckpt-trace /dev/mapper/st2 --steps 1 --seed "$seed" >/dev/null
		rc=$?
		dmsetup remove --noudevsync st2 2>/dev/null
		rm -f /tmp/state.st
		[ $rc = 0 ] && ckptctl export --with-optimizer /dev/mapper/scratch2 --to /tmp/state.st >/dev/null 2>&1 &&
			cmp -s /tmp/state.st "$ref/$((at + 1)).st" ||
			{ not_ok "$1: step $((at + 1)) built on it by the kernel target differs from the reference"; return; }
	fi
	ok "$1: at step $at (expected $2..$3), verify passes, state and the next step equal the reference"
}

prev=0 reported=0
grep -v '^#' /tmp/entries >/tmp/list
while read -r i flags sector nr text; do
	case $flags in
	mark)	# ours; dm-log-writes adds "dm-log-writes-end" at removal
		case $text in step-*) reported=${text#step-} ;; esac ;;
	*flush*|*fua*)
		ckpt-log-replay /dev/mapper/lwlog --replay /dev/mapper/scratch --from $prev --to $((i + 1)) ||
			die "replay up to entry $i failed"
		prev=$((i + 1))
		check "entry $i ($flags), step $reported reported" "$reported" $((reported + 1)) ;;
	esac
done </tmp/list
[ "$reported" = "$steps" ] || not_ok "the log holds marks up to step $reported of $steps"
echo "logreplay: $((pass + fail)) states checked, $fail failed"
[ $fail = 0 ]
