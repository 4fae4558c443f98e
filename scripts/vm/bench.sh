#!/bin/bash
# make bench-vm: in one VM boot, fio's sequential write, read and 50/50 mixed
# bandwidth (O_DIRECT, 1 MiB, libaio qd8) on the raw emulated NVMe namespace,
# then the kernel target's update rate over the same device (ckpt-trace on
# /dev/mapper/ckpt) and the userspace engine's on the raw namespace. Prints
# params/s and the ratio to the device limit: AdamW moves 28 B/param per step
# (14 in, 14 out), so the limit is fio's mixed bandwidth / 28 B.
# Under TCG the CPU, not the device, is expected to be the limit.
#
#   scripts/vm/bench.sh [--kernel 6.1|6.12] [--cpu max|qemu64] [--params N] [--steps N]
set -euo pipefail
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
# All of the script is one compound command, parsed before it runs: editing
# the file while a run is under way cannot derail that run.
{

kernel=6.1 cpu=max params=1000000 steps=20
fio_off=256M fio_size=512M fio_rt=5
while [ $# -gt 0 ]; do
	case $1 in
	--kernel) kernel=$2; shift 2 ;;
	--cpu) cpu=$2; shift 2 ;;
	--params) params=$2; shift 2 ;;
	--steps) steps=$2; shift 2 ;;
	-h|--help) sed -n '2,/^set -eu/p' "$0" | sed -e '/^set -eu/d' -e 's/^# \{0,1\}//'; exit 2 ;;
	*) die "unknown argument $1" ;;
	esac
done
TRACE=$BUILD_DIR/tools/ckpt-trace
[ -x "$TRACE" ] || die "$TRACE missing (make all)"

d=$VM_CACHE/bench/$(date +%Y%m%d-%H%M%S)-$kernel-$cpu
mkdir -p "$d"
# keep the last 3 benchmark runs (each holds a 1 GiB image, half of it written)
ls -1d "$VM_CACHE"/bench/*/ 2>/dev/null | head -n -3 | xargs -r rm -rf
img=$d/nvme.img
"$TRACE" "$img" --format --force --params "$params" --steps 0 >/dev/null
truncate -s 1G "$img"

set +e
"$VM_DIR/run" --kernel "$kernel" --cpu "$cpu" --image "$img" --out "$d/out" --log "$d/console.log" \
	"$VM_DIR/guest/bench.sh" "$steps" "$fio_off" "$fio_size" "$fio_rt"
rc=$?
set -e
if [ $rc -ne 0 ] && ! [ -f "$d/out/fio-rw.json" ]; then
	echo "bench-vm: the VM run failed (status $rc); see $d/console.log" >&2
	exit 1
fi

python3 - "$d/out" "$kernel" "$cpu" <<'EOF'
import json, os, sys
out, kernel, cpu = sys.argv[1:4]
B = 28  # bytes moved per param per AdamW step
def fio(rw):
    j = json.load(open(os.path.join(out, f"fio-{rw}.json")))["jobs"][0]
    return j["read"]["bw_bytes"], j["write"]["bw_bytes"]
w = fio("write")[1]; r = fio("read")[0]; mr, mw = fio("rw"); mix = mr + mw
info = json.load(open(os.path.join(out, "info.json")))
n = info["n_params"]
tf = os.path.join(out, "times")
times = {l.split()[0]: float(l.split()[2]) - float(l.split()[1])
         for l in (open(tf) if os.path.exists(tf) else [])}
def rate(name):
    lines = [l for l in open(os.path.join(out, f"{name}.trace")) if l.startswith("step ")]
    committed = sum(" committed " in l for l in lines)
    return committed, len(lines), times[name]
mb = lambda x: f"{x / 1e6:8.1f} MB/s"
print(f"bench-vm: kernel {kernel}, cpu {cpu}, {n} params, qemu TCG, emulated NVMe")
print(f"  fio seq write 1M qd8 direct   {mb(w)}")
print(f"  fio seq read  1M qd8 direct   {mb(r)}")
print(f"  fio 50/50 mix 1M qd8 direct   {mb(mix)}  ({mb(mr).strip()} read + {mb(mw).strip()} write)")
limit = mix / B
print(f"  device limit at {B} B/param    {limit / 1e6:8.2f} M params/s")
for name, label in (("kernel", "dm-ckpt (in-kernel)"), ("user", "userspace engine")):
    if name not in times:
        print(f"  {label:22s}        FAILED: see the console log")
        continue
    c, a, t = rate(name)
    ps = c * n / t if t > 0 else 0
    print(f"  {label:22s}        {ps / 1e6:8.2f} M params/s  ({c} steps committed of {a} attempts"
          f" in {t:.1f} s; {ps * B / 1e6:.1f} MB/s moved)  ratio to device limit {ps / limit:.3f}")
EOF
echo "bench-vm: results in $d"
[ $rc -eq 0 ] || { echo "bench-vm: the VM run failed (status $rc); see $d/console.log" >&2; exit 1; }
exit
}
