#!/bin/sh
# The README's order on a fresh machine: `make demo` configures the build
# before `make check` installs linux-source-6.1, whose tarball gives the
# kernel target's test programs their kselftest headers. The build must
# configure again once the tarball appears, and then build those programs.
# Here the tarball's folder is a scratch one: empty at configure time, then
# given (a link to) the real tarball. TAP output.
set -u
src=${1:?usage: test_reconfigure.sh SOURCE_DIR TARBALL}
real=${2:?usage: test_reconfigure.sh SOURCE_DIR TARBALL}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
TAP_OUT=$tmp/out
. "$src/tests/tap.sh"

b=$tmp/build
mkdir "$tmp/usrsrc"
tarball=$tmp/usrsrc/$(basename "$real")

ok "the real tarball is installed (scripts/deps.sh)" test -f "$real"
ok "configure without the tarball" cmake -S "$src" -B "$b" -DCMAKE_BUILD_TYPE=Release \
	-DCKPT_KSELFTEST_TARBALL="$tarball" -DPython3_EXECUTABLE=/usr/bin/python3
ok "no kernel test program is configured" sh -c "test \"\$(cmake --build '$b' --target help | grep -c kmod_test_)\" = 0"
sleep 1	# the folder's new mtime is later than the configure's outputs
ln -s "$real" "$tarball"
# what every build runs first (Makefile generator, as the top-level Makefile
# configures): the check whether the build system is out of date
ok "the next build checks its build system" cmake --build "$b" --target cmake_check_build_system
ok "and extracts the headers" cmake --build "$b" --target kselftest_headers
ok "every tests/kmod program is now configured" sh -c \
	"test \"\$(cmake --build '$b' --target help | grep -c kmod_test_)\" = \"\$(ls '$src'/tests/kmod/*.c | wc -l)\""
ok "the harness is there" test -s "$b/kselftest/kselftest_harness.h"

echo "1..$n"
[ "$failed" -eq 0 ]
