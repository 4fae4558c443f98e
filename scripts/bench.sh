#!/bin/sh
# The benchmarks of `make bench`. Each prints ratios measured within one run:
# the machine is shared and noisy, absolute figures drift between runs.
set -eu
build=${1:-build}
disk_dir=${CKPT_BENCH_DISK:-/var/tmp}

echo "== update loop vs the memory ceiling (64M params, one core)"
"$build/bench/ckpt_bench_update"
echo
echo "== userspace engine vs raw read+write bandwidth of the same file (64M params)"
"$build/bench/ckpt_bench_engine" /dev/shm "$disk_dir"
