#!/bin/sh
# SPDX-License-Identifier: MIT
# The install, from the outside (TAP): `cmake --install` into a staging
# DESTDIR, then a C program built with `pkg-config --cflags --libs ckpt`, the
# Python package, ckptctl, the man pages and the completion, each used from
# the staged files only (never the build tree); the exports of libckpt.so
# against ckpt.h; one version everywhere; `pip install .` (a wheel carrying
# libckpt) into a fresh venv.
#   test_install.sh BUILD_DIR
set -u
build=$(cd "$1" && pwd) || exit 1
top=$(cd "$(dirname "$0")/../.." && pwd)
py=${CKPT_PYTHON:-/usr/bin/python3}
n=0; failed=0
ok() { n=$((n + 1)); d=$1; shift; if "$@"; then echo "ok $n - $d"; else echo "not ok $n - $d"; failed=1; fi; }
bail() { echo "Bail out! $*"; exit 1; }
for t in cc pkg-config nm readelf groff bash; do
	command -v $t >/dev/null || bail "$t not installed (scripts/deps.sh)"
done
"$py" -m pip --version >/dev/null 2>&1 || bail "$py has no pip (python3-pip, scripts/deps.sh)"

version=$(cat "$top/VERSION")
scratch=$(mktemp -d "${TMPDIR:-/tmp}/ckpt-install.XXXXXX") || bail "mktemp"
trap 'rm -rf "$scratch"' EXIT INT TERM
stage=$scratch/stage
prefix=/usr/local
root=$stage$prefix

DESTDIR=$stage cmake --install "$build" --prefix $prefix >"$scratch/install.log" 2>&1 ||
	{ sed 's/^/# /' "$scratch/install.log"; bail "cmake --install failed"; }
libdir=$(dirname "$(find "$root" -name 'libckpt.so.*.*.*' | head -n 1)")
pydir=$(dirname "$(find "$root" -path '*-packages/ckpt/__init__.py' | head -n 1)")
pydir=${pydir%/ckpt}

# --- the files and the SONAME policy ---
ok "libckpt.so.$version installed" test -f "$libdir/libckpt.so.$version"
ok "libckpt.so.0 -> libckpt.so.$version" test "$(readlink "$libdir/libckpt.so.0")" = "libckpt.so.$version"
ok "libckpt.so -> libckpt.so.0" test "$(readlink "$libdir/libckpt.so")" = "libckpt.so.0"
ok "its SONAME is libckpt.so.0" sh -c 'readelf -d "$1" | grep -q "(SONAME).*\[libckpt.so.0\]"' sh "$libdir/libckpt.so.$version"
for f in include/ckpt.h include/ckpt_admin.h include/ckpt_abi.h sbin/ckptctl bin/ckpt-trace \
	share/man/man8/ckptctl.8 share/man/man4/dm-ckpt.4 share/bash-completion/completions/ckptctl; do
	ok "$f installed" test -f "$root/$f"
done
for f in lib/udev/rules.d/69-dm-ckpt.rules lib/systemd/system/dm-ckpt-activate.service \
	lib/systemd/system/dm-ckpt-activate@.service; do
	ok "$f installed" test -f "$root/$f"
done
ok "the units run the installed ckptctl" grep -q "^ExecStart=$prefix/sbin/ckptctl " "$root/lib/systemd/system/dm-ckpt-activate.service"
ok "ckpt.pc installed in $libdir/pkgconfig" test -f "$libdir/pkgconfig/ckpt.pc"
ok "the Python package installed ($pydir)" test -f "$pydir/ckpt/__init__.py" -a -f "$pydir/ckpt/torch/__init__.py"
ok "nothing installed outside the prefix" sh -c '[ -z "$(find "$1" -mindepth 1 -maxdepth 2 ! -path "$1/usr" ! -path "$1/usr/local")" ]' sh "$stage"

# --- exports: exactly the functions ckpt.h and ckpt_admin.h declare, each versioned ---
sed -n 's/^[a-z].*[ *]\(ckpt_[a-z0-9_]*\)(.*/\1/p' "$top/libckpt/include/ckpt.h" "$top/libckpt/include/ckpt_admin.h" |
	sort -u >"$scratch/declared"
nm -D --defined-only --with-symbol-versions "$libdir/libckpt.so.$version" | awk '$2 != "A"' >"$scratch/nm"
awk '{ sub(/@.*/, "", $3); print $3 }' "$scratch/nm" | sort -u >"$scratch/exported"
ok "ckpt.h and ckpt_admin.h declare the C ABI ($(wc -l <"$scratch/declared") functions)" test "$(wc -l <"$scratch/declared")" -gt 50
ok "every export has a release's version node (CKPT_MAJOR.MINOR)" sh -c '! grep -v "@@CKPT_[0-9]*\.[0-9]*$" "$1"' sh "$scratch/nm"
if cmp -s "$scratch/declared" "$scratch/exported"; then ok "libckpt.so exports exactly them" true
else ok "libckpt.so exports exactly them" false; diff "$scratch/declared" "$scratch/exported" | sed 's/^/# /'; fi

# --- one version ---
ok "dkms.conf's PACKAGE_VERSION is VERSION's ($version)" grep -qx "PACKAGE_VERSION=\"$version\"" "$top/dkms.conf"
ok "ckpt.pc's Version is $version" sh -c 'PKG_CONFIG_PATH="$1" pkg-config --modversion ckpt | grep -qx "$2"' sh "$libdir/pkgconfig" "$version"

# --- a C program against the staged files, through pkg-config ---
cat >"$scratch/prog.c" <<'C'
#include <ckpt_admin.h>	/* formats the image, then the training path of ckpt.h */
#include <stdio.h>
#include <string.h>
int main(int argc, char **argv)
{
	uint64_t shape[2] = { 64, 32 };
	ckpt_layout_builder *l = ckpt_layout_new();
	ckpt_device *d;
	struct ckpt_info info;
	if (argc != 2 || !l || ckpt_layout_add(l, "w", shape, 2, 0) < 0 ||
	    ckpt_format(argv[1], l, CKPT_DTYPE_BF16, 2048, 0) < 0 || ckpt_open(argv[1], &d) < 0 ||
	    ckpt_info(d, &info) < 0) {
		fprintf(stderr, "prog: %s\n", ckpt_last_error());
		return 1;
	}
	printf("%s %llu\n", ckpt_version(), (unsigned long long)info.n_params);
	ckpt_close(d);
	ckpt_layout_free(l);
	return 0;
}
C
flags=$(PKG_CONFIG_PATH="$libdir/pkgconfig" pkg-config --cflags --libs ckpt)
# (ckpt.pc is relocatable: its paths are relative to where it is)
inc=$(realpath -m "$(echo "$flags" | sed -n 's/.*-I\([^ ]*\).*/\1/p')")
lib=$(realpath -m "$(echo "$flags" | sed -n 's/.*-L\([^ ]*\).*/\1/p')")
ok "pkg-config --cflags --libs ckpt names the staged dirs ($flags)" \
	test "$inc" = "$root/include" -a "$lib" = "$libdir"
# shellcheck disable=SC2086
ok "a C program builds with it (-Wall -Werror, only the staged header)" \
	cc -std=c11 -Wall -Werror -o "$scratch/prog" "$scratch/prog.c" $flags
out=$(LD_LIBRARY_PATH=$libdir "$scratch/prog" "$scratch/c.img" 2>&1)
ok "it formats, opens and reads an image: '$out'" test "$out" = "$version 2048"
ok "it loads the staged libckpt.so.0" sh -c 'LD_LIBRARY_PATH="$1" ldd "$2" | grep -q "libckpt.so.0 => $1/libckpt.so.0"' sh "$libdir" "$scratch/prog"

# --- ckptctl, its man pages and completion ---
ok "the staged ckptctl runs on the staged library" sh -c 'LD_LIBRARY_PATH="$1" "$2" info "$3" | grep -q "step"' sh "$libdir" "$root/sbin/ckptctl" "$scratch/c.img"
for page in share/man/man8/ckptctl.8 share/man/man4/dm-ckpt.4; do
	ok "$page formats without warnings" sh -c '[ -z "$(groff -t -man -ww -z "$1" 2>&1)" ]' sh "$root/$page"
done
ok "dm-ckpt(4) holds the target's reference" sh -c 'grep -q "^\.SH CONSTRUCTOR" "$1" && grep -q "^\.SH ATOMICITY AND DURABILITY" "$1"' sh "$root/share/man/man4/dm-ckpt.4"
cmds=$(LD_LIBRARY_PATH=$libdir "$root/sbin/ckptctl" --help | sed -n '/^[Ss]ubcommands:/,/^$/s/^  \([a-z][a-z0-9-]*\).*/\1/p')
ok "ckptctl --help lists its commands" test "$(echo "$cmds" | wc -w)" -ge 10
for c in $cmds; do
	ok "ckptctl(8) documents '$c'" grep -qx "\\.SS $c" "$root/share/man/man8/ckptctl.8"
done
complete() {
	LD_LIBRARY_PATH=$libdir PATH=$root/sbin:$PATH bash -c '. "$1"; shift; COMP_WORDS=("$@"); COMP_CWORD=$(($# - 1)); _ckptctl; echo "${COMPREPLY[*]}"' sh \
		"$root/share/bash-completion/completions/ckptctl" ckptctl "$@"
}
ok "completion: every command" test "$(complete "" | tr ' ' '\n' | grep -v -- --help | sort | tr '\n' ' ')" = "$(echo $cmds | tr ' ' '\n' | sort | tr '\n' ' ')"
ok "completion: a command's options (ckptctl export --w)" test "$(complete export --w)" = "--with-optimizer"
ok "completion: --dtype values" test "$(complete format x.img --dtype "")" = "bf16 fp16"

# --- the Python package, from the staged files only ---
pycheck='
import os, sys, ckpt
stage, version, img = sys.argv[1:4]
assert ckpt.__file__.startswith(stage + "/"), ckpt.__file__
assert ckpt.__version__ == version, ckpt.__version__
lib = [l.split()[-1] for l in open("/proc/self/maps") if "libckpt.so" in l]
assert lib and all(p.startswith(stage + "/") for p in lib), lib
with ckpt.open(img) as dev:
    assert dev.info()["n_params"] == 2048
print("ok")'
ok "import ckpt from the staged package and library" sh -c 'cd "$5" && env -i PATH=/usr/bin:/bin PYTHONPATH="$1" LD_LIBRARY_PATH="$2" "$3" -c "$4" "$6" "$7" "$8" | grep -qx ok' sh \
	"$pydir" "$libdir" "$py" "$pycheck" "$scratch" "$stage" "$version" "$scratch/c.img"

# --- pip install . : a wheel that carries libckpt, into a fresh venv ---
# Offline, with build isolation: pip takes scikit-build-core from the
# wheelhouse (scripts/venv.sh --wheelhouse), which builds the library with
# CMake; then the package imports, with no LD_LIBRARY_PATH, the library
# inside it, and steps a device.
wheels=${CKPT_WHEELHOUSE:-}
ok "the wheelhouse of requirements-build.txt (${wheels:-CKPT_WHEELHOUSE unset: scripts/venv.sh})" \
	test -n "$wheels" -a -f "$wheels/.dm-ckpt-requirements-build.sha256"
venv=$scratch/venv
if "$py" -m venv "$venv" >"$scratch/venv.log" 2>&1 &&
	(cd "$top" && PIP_NO_INDEX=1 "$venv/bin/python" -m pip install --disable-pip-version-check --no-index \
		--find-links "$wheels" . numpy >"$scratch/pip.log" 2>&1); then
	ok "pip install . into a fresh venv (build isolation on, offline)" true
else
	ok "pip install . into a fresh venv (build isolation on, offline)" false
	sed 's/^/# /' "$scratch/venv.log" "$scratch/pip.log" | tail -n 40
fi
site=$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["platlib"])' 2>/dev/null)
ok "the wheel's metadata says version $version" test -d "$site/ckpt-$version.dist-info"
ok "the wheel carries libckpt.so in the package" test -f "$site/ckpt/libckpt.so" -a -f "$site/ckpt/torch/optimizer.py"
wheelcheck='
import sys, numpy as np, ckpt
site, version, img = sys.argv[1:4]
assert ckpt.__file__.startswith(site + "/"), ckpt.__file__
assert ckpt.__version__ == version, ckpt.__version__
lib = [l.split()[-1] for l in open("/proc/self/maps") if "libckpt.so" in l]
assert lib and all(p == site + "/ckpt/libckpt.so" for p in lib), lib
layout = ckpt.Layout().add("w", (64, 32))
ckpt.format(img, layout, dtype="fp16")
with ckpt.open(img) as dev:
    dev.begin([{"lr": 1e-2}])
    dev.write_grad("w", np.ones((64, 32), np.float16))
    assert dev.commit() == "committed"
    assert dev.info()["committed_step"] == 1
print("ok")'
ok "import ckpt from the wheel (its own libckpt.so, no LD_LIBRARY_PATH) and step a device" sh -c \
	'cd "$1" && env -i PATH=/usr/bin:/bin "$2" -c "$3" "$4" "$5" "$1/w.img" | grep -qx ok' sh \
	"$scratch" "$venv/bin/python" "$wheelcheck" "$site" "$version"
ok "without libckpt, import ckpt says what to install" sh -c 'rm "$1/ckpt/libckpt.so" && cd "$3" &&
	env -i PATH=/usr/bin:/bin "$2" -c "import ckpt" 2>&1 | grep -q "ckpt: cannot load libckpt.*make install"' sh \
	"$site" "$venv/bin/python" "$scratch"

echo "1..$n"
exit $failed
