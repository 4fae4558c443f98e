#!/bin/bash
# make bench-stripe: one optimizer device over 1, 2 and 4 drives. In one VM
# boot, four emulated NVMe namespaces, each limited by qemu to the same
# bandwidth (--throttle, default 4 MB/s) so that the drives, not TCG's CPU,
# bound a step; for each count a dm-stripe of that many (64 KiB stripes),
# an image on it, and STEPS steps through the kernel target over it and on the
# userspace engine over its own stripe set of the same drives. Prints steps/s and the scaling
# against one drive; the JSON goes to build/bench/stripe.json.
#
#   scripts/vm/stripe-bench.sh [--kernel 6.1|6.12] [--params N] [--steps N] [--throttle BPS]
set -euo pipefail
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
{

kernel=6.12 params=500000 steps=6 throttle=4000000 chunk=128
while [ $# -gt 0 ]; do
	case $1 in
	--kernel) kernel=$2; shift 2 ;;
	--params) params=$2; shift 2 ;;
	--steps) steps=$2; shift 2 ;;
	--throttle) throttle=$2; shift 2 ;;
	-h|--help) sed -n '2,/^set -eu/p' "$0" | sed -e '/^set -eu/d' -e 's/^# \{0,1\}//'; exit 2 ;;
	*) die "unknown argument $1" ;;
	esac
done

d=$VM_CACHE/stripe-bench/$(date +%Y%m%d-%H%M%S)-$kernel
mkdir -p "$d"
ls -1d "$VM_CACHE"/stripe-bench/*/ 2>/dev/null | head -n -3 | xargs -r rm -rf
images=()
for i in 1 2 3 4; do
	truncate -s 256M "$d/ns$i.img"
	images+=(--image "$d/ns$i.img")
done
set +e
"$VM_DIR/run" --kernel "$kernel" --cpu max --timeout 1800 --throttle "$throttle" "${images[@]}" \
	--out "$d/out" --log "$d/console.log" --quiet "$VM_DIR/guest/stripe-bench.sh" "$params" "$steps" "$chunk"
rc=$?
set -e
[ $rc -eq 0 ] || die "the VM run failed (status $rc); see $d/console.log"
mkdir -p "$BUILD_DIR/bench"
python3 - "$d/out" "$kernel" "$params" "$steps" "$throttle" "$BUILD_DIR/bench/stripe.json" <<'PY'
import json, sys
out, kernel, params, steps, throttle, dest = sys.argv[1:7]
params, steps, throttle = int(params), int(steps), int(throttle)
rate = {}
for line in open(f"{out}/times"):
    ways, who, t0, t1 = line.split()
    rate[(who, int(ways))] = steps / (float(t1) - float(t0))
print(f"bench-stripe: kernel {kernel}, {params} params, {steps} steps, each drive {throttle / 1e6:.1f} MB/s "
      f"(qemu throttle), dm-stripe 64 KiB")
res = {"kernel": kernel, "params": params, "steps": steps, "drive_bytes_per_s": throttle}
for who, label in (("kernel", "kernel target"), ("user", "userspace engine")):
    for ways in (1, 2, 4):
        r = rate[(who, ways)]
        x = r / rate[(who, 1)]
        res[f"{who}_steps_per_s_{ways}"] = round(r, 4)
        res[f"{who}_scaling_{ways}"] = round(x, 3)
        print(f"  {label:17s} {ways} drive(s): {r:7.3f} steps/s  {r * params * 26 / 1e6:6.1f} MB/s  "
              f"{x:4.2f}x one drive")
    x = res[f"{who}_scaling_4"]
    print(f"  {label}: 4 drives / 1 = {x:.2f} (target >= 3.5: {'met' if x >= 3.5 else f'missed by {3.5 - x:.2f}'})")
json.dump(res, open(dest, "w"), indent=1)
PY
echo "bench-stripe: results in $d"
exit
}
