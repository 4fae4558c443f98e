#!/bin/bash
# Power cuts: the kernel target steps a seeded training trace in qemu and the
# host kills qemu (SIGKILL) at a random moment of a step, boots again and
# goes on from the step the device resumes at, CUTS times. After each cut,
# on the host, with the userspace engine:
#   - the image opens and `ckptctl verify` passes;
#   - its committed step is the last one the guest saw COMMIT return for, or
#     the one after it (a cut between the commit and its report);
#   - masters, both moments, the trainer blob and the step (ckptctl export
#     --with-optimizer) equal, bit for bit, those of a reference run of the
#     same trace on the host that was never cut;
#   - the next boot's kernel target resumes at that same step.
# When a boot reaches the last step, the image starts over from step 0.
#
# qemu writes the emulated NVMe through the host's page cache
# (cache=writeback), so a cut keeps every write qemu completed, as a power
# cut behind a device with power-loss protection does. The reordering and
# loss of writes a volatile cache allows are the crash enumerator's part
# (tests/crash) and dm-log-writes replay's.
#
#   scripts/vm/powercut.sh [--cuts N] [--steps N] [--params N] [--seed N]
#                          [--kernel K] [--cpu C] [--max-delay SEC]
# A cut comes at most --max-delay seconds into stepping, drawn over the time
# the steps left take (learnt from the boots that ran to the end).
# Environment: BUILD (default build), CKPT_VM_RUN_ARGS. The last line is
# "N passed, N failed"; the result goes to docs/reliability.md, row
# CKPT_VM_RECORD_NAME (default kernel-power-cuts), run by CKPT_VM_RECORD_TARGET.
set -uo pipefail
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
{

cuts=20 steps=40 params=262144 seed=${CKPT_POWERCUT_SEED:-$RANDOM} kernel=6.12 cpu=max max_delay=6
while [ $# -gt 0 ]; do
	case $1 in
	--cuts) cuts=$2; shift 2 ;;
	--steps) steps=$2; shift 2 ;;
	--params) params=$2; shift 2 ;;
	--seed) seed=$2; shift 2 ;;
	--kernel) kernel=$2; shift 2 ;;
	--cpu) cpu=$2; shift 2 ;;
	--max-delay) max_delay=$2; shift 2 ;;
	-h|--help) sed -n '2,/^set -uo/p' "$0" | sed -e '/^set -uo/d' -e 's/^# \{0,1\}//'; exit 2 ;;
	*) echo "powercut.sh: unknown argument $1" >&2; exit 2 ;;
	esac
done

RUN=$VM_DIR/run
TRACE=$BUILD_DIR/tools/ckpt-trace
CTL=$BUILD_DIR/tools/ckptctl
read -r -a run_args <<<"${CKPT_VM_RUN_ARGS:-}"
for t in "$TRACE" "$CTL"; do [ -x "$t" ] || { echo "powercut.sh: $t missing (run make all)" >&2; exit 2; }; done
work=$VM_CACHE/powercut/$(date +%Y%m%d-%H%M%S)
mkdir -p "$work/ref"
ls -1d "$VM_CACHE"/powercut/*/ 2>/dev/null | head -n -3 | xargs -r rm -rf
RANDOM=$seed
pass=0 fail=0
ok() { pass=$((pass + 1)); echo "ok - $*"; }
not_ok() { fail=$((fail + 1)); echo "not ok - $*"; }
echo "# power cuts: $cuts cuts, trace seed $seed, $steps steps of ~$params params, $kernel/$cpu, work in $work"

# the reference: the same trace on the host, never cut, exported at each step
trace_reference "$work" "$params" "$steps" "$seed" || { echo "powercut.sh: cannot build the reference" >&2; exit 2; }

# check_image WHAT LOW HIGH: the image opens, verifies, and holds the
# reference state of a step in [LOW, HIGH]
check_image() {
	local what=$1 lo=$2 hi=$3 at
	if ! "$CTL" verify "$img" >"$work/verify.out" 2>&1; then
		not_ok "$what: ckptctl verify failed: $(tail -1 "$work/verify.out")"
		return 1
	fi
	at=$("$CTL" info --json "$img" | python3 -c 'import json,sys; print(json.load(sys.stdin)["committed_step"])')
	if [ -z "$at" ] || [ "$at" -lt "$lo" ] || [ "$at" -gt "$hi" ]; then
		not_ok "$what: committed step ${at:-?}, expected $lo..$hi"
		return 1
	fi
	rm -f "$work/cut.st"
	if ! "$CTL" export --with-optimizer "$img" --to "$work/cut.st" >/dev/null 2>&1 ||
		! cmp -s "$work/cut.st" "$work/ref/$at.st"; then
		not_ok "$what: the state at step $at differs from the reference (image kept: $img.bad$at)"
		cp "$img" "$img.bad$at"
		return 1
	fi
	ok "$what: committed step $at (expected $lo..$hi), verify passes, state equals the reference"
	expect_from=$at
}

now_ms() { echo $((${EPOCHREALTIME/./} / 1000)); }
img=$work/cut.img
cp "$work/base.img" "$img"
done_cuts=0 boot=0 expect_from=0 step_ms=$((max_delay * 1000 / steps))
while [ $done_cuts -lt "$cuts" ]; do
	# near the end the steps left are too short to cut into: start over
	if [ "$expect_from" -ge $((steps * 3 / 4)) ]; then
		cp "$work/base.img" "$img"
		expect_from=0
	fi
	boot=$((boot + 1))
	log=$work/boot$boot.log
	"$RUN" --kernel "$kernel" --cpu "$cpu" --quiet --image "$img" --log "$log" --timeout 900 "${run_args[@]}" \
		"$VM_DIR/guest/powercut.sh" "$steps" "$seed" 2>"$work/boot$boot.runner" &
	runner=$!
	# wait until the guest steps, then cut at a random moment of the steps
	# it has left (step_ms each, as the last boot that ran to the end took:
	# a cut drawn past the end is a boot lost)
	while kill -0 $runner 2>/dev/null && ! grep -aq '^powercut: stepping' "$log" 2>/dev/null; do sleep 0.2; done
	t_stepping=$(now_ms)
	from=$(sed -n 's/^powercut: resumed at step \([0-9]*\).*/\1/p' "$log" | tr -d '\r' | tail -1)
	window=$((300 + step_ms * (steps - ${from:-0})))	# ckpt-trace's start, then the steps
	[ $window -ge 1 ] && [ $window -le $((max_delay * 1000)) ] || window=$((max_delay * 1000))
	delay=$(((RANDOM * 32768 + RANDOM) % window))
	sleep "$(printf '%d.%03d' $((delay / 1000)) $((delay % 1000)))"
	cut=0
	if kill -0 $runner 2>/dev/null && pkill -KILL -f -- "file=$img,"; then cut=1; fi
	wait $runner
	rc=$?
	if [ $cut = 0 ] && [ $rc = 0 ] && [ "${from:-$steps}" -lt "$steps" ]; then
		step_ms=$((($(now_ms) - t_stepping) * 9 / 10 / (steps - from)))
	fi
	if [ -z "$from" ]; then
		not_ok "boot $boot: the guest did not resume (status $rc; $work/boot$boot.runner, $log)"
		break
	fi
	if [ -n "$expect_from" ] && [ "$from" != "$expect_from" ]; then
		not_ok "boot $boot: the kernel target resumed at step $from, the engine opened step $expect_from"
		break
	fi
	last=$(tr -d '\r' <"$log" | sed -n 's/^step \([0-9]*\) committed.*/\1/p' | tail -1)
	last=${last:-$from}
	if [ $cut = 1 ]; then
		done_cuts=$((done_cuts + 1))
		check_image "cut $done_cuts (boot $boot, $((delay))ms into stepping from step $from, last reported $last)" \
			"$last" $((last + 1)) || break
	elif [ $rc = 0 ] && grep -aq '^powercut: reached step' "$log"; then
		check_image "boot $boot ran to step $steps uncut" "$steps" "$steps" || break
		cp "$work/base.img" "$img"
		expect_from=0
	else
		not_ok "boot $boot failed before the cut (status $rc; $work/boot$boot.runner, $log)"
		break
	fi
done
# and the device still trains to the end after the last cut
if [ $fail = 0 ]; then
	boot=$((boot + 1))
	"$RUN" --kernel "$kernel" --cpu "$cpu" --quiet --image "$img" --log "$work/boot$boot.log" --timeout 900 \
		"${run_args[@]}" "$VM_DIR/guest/powercut.sh" "$steps" "$seed" 2>"$work/boot$boot.runner"
	rc=$?
	if [ $rc = 0 ]; then
		check_image "after $done_cuts cuts the trace runs to step $steps" "$steps" "$steps"
	else
		not_ok "after $done_cuts cuts, the last boot failed (status $rc; $work/boot$boot.runner)"
	fi
fi
"$ROOT/scripts/reliability.py" record --build "$BUILD_DIR" --name "${CKPT_VM_RECORD_NAME:-kernel-power-cuts}" \
	--what "qemu killed mid-step under the kernel target ($kernel/$cpu), state checked against an uncut run" \
	--count "$done_cuts" --unit cuts --lost "$fail" --target "${CKPT_VM_RECORD_TARGET:-make check-powercut}" ||
	echo "# could not record the result for docs/reliability.md"
echo "$pass passed, $fail failed"
[ $fail -eq 0 ]
exit
}
