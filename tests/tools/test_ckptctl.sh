#!/bin/sh
# ckptctl from the outside: safetensors format/import/export round trips
# (checked by an independent reader: Debian's python3 with json + numpy),
# verify finding a flipped byte, restore and --rollback, probe on a non-NVMe
# path, and the error paths (missing device, wrong image, bad manifest,
# lying safetensors headers). TAP output; any failure makes the exit status
# non-zero. The device-mapper and NVMe paths run in the VM: tests/vm/ckptctl_dm.sh.
set -u
bin=${1:?usage: test_ckptctl.sh BUILD_DIR}/tools
ctl=$bin/ckptctl
py=/usr/bin/python3
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
TAP_OUT=$tmp/out
. "$(dirname "$0")/../tap.sh"

cd "$tmp" || exit 1

# ---------------------------------------------------------------- fixtures
# An independent safetensors writer and reader (json + numpy only).
cat >st.py <<'PY'
import json, struct, sys
import numpy as np

def write(path, tensors, meta=None):
    hdr, blobs, off = {}, [], 0
    for name, (dt, arr) in tensors.items():
        b = arr.tobytes()
        hdr[name] = {"dtype": dt, "shape": list(arr.shape), "data_offsets": [off, off + len(b)]}
        off += len(b)
        blobs.append(b)
    if meta:
        hdr["__metadata__"] = meta
    h = json.dumps(hdr).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))

def read(path):
    b = open(path, "rb").read()
    n = struct.unpack("<Q", b[:8])[0]
    assert (8 + n) % 8 == 0, "data not 8-byte aligned"
    h = json.loads(b[8:8 + n].decode("utf-8"))
    data = b[8 + n:]
    meta = h.pop("__metadata__", {})
    dt = {"F32": np.float32, "F16": np.float16, "F64": np.float64, "I64": np.int64, "BF16": np.uint16}
    end = 0
    out = {}
    for k, v in sorted(h.items(), key=lambda kv: kv[1]["data_offsets"]):
        s, e = v["data_offsets"]
        assert s == end, "gap or overlap"
        end = e
        out[k] = (v["dtype"], np.frombuffer(data[s:e], dtype=dt[v["dtype"]]).reshape(v["shape"]))
    assert end == len(data), "trailing bytes"
    return out, meta

def f32(dt, a):  # what the device's fp32 masters hold for an input tensor
    if dt == "BF16":
        return (a.astype(np.uint32) << 16).view(np.float32)
    return a.astype(np.float32)

def models():
    r = np.random.default_rng(7)
    def t(*shape):
        return r.standard_normal(shape).astype(np.float32)
    base = {"embed.weight": t(300, 70), "layer0.norm.weight": t(70), "layer0.attn.weight": t(70, 70),
            "layer0.attn.bias": t(70), "head.weight": t(70, 300), "head.bias": t(300)}
    write("f32.safetensors", {k: ("F32", v) for k, v in base.items()} |
          {"position_ids": ("I64", np.arange(16, dtype=np.int64))}, {"format": "pt"})
    write("f16.safetensors", {k: ("F16", v.astype(np.float16)) for k, v in base.items()})
    bf = {k: ("BF16", (v.view(np.uint32) >> 16).astype(np.uint16)) for k, v in base.items()}
    write("bf16.safetensors", bf)

if __name__ == "__main__":
    cmd = sys.argv[1]
    if cmd == "models":
        models()
    elif cmd == "same":  # same IN EXPORTED: every float tensor of IN equals EXPORTED's F32 tensor
        a, _ = read(sys.argv[2])
        b, meta = read(sys.argv[3])
        for k, (dt, v) in a.items():
            if dt == "I64":
                continue
            bdt, bv = b[k]
            assert bdt == "F32", (k, bdt)
            assert bv.shape == v.shape, (k, bv.shape, v.shape)
            assert np.array_equal(f32(dt, v).view(np.uint32), bv.view(np.uint32)), k
        print("equal", len(a), meta)
    elif cmd == "identical":  # identical A B: all tensors bit for bit, and the step
        a, ma = read(sys.argv[2])
        b, mb = read(sys.argv[3])
        assert a.keys() == b.keys(), (a.keys(), b.keys())
        for k in a:
            assert np.array_equal(a[k][1].view(np.uint8), b[k][1].view(np.uint8)), k
        assert ma["step"] == mb["step"], (ma, mb)
        print("identical", len(a))
    elif cmd == "meta":  # meta FILE KEY VALUE
        _, m = read(sys.argv[2])
        assert m.get(sys.argv[3]) == sys.argv[4], m
    elif cmd == "nonzero":  # nonzero FILE NAME
        t, _ = read(sys.argv[2])
        assert np.any(t[sys.argv[3]][1] != 0), sys.argv[3]
    elif cmd == "write":  # write FILE NAME SHAPE VALUE: one F32 tensor filled with VALUE
        shape = [int(x) for x in sys.argv[4].split("x")]
        write(sys.argv[2], {sys.argv[3]: ("F32", np.full(shape, float(sys.argv[5]), dtype=np.float32))})
    elif cmd == "extra":  # extra IN OUT NAME: IN's tensors plus an F32 tensor NAME
        t, m = read(sys.argv[2])
        t[sys.argv[4]] = ("F32", np.ones(8, dtype=np.float32))
        write(sys.argv[3], {k: (dt, v) for k, (dt, v) in t.items() if dt != "BF16"}, m)
    elif cmd == "flip":  # flip FILE OFFSET: xor one byte
        with open(sys.argv[2], "r+b") as f:
            f.seek(int(sys.argv[3]))
            c = f.read(1)[0]
            f.seek(int(sys.argv[3]))
            f.write(bytes([c ^ 0x5a]))
    elif cmd == "setbyte":  # setbyte FILE OFFSET VALUE
        with open(sys.argv[2], "r+b") as f:
            f.seek(int(sys.argv[3]))
            f.write(bytes([int(sys.argv[4])]))
    elif cmd == "off":  # off INFO_JSON KEY [PLUS]: a layout offset (+ PLUS)
        j = json.load(open(sys.argv[2]))
        print(j["regions"][sys.argv[3]] + (int(sys.argv[4]) if len(sys.argv) > 4 else 0))
    elif cmd == "v1":  # v1 FILE: make a META2 image what main's format wrote (one metadata copy)
        def crc32c(b):
            c = 0xffffffff
            for x in b:
                c ^= x
                for _ in range(8):
                    c = (c >> 1) ^ (0x82f63b78 if c & 1 else 0)
            return c ^ 0xffffffff
        with open(sys.argv[2], "r+b") as f:
            for k in (0, 1):
                f.seek(k * 4096)
                b = bytearray(f.read(4096))
                if b[:4] != b"CKPT":
                    continue
                meta2 = struct.unpack_from("<Q", b, 168)[0]
                struct.pack_into("<I", b, 20, 0)       # feature_incompat
                struct.pack_into("<QI", b, 168, 0, 0)  # meta2_off, group_crc
                struct.pack_into("<Q", b, 88, meta2)  # dev_bytes: the layout end without the copy
                struct.pack_into("<I", b, 8, 0)
                struct.pack_into("<I", b, 8, crc32c(bytes(b)))
                f.seek(k * 4096)
                f.write(b)
            f.truncate(meta2)
    elif cmd == "recoff":  # recoff INFO_JSON TENSOR [SLOT]: byte offset of that tensor's first fp32 p
        j = json.load(open(sys.argv[2]))
        t = [x for x in j["tensors"] if x["name"] == sys.argv[3]][0]
        slot = int(sys.argv[4]) if len(sys.argv) > 4 else j["committed_slot"]
        L, cp = j["regions"], j["chunk_params"]
        c, i = divmod(t["offset"], cp)
        print(L["rec_off"][slot] + c * L["record_bytes"] + 4096 + i * 4 + 2)
    elif cmd == "plooff":  # plooff INFO_JSON TENSOR: byte offset of that tensor's first committed p_lo
        j = json.load(open(sys.argv[2]))
        t = [x for x in j["tensors"] if x["name"] == sys.argv[3]][0]
        print(j["regions"]["plo_off"][j["committed_slot"]] + t["offset"] * 2)
    elif cmd == "many":  # many FILE N [params]: N tensors of shape [3] with moments (or not), step 7
        r = np.random.default_rng(3)
        t = {}
        for i in range(int(sys.argv[3])):
            for sfx in ("",) if sys.argv[4:] == ["params"] else ("", ".exp_avg", ".exp_avg_sq"):
                a = r.standard_normal(3).astype(np.float32)
                t[f"t{i}{sfx}"] = ("F32", np.abs(a) if sfx == ".exp_avg_sq" else a)
        write(sys.argv[2], t, {"format": "pt", "step": "7"})
    elif cmd == "step":  # step IN OUT STEP: IN with __metadata__ step STEP
        t, m = read(sys.argv[2])
        write(sys.argv[3], t, m | {"step": sys.argv[4]})
    elif cmd == "setmeta":  # setmeta IN OUT KEY [VALUE]: IN with __metadata__ KEY set (or removed)
        t, m = read(sys.argv[2])
        m = dict(m)
        if len(sys.argv) > 5:
            m[sys.argv[4]] = sys.argv[5]
        else:
            m.pop(sys.argv[4], None)
        write(sys.argv[3], t, m)
    elif cmd == "sameexport":  # sameexport A B: same tensors, order, bytes and metadata (but the uuid)
        a, ma = read(sys.argv[2])
        b, mb = read(sys.argv[3])
        assert list(a) == list(b), (list(a), list(b))
        for k in a:
            assert a[k][0] == b[k][0] and np.array_equal(a[k][1].view(np.uint8), b[k][1].view(np.uint8)), k
        ma.pop("ckpt.uuid"), mb.pop("ckpt.uuid")
        assert ma == mb, (ma, mb)
        assert ma["dm-ckpt.tensor_group.ln"] == "1" and ma["dm-ckpt.group.1.flags"] == "1", ma
    elif cmd == "samelayout":  # samelayout INFO_A INFO_B: same geometry and tensors
        a, b = json.load(open(sys.argv[2])), json.load(open(sys.argv[3]))
        for k in ("dtype", "chunk_params", "n_chunks", "n_groups", "tensors"):
            assert a[k] == b[k], (k, a[k], b[k])
    elif cmd == "shard":  # shard IN DIR N [INDEX]: IN split into N shards, with an index
        import os
        t, m = read(sys.argv[2])
        n = int(sys.argv[4])
        os.makedirs(sys.argv[3], exist_ok=True)
        names, wm = list(t), {}
        for i in range(n):
            f = f"model-{i + 1:05d}-of-{n:05d}.safetensors"
            part = names[i * len(names) // n:(i + 1) * len(names) // n]
            write(os.path.join(sys.argv[3], f), {k: t[k] for k in part}, m)
            wm |= {k: f for k in part}
        idx = sys.argv[5] if len(sys.argv) > 5 else "model.safetensors.index.json"
        json.dump({"metadata": {"total_size": 0}, "weight_map": wm}, open(os.path.join(sys.argv[3], idx), "w"))
    elif cmd == "index":  # index FILE JSON: write an index as given
        open(sys.argv[2], "w").write(sys.argv[3])
    elif cmd == "bad":  # headers that lie, one file each
        def raw(path, h, data=b"", hlen=None):
            with open(path, "wb") as f:
                f.write(struct.pack("<Q", len(h) if hlen is None else hlen) + h + data)
        d = bytes(16)
        e = lambda s, o: '"%s":{"dtype":"F32","shape":%s,"data_offsets":%s}' % (s, o[0], o[1])
        raw("past_end.st", ('{%s}' % e("a", ("[8]", "[0,32]"))).encode(), d)
        raw("overlap.st", ('{%s,%s}' % (e("a", ("[2]", "[0,8]")), e("b", ("[2]", "[4,12]")))).encode(), d[:12])
        raw("gap.st", ('{%s,%s}' % (e("a", ("[2]", "[0,8]")), e("b", ("[1]", "[12,16]")))).encode(), d)
        raw("trailing.st", ('{%s}' % e("a", ("[2]", "[0,8]"))).encode(), d)
        raw("size.st", b'{"a":{"dtype":"F16","shape":[4],"data_offsets":[0,16]}}', d)
        raw("dtype.st", b'{"a":{"dtype":"F17","shape":[4],"data_offsets":[0,16]}}', d)
        raw("dup.st", ('{%s,%s}' % (e("a", ("[2]", "[0,8]")), e("a", ("[2]", "[8,16]")))).encode(), d)
        raw("utf8.st", b'{"\xff\xfe":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}}', d)
        raw("json.st", b'{"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}', d)
        raw("overflow.st", ('{%s}' % e("a", ("[4294967296,4294967296]", "[0,16]"))).encode(), d)
        raw("pastfile.st", b'{}', b"", hlen=4096)
        raw("short.st", b"", b"", hlen=None)
        with open("huge.st", "wb") as f:  # sparse: 160 MB file, 150 MB header length
            f.write(struct.pack("<Q", 150_000_000) + b"{")
            f.truncate(160_000_000)
PY
run_py() { "$py" st.py "$@"; }
ok "fixtures: safetensors models (F32 with an I64 buffer, F16, BF16)" run_py models

# ---------------------------------------------------------------- help
for c in format info probe create remove status list message serve unserve import export verify restore plan; do
	ok "$c --help has a description, options and examples" sh -c \
		"'$ctl' $c --help | grep -q EXAMPLES && '$ctl' $c --help | grep -q Options"
done

# ---------------------------------------------------------------- the command line
version=$(sed -n 's/^CMAKE_PROJECT_VERSION:[A-Z]*=//p' "$1/CMakeCache.txt")
ok "--version prints 'ckptctl <project version>'" sh -c "[ \"\$('$ctl' --version)\" = 'ckptctl $version' ] && [ -n '$version' ]"
fails_with "an unknown command is named (exit 64: usage)" 64 "^ckptctl: unknown command 'bogus'; see ckptctl --help\$" "$ctl" bogus
fails_with "no command at all" 64 "^ckptctl: a command is required; see ckptctl --help\$" "$ctl"
fails_with "an unknown option names the command's help" 64 "^ckptctl info: .*--bogus.*; see ckptctl info --help\$" \
	"$ctl" info --bogus x.img
fails_with "a missing argument" 64 "^ckptctl verify: device is required; see ckptctl verify --help\$" "$ctl" verify
ok "--help documents the exit statuses" sh -c "'$ctl' --help | grep -q '^  64  usage'"

# ---------------------------------------------------------------- serve
# What can be refused before configfs is touched (the VM's NVMe-oF test
# serves for real: scripts/vm/guest/nvmeof-storage.sh).
nqn=nqn.2014-08.org.example:ckpt0
fails_with "serve: an NQN without 'nqn.'" 1 "'bogus' is not an NQN" "$ctl" serve ckpt0 --nqn bogus --addr 10.0.0.1 --any-host
fails_with "serve: an NQN with '/'" 1 "is not an NQN" "$ctl" serve ckpt0 --nqn nqn.a/b --addr 10.0.0.1 --any-host
fails_with "serve: a bad --host NQN" 1 "--host 'h' is not an NQN" "$ctl" serve ckpt0 --nqn $nqn --addr 10.0.0.1 --host h
host=nqn.2014-08.org.example:trainer
fails_with "serve: no host named and no --any-host" 1 "name the hosts that may connect" \
	"$ctl" serve ckpt0 --nqn $nqn --addr 10.0.0.1
fails_with "serve: --any-host with a --host" 1 "--any-host serves every host" \
	"$ctl" serve ckpt0 --nqn $nqn --addr 10.0.0.1 --any-host --host $host
fails_with "serve: --no-auth with --key-file" 1 "keys or none" \
	"$ctl" serve ckpt0 --nqn $nqn --addr 10.0.0.1 --host $host --no-auth --key-file keys
key=DHHC-1:00:bT8NH/CSjC1+zL3Cx9virgNRHo8fZ5HWew9os12Qq3kiTZuX:
echo "$host $key" >keys
fails_with "serve: a key file line without the controller's key" 1 "keys:1: not 'HOSTNQN HOST_KEY CTRL_KEY'" \
	"$ctl" serve ckpt0 --nqn $nqn --addr 10.0.0.1 --host $host --key-file keys
echo "$host $key secret" >keys
fails_with "serve: a key that is no DH-HMAC-CHAP secret" 1 "'secret' is not a DH-HMAC-CHAP secret" \
	"$ctl" serve ckpt0 --nqn $nqn --addr 10.0.0.1 --host $host --key-file keys
echo "nqn.2014-08.org.example:other $key $key" >keys
fails_with "serve: keys of a host not named" 1 "is not a --host" \
	"$ctl" serve ckpt0 --nqn $nqn --addr 10.0.0.1 --host $host --key-file keys
: >keys
fails_with "serve: a named host without keys in the file" 1 "has no keys for --host $host" \
	"$ctl" serve ckpt0 --nqn $nqn --addr 10.0.0.1 --host $host --key-file keys
fails_with "serve: not an IP address" 1 "'example.org' is not an IPv4 or IPv6 address" \
	"$ctl" serve ckpt0 --nqn $nqn --addr example.org --any-host
fails_with "serve: a port out of range" 1 "port '70000' is not 1..65535" "$ctl" serve ckpt0 --nqn $nqn --addr 10.0.0.1:70000 --any-host
fails_with "serve: an IPv6 address without ']'" 1 "no ']'" "$ctl" serve ckpt0 --nqn $nqn --addr '[fe80::1:4420' --any-host
: >served.img
fails_with "serve: a file is not a dm-ckpt device" 1 "is not a block device" "$ctl" serve ./served.img --nqn $nqn --addr 10.0.0.1 --any-host
fails_with "serve: transport rdma is a usage error" 64 "transport" "$ctl" serve ckpt0 --nqn $nqn --addr 10.0.0.1 --transport rdma
fails_with "unserve: a subsystem serve did not make" 1 "is not served by ckptctl serve" "$ctl" unserve nqn.2014-08.org.example:none

# ---------------------------------------------------------------- plan
# The numbers are tests/unit/test_plan.cpp's; here the command line.
ok "plan: the table, 7e9 params on one GPU" sh -c \
	"'$ctl' plan --params 7e9 | grep -Eq '^GPU memory per rank +112.0 GB +28.0 GB +28.0 GB\$'"
ok "plan -o json: 8 x 4 ranks, 8-bit state" sh -c \
	"'$ctl' plan --params 7e9 --gpus 8 --nodes 4 --state 8bit -o json | '$py' -c \"
import json, sys
j = json.load(sys.stdin)
assert j['ranks'] == 32 and j['state'] == '8bit', j
assert j['gpu_adamw']['network_bytes_per_step_per_node'] == 21000000000, j
assert abs(j['dm_ckpt']['device_write_bytes_per_step'] - 8.09375 * 7e9 / 32) <= 0.5, j\""
ok "plan --json is -o json" sh -c "[ \"\$('$ctl' plan --params 1e6 --json)\" = \"\$('$ctl' plan --params 1e6 -o json)\" ]"
for bad in -1 0 nan inf 1e30 garbage 1.5 7e9x ''; do
	fails_with "plan --params '$bad' is refused (exit 64)" 64 "^ckptctl plan: --params: .*; see ckptctl plan --help\$" \
		"$ctl" plan --params "$bad"
done
for bad in 0 -2 1e30 nan x 70000; do
	fails_with "plan --gpus '$bad' is refused" 64 "^ckptctl plan: --gpus: " "$ctl" plan --params 7e9 --gpus "$bad"
	fails_with "plan --nodes '$bad' is refused" 64 "^ckptctl plan: --nodes: " "$ctl" plan --params 7e9 --nodes "$bad"
done
fails_with "plan: more ranks than params" 64 "at least one param per rank" "$ctl" plan --params 4 --gpus 8
ok "plan --master bf16: 4.03 B of state per param" sh -c \
	"'$ctl' plan --params 7e9 --state 8bit --master bf16 -o json | '$py' -c \"
import json, sys
j = json.load(sys.stdin)
assert j['master'] == 'bf16' and j['state'] == '8bit', j
assert abs(j['dm_ckpt']['device_write_bytes_per_step'] - 6.09375 * 7e9) <= 0.5, j\""
fails_with "plan --master bf16 needs --state 8bit" 64 "needs --state 8bit" "$ctl" plan --params 7e9 --master bf16
fails_with "plan --state other than fp32 or 8bit" 64 "^ckptctl plan: .*--state" "$ctl" plan --params 7e9 --state 4bit
fails_with "plan without --params" 64 "^ckptctl plan: --params is required" "$ctl" plan
fails_with "plan -o other than table or json" 64 "^ckptctl plan: .*--output" "$ctl" plan --params 7e9 -o yaml

# Without device-mapper (no control node under DM_DEV_DIR, and none can be
# made there), every command that needs it says so in one line.
mkdir nodm && : >nodm/mapper
if grep -q ' device-mapper$' /proc/misc; then
	nodm="device-mapper is loaded, but its control node nodm/mapper/control is missing"
else
	nodm="^ckptctl: device-mapper is not available: load it with 'modprobe dm-mod'\$"
fi
for c in "status t0" "remove t0" "message t0 stats"; do
	fails_with "$c without device-mapper" 1 "$nodm" env DM_DEV_DIR="$tmp/nodm" "$ctl" $c
	ok "... in one line" sh -c "out=\$(DM_DEV_DIR='$tmp/nodm' '$ctl' $c 2>&1);
		[ \$(printf '%s\n' \"\$out\" | wc -l) -eq 1 ] && printf '%s\n' \"\$out\" | grep -q \"$nodm\""
done

# ---------------------------------------------------------------- manifests, strictly
manifest_fails() {	# manifest_fails DESCRIPTION PATTERN JSON
	printf '%s\n' "$3" >strict.json
	fails_with "$1" 1 "$2" "$ctl" format strict.img -m strict.json
	ok "... in the project's words, and nothing made" sh -c \
		"out=\$('$ctl' format strict.img -m strict.json 2>&1); [ \$? -eq 1 ] && [ ! -e strict.img ] &&
		 printf '%s\n' \"\$out\" | grep -q '^ckptctl: strict.json: ' && ! printf '%s\n' \"\$out\" | grep -q json.exception"
}
manifest_fails "a misspelled key is refused with its path" \
	"strict.json: \\$.tensors\\[0\\].shpe: unknown key 'shpe' (known keys here: name, shape, group)" \
	'{"tensors": [{"name": "w", "shpe": [64]}]}'
manifest_fails "a misspelled top-level key" "strict.json: \\$.chunk_param: unknown key 'chunk_param'" \
	'{"chunk_param": 4096, "tensors": [{"name": "w", "shape": [64]}]}'
manifest_fails "a missing key" "strict.json: tensor 'b': \\$.tensors\\[1\\]: missing key 'shape'" \
	'{"tensors": [{"name": "w", "shape": [64]}, {"name": "b"}]}'
manifest_fails "a wrong type" "strict.json: \\$.tensors\\[0\\].name: must be a string, not 7" \
	'{"tensors": [{"name": 7, "shape": [64]}]}'

# ---------------------------------------------------------------- format from safetensors
ok "format --from-safetensors with groups" "$ctl" format m.img --from-safetensors f32.safetensors \
	--group 1:'*.bias,*norm*' --chunk-params 4096
"$ctl" info --json m.img >m.json 2>/dev/null
ok "groups by glob: biases and norms in group 1, the rest in 0; buffers skipped" "$py" -c "
import json; j = json.load(open('m.json'))
g = {t['name']: t['group'] for t in j['tensors']}
assert g == {'embed.weight': 0, 'layer0.attn.weight': 0, 'head.weight': 0,
             'layer0.norm.weight': 1, 'layer0.attn.bias': 1, 'head.bias': 1}, g
assert j['n_groups'] == 2 and j['dtype'] == 'bf16', j"
ok "format infers fp16 from an all-F16 file" sh -c \
	"'$ctl' format h.img --from-safetensors f16.safetensors --chunk-params 4096 | grep -q 'groups, fp16'"
ok "format --include/--exclude" sh -c \
	"'$ctl' format x.img --from-safetensors f32.safetensors --include 'layer0.*' --exclude '*.bias' --json |
	 $py -c 'import json,sys; j=json.load(sys.stdin); assert [t[\"name\"] for t in j[\"tensors\"]] == [\"layer0.norm.weight\", \"layer0.attn.weight\"], j[\"tensors\"]'"
fails_with "format --group with a bad spec" 1 "expected G:GLOB" "$ctl" format x.img --from-safetensors f32.safetensors --group 64:'*'
fails_with "format without a manifest or safetensors" 64 "give --manifest" "$ctl" format x.img
fails_with "format from a missing safetensors file" 1 "cannot open" "$ctl" format x.img --from-safetensors nope.safetensors
echo '{"tensors": [' >bad.json
fails_with "format with a broken manifest" 1 "not a JSON object" "$ctl" format x.img -m bad.json
fails_with "format with a missing manifest" 1 "cannot read manifest" "$ctl" format x.img -m nope.json

# ---------------------------------------------------------------- import/export round trips
for dt in f32 f16 bf16; do
	ok "$dt: format" "$ctl" format $dt.img --from-safetensors $dt.safetensors --chunk-params 4096 --dtype bf16
	ok "$dt: import" "$ctl" import $dt.img --from $dt.safetensors
	ok "$dt: export" "$ctl" export $dt.img --to $dt.out.safetensors
	ok "$dt: exported F32 equals the input, converted exactly" run_py same $dt.safetensors $dt.out.safetensors
	ok "$dt: verify after import" "$ctl" verify $dt.img
done
ok "export writes the step metadata" run_py meta f32.out.safetensors step 0
ok "export of params only has no exp_avg" sh -c "! grep -q exp_avg f32.out.safetensors"

# Train three steps on the imported model, then export with the optimizer.
ok "train 3 steps (ckpt-trace)" "$bin/ckpt-trace" f32.img --steps 3 --seed 5
ok "export --with-optimizer" "$ctl" export f32.img --to s3.safetensors --with-optimizer
ok "... has step 3, moments and the trainer blob" sh -c \
	"$py st.py meta s3.safetensors step 3 && $py st.py nonzero s3.safetensors head.weight.exp_avg_sq &&
	 $py st.py meta s3.safetensors ckpt.trainer_blob \$('$ctl' restore --json f32.img | $py -c 'import json,sys; print(json.load(sys.stdin)[\"blob_hex\"])')"
ok "own reader round trip: import --with-optimizer into a new device" sh -c \
	"'$ctl' format r.img --from-safetensors f32.safetensors --chunk-params 4096 --dtype bf16 >/dev/null 2>&1 &&
	 '$ctl' import r.img --from s3.safetensors --with-optimizer | grep -q 'committed step 3'"
ok "... exports the same tensors and step" sh -c \
	"'$ctl' export r.img --to r3.safetensors --with-optimizer >/dev/null && $py st.py identical s3.safetensors r3.safetensors"
cp f32.img f32b.img
ok "... and the next step is bit-identical to the original device's" sh -c \
	"'$bin/ckpt-trace' f32b.img --steps 1 --seed 5 >/dev/null && '$bin/ckpt-trace' r.img --steps 1 --seed 5 >/dev/null &&
	 '$ctl' export f32b.img --to a4.safetensors --with-optimizer >/dev/null &&
	 '$ctl' export r.img --to b4.safetensors --with-optimizer >/dev/null && $py st.py identical a4.safetensors b4.safetensors"
ok "import without --with-optimizer ignores the moments" sh -c \
	"'$ctl' format r2.img --from-safetensors s3.safetensors --chunk-params 4096 --dtype bf16 2>/dev/null | grep -q 'tensors         6' &&
	 '$ctl' import r2.img --from s3.safetensors | grep -q 'ignored 12 exp_avg'"

# ---------------------------------------------------------------- 8-bit moments
ok "8bit: format --state 8bit" sh -c \
	"'$ctl' format q.img --from-safetensors f32.safetensors --chunk-params 4096 --dtype bf16 --state 8bit |
	 grep -q 'bf16, 8bit moments'"
ok "8bit: the records are half the size" sh -c "[ \$(stat -c %s q.img) -lt \$(stat -c %s r.img) ]"
ok "8bit: import --with-optimizer encodes the moments" sh -c \
	"'$ctl' import q.img --from s3.safetensors --with-optimizer | grep -q 'committed step 3'"
ok "8bit: verify" "$ctl" verify q.img
ok "8bit: two steps (ckpt-trace)" "$bin/ckpt-trace" q.img --steps 2 --seed 5
ok "8bit: export --with-optimizer decodes them to F32" sh -c \
	"'$ctl' export q.img --to q5.safetensors --with-optimizer >/dev/null &&
	 $py st.py meta q5.safetensors step 5 && $py st.py nonzero q5.safetensors head.weight.exp_avg_sq"
fails_with "format --state refuses other states" any "4bit not in" "$ctl" format q2.img -m bad.json --state 4bit

# ---------------------------------------------------------------- bf16 masters
ok "bf16 masters: format --state 8bit --master bf16" sh -c \
	"'$ctl' format qb.img --from-safetensors f32.safetensors --chunk-params 4096 --dtype bf16 --state 8bit \
	   --master bf16 | grep -q 'bf16, 8bit moments, bf16 masters'"
ok "bf16 masters: smaller records than 8-bit moments alone" sh -c "[ \$(stat -c %s qb.img) -lt \$(stat -c %s q.img) ]"
ok "bf16 masters: import --with-optimizer rounds the masters" sh -c \
	"'$ctl' import qb.img --from s3.safetensors --with-optimizer | grep -q 'committed step 3'"
ok "bf16 masters: verify" "$ctl" verify qb.img
ok "bf16 masters: two steps (ckpt-trace)" "$bin/ckpt-trace" qb.img --steps 2 --seed 5
ok "bf16 masters: export --with-optimizer gives F32" sh -c \
	"'$ctl' export qb.img --to qb5.safetensors --with-optimizer >/dev/null &&
	 $py st.py meta qb5.safetensors step 5 && $py st.py nonzero qb5.safetensors head.weight.exp_avg_sq"
fails_with "format --master bf16 needs --state 8bit" any "bf16 masters need 8-bit moments" \
	"$ctl" format qb2.img --from-safetensors f32.safetensors --chunk-params 4096 --dtype bf16 --master bf16

# ---------------------------------------------------------------- 8-bit images through an export
# The export says which state formats the image had (dm-ckpt.state,
# dm-ckpt.master); format --from-safetensors lays them out again, and an
# import of the export gives back the state bit for bit: exported again, it
# is the same file. Each encode of a decoded block is that block's encode.
ok "8bit: export records the state formats" sh -c \
	"$py st.py meta q5.safetensors dm-ckpt.state 8bit && $py st.py meta q5.safetensors dm-ckpt.master fp32 &&
	 $py st.py meta qb5.safetensors dm-ckpt.state 8bit && $py st.py meta qb5.safetensors dm-ckpt.master bf16 &&
	 $py st.py meta s3.safetensors dm-ckpt.state fp32 && $py st.py meta s3.safetensors dm-ckpt.master fp32"
for i in q5:'8bit moments, fp32 masters' qb5:'8bit moments, bf16 masters'; do
	f=${i%%:*}
	ok "8bit: format --from-safetensors of $f's export lays out ${i#*:}" sh -c \
		"'$ctl' format x$f.img --from-safetensors $f.safetensors 2>fmt.err | grep -q 'bf16, ${i#*:}' &&
		 grep -q 'dm-ckpt metadata): bf16, chunks of 4096, .*, ${i#*:}' fmt.err"
	ok "... import of the export, exported again, is the same state bit for bit" sh -c \
		"'$ctl' import x$f.img --from $f.safetensors --with-optimizer >/dev/null &&
		 '$ctl' export x$f.img --to x$f.safetensors --with-optimizer >/dev/null &&
		 $py st.py identical $f.safetensors x$f.safetensors"
	ok "... and so is a second round trip" sh -c \
		"'$ctl' format y$f.img --from-safetensors x$f.safetensors 2>/dev/null >/dev/null &&
		 '$ctl' import y$f.img --from x$f.safetensors --with-optimizer >/dev/null &&
		 '$ctl' export y$f.img --to y$f.safetensors --with-optimizer >/dev/null &&
		 $py st.py identical $f.safetensors y$f.safetensors"
done
ok "8bit: --state overrides the file's, and drops bf16 masters, saying so" sh -c \
	"'$ctl' format xs.img --from-safetensors qb5.safetensors --state fp32 2>fmt.err | grep -q 'bf16, fp32 moments, fp32 masters' &&
	 grep -q -- '--state fp32 overrides the file.s 8bit' fmt.err && grep -q 'bf16 masters are dropped' fmt.err"
ok "8bit: --master overrides the file's" sh -c \
	"'$ctl' format xm.img --from-safetensors qb5.safetensors --master fp32 2>fmt.err | grep -q 'bf16, 8bit moments, fp32 masters' &&
	 grep -q -- '--master fp32 overrides the file.s bf16' fmt.err"
ok "8bit: an export without the keys (an older one) lays out fp32 state" sh -c \
	"$py st.py setmeta q5.safetensors old.safetensors dm-ckpt.state && $py st.py setmeta old.safetensors old.safetensors dm-ckpt.master &&
	 '$ctl' format xo.img --from-safetensors old.safetensors 2>/dev/null | grep -q 'bf16, fp32 moments, fp32 masters'"

# ---------------------------------------------------------------- lossless interchange
# export -> format --from-safetensors -> import -> export: the dm-ckpt.*
# metadata carries the layout (interleaved groups, chunk size, dtype) and the
# groups' hyperparameters.
cat >ix.json <<'JSON'
{"dtype": "fp16", "chunk_params": 2048,
 "tensors": [{"name": "emb", "shape": [300, 70]}, {"name": "ln", "shape": [70], "group": 1},
             {"name": "head", "shape": [70, 300]}],
 "groups": [{"lr": 0.001, "betas": [0.9, 0.95], "eps": 1e-8, "weight_decay": 0.1, "adam_l2": false},
            {"lr": 0.002, "betas": [0.8, 0.999], "eps": 1e-6, "weight_decay": 0.0, "adam_l2": true}]}
JSON
ok "interchange: format with hyperparameters, train 3 steps, export" sh -c \
	"'$ctl' format ix.img -m ix.json >/dev/null && '$bin/ckpt-trace' ix.img --steps 3 --seed 5 >/dev/null &&
	 '$ctl' export ix.img --to ix.safetensors --with-optimizer >/dev/null"
ok "... metadata has the version, dtype, chunk size, step, groups and hyperparameters" sh -c \
	"for kv in format_version=1 dtype=fp16 chunk_params=2048 step=3 n_groups=2 tensor_group.emb=0 tensor_group.ln=1 \
	   group.0.lr=0.001 group.0.beta2=0.95 group.0.weight_decay=0.1 group.0.flags=0 group.1.eps=1e-06 group.1.flags=1; do
	   $py st.py meta ix.safetensors dm-ckpt.\${kv%%=*} \${kv#*=} || exit 1; done"
ok "... format --from-safetensors gives the same layout" sh -c \
	"'$ctl' format ix2.img --from-safetensors ix.safetensors >/dev/null 2>fmt.err && grep -q 'dm-ckpt metadata' fmt.err &&
	 '$ctl' info --json ix.img >ixa.json && '$ctl' info --json ix2.img >ixb.json && $py st.py samelayout ixa.json ixb.json"
ok "... import and export give the same bytes, groups and hyperparameters" sh -c \
	"'$ctl' import ix2.img --from ix.safetensors --with-optimizer >/dev/null &&
	 '$ctl' export ix2.img --to ix2.safetensors --with-optimizer >/dev/null && $py st.py sameexport ix.safetensors ix2.safetensors"
ok "... a command-line flag overrides the file's, and says so" sh -c \
	"'$ctl' format ix3.img --from-safetensors ix.safetensors --chunk-params 4096 --dtype bf16 2>fmt.err >/dev/null &&
	 grep -q -- '--chunk-params 4096 overrides the file.s 2048' fmt.err && grep -q -- '--dtype bf16 overrides the file.s fp16' fmt.err &&
	 '$ctl' info ix3.img | grep -q 'chunks of 4096, 2 groups, bf16'"
for c in "dm-ckpt.colour=red:unknown dm-ckpt key" "dm-ckpt.chunk_params=02048:not an integer" \
	"dm-ckpt.chunk_params=3000:not a power of two" "dm-ckpt.format_version=2:not the one this library reads" \
	"dm-ckpt.dtype=fp8:not bf16 or fp16" "dm-ckpt.n_groups=3:the tensors use groups 0 to 1" \
	"dm-ckpt.tensor_group.ln=2:not below" "dm-ckpt.tensor_group.nope=0:names no tensor" \
	"dm-ckpt.group.1.lr=-0.5:lr = -0.5 is invalid" "dm-ckpt.group.1.eps=nan:not a finite number" \
	"dm-ckpt.group.0.flags=2:unknown bits" "dm-ckpt.group.0.momentum=1:unknown key" \
	"dm-ckpt.group.2.lr=1:group 2 is not below" "dm-ckpt.step=x:not an integer" \
	"dm-ckpt.step:no dm-ckpt.step" "dm-ckpt.group.1.beta1:no dm-ckpt.group.1.beta1" \
	"dm-ckpt.tensor_group.head:no dm-ckpt.tensor_group.head" "dm-ckpt.state=4bit:'4bit' is not fp32 or 8bit" \
	"dm-ckpt.master=bf16:bf16 masters come only with dm-ckpt.state 8bit" "dm-ckpt.master=fp16:is not fp32 or bf16"; do
	kv=${c%%:*}
	if [ "$kv" = "${kv#*=}" ]; then run_py setmeta ix.safetensors bad.safetensors "$kv"
	else run_py setmeta ix.safetensors bad.safetensors "${kv%%=*}" "${kv#*=}"; fi
	fails_with "format refuses __metadata__ $kv" 1 "${c#*:}" "$ctl" format x.img --from-safetensors bad.safetensors
done
"$ctl" format ix4.img --from-safetensors ix.safetensors >/dev/null 2>&1
run_py setmeta ix.safetensors bad.safetensors dm-ckpt.colour red
fails_with "import refuses bad dm-ckpt metadata too" 1 "unknown dm-ckpt key" "$ctl" import ix4.img --from bad.safetensors
run_py setmeta ix.safetensors bad.safetensors step 4
fails_with "import refuses a step that disagrees with dm-ckpt.step" 1 "disagree" "$ctl" import ix4.img --from bad.safetensors --with-optimizer

# ---------------------------------------------------------------- sharded checkpoints
run_py shard f32.safetensors hf 3
ok "sharded: format from a model folder (index)" sh -c \
	"'$ctl' format sh.img --from-safetensors hf --chunk-params 4096 --dtype bf16 2>fmt.err >/dev/null && grep -q 'index.json: 6 tensors' fmt.err"
ok "... import from the index, export equals the single file" sh -c \
	"'$ctl' import sh.img --from hf/model.safetensors.index.json >/dev/null && '$ctl' export sh.img --to sh.safetensors >/dev/null &&
	 $py st.py same f32.safetensors sh.safetensors"
mkdir -p hf1 && cp f32.safetensors hf1/model.safetensors
ok "... a folder with model.safetensors" sh -c "'$ctl' format sh1.img --from-safetensors hf1 --chunk-params 4096 >/dev/null 2>&1"
run_py shard ix.safetensors ixs 2
ok "... the lossless round trip through shards" sh -c \
	"'$ctl' format ix5.img --from-safetensors ixs >/dev/null 2>&1 && '$ctl' import ix5.img --from ixs --with-optimizer >/dev/null &&
	 '$ctl' export ix5.img --to ix5.safetensors --with-optimizer >/dev/null && $py st.py sameexport ix.safetensors ix5.safetensors"
mkdir -p empty
fails_with "sharded: a folder without a model" 1 "without model.safetensors" "$ctl" format x.img --from-safetensors empty
cp -r hf hfb && cp f32.safetensors hfb/model.safetensors
fails_with "sharded: a folder with both" 1 "holds both" "$ctl" format x.img --from-safetensors hfb
idx=hf/model.safetensors.index.json
wm=$("$py" -c "import json; print(json.dumps(json.load(open('$idx'))['weight_map']))")
for c in "trav:{\"weight_map\": {\"head.bias\": \"../f32.safetensors\"}}:is not a file name in the index's folder" \
	"abs:{\"weight_map\": {\"head.bias\": \"/etc/passwd\"}}:is not a file name" \
	"dot:{\"weight_map\": {\"head.bias\": \"..\"}}:is not a file name" \
	"dup:{\"weight_map\": {\"head.bias\": \"model-00001-of-00003.safetensors\", \"head.bias\": \"model-00002-of-00003.safetensors\"}}:names 'head.bias' twice" \
	"nomap:{\"metadata\": {}}:no \"weight_map\"" "extra:{\"weight_map\": $wm, \"x\": 1}:unknown key 'x'" \
	"json:{\"weight_map\": :not valid JSON" \
	"wrong:$(echo "$wm" | sed 's/"head.bias": "model-00003/"head.bias": "model-00001/'):is in shard model-00003-of-00003.safetensors, the index names shard model-00001" \
	"lacks:$(echo "$wm" | sed 's/"head.bias": "[^"]*", //; s/, "head.bias": "[^"]*"//'):which the index does not name" \
	"more:$(echo "$wm" | sed 's/}$/, "ghost": "model-00001-of-00003.safetensors"}/'):puts tensor 'ghost' in shard"; do
	name=${c%%:*}; rest=${c#*:}; body=${rest%:*}
	case $name in wrong|lacks|more) body="{\"weight_map\": $body}";; esac
	run_py index hf/$name.index.json "$body"
	fails_with "sharded: index refused: $name" 1 "${rest##*:}" "$ctl" format x.img --from-safetensors hf/$name.index.json
	fails_with "sharded: import refuses it too: $name" 1 "${rest##*:}" "$ctl" import ix4.img --from hf/$name.index.json
done

# ---------------------------------------------------------------- import errors
"$ctl" format e.img --force --from-safetensors f32.safetensors --chunk-params 4096 >/dev/null 2>&1
fails_with "import into a missing device" 1 "cannot open" "$ctl" import missing.img --from f32.safetensors
head -c 65536 /dev/urandom >random.img
fails_with "import into random bytes" 1 "not a usable dm-ckpt image" "$ctl" import random.img --from f32.safetensors
fails_with "import after the first step" 1 "before its first step" "$ctl" import f32.img --from f32.safetensors
run_py write shape.safetensors head.bias 3x100 1
fails_with "import with a wrong shape" 1 "has shape \[3,100\]" "$ctl" import e.img --from shape.safetensors --partial
run_py write one.safetensors head.bias 300 1
fails_with "import of a file lacking tensors" 1 "lacks tensors of the device" "$ctl" import e.img --from one.safetensors
ok "import --partial keeps the others" sh -c "'$ctl' import e.img --from one.safetensors --partial | grep -q 'kept 5 tensors'"
"$ctl" format e.img --force --from-safetensors f32.safetensors --chunk-params 4096 >/dev/null 2>&1
run_py extra f32.safetensors extra.safetensors other
fails_with "import of unknown tensors" 1 "has tensors the device lacks: other" "$ctl" import e.img --from extra.safetensors
ok "import --partial skips them" sh -c "'$ctl' import e.img --from extra.safetensors --partial | grep -q 'skipped 1 tensors the device lacks: other'"
"$ctl" format e.img --force --from-safetensors f32.safetensors --chunk-params 4096 >/dev/null 2>&1
fails_with "import --with-optimizer without moments" 1 "has no 'embed.weight.exp_avg'" "$ctl" import e.img --from f32.safetensors --with-optimizer
run_py write nan.safetensors head.bias 300 nan
fails_with "import of a NaN" 1 "element 0 is nan" "$ctl" import e.img --from nan.safetensors --partial
fails_with "import from a missing file" 1 "cannot open nope" "$ctl" import e.img --from nope.safetensors
ok "a refused import changed nothing" sh -c "'$ctl' verify e.img && '$ctl' info --json e.img | grep -q '\"sequence\": 1'"

# ---------------------------------------------------------------- lying safetensors headers
run_py bad
for c in "past_end:run past the end" "overlap:overlap another" "gap:belong to no tensor" "trailing:the tensors cover 8" \
	"size:needs 8 bytes" "dtype:unknown dtype 'F17'" "dup:names 'a' twice" "utf8:ill-formed UTF-8" \
	"json:not valid JSON" "overflow:overflows" "pastfile:larger than the file" "short:too short" \
	"huge:exceeds the format's limit"; do
	f=${c%%:*}
	fails_with "format rejects a header: $f" 1 "${c#*:}" "$ctl" format x.img --from-safetensors $f.st
	fails_with "import rejects a header: $f" 1 "${c#*:}" "$ctl" import e.img --from $f.st
done

# ---------------------------------------------------------------- verify and restore
ok "verify a trained device" sh -c "'$ctl' verify f32.img | grep -q 'verify: ok'"
ok "verify --json" sh -c "'$ctl' verify --json f32.img | $py -c 'import json,sys; j=json.load(sys.stdin); assert j[\"ok\"] and j[\"rollback\"][\"available\"] and j[\"rollback\"][\"step\"] == 2, j'"
cp f32.img v.img
"$ctl" info --json v.img >v.json
run_py flip v.img "$(run_py recoff v.json head.bias)"
fails_with "verify finds a flipped byte and names the tensor" 2 "tensors: head.bias" "$ctl" verify v.img
fails_with "... and says where" 2 "record data of chunk .*checksum mismatch" "$ctl" verify v.img
fails_with "... and the p it corrupted" 2 "head.bias\[0\]" "$ctl" verify v.img
ok "verify --json lists the damage" sh -c "'$ctl' verify --json v.img | $py -c 'import json,sys; j=json.load(sys.stdin); assert not j[\"ok\"] and [\"head.bias\"] in [d[\"tensors\"] for d in j[\"damage\"]], j'"
fails_with "export refuses the damaged state" 1 "data checksum mismatch" "$ctl" export v.img --to v.safetensors
fails_with "restore reports the damage" 2 "DAMAGED" "$ctl" restore v.img
ok "restore --rollback recovers the previous step" sh -c "'$ctl' restore --rollback v.img | grep -q 'rolled back from step 3 to step 2'"
ok "... which verifies" "$ctl" verify v.img
cp f32.img pl.img
run_py flip pl.img "$(run_py plooff v.json head.bias)"
fails_with "verify checks the p_lo checksum" 2 "p_lo of chunk .*checksum mismatch" "$ctl" verify pl.img
fails_with "... and names the tensor" 2 "tensors: head.bias" "$ctl" verify pl.img
fails_with "restore reports it" 2 "DAMAGED" "$ctl" restore pl.img
cp f32.img w.img
ok "restore shows step, blob and the previous step" sh -c \
	"'$ctl' restore w.img | grep -q 'printable .*step 3' && '$ctl' restore w.img | grep -q 'previous step   2 is readable'"
ok "restore --rollback" sh -c "'$ctl' restore --rollback w.img | grep -q 'committed step 2 '"
ok "... the blob is the previous step's" sh -c "'$ctl' restore --json w.img | $py -c 'import json,sys; j=json.load(sys.stdin); assert j[\"committed_step\"] == 2 and j[\"blob_printable\"].endswith(\"step 2\"), j'"
fails_with "... a second rollback is refused" 2 "cannot roll back" "$ctl" restore --rollback w.img
# z.img: the same start and the same first two steps, never rolled back.
"$ctl" format z.img --from-safetensors f32.safetensors --chunk-params 4096 --dtype bf16 >/dev/null 2>&1
"$ctl" import z.img --from f32.safetensors >/dev/null
"$bin/ckpt-trace" z.img --steps 2 --seed 5 >/dev/null
ok "... training resumes from the rolled-back step as from the original step 2" sh -c \
	"'$bin/ckpt-trace' w.img --steps 1 --seed 9 >/dev/null && '$bin/ckpt-trace' z.img --steps 1 --seed 9 >/dev/null &&
	 '$ctl' export w.img --to w3.safetensors --with-optimizer >/dev/null &&
	 '$ctl' export z.img --to z3.safetensors --with-optimizer >/dev/null && $py st.py identical w3.safetensors z3.safetensors"
fails_with "rollback at step 0 is refused" 2 "no previous step" "$ctl" restore --rollback e.img
fails_with "verify a missing device" 1 "cannot open" "$ctl" verify missing.img
fails_with "verify random bytes" 1 "not a dm-ckpt image" "$ctl" verify random.img
cp f32.img sb.img
run_py flip sb.img 200
fails_with "verify: a damaged superblock copy is reported" 3 "INVALID" "$ctl" verify sb.img
fails_with "... and is not ok: DEGRADED, exit status 3" 3 "^verify: DEGRADED" "$ctl" verify sb.img

# ---------------------------------------------------------------- damaged copies (META2)
# f32.img is at step 3 (sequence 5: superblock copy 1 is the current one).
cp f32.img cur.img
run_py flip cur.img 4296
ok "info: a damaged current superblock copy: the older commit is used, with a warning" sh -c \
	"'$ctl' info cur.img | grep -q 'committed step  2' &&
	 '$ctl' info cur.img | grep -q 'WARNING .*superblock copy 1 (byte 4096) is damaged (checksum mismatch): using copy 0.*may have been lost'"
ok "info --json: superblock_copy and warnings" sh -c "'$ctl' info --json cur.img 2>/dev/null | $py -c '
import json,sys; j=json.load(sys.stdin)
assert j[\"superblock_copy\"] == 0 and len(j[\"warnings\"]) == 1 and \"superblock copy 1\" in j[\"warnings\"][0], j'"
ok "info --json also warns on stderr" sh -c "'$ctl' info --json cur.img 2>&1 >/dev/null | grep -q 'warning: .*superblock copy 1'"
fails_with "verify: DEGRADED, exit status 3" 3 "^verify: DEGRADED" "$ctl" verify cur.img
ok "verify --json: status degraded" sh -c "'$ctl' verify --json cur.img | $py -c '
import json,sys; j=json.load(sys.stdin); assert j[\"status\"] == \"degraded\" and not j[\"ok\"] and j[\"warnings\"], j'; test \$? -eq 0"

"$ctl" format g.img --from-safetensors f32.safetensors --group 1:'*.bias,*norm*' --chunk-params 4096 >/dev/null 2>&1
"$ctl" import g.img --from f32.safetensors >/dev/null
"$ctl" info --json g.img >g.json
ok "format: two copies of the group table and manifest" sh -c "'$ctl' info g.img | grep -q '2 copies of group table and manifest'"
ok "verify: both copies intact" sh -c "'$ctl' verify g.img | grep -q 'manifest 1 (byte [0-9]*): ok' && '$ctl' verify g.img | grep -q '^verify: ok'"
cp g.img gm.img
run_py flip gm.img "$(run_py off g.json manifest_off 20)"
ok "a flipped manifest byte: info works, with a warning" sh -c \
	"'$ctl' info gm.img | grep -q 'WARNING .*tensor manifest copy 0 (byte [0-9]*) is damaged (checksum mismatch): using copy 1'"
ok "... export works, with a warning, and exports the same tensors" sh -c \
	"'$ctl' export gm.img --to gm.safetensors 2>gm.err && grep -q 'warning: .*manifest copy 0' gm.err &&
	 $py st.py same f32.safetensors gm.safetensors"
fails_with "... verify says DEGRADED, exit status 3" 3 "manifest 0 (byte [0-9]*): DAMAGED: checksum mismatch" "$ctl" verify gm.img
ok "... verify --repair rewrites the damaged copy" sh -c "'$ctl' verify --repair gm.img | grep -q 'rewrote 1 damaged'"
ok "... and verify is ok again, the image identical to the original" sh -c \
	"'$ctl' verify gm.img | grep -q '^verify: ok' && cmp gm.img g.img"

cp g.img gg.img
run_py setbyte gg.img "$(run_py off g.json group_off)" 1
ok "a group byte changed to another valid group: the checksum catches it, copy 1 is used" sh -c \
	"'$ctl' info gg.img | grep -q 'WARNING .*group table copy 0 (byte 8192) is damaged (checksum mismatch'"
ok "... every tensor keeps its own group" sh -c "'$ctl' info --json gg.img 2>/dev/null | $py -c '
import json,sys; j=json.load(sys.stdin); assert {t[\"name\"]: t[\"group\"] for t in j[\"tensors\"]}[\"embed.weight\"] == 0, j'"
fails_with "... verify says DEGRADED" 3 "group table 0 (byte 8192): DAMAGED: checksum mismatch" "$ctl" verify gg.img
ok "... export still works" "$ctl" export gg.img --to gg.safetensors
ok "... ckpt-trace (the engine) trains on it" "$bin/ckpt-trace" gg.img --steps 1 --seed 3
ok "... verify --repair, then ok" sh -c "'$ctl' verify --repair gg.img | grep -q '^verify: ok' && '$ctl' verify gg.img"
run_py flip gg.img "$(run_py off g.json meta2_off 4116)"	# manifest copy 1
run_py flip gg.img "$(run_py off g.json manifest_off 4)"
fails_with "both manifest copies damaged: info refuses, naming both" 1 "copy 0 at byte .*checksum mismatch; copy 1 at byte" "$ctl" info gg.img
fails_with "... verify: CORRUPT" 2 "^verify: CORRUPT" "$ctl" verify gg.img

cp g.img short.img
truncate -s -1 short.img
fails_with "a file one byte short: a clear error naming the missing bytes" 1 "the last 1 bytes are missing" "$ctl" info short.img
fails_with "... verify salvages it: DEGRADED, naming the missing bytes" 3 "WARNING: the file is smaller than the layout: .* the last 1 bytes are missing" "$ctl" verify short.img
fails_with "... and the manifest copy it cut" 3 "manifest 1 (byte [0-9]*): DAMAGED: read at [0-9]* from short.img: unexpected end of file" "$ctl" verify short.img
ok "... export salvages it, with a warning" sh -c \
	"'$ctl' export short.img --to short.safetensors 2>short.err && grep -q 'warning: .*last 1 bytes are missing' short.err &&
	 $py st.py same f32.safetensors short.safetensors"
fails_with "... verify --repair refuses it, saying how to go on" 1 "cannot repair: .*truncate -s" "$ctl" verify --repair short.img
ok "... extended to its size, verify --repair makes it whole" sh -c \
	"truncate -s $(stat -c %s g.img) short.img && '$ctl' verify --repair short.img | grep -q '^verify: ok' && cmp short.img g.img"
cp g.img short2.img
truncate -s 1000000 short2.img
fails_with "a file cut into its records: verify says CORRUPT and why" 2 "unexpected end of file" "$ctl" verify short2.img

cp g.img old.img
run_py v1 old.img
ok "an image without META2 (as formatted before it) opens as before" sh -c \
	"'$ctl' info old.img | grep -q '1 copy of group table and manifest' && '$ctl' verify old.img | grep -q '^verify: ok'"
ok "... exports the same tensors" sh -c "'$ctl' export old.img --to old.safetensors && $py st.py same f32.safetensors old.safetensors"
ok "... and trains" "$bin/ckpt-trace" old.img --steps 1 --seed 3
run_py flip old.img "$(run_py off g.json manifest_off 20)"
fails_with "... a flipped manifest byte there is still fatal (one copy)" 1 "tensor manifest: checksum mismatch" "$ctl" info old.img

# ---------------------------------------------------------------- many tensors
# import once kept pointers into a manifest it had freed: zeros or bad_alloc
# from a few dozen tensors on.
for nt in 24 400; do
	run_py many many$nt.safetensors $nt
	ok "$nt tensors: format, import --with-optimizer, export" sh -c \
		"'$ctl' format many$nt.img --from-safetensors many$nt.safetensors --chunk-params 2048 >/dev/null 2>&1 &&
		 '$ctl' import many$nt.img --from many$nt.safetensors --with-optimizer | grep -q 'imported $nt tensors.*committed step 7' &&
		 '$ctl' export many$nt.img --to many$nt.out.safetensors --with-optimizer"
	ok "$nt tensors: the export equals the input, moments and step" run_py identical many$nt.safetensors many$nt.out.safetensors
done
run_py many params400.safetensors 400 params
ok "... params only: import, export, equal" sh -c \
	"'$ctl' format many1.img --from-safetensors params400.safetensors --chunk-params 2048 >/dev/null 2>&1 &&
	 '$ctl' import many1.img --from params400.safetensors >/dev/null &&
	 '$ctl' export many1.img --to many1.out.safetensors && $py st.py same params400.safetensors many1.out.safetensors"

# ---------------------------------------------------------------- import: the step must leave room
"$ctl" format e.img --from-safetensors many24.safetensors --chunk-params 2048 --force >/dev/null 2>&1
run_py step many24.safetensors max.safetensors 18446744073709551615
fails_with "import refuses __metadata__ step 2^64-1" 1 "leaves the device no next step" \
	"$ctl" import e.img --from max.safetensors --with-optimizer
fails_with "import refuses --step 2^64-1" 1 "leaves the device no next step" \
	"$ctl" import e.img --from many24.safetensors --with-optimizer --step 18446744073709551615
fails_with "import refuses --step 2^63" 1 "at most 9223372036854775807" \
	"$ctl" import e.img --from many24.safetensors --with-optimizer --step 9223372036854775808
ok "... and changed nothing" sh -c "'$ctl' info --json e.img | grep -q '\"committed_step\": 0,'"
ok "import takes step 2^63-1, and the device can step from it" sh -c \
	"'$ctl' import e.img --from many24.safetensors --with-optimizer --step 9223372036854775807 >/dev/null &&
	 '$bin/ckpt-trace' e.img --steps 1 --seed 1 >/dev/null &&
	 '$ctl' info --json e.img | grep -q '\"committed_step\": 9223372036854775808'"

# ---------------------------------------------------------------- one writer at a time
cp z.img lk.img
cp z.img lk2.img
# Python with libckpt through ctypes; under an ASan build its runtime must
# be loaded first, with libstdc++ (else ASan cannot intercept libckpt's C++
# throws), as scripts/check-asan.sh does for the Python tests.
pyckpt() {
	libs=$(ldd "$bin/../libckpt/libckpt.so" 2>/dev/null)
	asan=$(echo "$libs" | awk '/libasan/ {print $3}')
	if [ -z "$asan" ]; then
		PYTHONPATH="$bin/../python" "$py" "$@"
		return
	fi
	cxx=$(echo "$libs" | awk '/libstdc\+\+/ {print $3}')
	PYTHONPATH="$bin/../python" LD_PRELOAD="$asan $cxx" \
		ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0" "$py" "$@"
}
# A trainer: holds lk.img open through the engine until its stdin closes.
mkfifo hold
pyckpt -c "
import ckpt, os, sys
d = ckpt.open(sys.argv[1])
print('open', os.getpid(), flush=True)
sys.stdin.read()
" lk.img <hold >held 2>&1 &
exec 9>hold
for i in $(seq 100); do grep -q open held && break; sleep 0.1; done
ok "a trainer has lk.img open" grep -q open held
holder=$(sed -n 's/^open //p' held)
fails_with "a second trainer is refused and told who holds it" 1 "in use: process $holder (python3)" \
	"$bin/ckpt-trace" lk.img --steps 1
fails_with "import is refused" 1 "lk.img is in use: process $holder" "$ctl" import lk.img --from f32.safetensors
fails_with "format is refused, even with --force" 1 "lk.img is in use" "$ctl" format lk.img --force --from-safetensors f32.safetensors
fails_with "restore --rollback is refused" 1 "lk.img is in use" "$ctl" restore --rollback lk.img
cp lk.img lk.ref
fails_with "export --to the trainer's image is refused, even with --force" 1 "lk.img is in use: process $holder" \
	"$ctl" export f32.img --to lk.img --force
ok "... and it is the trainer's still" cmp lk.img lk.ref
ok "info, verify, restore and export still work" sh -c \
	"'$ctl' info lk.img >/dev/null && '$ctl' verify lk.img >/dev/null && '$ctl' restore lk.img >/dev/null &&
	 '$ctl' export lk.img --to lk.safetensors >/dev/null"
exec 9>&-
wait
ok "once the trainer is gone, a step goes through" "$bin/ckpt-trace" lk.img --steps 1 --seed 2
ok "two opens in one process: the second is refused" pyckpt -c "
import ckpt, sys
d = ckpt.open(sys.argv[1])
try:
    ckpt.open(sys.argv[1])
except ckpt.CkptError as e:
    assert e.name == 'E_STATE' and 'this process' in e.message, e
else:
    raise SystemExit('second open succeeded')
d.close()
ckpt.open(sys.argv[1]).close()  # closed: free again
" lk2.img

# ---------------------------------------------------------------- FIFOs and other non-files
mkfifo fifo
for c in info verify restore "export --to fifo.out"; do
	fails_with "$c on a FIFO says so instead of hanging" 1 "fifo is a FIFO" timeout 20 "$ctl" $c fifo
done
fails_with "import from a FIFO" 1 "fifo is a FIFO" timeout 20 "$ctl" import e.img --from fifo
fails_with "import into a FIFO" 1 "fifo is a FIFO" timeout 20 "$ctl" import fifo --from f32.safetensors
fails_with "format -m a FIFO" 1 "fifo is a FIFO" timeout 20 "$ctl" format xf.img -m fifo
fails_with "format --from-safetensors a FIFO" 1 "fifo is a FIFO" timeout 20 "$ctl" format xf.img --from-safetensors fifo
fails_with "format onto a FIFO" 1 "fifo is a FIFO" timeout 20 "$ctl" format fifo --from-safetensors f32.safetensors
fails_with "info on a directory" 1 "is a directory" "$ctl" info .
ok "... and nothing was created" sh -c "[ ! -e xf.img ] && [ ! -e fifo.out ] && [ -p fifo ]"

# ---------------------------------------------------------------- export --to what is not a file
# A character device node of our own (as /dev/null): root could replace it.
if [ "$(id -u)" -eq 0 ] && mknod null c 1 3; then
	fails_with "export --to a character device is refused" 1 "null is a character device" \
		"$ctl" export f32.img --to null
	ok "... it is still a character device" test -c null
else
	ok "export --to a character device is refused # SKIP needs root" true
fi
fails_with "export --to a FIFO is refused" 1 "fifo is a FIFO" timeout 20 "$ctl" export f32.img --to fifo
ok "... the FIFO is still one" test -p fifo
mkdir outdir
fails_with "export --to a directory is refused" 1 "outdir is a directory" "$ctl" export f32.img --to outdir
fails_with "export --to the device itself is refused" 1 "is the device itself" "$ctl" export z.img --to z.img
ok "... which still verifies" "$ctl" verify z.img
# A swapped argument names another image as the output: refused, not replaced.
cp z.img zc.img
fails_with "export --to a dm-ckpt image is refused without --force" 1 "zc.img holds a dm-ckpt image.*--force" \
	"$ctl" export f32.img --to zc.img
ok "... which is left as it was" cmp z.img zc.img
ok "export --to a dm-ckpt image --force replaces it" sh -c \
	"'$ctl' export f32.img --to zc.img --force >/dev/null && $py st.py meta zc.img format pt"
fails_with "export --to a missing directory" 1 "cannot create nodir/x.safetensors" "$ctl" export f32.img --to nodir/x.safetensors
cp f32.img vd.img
run_py flip vd.img "$(run_py recoff v.json head.bias)"
fails_with "export of damaged state fails" 1 "data checksum mismatch" "$ctl" export vd.img --to vd.safetensors
ok "no temporary file is left behind, anywhere" sh -c "[ -z \"\$(ls -A outdir)\" ] && ! ls | grep -q '\\.tmp'"

# ---------------------------------------------------------------- format: refuse, reserve, replace
cp z.img old.img
cp z.img old.ref
fails_with "format over an image without --force is refused" 1 "holds a dm-ckpt image.*--force" \
	"$ctl" format old.img --from-safetensors f16.safetensors
ok "... and left it as it was" cmp old.img old.ref
head -c 1048576 /dev/zero >swap.img
mkswap swap.img >/dev/null 2>&1
fails_with "format over a blkid signature (swap) is refused" 1 "holds a swap signature" \
	"$ctl" format swap.img --from-safetensors f16.safetensors
fails_with "format with a too small --size fails" 1 "too small" \
	"$ctl" format old.img --force --from-safetensors f16.safetensors --size 8192
ok "... and left the old image as it was" cmp old.img old.ref
fails_with "a failed format of a new file" 1 "too small" "$ctl" format new.img --from-safetensors f16.safetensors --size 8192
ok "... leaves nothing behind" sh -c "[ ! -e new.img ] && ! ls | grep -q format-"
chmod 0600 old.img
ok "format --force over an image" sh -c "'$ctl' format old.img --force --from-safetensors f16.safetensors | grep -q 'groups, fp16'"
ok "... keeps the file's mode" sh -c "[ \"\$(stat -c %a old.img)\" = 600 ]"
echo '{"tensors": [{"name": "w", "shape": [5]}], "chunk_params": 2048}' >w.json
: >empty.img
ok "format over an empty file needs no --force" "$ctl" format empty.img -m w.json
if [ "$(id -u)" -eq 0 ] && mkdir small && mount -t tmpfs -o size=3m tmpfs small; then
	trap 'umount "$tmp/small" 2>/dev/null; rm -rf "$tmp"' EXIT
	fails_with "format reserves its space: larger than the file system fails" 1 "not enough space for small/x.img" \
		"$ctl" format small/x.img --from-safetensors f16.safetensors --size 4000000
	ok "... and leaves nothing" sh -c "[ -z \"\$(ls -A small)\" ]"
	ok "an image that fits" sh -c "'$ctl' format small/x.img --from-safetensors f16.safetensors --chunk-params 2048 >/dev/null"
	cp small/x.img x.ref
	fails_with "format --force over it, larger than the space left, fails" 1 "not enough space" \
		"$ctl" format small/x.img --force --from-safetensors f16.safetensors --size 2900000
	ok "... and leaves the old image and nothing else" sh -c "cmp small/x.img x.ref && [ \"\$(ls -A small)\" = x.img ]"
	umount small
else
	ok "format on a full file system # SKIP needs root and tmpfs" true
fi

# ---------------------------------------------------------------- list
mkdir imgs && cp f16.img imgs/b.img && cp h.img imgs/a.img && cp f16.safetensors imgs/ && mkdir imgs/sub
ok "list PATH...: the images, fields chosen, joined by the separator" sh -c \
	"'$ctl' list h.img f32.img -o path,committed_step,dtype --noheadings --separator '|' >list.out &&
	 [ \"\$(head -1 list.out)\" = 'h.img|0|fp16' ] && grep -qx 'f32.img|[1-9][0-9]*|bf16' list.out &&
	 [ \$(wc -l <list.out) -eq 2 ]"
ok "list --images DIR: only the images in it, sorted, under a heading" sh -c \
	"'$ctl' list --images imgs -o path,tensors >list.out && [ \"\$(sed 's/  */ /g' list.out)\" = 'path tensors
imgs/a.img 6
imgs/b.img 6' ]"
ok "list -o +FIELD adds to the defaults" sh -c \
	"'$ctl' list h.img -o +n_groups | head -1 | grep -q '^path  *committed_step  *dtype  *n_params  *uuid  *n_groups\$'"
fails_with "list: a given path that is not an image is an error, after the rest" 1 \
	"^ckptctl: f16.safetensors is not a usable dm-ckpt image" "$ctl" list --noheadings -o path f16.safetensors h.img
ok "... which is still listed" sh -c "'$ctl' list --noheadings -o path f16.safetensors h.img 2>/dev/null | grep -qx h.img"
fails_with "list: an unknown field is refused with the valid ones (exit 64)" 64 \
	"^ckptctl list: unknown field 'bogus'; valid fields: path,uuid,committed_step,.*,warnings\$" "$ctl" list h.img -o path,bogus
fails_with "status: an unknown field, refused before device-mapper is asked" 64 \
	"^ckptctl status: unknown field 'bogus'; valid fields: name,node,backing,.*state" \
	env DM_DEV_DIR="$tmp/nodm" "$ctl" status t0 -o bogus
fails_with "list of the kernel targets without device-mapper" 1 "$nodm" env DM_DEV_DIR="$tmp/nodm" "$ctl" list
fails_with "list --prometheus reports kernel targets, not images" 1 \
	"^ckptctl: list --prometheus reports kernel targets: an image has no live status\$" "$ctl" list --prometheus h.img
fails_with "list --prometheus and --json together: usage (exit 64)" 64 "excludes" "$ctl" list --prometheus --json
fails_with "status --prometheus and --json together: usage (exit 64)" 64 "excludes" "$ctl" status t0 --prometheus --json
fails_with "list --prometheus without device-mapper says so (a scrape fails, not empty)" 1 "$nodm" \
	env DM_DEV_DIR="$tmp/nodm" "$ctl" list --prometheus

# ---------------------------------------------------------------- progress
echo '{"tensors": [{"name": "w", "shape": [1024, 1024]}], "chunk_params": 4096}' >p.json
for c in "format p.img -m p.json --force" "verify p.img" "export p.img --to p.safetensors" "import p.img --from p.safetensors"; do
	ok "${c%% *} --progress: a line per phase up to 100% on stderr, however short" sh -c \
		"'$ctl' $c --progress 2>err >out && grep -q '^ckptctl ${c%% *}: \(check \)\?100% ([0-9]* s)\$' err &&
		 ! grep -q '%' out"
	ok "... and none when stderr is not a terminal" sh -c "'$ctl' $c 2>err >/dev/null && ! grep -q '%' err"
done
ok "on a terminal, a command shorter than a second shows no progress" sh -c \
	"script -qec \"'$ctl' verify p.img\" /dev/null >tty.out && ! grep -q '%' tty.out"
ok "... with --progress, a line redrawn in place and cleared at the end" sh -c \
	"script -qec \"'$ctl' verify --progress p.img\" /dev/null >tty.out &&
	 grep -q \"\$(printf '\\rckptctl verify: check 100%% ([0-9]* s)\\033\\[K\\r\\033\\[K')\" tty.out"
fails_with "--progress and --no-progress exclude each other" 64 "excludes" "$ctl" verify --progress --no-progress p.img

# ---------------------------------------------------------------- probe, create and friends off the VM
fails_with "probe a regular file" 1 "not an NVMe namespace" "$ctl" probe f32.img
fails_with "probe a character device" 1 "not an NVMe namespace" "$ctl" probe /dev/null
fails_with "probe a missing path" 1 "cannot open" "$ctl" probe /dev/nope
fails_with "create on random bytes" 1 "no valid dm-ckpt superblock" "$ctl" create t0 random.img
fails_with "create on a file" 1 "regular file" "$ctl" create t0 f32.img
fails_with "create with a bad name" 1 "not a device-mapper name" "$ctl" create a/b f32.img
fails_with "create with a bad queue depth" 64 "queue-depth" "$ctl" create t0 f32.img --queue-depth 0

# ---------------------------------------------------------------- ckpttab: the strict parse
# Every bad line is refused with its file and line before anything is done
# (no device-mapper needed: the parse comes first). The VM test
# (scripts/vm/guest/assembly.sh) activates real ones.
u=0f3c2a5e-7d41-4b8e-9a10-2c6f1e0d9b77
tab() { printf '# name device options\n\nckpt0 UUID=%s queue_depth=16,staging_kb=2048,ro\n' $u >t.tab; printf '%s\n' "$@" >>t.tab; }
tab 'ckpt1 UUID=nope'
fails_with "ckpttab: a bad uuid, with its line" 1 "t.tab:4: 'UUID=nope' is not UUID=" "$ctl" activate --all --ckpttab t.tab
tab 'ckpt1 nvme0n1'
fails_with "ckpttab: a device neither UUID= nor a path" 1 "t.tab:4: device 'nvme0n1' is neither" "$ctl" activate --all --ckpttab t.tab
tab 'ckpt1 /dev/x rw'
fails_with "ckpttab: an unknown option" 1 "t.tab:4: unknown option 'rw'" "$ctl" activate --all --ckpttab t.tab
tab 'ckpt1 /dev/x queue_depth=129'
fails_with "ckpttab: queue_depth out of range" 1 "t.tab:4: queue_depth=129: not a number from 1 to 128" "$ctl" activate --all --ckpttab t.tab
tab 'ckpt1 /dev/x ro,ro'
fails_with "ckpttab: an option twice" 1 "t.tab:4: option 'ro' given twice" "$ctl" activate --all --ckpttab t.tab
tab 'ckpt0 /dev/x'
fails_with "ckpttab: a name twice" 1 "t.tab:4: the name ckpt0 is listed twice" "$ctl" activate --all --ckpttab t.tab
tab "ckpt1 UUID=$(echo $u | tr a-f A-F)"
fails_with "ckpttab: an image twice (uuids in any case)" 1 "t.tab:4: the image $u is listed twice" "$ctl" activate --all --ckpttab t.tab
printf 'ckpt1 /dev/x\nckpt2 /dev/../dev//x\n' >t.tab
fails_with "ckpttab: a device twice, spelled two ways" 1 "t.tab:2: the device /dev/../dev//x is listed twice (as /dev/x)" \
	"$ctl" activate --all --ckpttab t.tab
: >tabdev && ln -s tabdev tabdev.lnk
printf 'ckpt1 %s/tabdev\nckpt2 %s/tabdev.lnk\n' "$PWD" "$PWD" >t.tab
fails_with "ckpttab: a device twice, through a symlink" 1 "t.tab:2: the device .*/tabdev.lnk is listed twice" \
	"$ctl" activate --all --ckpttab t.tab
tab 'ckpt1 /dev/x - extra'
fails_with "ckpttab: too many fields" 1 "t.tab:4: 4 fields; want NAME DEVICE" "$ctl" activate --all --ckpttab t.tab
tab 'a/b /dev/x'
fails_with "ckpttab: a bad name" 1 "t.tab:4: 'a/b' is not a device-mapper name" "$ctl" activate --all --ckpttab t.tab
printf 'ckpt1 /dev/x\r\n' >t.tab
fails_with "ckpttab: a control byte" 1 "t.tab:1: a control or non-ASCII byte (0x0d)" "$ctl" activate --all --ckpttab t.tab
fails_with "ckpttab: a missing file" 1 "cannot read nope.tab" "$ctl" activate --all --ckpttab nope.tab
fails_with "ckpttab: a directory" 1 "is not a regular file" "$ctl" activate --all --ckpttab .
fails_with "activate needs one of --all, --uuid, --device (exit 64: usage)" 64 \
	"^ckptctl activate: give one of --all, --uuid UUID, --device DEV; see ckptctl activate --help\$" \
	"$ctl" activate --ckpttab t.tab
fails_with "activate: two of --all, --uuid, --device" 64 "give one of" "$ctl" activate --all --device /dev/x --ckpttab t.tab
fails_with "activate --uuid needs a uuid (exit 64)" 64 "^ckptctl activate: .*not a uuid.*; see ckptctl activate --help\$" \
	"$ctl" activate --uuid xyz --ckpttab t.tab
fails_with "deactivate needs one of --all, --uuid, NAME (exit 64)" 64 \
	"^ckptctl deactivate: give one of --all, --uuid UUID, NAME; see ckptctl deactivate --help\$" \
	"$ctl" deactivate --ckpttab t.tab
fails_with "deactivate: NAME and --all" 64 "give one of" "$ctl" deactivate --all ckpt0 --ckpttab t.tab
fails_with "deactivate --uuid needs a uuid (exit 64)" 64 "not a uuid" "$ctl" deactivate --uuid xyz
fails_with "deactivate: an unknown option (exit 64)" 64 "^ckptctl deactivate: .*--bogus.*; see ckptctl deactivate --help\$" \
	"$ctl" deactivate --bogus
tab 'ckpt1 /dev/x noauto'
fails_with "activate --uuid of an image not listed" 1 "lists no image 11111111-" "$ctl" activate --uuid 11111111-2222-3333-4444-555555555555 --ckpttab t.tab

# ---------------------------------------------------------------- stripe sets
ok "stripe: a set of three drive files" sh -c \
	"'$ctl' stripe s.stripe sd0 sd1 sd2 --stripe-kib 16 --drive-size 3000000 | grep -q 'a stripe set of 3 drives, 16 KiB stripes'"
ok "... import and export through it: the same tensors and step as the image" sh -c \
	"'$ctl' format s.stripe --from-safetensors f32.safetensors --chunk-params 4096 --dtype bf16 >/dev/null 2>&1 &&
	 '$ctl' import s.stripe --from s3.safetensors --with-optimizer | grep -q 'committed step 3' &&
	 '$ctl' export s.stripe --to st3.safetensors --with-optimizer >/dev/null && $py st.py identical s3.safetensors st3.safetensors"
ok "... steps on it verify, and its info names the set" sh -c \
	"'$bin/ckpt-trace' s.stripe --steps 2 --seed 5 >/dev/null && '$ctl' verify s.stripe | grep -q 'verify: ok' &&
	 '$ctl' info --json s.stripe | $py -c 'import json,sys; j=json.load(sys.stdin); assert j[\"committed_step\"] == 5, j'"
fails_with "stripe: the descriptor exists" 1 "exists" "$ctl" stripe s.stripe sd0
fails_with "stripe: a drive named twice" 1 "named twice" "$ctl" stripe t.stripe sd0 ./sd0
fails_with "stripe: a missing drive without --drive-size" 1 "does not exist" "$ctl" stripe t.stripe sd0 nowhere
fails_with "stripe: a stripe that is not a power of two" 1 "power of two" "$ctl" stripe t.stripe sd0 --stripe-kib 12
fails_with "stripe: a drive that is a stripe set" 1 "a stripe set itself" "$ctl" stripe t.stripe sd0 s.stripe
ok "... and none of them left anything" sh -c "! ls t.stripe* nowhere 2>/dev/null"
fails_with "a drive another writer holds refuses the set" 1 "sd1 is in use" flock -x sd1 "$bin/ckpt-trace" s.stripe --steps 1
fails_with "export never replaces the descriptor" 1 "names a stripe set" "$ctl" export f32.img --to s.stripe --force

# The boot units (scripts/systemd), pointed at this build's ckptctl:
# systemd-analyze verify finds nothing wrong (package systemd, scripts/deps.sh).
units=$(cd "$(dirname "$0")/../../scripts/systemd" && pwd)
mkdir unit
for f in "$units"/*.service; do sed "s|/usr/sbin/ckptctl|$ctl|" "$f" >"unit/${f##*/}"; done
cp unit/dm-ckpt-activate@.service unit/dm-ckpt-activate@nvme0n1.service
ok "systemd-analyze verify: dm-ckpt-activate.service and an instance of dm-ckpt-activate@" sh -c \
	"out=\$(systemd-analyze verify unit/dm-ckpt-activate.service unit/dm-ckpt-activate@nvme0n1.service 2>&1) && echo \"\$out\" && [ -z \"\$out\" ]"

echo "1..$n"
echo "$((n - failed)) passed, $failed failed"
[ "$failed" -eq 0 ]
