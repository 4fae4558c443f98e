# SPDX-License-Identifier: MIT
"""The Python half of tests/vm/offload_dm.sh: a PyTorch training loop whose
optimizer, ckpt.torch.OffloadAdamW, runs on the kernel target (/dev/mapper/NAME)
inside the test VM, and the same training with the userspace engine, which must
agree bit for bit.

Run in the VM by offload_dm.sh through `hostrun` (the host's Python and torch,
chrooted into the host's / shared read-only over 9p):

    offload_dm.py prep   DEV           reference runs (userspace engine, files in
                                       /tmp), then format DEV (bf16) and 3 steps
    offload_dm.py resume MAPPER        OffloadAdamW on the kernel target: drops a
                                       step a stopped trainer left open, resumes
                                       at step 3, 5 more steps; Device.rollback()
                                       to step 7 and step 8 again; state reads
                                       during an open step
    offload_dm.py check  DEV MAPPER    the userspace engine on DEV at step 8 holds
                                       the reference's state; then the fp16
                                       variant (LossScaler) through the whole
                                       flow, calling ckptctl create/remove itself
                                       (MAPPER is /dev/mapper/NAME); then a
                                       flipped p_lo bit makes read_params
                                       through the kernel target fail

Every assertion prints "PASS what" or "FAIL what: why"; offload_dm.sh turns
them into TAP lines. Other lines are comments. Each phase also works with
regular files for DEV and MAPPER (--no-target skips ckptctl create/remove),
to try it on the host.
"""

import time

T_START = time.monotonic()

import json  # noqa: E402 - after T_START: the imports are timed
import os  # noqa: E402
import subprocess  # noqa: E402
import tempfile  # noqa: E402
import sys  # noqa: E402
import warnings  # noqa: E402

import numpy as np  # noqa: E402
import torch  # noqa: E402

import ckpt  # noqa: E402
import ckpt.torch  # noqa: E402

import checks  # noqa: E402 - tests/vm/checks.py, beside this file
from checks import check, say  # noqa: E402

SEED = 1234
STEPS_BEFORE = 3      # userspace engine on the backing device
STEPS_TOTAL = 8       # then 5 through the kernel target
CHUNK = 2048          # the smallest chunk: 3 chunks (groups never share one)
TMP = tempfile.gettempdir()   # the guest's /tmp (hostrun sets TMPDIR)
REF = os.path.join(TMP, "offload_ref")
T0 = time.monotonic()


def model_and_groups():
    """A tiny MLP (3,368 params) and its two param groups (weight decay on the
    matrices only), as (name, tensor) pairs."""
    torch.manual_seed(SEED)
    model = torch.nn.Sequential(torch.nn.Embedding(64, 16), torch.nn.Flatten(),
                                torch.nn.Linear(4 * 16, 32), torch.nn.GELU(),
                                torch.nn.Linear(32, 8))
    named = list(model.named_parameters())
    decay = [(n, p) for n, p in named if p.dim() > 1]
    no_decay = [(n, p) for n, p in named if p.dim() <= 1]
    groups = [{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}]
    return model, groups


def batch(it):
    """The batch of iteration it: a function of the seed and it alone."""
    g = torch.Generator().manual_seed(SEED * 1000 + it)
    x = torch.randint(0, 64, (32, 4), generator=g)
    y = torch.randint(0, 8, (32,), generator=g)
    return x, y


def bits(a):
    return np.ascontiguousarray(np.asarray(a, dtype=np.float32)).view(np.uint32)


def fmt_dev(dev, dtype):
    """ckpt.format on DEV (OffloadAdamW formats only paths that do not exist) with
    the model's layout; the model's values go in with init_from_model."""
    _, groups = model_and_groups()
    layout = ckpt.Layout()
    for gi, g in enumerate(groups):
        for n, p in g["params"]:
            layout.add(n, tuple(p.shape), gi)
    ckpt.format(dev, layout, dtype=dtype, chunk_params=CHUNK)


def train(path, dtype, until, init_from_model=False, expect_resume=None, tag=""):
    """Trains until the device's committed step is `until` (fp16: iterations that
    overflow commit nothing). The blob carries the iteration and the loss scaler.
    Returns ({iteration: [loss hex, result]}, committed blobs, the optimizer's
    resumed step)."""
    model, groups = model_and_groups()
    kw = {"init_from_model": True} if init_from_model else {}
    opt = ckpt.torch.OffloadAdamW(groups, path, lr=3e-2, betas=(0.9, 0.95), dtype=dtype,
                                  chunk_params=CHUNK, **kw)
    # fp16: a scale that overflows at first, backs off, and grows again
    scaler = ckpt.torch.LossScaler(init_scale=2.0 ** 24, growth_interval=2) if dtype == "fp16" else None
    try:
        check(f"{tag}OffloadAdamW on {path}: a {dtype} device", opt.dtype == dtype, opt.dtype)
        it = 0
        if opt.committed_step:
            blob = json.loads(opt.blob())
            it = blob["iteration"]
            if scaler:
                scaler.load_state_dict(blob["scaler"])
        if expect_resume is not None:
            check(f"{tag}resumes at committed step {expect_resume}",
                  opt.resumed_step == expect_resume and opt.committed_step == expect_resume,
                  f"resumed_step {opt.resumed_step}, committed_step {opt.committed_step}")
            # the model got the device's params
            dev_p = {n: ckpt.torch.lowp_to_torch(opt.device.read_params(n), dtype).float()
                     for n in opt.names()}
            check(f"{tag}the model holds the device's params after the resume",
                  all(torch.equal(p.data, dev_p[n].view(p.shape)) for n, p in
                      model.named_parameters()))
        log, blobs = {}, {}
        opt.set_blob(lambda: json.dumps({"iteration": it + 1, "step": opt.committed_step + 1,
                                         "scaler": scaler.state_dict() if scaler else None}).encode())
        while opt.committed_step < until:
            x, y = batch(it)
            loss = torch.nn.functional.cross_entropy(model(x), y)
            if scaler:
                scaler.scale(loss).backward()
                scale = scaler.get_scale()
                scaler.step(opt)
                scaler.update()
            else:
                loss.backward()
                scale = None
                opt.step()
            opt.zero_grad()
            log[it] = [float(loss).hex(), opt.last_result]
            if opt.last_result == "committed":
                blobs[opt.committed_step] = opt.blob().decode()
            say(f"# {tag}{path} iteration {it}: loss {float(loss):.6f}, {opt.last_result}, "
                f"committed step {opt.committed_step}" + (f", scale {scale:g}" if scale else ""))
            it += 1
        resumed = opt.resumed_step
    finally:
        opt.close()
    return log, blobs, resumed


def state_of(path):
    """{name: (param, exp_avg, exp_avg_sq, lowp params)} of a device, and its
    committed step and blob, read with whatever libckpt picks for path."""
    with ckpt.open(path) as dev:
        st = {t["name"]: tuple(dev.read_state(t["name"])) +
              (np.ascontiguousarray(dev.read_params(t["name"])).view(np.uint16),)
              for t in dev.tensors()}
        return st, dev.committed_step, dev.blob().decode()


def same_state(a, b):
    """'' if the two states are bit-identical, else what differs."""
    if a.keys() != b.keys():
        return f"tensors {sorted(a)} vs {sorted(b)}"
    for n in a:
        for k, what in enumerate(("param", "exp_avg", "exp_avg_sq")):
            x, y = bits(a[n][k]), bits(b[n][k])
            if not np.array_equal(x, y):
                return f"{n} {what}: {int((x != y).sum())} of {x.size} words differ"
        if not np.array_equal(a[n][3], b[n][3]):
            return f"{n} low-precision params differ"
    return ""


def save_ref(dtype, log, blobs, st):
    with open(f"{REF}-{dtype}.json", "w") as f:
        json.dump({"log": log, "blobs": blobs}, f)
    np.savez(f"{REF}-{dtype}.npz", **{f"{n}.{k}": st[n][k] for n in st for k in range(4)})


def load_ref(dtype):
    with open(f"{REF}-{dtype}.json") as f:
        r = json.load(f)
    z = np.load(f"{REF}-{dtype}.npz")
    names = sorted({k.rsplit(".", 1)[0] for k in z.files})
    st = {n: tuple(z[f"{n}.{k}"] for k in range(4)) for n in names}
    log = {int(k): v for k, v in r["log"].items()}
    blobs = {int(k): v for k, v in r["blobs"].items()}
    return log, blobs, st


def same_log(got, ref, what):
    bad = [it for it in got if ref.get(it) != got[it]]
    missing = [it for it in got if it not in ref]
    check(f"{what}: losses and results bit-identical to the reference ({len(got)} iterations)",
          not bad and not missing and got,
          f"iterations {bad[:5]} differ: {[(got[i], ref.get(i)) for i in bad[:3]]}")


def reference(dtype):
    """The whole training with the userspace engine on a file in /tmp."""
    path = f"{REF}-{dtype}.img"
    if os.path.exists(path):
        os.unlink(path)
    log, blobs, _ = train(path, dtype, STEPS_TOTAL, tag=f"reference {dtype}: ")
    st, step, _ = state_of(path)
    check(f"reference {dtype}: {STEPS_TOTAL} steps committed on a file with the userspace engine",
          step == STEPS_TOTAL, f"committed step {step}")
    save_ref(dtype, log, blobs, st)
    os.unlink(path)
    return log


def prep(dev, dtype):
    """Format DEV and commit the first steps with the userspace engine on it."""
    ref_log, ref_blobs, _ = load_ref(dtype)
    fmt_dev(dev, dtype)
    check(f"{dtype}: ckpt.format {dev} with the model's layout", True)
    log, blobs, _ = train(dev, dtype, STEPS_BEFORE, init_from_model=True,
                          tag=f"{dtype} engine: ")
    with ckpt.open(dev) as d:
        check(f"{dtype}: {STEPS_BEFORE} steps committed on {dev} with the userspace engine",
              d.committed_step == STEPS_BEFORE, f"committed step {d.committed_step}")
    same_log(log, ref_log, f"{dtype} engine on {dev}")
    with open(os.path.join(TMP, f"offload_{dtype}_engine.json"), "w") as f:
        json.dump(log, f)


def resume(mapper, dtype):
    """Resume through the kernel target and train to STEPS_TOTAL."""
    ref_log, ref_blobs, ref_st = load_ref(dtype)
    with ckpt.open(mapper) as d:
        blob = d.blob().decode()
    check(f"{dtype}: the blob of step {STEPS_BEFORE} reads back through {mapper}",
          blob == ref_blobs.get(STEPS_BEFORE), f"{blob!r} vs {ref_blobs.get(STEPS_BEFORE)!r}")
    # a model of another shape is refused, and the device is untouched
    small = torch.nn.Linear(3, 2)
    try:
        ckpt.torch.OffloadAdamW(small.named_parameters(), mapper).close()
        check(f"{dtype}: OffloadAdamW on {mapper} refuses another model's params", False,
              "no LayoutMismatchError")
    except ckpt.torch.LayoutMismatchError as e:
        check(f"{dtype}: OffloadAdamW on {mapper} refuses another model's params", True)
        say(f"#   {str(e)[:160]}")
    # a trainer that stopped mid-step (killed: no abort) leaves its step open
    # on the kernel target; the next one drops it and resumes as after a crash
    with ckpt.open(mapper) as d:
        t = d.tensors()[0]
        d.begin([{"lr": 1e-3, "weight_decay": 0.0}] * d.info()["n_groups"])
        d.write_grad(t["name"], ckpt.torch.torch_to_lowp(torch.ones(t["numel"]), d.dtype))
    with ckpt.open(mapper) as d:
        left = d.status()
    check(f"{dtype} kernel: a step left open on {mapper} by a trainer that stopped",
          left["state"] == "open" and left["open_step"] == STEPS_BEFORE + 1, f"{left}")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        log, blobs, resumed = train(mapper, dtype, STEPS_TOTAL, expect_resume=STEPS_BEFORE,
                                    tag=f"{dtype} kernel: ")
    stale = [str(w.message) for w in caught if "left open" in str(w.message)]
    check(f"{dtype} kernel: OffloadAdamW aborted that step, saying so, and resumed from step "
          f"{STEPS_BEFORE}", len(stale) == 1 and f"step {STEPS_BEFORE + 1} was left open" in stale[0],
          f"{[str(w.message) for w in caught]}")
    results = [r for _, r in log.values()]
    skipped = results.count("overflow")
    check(f"{dtype} kernel: {STEPS_TOTAL - STEPS_BEFORE} steps committed through {mapper}"
          + (f" ({skipped} overflowing iteration(s) skipped)" if skipped else ", all \"committed\""),
          len(blobs) == STEPS_TOTAL - STEPS_BEFORE and
          results.count("committed") == STEPS_TOTAL - STEPS_BEFORE and
          (dtype == "fp16" or not skipped), f"{log}")
    check(f"{dtype} kernel: every step's blob round-trips through {mapper}",
          all(blobs[s] == ref_blobs.get(s) for s in blobs), f"{blobs} vs {ref_blobs}")
    same_log(log, ref_log, f"{dtype} kernel on {mapper}")
    say(f"# {dtype} kernel losses: " +
        " ".join(f"{float.fromhex(v[0]):.6f}" for _, v in sorted(log.items())))
    st, step, _ = state_of(mapper)
    check(f"{dtype} kernel: committed step {STEPS_TOTAL} and fp32 state identical to the "
          f"reference (read through {mapper})",
          step == STEPS_TOTAL and not same_state(st, ref_st),
          f"step {step}; {same_state(st, ref_st)}")
    rollback(mapper, dtype, ref_log, ref_st)


def rollback(mapper, dtype, ref_log, ref_st):
    """What a rank one step ahead does on open: Device.rollback() through the
    kernel target (the ROLLBACK command, no DM message), once; then the last
    step again, which must give the reference's state once more."""
    with ckpt.open(mapper) as d:
        try:
            back = d.rollback()
        except ckpt.CkptError as e:
            back = str(e)
        check(f"{dtype} kernel: Device.rollback() through {mapper} goes back to step "
              f"{STEPS_TOTAL - 1}", back == STEPS_TOTAL - 1 and d.committed_step == back,
              f"{back!r}, committed step {d.committed_step}")
        try:
            d.rollback()
            check(f"{dtype} kernel: a second rollback is refused", False, "it was not")
        except ckpt.CkptError as e:
            check(f"{dtype} kernel: a second rollback is refused, saying why",
                  "older superblock copy commits step" in str(e), str(e))
    log, _, _ = train(mapper, dtype, STEPS_TOTAL, expect_resume=STEPS_TOTAL - 1,
                      tag=f"{dtype} kernel after the rollback: ")
    same_log(log, ref_log, f"{dtype} kernel after the rollback")
    st, step, _ = state_of(mapper)
    check(f"{dtype} kernel: step {STEPS_TOTAL} done again after the rollback, fp32 state "
          f"identical to the reference", step == STEPS_TOTAL and not same_state(st, ref_st),
          f"step {step}; {same_state(st, ref_st)}")


def kernel_client(mapper):
    """The kernel client's writes are asynchronous: a write the target refuses
    (a tensor's gradient written twice in a step) surfaces at a later call,
    at the latest at COMMIT, which then commits nothing; the step is aborted
    and the committed step stays. A step opened and aborted reads no status
    page: BEGIN takes the committed step the client knows."""
    with ckpt.open(mapper) as d:
        step0 = d.committed_step
        t = d.tensors()[0]
        g = np.zeros(t["numel"], dtype=np.uint16 if d.dtype == "bf16" else np.float16)
        groups = [{"lr": 1e-3, "weight_decay": 0.0}] * d.info()["n_groups"]
        before = d.traffic()
        d.begin(groups)
        d.write_grad(t["name"], g)
        err = None
        try:
            d.write_grad(t["name"], g)      # refused by the target, told later
            d.commit(b"never")
        except ckpt.CkptError as e:
            err = e
        check(f"kernel client: a gradient written twice through {mapper} is refused by a later "
              f"call or the COMMIT (E_TWICE)", err is not None and err.name == "E_TWICE",
              f"{err.name + ': ' + err.message if err else 'no error'}")
        d.abort()
        after = d.traffic()
        check(f"kernel client: the step was aborted and step {step0} stays committed",
              d.committed_step == step0, f"committed step {d.committed_step}")
        check("kernel client: BEGIN, two writes and ABORT read the status page only to "
              "word the refusal", after["status_reads"] - before["status_reads"] <= 1,
              f"{after} vs {before}")


def state_during_step(mapper):
    """read_state while a step is open returns the committed step's state, on
    the kernel target as on the engine (the open step writes the other slot):
    read after every gradient of a step is written, then the step aborted."""
    with ckpt.open(mapper) as d:
        names = [t["name"] for t in d.tensors()]
        committed = {n: [bits(a).copy() for a in d.read_state(n)] for n in names}
        d.begin([{"lr": 1e-3, "weight_decay": 0.0}] * d.info()["n_groups"])
        err, differ = None, []
        try:
            for t in d.tensors():
                d.write_grad(t["name"], ckpt.torch.torch_to_lowp(torch.ones(t["numel"]), d.dtype))
            differ = [n for n in names if not all(np.array_equal(bits(a), b) for a, b in
                                                  zip(d.read_state(n), committed[n]))]
        except ckpt.CkptError as e:
            err = e
        finally:
            d.abort()
        check(f"kernel client: read_state through {mapper} during an open step returns the "
              f"committed step's state", err is None and not differ,
              f"{err.name + ': ' + err.message}" if err else f"{differ} differ")


def after(dev, dtype):
    """The userspace engine on the backing device after the kernel target."""
    _, ref_blobs, ref_st = load_ref(dtype)
    try:
        st, step, blob = state_of(dev)
    except ckpt.CkptError as e:
        check(f"{dtype}: the userspace engine opens {dev} after the kernel target", False, str(e))
        return
    check(f"{dtype}: the userspace engine on {dev}: committed step {STEPS_TOTAL}",
          step == STEPS_TOTAL, f"committed step {step}")
    check(f"{dtype}: ... with the blob of step {STEPS_TOTAL}", blob == ref_blobs.get(STEPS_TOTAL),
          f"{blob!r} vs {ref_blobs.get(STEPS_TOTAL)!r}")
    why = same_state(st, ref_st)
    check(f"{dtype}: ... fp32 masters, exp_avg, exp_avg_sq and {dtype} params bit-identical to "
          f"the reference run on a file", not why, why)
    n = sum(v[0].size for v in st.values())
    say(f"# {dtype}: {len(st)} tensors, {n} params compared")


def ckptctl(*args):
    r = subprocess.run(["ckptctl", *args], capture_output=True, text=True)
    for line in (r.stdout + r.stderr).splitlines():
        say(f"#   {line}")
    return r.returncode == 0


def flipped_params(dev, mapper, no_target):
    """A flipped bit in the committed p_lo of DEV: read_params through the
    kernel target fails with E_RECORD naming the tensor (the client checks the
    p_lo against its record header on the backing device)."""
    info = json.loads(subprocess.run(["ckptctl", "info", "--json", dev], capture_output=True,
                                     text=True, check=True).stdout)
    t = info["tensors"][-1]
    off = info["regions"]["plo_off"][info["committed_slot"]] + 2 * t["offset"] + 1

    def flip():
        fd = os.open(dev, os.O_RDWR)
        try:
            b = os.pread(fd, 1, off)
            os.pwrite(fd, bytes([b[0] ^ 0x10]), off)
            os.fsync(fd)
        finally:
            os.close(fd)

    flip()
    name = os.path.basename(mapper)
    if not no_target:
        check(f"p_lo: ckptctl create {name} {dev} with a flipped p_lo bit", ckptctl("create", name, dev))
    try:
        with ckpt.open(mapper) as d:
            try:
                d.read_params(t["name"])
                check(f"p_lo: read_params({t['name']!r}) through {mapper} fails", False, "it did not")
            except ckpt.CkptError as e:
                check(f"p_lo: read_params({t['name']!r}) through {mapper} fails with E_RECORD naming it",
                      e.name == "E_RECORD" and f"'{t['name']}'" in e.message, f"{e.name}: {e.message}")
    finally:
        if not no_target:
            check(f"p_lo: ckptctl remove {name}", ckptctl("remove", name))
        flip()


def main(argv):
    torch.set_num_threads(1)
    no_target = "--no-target" in argv
    argv = [a for a in argv if a != "--no-target"]
    phase = argv[0]
    say(f"# offload_dm.py {phase}: torch {torch.__version__}, numpy {np.__version__}, "
        f"ckpt from {os.path.dirname(ckpt.__file__)}; imports took {T0 - T_START:.1f} s")
    if phase == "prep":
        (dev,) = argv[1:]
        for dtype in ("bf16", "fp16"):
            t = time.monotonic()
            reference(dtype)
            say(f"# reference {dtype}: {time.monotonic() - t:.1f} s")
        prep(dev, "bf16")
    elif phase == "resume":
        (mapper,) = argv[1:]
        resume(mapper, "bf16")
        kernel_client(mapper)
        state_during_step(mapper)
    elif phase == "check":
        dev, mapper = argv[1:]
        after(dev, "bf16")
        # the fp16 variant, all in this process
        prep(dev, "fp16")
        name = os.path.basename(mapper)
        if not no_target:
            check(f"fp16: ckptctl create {name} {dev}", ckptctl("create", name, dev))
        try:
            resume(mapper, "fp16")
        finally:
            if not no_target:
                check(f"fp16: ckptctl remove {name}", ckptctl("remove", name))
        after(dev, "fp16")
        flipped_params(dev, mapper, no_target)
    else:
        raise SystemExit(f"unknown phase {phase}")
    say(f"# offload_dm.py {phase}: {time.monotonic() - T0:.1f} s after the imports, "
        f"{checks.failures} failure(s)")
    return 1 if checks.failures else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
