#!/bin/sh
# Runs every libFuzzer target of tests/fuzz (built in FUZZ_BUILD by
# `make fuzz-build`: cmake -DCKPT_FUZZ=ON with clang) for SECONDS each, from
# its seed corpus in tests/fuzz/corpus/NAME, with a fixed -seed. Every file
# of the seed corpus runs first, so a crash once found and kept there
# (crash-*) is replayed by every run: a regression test.
#
#   check-fuzz.sh [--keep] FUZZ_BUILD SECONDS
#
# New inputs go to FUZZ_BUILD/fuzz-corpus/NAME (started afresh unless
# --keep, which `make fuzz` passes so long runs build on each other), crash
# inputs to FUZZ_BUILD/fuzz-artifacts. Any crash, sanitizer report, leak,
# timeout or out-of-memory fails the run loudly, with the input named.
# Executions per target go to FUZZ_BUILD/fuzz-stats.txt.
set -u
keep=0
if [ "${1:-}" = "--keep" ]; then
	keep=1
	shift
fi
build=${1:?usage: check-fuzz.sh [--keep] FUZZ_BUILD SECONDS}
secs=${2:?usage: check-fuzz.sh [--keep] FUZZ_BUILD SECONDS}
seed=${FUZZ_SEED:-1}
top=$(cd "$(dirname "$0")/.." && pwd)
build=$(cd "$build" && pwd)
[ -f "$build/CMakeCache.txt" ] && grep -q '^CKPT_FUZZ:BOOL=ON' "$build/CMakeCache.txt" || {
	echo "check-fuzz: $build is not a CKPT_FUZZ=ON build (make fuzz-build)" >&2
	exit 2
}
arts=$build/fuzz-artifacts
stats=$build/fuzz-stats.txt
mkdir -p "$arts"
: >"$stats"

status=0
for dir in "$top"/tests/fuzz/corpus/*/; do
	name=$(basename "$dir")
	bin=$build/tests/fuzz/fuzz_$name
	if [ ! -x "$bin" ]; then
		echo "check-fuzz: FAIL $name: no $bin" >&2
		status=1
		continue
	fi
	work=$build/fuzz-corpus/$name
	[ "$keep" -eq 1 ] || rm -rf "$work"
	mkdir -p "$work"
	log=$build/fuzz-$name.log
	rm -f "$arts/$name-"*
	# -timeout: one input may take 10 s (a hang is a finding too);
	# -rss_limit_mb: the parsers bound what they allocate.
	"$bin" -seed="$seed" -max_total_time="$secs" -timeout=10 -rss_limit_mb=2048 \
		-print_final_stats=1 -artifact_prefix="$arts/$name-" \
		"$work" "$dir" >"$log" 2>&1
	rc=$?
	runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
	echo "$name ${runs:-0}" >>"$stats"
	"$(dirname "$0")/reliability.py" record --name "fuzz-$name" \
		--what "libFuzzer on the $name parser, ${secs} s from the corpus (crashes kept there replayed)" \
		--count "${runs:-0}" --unit executions --lost $((rc != 0)) \
		--target "make $([ "$keep" -eq 1 ] && echo fuzz || echo check-fuzz)" ||
		echo "check-fuzz: could not record the result for docs/reliability.md" >&2
	if [ "$rc" -ne 0 ]; then
		echo "check-fuzz: FAIL $name (exit $rc) after ${runs:-?} executions; last lines of $log:" >&2
		tail -n 40 "$log" >&2
		for a in "$arts/$name-"*; do
			[ -e "$a" ] || break
			echo "check-fuzz: input: $a (replay: $bin $a)" >&2
			echo "check-fuzz: keep it as a regression test: cp $a tests/fuzz/corpus/$name/crash-WHAT, then fix" >&2
		done
		status=1
	else
		echo "check-fuzz: ok $name: ${runs:-?} executions in ${secs}s"
	fi
done
[ "$status" -eq 0 ] && echo "check-fuzz: no crash"
exit $status
