#!/bin/bash
# Kernel crash states by replay: the kernel target steps a seeded trace over
# dm-log-writes in qemu, and the guest replays the log up to every flush and
# FUA entry, the states a power cut behind a volatile write cache can leave;
# each is checked against the host's uninterrupted reference with the engine
# and with the kernel target (scripts/vm/guest/logreplay.sh says how).
#
#   scripts/vm/logreplay.sh [--steps N] [--params N] [--seed N] [--kernel K] [--cpu C]
# Environment: BUILD (default build), CKPT_VM_RUN_ARGS. The last line is
# "N passed, N failed"; the result goes to docs/reliability.md, row
# CKPT_VM_RECORD_NAME (default kernel-log-replay), run by CKPT_VM_RECORD_TARGET.
set -uo pipefail
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
{

steps=8 params=65536 seed=${CKPT_LOGREPLAY_SEED:-$RANDOM} kernel=6.12 cpu=max
while [ $# -gt 0 ]; do
	case $1 in
	--steps) steps=$2; shift 2 ;;
	--params) params=$2; shift 2 ;;
	--seed) seed=$2; shift 2 ;;
	--kernel) kernel=$2; shift 2 ;;
	--cpu) cpu=$2; shift 2 ;;
	-h|--help) sed -n '2,/^set -uo/p' "$0" | sed -e '/^set -uo/d' -e 's/^# \{0,1\}//'; exit 2 ;;
	*) echo "logreplay.sh: unknown argument $1" >&2; exit 2 ;;
	esac
done
read -r -a run_args <<<"${CKPT_VM_RUN_ARGS:-}"
for t in ckpt-trace ckptctl ckpt-log-replay; do
	[ -x "$BUILD_DIR/tools/$t" ] || { echo "logreplay.sh: $BUILD_DIR/tools/$t missing (run make all)" >&2; exit 2; }
done
work=$VM_CACHE/logreplay/$(date +%Y%m%d-%H%M%S)
mkdir -p "$work"
ls -1d "$VM_CACHE"/logreplay/*/ 2>/dev/null | head -n -3 | xargs -r rm -rf
echo "# log replay: trace seed $seed, $steps steps of ~$params params, $kernel/$cpu, work in $work"
trace_reference "$work" "$params" "$steps" "$seed" || { echo "logreplay.sh: cannot build the reference" >&2; exit 2; }

# data | log (the data written per step, twice over, and room) | scratch | scratch2
bytes=$(stat -c %s "$work/base.img")
d=$(((bytes + 1048575) / 1048576 * 2048))
l=$((d * (steps + 4) * 2 + 65536))
cp "$work/base.img" "$work/nvme.img"
truncate -s $(((3 * d + l) * 512)) "$work/nvme.img"

"$VM_DIR/run" --kernel "$kernel" --cpu "$cpu" --quiet --image "$work/nvme.img" --log "$work/console.log" \
	--timeout 1200 "${run_args[@]}" "$VM_DIR/guest/logreplay.sh" "$d" "$l" "$steps" "$seed" "$work/ref" \
	2>"$work/runner"
rc=$?
sed 's/^/# /' "$work/runner"
pass=0 fail=0
while IFS= read -r line; do
	case $line in
	"ok "*) pass=$((pass + 1)); echo "ok - $kernel/$cpu replay: ${line#ok * - }" ;;
	"not ok "*) fail=$((fail + 1)); echo "not ok - $kernel/$cpu replay: ${line#not ok * - }" ;;
	"logreplay: "*) echo "# $line" ;;
	esac
done < <(tr -d '\r' <"$work/console.log")
if [ $rc -ne 0 ] && [ $fail = 0 ]; then
	fail=$((fail + 1))
	echo "not ok - $kernel/$cpu replay run: status $rc ($work/runner, $work/console.log)"
fi
[ $pass -gt 0 ] || { fail=$((fail + 1)); echo "not ok - $kernel/$cpu replay: no state checked"; }
"$ROOT/scripts/reliability.py" record --build "$BUILD_DIR" --name "${CKPT_VM_RECORD_NAME:-kernel-log-replay}" \
	--what "crash states of the kernel target replayed from dm-log-writes at every flush/FUA ($kernel/$cpu), checked by the engine and the target" \
	--count $((pass + fail)) --unit states --lost "$fail" --target "${CKPT_VM_RECORD_TARGET:-make check-logreplay}" ||
	echo "# could not record the result for docs/reliability.md"
echo "$pass passed, $fail failed"
[ $fail -eq 0 ]
exit
}
