#!/bin/sh
# ckptctl and ckpt-trace from the outside: output, exit codes, error messages,
# and the engine's determinism (the property the kernel comparison rests on).
# TAP output; any failure makes the exit status non-zero.
set -u
bin=${1:?usage: test_tools.sh BUILD_DIR}/tools
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
TAP_OUT=$tmp/out
. "$(dirname "$0")/../tap.sh"

cat >"$tmp/m.json" <<'JSON'
{"dtype": "fp16", "chunk_params": 4096,
 "tensors": [{"name": "emb", "shape": [300, 70]}, {"name": "ln", "shape": [70], "group": 1},
             {"name": "head", "shape": [70, 300]}]}
JSON

ok "format from a manifest" "$bin/ckptctl" format "$tmp/a.img" -m "$tmp/m.json"
ok "info names the tensors" sh -c "'$bin/ckptctl' info '$tmp/a.img' | grep -q 'head.*shape \[70,300\]'"
ok "info --json is JSON with the geometry" sh -c \
	"'$bin/ckptctl' info --json '$tmp/a.img' | /usr/bin/python3 -c 'import json,sys; j=json.load(sys.stdin); assert j[\"dtype\"]==\"fp16\" and j[\"chunk_params\"]==4096 and j[\"committed_step\"]==0 and len(j[\"tensors\"])==3, j'"
ok "info --table is a dm table line" sh -c \
	"'$bin/ckptctl' info --table '$tmp/a.img' | grep -qE '^0 [0-9]+ ckpt $tmp/a.img\$'"
ok "--chunk-params overrides the manifest" sh -c \
	"'$bin/ckptctl' format '$tmp/b.img' -m '$tmp/m.json' --chunk-params 8192 --dtype bf16 | grep -q 'chunks of 8192, 2 groups, bf16'"
fails_with "info on a missing file" any "cannot open" "$bin/ckptctl" info "$tmp/missing.img"
head -c 65536 /dev/urandom >"$tmp/random.img"
fails_with "info on random bytes" any "not a usable dm-ckpt image" "$bin/ckptctl" info "$tmp/random.img"
head -c 8192 "$tmp/a.img" >"$tmp/trunc.img"
fails_with "info on a truncated image" any "smaller than" "$bin/ckptctl" info "$tmp/trunc.img"
echo '{"tensors": [' >"$tmp/bad.json"
fails_with "format with a broken manifest" any "not a JSON object" "$bin/ckptctl" format "$tmp/c.img" -m "$tmp/bad.json"
echo '{"tensors": [{"name": "x", "shape": [4, 0]}]}' >"$tmp/bad.json"
fails_with "format with an empty dimension" any "empty dimension" "$bin/ckptctl" format "$tmp/c.img" -m "$tmp/bad.json"
echo '{"tensors": [{"name": "x", "shape": [4]}, {"name": "x", "shape": [4]}]}' >"$tmp/bad.json"
fails_with "format with a duplicate name" any "added twice" "$bin/ckptctl" format "$tmp/c.img" -m "$tmp/bad.json"
echo '{"tensors": [{"name": "x", "shape": [4], "group": 64}]}' >"$tmp/bad.json"
fails_with "format with a group out of range" any "group 64 out of range" "$bin/ckptctl" format "$tmp/c.img" -m "$tmp/bad.json"
fails_with "format with a bad chunk size" any "power of two" "$bin/ckptctl" format "$tmp/c.img" -m "$tmp/m.json" --chunk-params 3000
fails_with "format into a file too small" any "too small" "$bin/ckptctl" format "$tmp/c.img" -m "$tmp/m.json" --size 8192

# The same trace with different engine concurrency leaves identical images.
ok "trace: format" "$bin/ckpt-trace" "$tmp/t1.img" --format --params 200000 --chunk-params 4096 --steps 0 --seed 3
cp "$tmp/t1.img" "$tmp/t2.img"
ok "trace: 60 steps, one worker" sh -c "'$bin/ckpt-trace' '$tmp/t1.img' --steps 60 --seed 3 --workers 1 --depth 1 >'$tmp/t1.txt'"
ok "trace: 60 steps, three workers" sh -c "'$bin/ckpt-trace' '$tmp/t2.img' --steps 60 --seed 3 --workers 3 --depth 4 >'$tmp/t2.txt'"
ok "trace: overflow and abort steps happened" sh -c "grep -q overflow '$tmp/t1.txt' && grep -q aborted '$tmp/t1.txt'"
ok "trace: the same output" cmp "$tmp/t1.txt" "$tmp/t2.txt"
ok "trace: byte-identical images" cmp "$tmp/t1.img" "$tmp/t2.img"
ok "trace: resumes from the committed step" sh -c "'$bin/ckpt-trace' '$tmp/t1.img' --steps 5 --seed 3 | tail -1 | grep -q 'committed step 65'"
cp "$tmp/t1.img" "$tmp/t1.ref"
fails_with "trace: --format over an image is refused without --force" 1 "t1.img holds a dm-ckpt image" \
	"$bin/ckpt-trace" "$tmp/t1.img" --format --params 200000 --chunk-params 4096 --steps 0 --seed 3
ok "... and leaves it as it was" cmp "$tmp/t1.img" "$tmp/t1.ref"
ok "trace: --format --force formats it again" sh -c \
	"'$bin/ckpt-trace' '$tmp/t1.ref' --format --force --params 200000 --chunk-params 4096 --steps 0 --seed 3 |
	 tail -1 | grep -q 'committed step 0'"

# A step must not build upon a corrupt committed record: the flipped bit would
# become new committed state with a fresh checksum (and verify would say ok).
cp "$tmp/t1.img" "$tmp/t3.img"
flip_off=$("$bin/ckptctl" info --json "$tmp/t3.img" | /usr/bin/python3 -c \
	'import json,sys; j=json.load(sys.stdin); L=j["regions"]; print(L["rec_off"][j["committed_slot"]] + 4096 + 2)')
/usr/bin/python3 -c 'import sys
with open(sys.argv[1], "r+b") as f:
    f.seek(int(sys.argv[2])); c = f.read(1)[0]; f.seek(int(sys.argv[2])); f.write(bytes([c ^ 0x40]))' \
	"$tmp/t3.img" "$flip_off"
fails_with "trace: a flipped bit in committed state fails the step" any "chunk 0 slot .*data checksum mismatch" \
	"$bin/ckpt-trace" "$tmp/t3.img" --steps 1 --seed 3
ok "... and commits nothing" sh -c "'$bin/ckptctl' info --json '$tmp/t3.img' | /usr/bin/python3 -c \
	'import json,sys; assert json.load(sys.stdin)[\"committed_step\"] == 65'"
fails_with "... verify still finds the flipped bit" 2 "record data of chunk 0 .*checksum mismatch" \
	"$bin/ckptctl" verify "$tmp/t3.img"

echo "1..$n"
[ "$failed" -eq 0 ]
