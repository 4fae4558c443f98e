#!/bin/sh
# The virtual environment of requirements.txt: torch 2, transformers,
# accelerate, deepspeed, safetensors, bitsandbytes, torchao (the tests under
# torch 2, the integrations' tests, make demo where present).
#   scripts/venv.sh           create or refresh it; prints nothing else when
#                             it is up to date
#   scripts/venv.sh --python  print its interpreter's path (creates nothing)
#   scripts/venv.sh --wheelhouse
#                             print the wheelhouse's path (creates nothing):
#                             the wheels of requirements-build.txt, which
#                             `pip install .` of the project builds with,
#                             downloaded for offline installs
#   scripts/venv.sh --ops     print the directory of DeepSpeed's compiled ops
#                             (TORCH_EXTENSIONS_DIR; creates nothing): CPU
#                             Adam, async I/O and pinned memory, which
#                             ZeRO-Infinity runs on, built once here (about
#                             11 minutes on 2 cores; needs libaio-dev) rather
#                             than on a benchmark's first step
# It lives outside the clone, so a fresh clone (and CI) reuses it:
#   CKPT_VENV       the venv (default /var/cache/dm-ckpt/venv)
#   CKPT_PIP_CACHE  pip's cache (default /var/cache/dm-ckpt/pip): a rebuilt
#                   venv downloads nothing it downloaded before, and
#                   deepspeed's wheel, built once, is kept there
# The venv records the hash of the requirements file it was made from, last
# of all: a different hash (a moved pin), or none (an install cut off), and
# it is made again from scratch. (In place: a venv's scripts name its path,
# so one made elsewhere and moved would not run.)
set -eu

ROOT=$(cd "$(dirname "$0")/.." && pwd)
REQ=$ROOT/requirements.txt
VENV=${CKPT_VENV:-/var/cache/dm-ckpt/venv}
CACHE=${CKPT_PIP_CACHE:-/var/cache/dm-ckpt/pip}
BASE_PYTHON=${CKPT_VENV_BASE_PYTHON:-/usr/bin/python3}

WHEELS=$VENV-wheelhouse
BUILD_REQ=$ROOT/requirements-build.txt
OPS=$VENV-ops

case "${1:-}" in
--python) echo "$VENV/bin/python"; exit 0 ;;
--wheelhouse) echo "$WHEELS"; exit 0 ;;
--ops) echo "$OPS"; exit 0 ;;
esac
[ $# -eq 0 ] || { echo "usage: $0 [--python | --wheelhouse | --ops]" >&2; exit 2; }

# DeepSpeed's ops, built by the venv's DeepSpeed into OPS, stamped with the
# venv's requirements hash (a new venv builds them again)
build_ops() {
	ops_stamp=$OPS/.dm-ckpt-requirements.sha256
	if [ -f "$ops_stamp" ] && [ "$(cat "$ops_stamp")" = "$want" ]; then
		return 0
	fi
	echo "venv: building DeepSpeed's CPU Adam, async I/O and pinned-memory ops into $OPS"
	rm -rf "$OPS"
	mkdir -p "$OPS"
	TORCH_EXTENSIONS_DIR=$OPS "$VENV/bin/python" -c '
from deepspeed.accelerator import get_accelerator
for name in ("CPUAdamBuilder", "AsyncIOBuilder", "PinMemoryBuilder"):
    b = get_accelerator().create_op_builder(name)   # the builders ZeRO loads them with
    if not b.is_compatible(verbose=True):
        raise SystemExit(f"venv: DeepSpeed cannot build its {b.name} op here")
    b.load(verbose=False)
' || { echo "venv: DeepSpeed's ops did not build" >&2; exit 1; }
	echo "$want" > "$ops_stamp"
}

# The wheelhouse, with a stamp of its own (a moved build pin refills it, the
# venv stays)
wheels_want=$(sha256sum "$BUILD_REQ" | cut -d' ' -f1)
wheels_stamp=$WHEELS/.dm-ckpt-requirements-build.sha256
if ! { [ -f "$wheels_stamp" ] && [ "$(cat "$wheels_stamp")" = "$wheels_want" ]; }; then
	echo "venv: downloading requirements-build.txt into $WHEELS"
	rm -rf "$WHEELS"
	mkdir -p "$WHEELS" "$CACHE"
	"$BASE_PYTHON" -m pip --cache-dir "$CACHE" --disable-pip-version-check download -q --no-deps \
		--only-binary=:all: -d "$WHEELS" -r "$BUILD_REQ"
	echo "$wheels_want" > "$wheels_stamp"
fi

want=$(sha256sum "$REQ" | cut -d' ' -f1)
stamp=$VENV/.dm-ckpt-requirements.sha256
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ] && [ -x "$VENV/bin/python" ]; then
	build_ops
	exit 0
fi

echo "venv: installing requirements.txt into $VENV (pip cache $CACHE)"
mkdir -p "$(dirname "$VENV")" "$CACHE"
rm -rf "$VENV"
"$BASE_PYTHON" -m venv "$VENV"
pip() { "$VENV/bin/python" -m pip --cache-dir "$CACHE" --disable-pip-version-check "$@"; }
# torch first: deepspeed's setup.py imports it
pip install -q "$(grep -E '^torch==' "$REQ")" "$(grep -E '^numpy==' "$REQ")"
# DS_BUILD_OPS=0: DeepSpeed compiles its ops (CPU Adam, async I/O) on first
# use, with ninja, not at install
DS_BUILD_OPS=0 pip install -q --no-build-isolation -r "$REQ"
"$VENV/bin/python" -c 'import torch, transformers, accelerate, deepspeed, safetensors' \
	|| { echo "venv: the installed packages do not import" >&2; exit 1; }
echo "$want" > "$stamp"
echo "venv: $("$VENV/bin/python" -c 'import torch; print("torch", torch.__version__)') in $VENV"
build_ops
