#!/bin/sh
# Guest side of scripts/vm/tests.sh: run the kernel target's test programs
# (names given as arguments, installed in /opt/ckpt/tests) one after the other.
# Each one's TAP output goes to the console and to /out/tap/NAME.tap; a program
# that exits non-zero without reporting a failing test gets a "not ok" line of
# its own, and so does a missing one. Exit status: 0 if all passed.
mkdir -p /out/tap
status=0
for t in "$@"; do
	f=/out/tap/$t.tap
	echo "# ckpt-vm: ==== $t ===="
	if [ ! -x "/opt/ckpt/tests/$t" ]; then
		echo "not ok 1 $t # program missing from the initramfs" | tee "$f"
		status=1
		continue
	fi
	start=$(cut -d' ' -f1 /proc/uptime)
	{ "/opt/ckpt/tests/$t"; echo $? >/tmp/rc.$t; } 2>&1 | tee "$f"
	rc=$(cat /tmp/rc.$t)
	end=$(cut -d' ' -f1 /proc/uptime)
	echo "# ckpt-vm: $t exit status $rc, $(awk -v a="$start" -v b="$end" 'BEGIN { printf "%.1f", b - a }') s"
	if grep -q '^not ok' "$f"; then
		status=1
	elif [ "$rc" != 0 ] && [ "$rc" != 4 ]; then
		# 4 is KSFT_SKIP: every test skipped
		echo "not ok 999 $t # exited with status $rc without a failing test" | tee -a "$f"
		status=1
	elif ! grep -qE '^(not )?ok ' "$f"; then
		echo "not ok 999 $t # printed no TAP result" | tee -a "$f"
		status=1
	fi
done
dmesg >/out/dmesg.txt
exit $status
