# SPDX-License-Identifier: MIT
"""The Python half of tests/vm/nvmeof.sh: a dm-ckpt device served over NVMe/TCP
(ckptctl serve) and trained through with ckpt.torch.OffloadAdamW on the
NVMe-oF namespace, against the userspace engine, bit for bit; and the bytes on
the wire per param per step, with a baseline that moves the fp32 state as
host-side offload does (params and both moments read and written each step).

    nvmeof.py IMG PLAIN     IMG: a block device for the dm-ckpt image,
                            PLAIN: one for the baseline

Run in the VM by nvmeof.sh through `hostrun` (the host's Python and torch).
Storage and trainer share the guest and talk over the loopback interface,
whose tx_bytes count every byte of both directions once. Every assertion
prints "PASS what" or "FAIL what: why"; other lines are comments.
"""

import time

T_START = time.monotonic()

import json  # noqa: E402 - after T_START: the imports are timed
import mmap  # noqa: E402
import os  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import warnings  # noqa: E402

import numpy as np  # noqa: E402
import torch  # noqa: E402

import ckpt  # noqa: E402
import ckpt.torch  # noqa: E402

SEED = 4321
WARM = 1            # steps before the bytes are counted (the client's first reads)
MEASURE = 4         # steps counted
STEPS = WARM + MEASURE
DTYPE = "bf16"
NAME = "ckpt0"
NQN = "nqn.2014-08.org.example.dm-ckpt:ckpt0"
PLAIN_NQN = "nqn.2014-08.org.example.dm-ckpt:plain"
ADDR, PORT = "127.0.0.1", "4420"
NVMET = "/sys/kernel/config/nvmet"
TMP = tempfile.gettempdir()
failures = 0
# fp32 params on a bf16 device, as the engine's reference has them too
warnings.filterwarnings("ignore", category=ckpt.torch.PrecisionWarning)


def say(*a):
    print(*a, flush=True)


def check(what, cond, why=""):
    global failures
    if cond:
        say(f"PASS {what}")
    else:
        failures += 1
        say(f"FAIL {what}{': ' + why if why else ''}")
    return cond


def run(*cmd):
    p = subprocess.run(cmd, capture_output=True, text=True)
    for line in (p.stdout + p.stderr).splitlines():
        say(f"#   {line}")
    return p


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


def wire_bytes():
    with open("/sys/class/net/lo/statistics/tx_bytes") as f:
        return int(f.read())


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


def configfs_tree():
    return sorted(os.path.join(d, f) for d, ds, fs in os.walk(NVMET, followlinks=False) for f in ds + fs)


def connect(nqn):
    with open("/dev/nvme-fabrics", "w") as f:
        f.write(f"transport=tcp,traddr={ADDR},trsvcid={PORT},nqn={nqn}")


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


def serve_plain(dev, port):
    """The baseline's device, served as nvmetcli would, on ckptctl serve's port."""
    sub = f"{NVMET}/subsystems/{PLAIN_NQN}"
    os.mkdir(sub)
    with open(f"{sub}/attr_allow_any_host", "w") as f:
        f.write("1")
    os.mkdir(f"{sub}/namespaces/1")
    with open(f"{sub}/namespaces/1/device_path", "w") as f:
        f.write(dev)
    with open(f"{sub}/namespaces/1/enable", "w") as f:
        f.write("1")
    os.symlink(sub, f"{NVMET}/ports/{port}/subsystems/{PLAIN_NQN}")


def unserve_plain(port):
    sub = f"{NVMET}/subsystems/{PLAIN_NQN}"
    os.unlink(f"{NVMET}/ports/{port}/subsystems/{PLAIN_NQN}")
    with open(f"{sub}/namespaces/1/enable", "w") as f:
        f.write("0")
    os.rmdir(f"{sub}/namespaces/1")
    os.rmdir(sub)


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


def main():
    img, plain = sys.argv[1], sys.argv[2]
    say(f"# python {sys.version.split()[0]}, torch {torch.__version__}; imports {time.monotonic() - T_START:.1f} s")
    model, _ = model_and_groups()
    n_params = sum(p.numel() for p in model.parameters())

    # the reference: the userspace engine on a file
    ref_path = os.path.join(TMP, "nvmeof_ref.img")
    ref_losses = train(ref_path)
    ref_state, ref_step = state_of(ref_path)
    check(f"reference: {STEPS} steps with the userspace engine on a file", ref_step == STEPS, f"step {ref_step}")

    # the storage side: the image at step 0, the kernel target, served
    _, groups = model_and_groups()
    layout = ckpt.Layout()
    for gi, g in enumerate(groups):
        for n, p in g["params"]:
            layout.add(n, tuple(p.shape), gi)
    ckpt.format(img, layout, dtype=DTYPE, chunk_params=2048)
    model, groups = model_and_groups()
    ckpt.torch.OffloadAdamW(groups, img, lr=1e-3, dtype=DTYPE, chunk_params=2048, init_from_model=True).close()
    tree0 = configfs_tree()
    check(f"ckptctl create {NAME} {img}", run("ckptctl", "create", NAME, img).returncode == 0)
    check(f"ckptctl serve {NAME} on {ADDR}:{PORT}",
          run("ckptctl", "serve", NAME, "--nqn", NQN, "--addr", f"{ADDR}:{PORT}").returncode == 0)
    with open(f"/run/ckpt/nvmet/{NQN}.json") as f:
        served = json.load(f)
    p = run("ckptctl", "serve", NAME, "--nqn", NQN + "x", "--addr", f"{ADDR}:{PORT}")
    check("a second serve of the device is refused", p.returncode == 1 and "served already" in p.stderr,
          p.stderr.strip())
    p = run("ckptctl", "serve", "plain", "--nqn", PLAIN_NQN, "--addr", f"{ADDR}:{PORT}")
    check("serve refuses a device that is not dm-ckpt", p.returncode == 1 and "not a dm-ckpt device" in p.stderr,
          p.stderr.strip())
    p = run("ckptctl", "serve", NAME, "--nqn", "nqn.x/y", "--addr", f"{ADDR}:{PORT}")
    check("serve refuses a bad NQN", p.returncode == 1 and "not an NQN" in p.stderr, p.stderr.strip())
    serve_plain(plain, served["port"])

    # the trainer side: NVMe/TCP
    connect(NQN)
    connect(PLAIN_NQN)
    remote = namespace(NQN, 1)
    remote_plain = namespace(PLAIN_NQN, 1)
    say(f"# served: {remote} (dm-ckpt), {namespace(NQN, 2)} (its backing), {remote_plain} (baseline)")
    with ckpt.open(remote) as d:
        check(f"{remote} opens as a dm-ckpt device (its status page), at step 0", d.committed_step == 0,
              f"step {d.committed_step}")
    counted = []
    losses = train(remote, counted)
    check(f"OffloadAdamW through {remote}: losses bit-identical to the engine's ({STEPS} steps)",
          losses == ref_losses, f"{losses} vs {ref_losses}")
    state, step = state_of(remote)
    diff = [n for n in ref_state if any(not np.array_equal(a, b) for a, b in zip(ref_state[n], state.get(n, [])))]
    check(f"fp32 masters and moments read through {remote} bit-identical to the engine's (step {step})",
          step == STEPS and not diff and state.keys() == ref_state.keys(), f"step {step}, differ: {diff}")
    base = baseline(remote_plain, n_params)
    ours = counted[0] / MEASURE / n_params
    theirs = base / MEASURE / n_params
    say(f"# wire bytes per param per step ({n_params} params, {MEASURE} steps, loopback tx_bytes): "
        f"dm-ckpt {ours:.2f}, host-side offload baseline {theirs:.2f}, ratio {theirs / ours:.2f}")
    check("dm-ckpt moves fewer bytes on the wire than the fp32 baseline", 0 < ours < theirs,
          f"{ours:.2f} vs {theirs:.2f}")

    # undo
    disconnect(NQN)
    disconnect(PLAIN_NQN)
    unserve_plain(served["port"])
    check(f"ckptctl unserve {NAME}", run("ckptctl", "unserve", NAME).returncode == 0)
    check("unserve removed exactly what serve made", configfs_tree() == tree0,
          f"{sorted(set(configfs_tree()) ^ set(tree0))[:8]}")
    p = run("ckptctl", "unserve", NAME)
    check("a second unserve is refused", p.returncode == 1 and "not served" in p.stderr, p.stderr.strip())
    check(f"ckptctl remove {NAME}", run("ckptctl", "remove", NAME).returncode == 0)
    check(f"ckptctl verify {img}", run("ckptctl", "verify", img).returncode == 0)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
