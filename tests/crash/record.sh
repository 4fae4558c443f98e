#!/bin/sh
# Runs one crash enumeration (crash_test DTYPE MODEL) and records how many
# states it checked and lost for docs/reliability.md (scripts/reliability.py).
# Usage: record.sh CRASH_TEST DTYPE MODEL [TARGET [ROW]]
# TARGET: what ran it (default make check); ROW: the table's row (default
# crash-engine-DTYPE-MODEL; the campaign keeps its own rows).
out=$("$1" "$2" "$3" 2>&1)
rc=$?
printf '%s\n' "$out"
n=$(printf '%s\n' "$out" | sed -n 's/.*: \([0-9]*\) crash states checked.*/\1/p')
lost=$(printf '%s\n' "$out" | sed -n 's/.*: \([0-9]*\) lost or corrupted$/\1/p')
[ -n "$n" ] && [ -n "$lost" ] || { echo "record.sh: no summary from $1 (exit $rc)" >&2; exit 1; }
"$(dirname "$0")/../../scripts/reliability.py" record --name "${5:-crash-engine-$2-$3}" \
	--what "crash states of the userspace engine ($2, $3 model): flush-ordered subsets and torn writes" \
	--count "$n" --unit states --lost "$lost" --target "${4:-make check}" ||
	echo "record.sh: could not record the result for docs/reliability.md" >&2
exit $rc
