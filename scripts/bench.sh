#!/bin/sh
# The benchmarks of `make bench`. Each prints ratios measured within one run
# (medians of interleaved repeats, with min..max): the machine is shared and
# noisy, absolute figures drift between runs. The last line is one JSON
# object: loop_fraction_of_bound (the dispatched update over the same-run
# 28 B/param memory bound), engine_fraction_of_device_shm and
# engine_fraction_of_device_disk (an engine step over fio moving the same
# bytes on the same file), exposed_step_vs_torch_ram_* (OffloadAdamW's step
# as the trainer waits for it over torch's AdamW step in RAM,
# bench/step_bench.py, which also compares two builds: --before), and the
# figures behind them.
set -eu
build=${1:-build}
disk_dir=${CKPT_BENCH_DISK:-/var/tmp}
command -v fio >/dev/null || { echo "bench: fio is missing (scripts/deps.sh installs it)" >&2; exit 1; }
out=$(mktemp)
trap 'rm -f "$out" "$out.update" "$out.engine" "$out.step"' EXIT

echo "== update loop vs the memory ceiling (64M params, one core)"
"$build/bench/ckpt_bench_update" | tee "$out"
tail -n 1 "$out" >"$out.update"
echo
echo "== userspace engine vs the device (fio) on the same file (64M params)"
"$build/bench/ckpt_bench_engine" shm=/dev/shm disk="$disk_dir" | tee "$out"
tail -n 1 "$out" >"$out.engine"
echo
echo "== OffloadAdamW's exposed step vs torch's AdamW in RAM (Debian's torch, /dev/shm)"
"${PYTHON:-/usr/bin/python3}" "$(dirname "$0")/../bench/step_bench.py" --after "$build/python" | tee "$out"
tail -n 1 "$out" >"$out.step"
echo
python3 -c '
import json, sys
r = {}
for f in sys.argv[1:]:
    r.update(json.load(open(f)))
print(json.dumps(r))' "$out.update" "$out.engine" "$out.step"
