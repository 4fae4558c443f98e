# SPDX-License-Identifier: MIT
# TAP helpers of the project's shell tests, sourced by them (on the host from
# tests/, in the VM from /ckpt/lib/tap.sh, which the runner puts there).
# Set TAP_OUT to a scratch file first; each test's output goes there and is
# shown, commented, when the test fails.
n=0
failed=0

_tap_fail() {	# _tap_fail LINE: a failed test, its output as comments
	echo "not ok $n - $1"
	sed 's/^/# /' "$TAP_OUT"
	failed=$((failed + 1))
}

ok() {	# ok DESCRIPTION COMMAND...: passes when COMMAND succeeds
	n=$((n + 1))
	desc=$1
	shift
	if "$@" >"$TAP_OUT" 2>&1; then
		echo "ok $n - $desc"
	else
		_tap_fail "$desc"
	fi
}

# fails_with DESCRIPTION STATUS PATTERN COMMAND...: COMMAND exits with STATUS
# (any: any non-zero status) and its output says PATTERN. A sanitized build
# (scripts/check-asan.sh) exits with CKPT_SANITIZER_STATUS on a report: that
# is never the expected failure.
fails_with() {
	n=$((n + 1))
	desc=$1
	want=$2
	pattern=$3
	shift 3
	"$@" >"$TAP_OUT" 2>&1
	rc=$?
	if [ -n "${CKPT_SANITIZER_STATUS:-}" ] && [ "$rc" -eq "$CKPT_SANITIZER_STATUS" ]; then
		_tap_fail "$desc (exit status $rc: a sanitizer report)"
	elif [ "$rc" -eq 0 ] || { [ "$want" != any ] && [ "$rc" -ne "$want" ]; }; then
		_tap_fail "$desc (exit status $rc, expected $want)"
	elif grep -q -- "$pattern" "$TAP_OUT"; then
		echo "ok $n - $desc"
	else
		_tap_fail "$desc (message lacks '$pattern')"
	fi
}

has() {	# has PATTERN COMMAND...: COMMAND succeeds and prints PATTERN
	pattern=$1
	shift
	"$@" >"$TAP_OUT.2" 2>&1 || { cat "$TAP_OUT.2"; return 1; }
	grep -q -- "$pattern" "$TAP_OUT.2" || { cat "$TAP_OUT.2"; return 1; }
}

# checks DESCRIPTION COMMAND...: COMMAND prints a line "PASS what" or
# "FAIL what" per check of its own (the Python halves of the VM tests), each
# of which becomes a TAP line, its other lines comments; then one more test:
# COMMAND exited 0.
checks() {
	desc=$1
	shift
	t0=$(date +%s)
	"$@" >"$TAP_OUT.checks" 2>&1
	rc=$?
	while IFS= read -r line; do
		case $line in
		"PASS "*) n=$((n + 1)); echo "ok $n - ${line#PASS }" ;;
		"FAIL "*) n=$((n + 1)); failed=$((failed + 1)); echo "not ok $n - ${line#FAIL }" ;;
		"#"*) echo "$line" ;;
		*) echo "# $line" ;;
		esac
	done <"$TAP_OUT.checks"
	n=$((n + 1))
	if [ $rc = 0 ]; then
		echo "ok $n - $desc: exit 0 ($(($(date +%s) - t0)) s)"
	else
		echo "not ok $n - $desc: exit $rc ($(($(date +%s) - t0)) s)"
		failed=$((failed + 1))
	fi
}
