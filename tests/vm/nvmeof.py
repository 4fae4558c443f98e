# SPDX-License-Identifier: MIT
"""The trainer of the NVMe-oF test (scripts/vm/tests.sh, nvmeof_run): a dm-ckpt device
served over NVMe/TCP by another guest (ckptctl serve) is trained through with
ckpt.torch.OffloadAdamW on the NVMe-oF namespace, and must agree bit for bit
with the userspace engine; the bytes on the trainer's interface per param per
step are compared with a baseline that moves the fp32 state as host-side
offload does (params and both moments read and written each step, on a plain
device served the same way).

    nvmeof.py prep IMG PLAIN REF   on the host: the reference training with
                                   the userspace engine (REF/ref.npz,
                                   REF/ref.json), IMG formatted for the model
                                   at step 0, PLAIN sized for the baseline,
                                   the trainer's DH-HMAC-CHAP secrets
                                   (REF/keys, for ckptctl serve --key-file)
    nvmeof.py train ADDR REF IFACE in the trainer guest (hostrun): connects
                                   to the storage guest at ADDR, trains,
                                   compares, counts IFACE's bytes

Every assertion prints "PASS what" or "FAIL what: why"; other lines are
comments.
"""

import time

T_START = time.monotonic()

import base64  # noqa: E402 - after T_START: the imports are timed
import json  # noqa: E402
import mmap  # noqa: E402
import os  # noqa: E402
import re  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import warnings  # noqa: E402
import zlib  # noqa: E402

import numpy as np  # noqa: E402
import torch  # noqa: E402

import ckpt  # noqa: E402
import ckpt.torch  # noqa: E402

import checks  # noqa: E402 - tests/vm/checks.py, beside this file
from checks import check, say  # noqa: E402

SEED = 4321
WARM = 1            # steps before the bytes are counted (the client's first reads)
MEASURE = 4         # steps counted
STEPS = WARM + MEASURE
DTYPE = "bf16"
NQN = "nqn.2014-08.org.example.dm-ckpt:ckpt0"
PLAIN_NQN = "nqn.2014-08.org.example.dm-ckpt:plain"
# the one host the storage allows, and another; each NQN has its host id (the
# kernel refuses a host NQN with another's id)
HOST_NQN = "nqn.2014-08.org.example.dm-ckpt:trainer"
HOST_IDS = {HOST_NQN: "5f0e2c1a-6d4b-4c7e-9a51-000000000001",
            HOST_NQN + "-other": "5f0e2c1a-6d4b-4c7e-9a51-000000000002"}
PORT = "4420"
TMP = tempfile.gettempdir()
# fp32 params on a bf16 device, as the engine's reference has them too
warnings.filterwarnings("ignore", category=ckpt.torch.PrecisionWarning)


def model_and_groups():
    """An MLP of 262,912 params in two param groups."""
    torch.manual_seed(SEED)
    model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.GELU(), torch.nn.Linear(512, 256))
    named = list(model.named_parameters())
    return model, [{"params": [(n, p) for n, p in named if p.dim() > 1], "weight_decay": 0.1},
                   {"params": [(n, p) for n, p in named if p.dim() <= 1], "weight_decay": 0.0}]


def batch(it):
    g = torch.Generator().manual_seed(SEED * 1000 + it)
    return torch.randn(64, 256, generator=g), torch.randn(64, 256, generator=g)


IFACE = "lo"


def wire_bytes():
    """Bytes received and sent on the trainer's interface."""
    n = 0
    for what in ("rx_bytes", "tx_bytes"):
        with open(f"/sys/class/net/{IFACE}/statistics/{what}") as f:
            n += int(f.read())
    return n


def train(path, counted=None, **kw):
    """STEPS steps on path; the losses' hex. counted(list): the loopback bytes
    of the last MEASURE steps are appended."""
    model, groups = model_and_groups()
    opt = ckpt.torch.OffloadAdamW(groups, path, lr=1e-3, dtype=DTYPE, chunk_params=2048, **kw)
    losses = []
    try:
        for it in range(opt.committed_step, STEPS):
            if it == WARM and counted is not None:
                before = wire_bytes()
            x, y = batch(it)
            loss = torch.nn.functional.mse_loss(model(x), y)
            loss.backward()
            opt.step()
            opt.zero_grad()
            losses.append(float(loss).hex())
        if counted is not None:
            counted.append(wire_bytes() - before)
    finally:
        opt.close()
    return losses


def state_of(path):
    with ckpt.open(path) as dev:
        return ({t["name"]: [np.ascontiguousarray(a, dtype=np.float32).view(np.uint32)
                             for a in dev.read_state(t["name"])] for t in dev.tensors()},
                dev.committed_step)


def dhchap_secret(rng):
    """A DH-HMAC-CHAP secret as nvme gen-dhchap-key makes one: 32 random
    bytes and their CRC-32 (little-endian), base64, untransformed (00)."""
    key = rng.bytes(32)
    return "DHHC-1:00:" + base64.b64encode(key + zlib.crc32(key).to_bytes(4, "little")).decode() + ":"


def read_keys(ref):
    """{host NQN: (host secret, controller secret)} of REF/keys."""
    with open(os.path.join(ref, "keys")) as f:
        return {w[0]: (w[1], w[2]) for w in (line.split() for line in f) if w}


def connect(addr, nqn, host=HOST_NQN, wait=300, keys=None):
    """nvme connect -t tcp, as nvme-cli does it (a line to /dev/nvme-fabrics),
    as host, authenticating with keys (host secret, controller secret) when
    given; retried for wait seconds until the storage node serves nqn."""
    t0 = time.monotonic()
    auth = f",dhchap_secret={keys[0]},dhchap_ctrl_secret={keys[1]}" if keys else ""
    while True:
        try:
            with open("/dev/nvme-fabrics", "w") as f:
                f.write(f"transport=tcp,traddr={addr},trsvcid={PORT},nqn={nqn},hostnqn={host},"
                        f"hostid={HOST_IDS[host]}{auth}")
            return ""
        except OSError as e:
            if time.monotonic() - t0 >= wait:
                return str(e)
            time.sleep(1)


def namespace(nqn, nsid):
    """/dev/nvmeXnY of namespace nsid of the subsystem nqn (waits for it)."""
    for _ in range(200):
        for d in sorted(os.listdir("/sys/block")):
            base = f"/sys/block/{d}"
            try:
                with open(f"{base}/device/subsysnqn") as f:
                    sub = f.read().strip()
                with open(f"{base}/nsid") as f:
                    ns = int(f.read())
            except OSError:
                continue
            if sub == nqn and ns == nsid and os.path.exists(f"/dev/{d}"):
                return f"/dev/{d}"
        time.sleep(0.05)
    raise SystemExit(f"namespace {nsid} of {nqn} did not appear")


def disconnect(nqn):
    for c in os.listdir("/sys/class/nvme"):
        try:
            with open(f"/sys/class/nvme/{c}/subsysnqn") as f:
                if f.read().strip() != nqn:
                    continue
            with open(f"/sys/class/nvme/{c}/delete_controller", "w") as f:
                f.write("1")
        except OSError:
            pass


def baseline(dev, n_params):
    """Host-side offload's traffic: each step reads the fp32 params and both
    moments (12 B a param) and writes them back, O_DIRECT."""
    size = (n_params * 12 + 4095) // 4096 * 4096
    buf = mmap.mmap(-1, 1 << 20)
    fd = os.open(dev, os.O_RDWR | os.O_DIRECT)
    try:
        before = wire_bytes()
        for _ in range(MEASURE):
            for write in (False, True):
                for off in range(0, size, len(buf)):
                    n = min(len(buf), size - off)
                    view = memoryview(buf)[:n]
                    got = os.pwritev(fd, [view], off) if write else os.preadv(fd, [view], off)
                    view.release()
                    if got != n:
                        raise OSError(f"short {'write' if write else 'read'} at {off}")
            os.fsync(fd)
        return wire_bytes() - before
    finally:
        os.close(fd)


def layout_of(groups):
    layout = ckpt.Layout()
    for gi, g in enumerate(groups):
        for n, p in g["params"]:
            layout.add(n, tuple(p.shape), gi)
    return layout


def prep(img, plain, ref):
    """The reference, the image at step 0, the baseline's device."""
    os.makedirs(ref, exist_ok=True)
    ref_path = os.path.join(ref, "ref.img")
    if os.path.exists(ref_path):
        os.unlink(ref_path)
    losses = train(ref_path)
    state, step = state_of(ref_path)
    os.unlink(ref_path)
    check(f"reference: {STEPS} steps with the userspace engine on a file", step == STEPS, f"step {step}")
    np.savez(os.path.join(ref, "ref.npz"), **{f"{n}.{k}": state[n][k] for n in state for k in range(3)})
    with open(os.path.join(ref, "ref.json"), "w") as f:
        json.dump({"losses": losses}, f)
    _, groups = model_and_groups()
    with open(img, "wb") as f:
        f.truncate(64 << 20)
    ckpt.format(img, layout_of(groups), dtype=DTYPE, chunk_params=2048)
    model, groups = model_and_groups()
    ckpt.torch.OffloadAdamW(groups, img, lr=1e-3, dtype=DTYPE, chunk_params=2048, init_from_model=True).close()
    with ckpt.open(img) as d:
        check(f"{img}: formatted for the model, at step 0", d.committed_step == 0)
    n_params = sum(p.numel() for p in model.parameters())
    with open(plain, "wb") as f:
        f.truncate(max(64 << 20, (n_params * 12 + (1 << 20)) // (1 << 20) * (1 << 20)))
    rng = np.random.default_rng()
    with open(os.path.join(ref, "keys"), "w") as f:
        f.write(f"{HOST_NQN} {dhchap_secret(rng)} {dhchap_secret(rng)}\n")


def hostile_writes(path):
    """An authenticated host writes garbage to every window of the served
    device: each write is refused (EIO), as the target refuses it."""
    with ckpt.open(path) as d:
        l = d.info()
    fd = os.open(path, os.O_RDWR | os.O_DIRECT)
    buf = mmap.mmap(-1, 8192)
    buf.write(bytes(range(256)) * 32)
    size = os.lseek(fd, 0, os.SEEK_END)
    n_params = l["n_params"]
    image = 4096 + 4 * n_params
    windows = {"control block (a garbage command)": 0, "GRAD window (no step open)": 4096,
               "PARAM window": 4096 + 2 * n_params, "IMAGE window (the superblock)": image,
               "IMAGE window (its last block)": size - 4096}
    try:
        for what, off in windows.items():
            try:
                os.pwritev(fd, [memoryview(buf)[:4096]], off)
                check(f"a garbage write to the {what} at {off} is refused", False, "it was accepted")
            except OSError as e:
                check(f"a garbage write to the {what} at {off} is refused ({e.strerror})", True)
    finally:
        os.close(fd)
        buf.close()


def train_remote(addr, ref):
    with open(os.path.join(ref, "ref.json")) as f:
        ref_losses = json.load(f)["losses"]
    z = np.load(os.path.join(ref, "ref.npz"))
    ref_state = {n: [z[f"{n}.{k}"] for k in range(3)] for n in {k.rsplit(".", 1)[0] for k in z.files}}
    model, _ = model_and_groups()
    n_params = sum(p.numel() for p in model.parameters())
    check("the trainer holds no dm-ckpt image (no local device answers as one)",
          not any(d.startswith("dm-") for d in os.listdir("/sys/block")))

    keys = read_keys(ref)[HOST_NQN]
    err = connect(addr, PLAIN_NQN)
    if err:
        raise SystemExit(f"cannot connect to {PLAIN_NQN} at {addr}:{PORT}: {err}")
    # the trainer's host NQN without its secrets, or with a wrong one, is refused
    err = connect(addr, NQN, wait=0)
    check(f"{NQN} refuses the trainer's NQN without its DH-HMAC-CHAP secrets", err, "it connected")
    err = connect(addr, NQN, wait=0, keys=(dhchap_secret(np.random.default_rng()), keys[1]))
    check(f"{NQN} refuses a wrong host secret", err, "it connected")
    err = connect(addr, NQN, wait=0, keys=(keys[0], dhchap_secret(np.random.default_rng())))
    check(f"{NQN} refuses a controller that cannot prove the controller secret (the host checks it)", err,
          "it connected")
    err = connect(addr, NQN, keys=keys)
    if err:
        raise SystemExit(f"cannot connect to {NQN} at {addr}:{PORT} with the trainer's secrets: {err}")
    err = connect(addr, NQN, host=HOST_NQN + "-other", wait=0, keys=keys)
    check(f"another host is refused by {NQN} (ckptctl serve --host), its secrets or not", err, "it connected")
    remote = namespace(NQN, 1)
    remote_plain = namespace(PLAIN_NQN, 1)
    served = []
    for d in os.listdir("/sys/block"):
        if re.fullmatch(r"nvme\d+c\d+n\d+", d):
            continue    # a path of a multipath namespace (hidden), not a namespace
        try:
            with open(f"/sys/block/{d}/device/subsysnqn") as f:
                if f.read().strip() == NQN:
                    served.append(d)
        except OSError:
            pass
    check(f"{NQN} serves one namespace, the dm-ckpt device (not its backing device)", served == [remote[5:]],
          f"{served}")
    say(f"# served by {addr}: {remote} (dm-ckpt, its only namespace), {remote_plain} (baseline)")
    ctrl = os.path.basename(os.path.realpath(f"/sys/block/{os.path.basename(remote)}/device"))
    with ckpt.open(remote) as d:
        check(f"{remote} opens as a dm-ckpt device (its status page), at step 0", d.committed_step == 0,
              f"step {d.committed_step}")
    counted = []
    losses = train(remote, counted)
    check(f"OffloadAdamW through {remote} ({ctrl}): losses bit-identical to the engine's ({STEPS} steps)",
          losses == ref_losses, f"{losses} vs {ref_losses}")
    state, step = state_of(remote)
    diff = [n for n in ref_state if any(not np.array_equal(a, b) for a, b in zip(ref_state[n], state.get(n, [])))]
    check(f"fp32 masters and moments read through {remote} bit-identical to the engine's (step {step})",
          step == STEPS and not diff and state.keys() == ref_state.keys(), f"step {step}, differ: {diff}")
    hostile_writes(remote)
    state2, step2 = state_of(remote)
    same = step2 == step and all(np.array_equal(a, b) for n in state for a, b in zip(state[n], state2[n]))
    check(f"... and after them the committed state read through {remote} is as it was (step {step2})", same,
          "it changed")
    base = baseline(remote_plain, n_params)
    ours = counted[0] / MEASURE / n_params
    theirs = base / MEASURE / n_params
    say(f"# wire bytes per param per step ({n_params} params, {MEASURE} steps, {IFACE} rx+tx): "
        f"dm-ckpt {ours:.2f}, host-side offload baseline {theirs:.2f}, ratio {theirs / ours:.2f}")
    check("dm-ckpt moves fewer bytes on the wire than the fp32 baseline", 0 < ours < theirs,
          f"{ours:.2f} vs {theirs:.2f}")
    disconnect(NQN)
    disconnect(PLAIN_NQN)


def main():
    global IFACE
    say(f"# python {sys.version.split()[0]}, torch {torch.__version__}; imports {time.monotonic() - T_START:.1f} s")
    if sys.argv[1:2] == ["prep"] and len(sys.argv) == 5:
        prep(*sys.argv[2:])
    elif sys.argv[1:2] == ["train"] and len(sys.argv) == 5:
        IFACE = sys.argv[4]
        train_remote(sys.argv[2], sys.argv[3])
    else:
        raise SystemExit("usage: nvmeof.py prep IMG PLAIN REF | train ADDR REF IFACE")
    return 1 if checks.failures else 0


if __name__ == "__main__":
    sys.exit(main())
