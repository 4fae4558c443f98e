#!/bin/sh
# The userspace tests against an ASan+UBSan build (cmake -DCKPT_SANITIZE=ON,
# make check-asan): the GoogleTest programs, the tools' TAP tests (ckptctl,
# ckpt-trace), then the Python tests with the sanitized libckpt.so loaded
# into /usr/bin/python3. Left out, as they run nothing of ours that the
# others do not: checkpatch; the 2^32 conversion sweep (arithmetic only,
# 51 s under ASan; UpdateVariants and UpdateConv's boundary tests cover the
# same code); the crash enumeration of the wide model (80 s: the small
# models' runs take every kind of step and crash state through the same
# code); the README and demo walk-throughs and the convergence runs
# (python_readme, python_offload_demo, python_oracle, python_offload_8bit,
# python_offload_bf16master: long trainings through the paths the offload
# tests take).
#
# A sanitizer report must fail the run even where a test expects its program
# to fail (ckptctl's error paths): every report ends the program with status
# 86 (CKPT_SANITIZER_STATUS, which tests/tap.sh's fails_with refuses), and
# ASan's reports also go to log files under BUILD/sanitizer-logs, any of which
# fails the run, with its text shown. (UBSan beside ASan ignores log_path: its
# reports go to stderr only.)
#
# python3 is not built with ASan: libasan must be loaded first (LD_PRELOAD),
# with libstdc++ (else ASan cannot intercept C++ throws of libckpt.so, which
# python3 loads later), and without leak detection, which would report the
# interpreter's and torch's own allocations at exit.
set -u
build=${1:?usage: check-asan.sh ASAN_BUILD_DIR [ctest options]}
shift
[ -f "$build/CMakeCache.txt" ] && grep -q '^CKPT_SANITIZE:BOOL=ON' "$build/CMakeCache.txt" || {
	echo "check-asan: $build is not a CKPT_SANITIZE=ON build" >&2
	exit 2
}
logs=$(cd "$build" && pwd)/sanitizer-logs
rm -rf "$logs"
mkdir -p "$logs"

# halt_on_error/-fno-sanitize-recover: the first report stops the program,
# with a status no test expects; UBSan's reports need print_stacktrace to
# say where.
export CKPT_SANITIZER_STATUS=86
common="log_path=$logs/report:log_exe_name=1:print_stacktrace=1:halt_on_error=1:exitcode=$CKPT_SANITIZER_STATUS"
export ASAN_OPTIONS="$common:detect_leaks=1:strict_string_checks=1:detect_stack_use_after_return=1:check_initialization_order=1"
export UBSAN_OPTIONS="$common"

native_skip='^(checkpatch|UpdateConv\.F32ToLowExhaustiveDispatched|crash_wide)$'
python_skip='^python_(readme|offload_demo|oracle|offload_8bit|offload_bf16master)$'
status=0
(cd "$build" && ctest --output-on-failure -LE python -E "$native_skip" "$@") || status=1
cxx=$(sed -n 's/^CMAKE_CXX_COMPILER:[A-Z]*=//p' "$build/CMakeCache.txt")
preload="$("$cxx" -print-file-name=libasan.so) $("$cxx" -print-file-name=libstdc++.so)"
(cd "$build" && ASAN_OPTIONS="$ASAN_OPTIONS:detect_leaks=0" LD_PRELOAD="$preload" \
	ctest --output-on-failure -L python -E "$python_skip" "$@") || status=1

# log_path names each file report.<exe>.<pid>
for f in "$logs"/report*; do
	[ -e "$f" ] || break
	echo "check-asan: sanitizer report $f:"
	cat "$f"
	status=1
done
reports=$(find "$logs" -name 'report*' 2>/dev/null | wc -l)
count() { (cd "$build" && ctest -N "$@" | sed -n 's/^Total Tests: //p'); }
tests=$(($(count -LE python -E "$native_skip") + $(count -L python -E "$python_skip")))
"$(dirname "$0")/reliability.py" record --name asan-ubsan \
	--what "library, tools, unit, tool and Python tests under ASan+UBSan" \
	--count "${tests:-0}" --unit tests --lost $((status != 0 ? (reports > 0 ? reports : 1) : 0)) \
	--target "make check-asan" || echo "check-asan: could not record the result for docs/reliability.md" >&2
[ "$status" -eq 0 ] && echo "check-asan: no sanitizer report"
exit $status
