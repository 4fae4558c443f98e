#!/bin/sh
# The benchmarks of `make bench`. Each prints ratios measured within one run
# (medians of interleaved repeats, with min..max): the machine is shared and
# noisy, absolute figures drift between runs. The last line is one JSON
# object: loop_fraction_of_bound (the dispatched update over the same-run
# 28 B/param memory bound), engine_fraction_of_device_shm and
# engine_fraction_of_device_disk (an engine step over fio moving the same
# bytes on the same file), and the figures behind them.
set -eu
build=${1:-build}
disk_dir=${CKPT_BENCH_DISK:-/var/tmp}
command -v fio >/dev/null || { echo "bench: fio is missing (scripts/deps.sh installs it)" >&2; exit 1; }
out=$(mktemp)
trap 'rm -f "$out" "$out.update" "$out.engine"' EXIT

echo "== update loop vs the memory ceiling (64M params, one core)"
"$build/bench/ckpt_bench_update" | tee "$out"
tail -n 1 "$out" >"$out.update"
echo
echo "== userspace engine vs the device (fio) on the same file (64M params)"
"$build/bench/ckpt_bench_engine" shm=/dev/shm disk="$disk_dir" | tee "$out"
tail -n 1 "$out" >"$out.engine"
echo
python3 -c '
import json, sys
r = {}
for f in sys.argv[1:]:
    r.update(json.load(open(f)))
print(json.dumps(r))' "$out.update" "$out.engine"
