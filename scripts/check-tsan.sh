#!/bin/sh
# The engine's threads under ThreadSanitizer (cmake -DCKPT_TSAN=ON,
# make check-tsan): the engine's unit tests (its worker threads, one
# io_uring each, a gradient write's chunks as one batch), the C ABI's
# tests (a device handle used and closed from several threads), and the
# tools' TAP test, whose ckpt-trace runs the same trace with one and with
# three workers. Python is not run: an uninstrumented interpreter cannot
# host TSan.
#
# As in check-asan.sh, a report must fail the run even where a test
# expects its program to fail: every report ends the program with status
# 86 (CKPT_SANITIZER_STATUS, which tests/tap.sh's fails_with refuses) and
# goes to a log file under BUILD/sanitizer-logs, any of which fails the
# run. Races are fixed in the code; tests/tsan.supp may only name reports
# inside a system library, each with a comment saying why.
set -u
build=${1:?usage: check-tsan.sh TSAN_BUILD_DIR}
top=$(cd "$(dirname "$0")/.." && pwd)
[ -f "$build/CMakeCache.txt" ] && grep -q '^CKPT_TSAN:BOOL=ON' "$build/CMakeCache.txt" || {
	echo "check-tsan: $build is not a CKPT_TSAN=ON build" >&2
	exit 2
}
build=$(cd "$build" && pwd)
logs=$build/sanitizer-logs
rm -rf "$logs"
mkdir -p "$logs"

export CKPT_SANITIZER_STATUS=86
export TSAN_OPTIONS="log_path=$logs/report:log_exe_name=1:halt_on_error=1:exitcode=$CKPT_SANITIZER_STATUS:second_deadlock_stack=1:suppressions=$top/tests/tsan.supp"

status=0
for t in engine_tests capi_tests; do
	echo "check-tsan: $t"
	"$build/tests/$t" --gtest_brief=1 || status=1
done
(cd "$build" && ctest --output-on-failure -R '^tools$') || status=1

for f in "$logs"/report*; do
	[ -e "$f" ] || break
	echo "check-tsan: ThreadSanitizer report $f:"
	cat "$f"
	status=1
done
reports=$(find "$logs" -name 'report*' 2>/dev/null | wc -l)
"$(dirname "$0")/reliability.py" record --name tsan \
	--what "engine_tests, capi_tests and the tools' concurrency runs under ThreadSanitizer" \
	--count 3 --unit "test programs" --lost $((status != 0 ? (reports > 0 ? reports : 1) : 0)) \
	--target "make check-tsan" || echo "check-tsan: could not record the result for docs/reliability.md" >&2
[ "$status" -eq 0 ] && echo "check-tsan: no ThreadSanitizer report"
exit $status
