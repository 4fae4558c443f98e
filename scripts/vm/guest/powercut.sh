#!/bin/sh
# Guest side of the power-cut test (scripts/vm/powercut.sh): map the backing
# device through dm-ckpt, say which step it resumes from, and step the
# seeded trace up to step STEPS; the host kills qemu at a random moment.
# Usage: powercut.sh STEPS SEED
steps=${1:?steps}
seed=${2:?seed}
fail() { echo "powercut: FAIL: $*"; exit 1; }

table=$(ckptctl info --table /dev/nvme0n1) || fail "ckptctl info --table /dev/nvme0n1 failed"
dmsetup create ckpt --noudevsync --table "$table" || fail "dmsetup create failed"
dmsetup mknodes ckpt
at=$(ckpt-trace /dev/mapper/ckpt --steps 0 | sed -n 's/^committed step //p')
[ -n "$at" ] || fail "cannot read the committed step through /dev/mapper/ckpt"
echo "powercut: resumed at step $at"
echo "powercut: stepping"
# each "step N committed" line is printed after COMMIT returned: from then on
# the step must survive any cut
ckpt-trace /dev/mapper/ckpt --steps $((steps - at)) --seed "$seed" || fail "ckpt-trace exited $?"
dmsetup remove --noudevsync ckpt || fail "dmsetup remove failed"
echo "powercut: reached step $steps"
