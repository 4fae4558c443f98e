# SPDX-License-Identifier: MIT
"""Shared helpers of the Python tests (not a test module itself).

- exact_update(): the engine's update (libckpt/core/ckpt_update.h) replayed in
  numpy float32, one correctly rounded operation at a time, in the same order,
  with the per-step scalars computed like hparams_for_step() in
  libckpt/src/device.cpp (double, then cast to fp32). numpy never contracts
  to FMA, so this model must agree with the engine BIT FOR BIT.
- fp16/bf16 conversions (round to nearest even) and a deterministic
  gradient trace.
- snapshot(): everything a committed step stands for (step, fp32 state,
  low-precision params, trainer blob), for before/after comparisons.

Run the tests with Debian's /usr/bin/python3 (it has torch and numpy) and
PYTHONPATH=<build>/python.
"""

import hashlib
import os
import re
import socket
import subprocess
import sys
import tempfile

import numpy as np

try:
    import ckpt  # noqa: F401  (re-exported for the test modules)
except ImportError as e:  # pragma: no cover - a setup problem, say what to do
    raise ImportError(f"cannot import ckpt ({e}): run with PYTHONPATH=<build dir>/python "
                      f"(python is {sys.executable})") from e

HERE = os.path.dirname(os.path.abspath(__file__))
# the build's ckptctl, beside the package assembled in <build>/python
CKPTCTL = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(ckpt.__file__)))),
                       "tools", "ckptctl")
TMP_ROOT = "/tmp"  # supports O_DIRECT (the engine falls back without it, e.g. on tmpfs)


def tempdir():
    return tempfile.TemporaryDirectory(prefix="ckpt-pytest-", dir=TMP_ROOT)


def read_file(path):
    """The bytes of the file at path."""
    with open(path, "rb") as f:
        return f.read()


def readme_blocks(lang):
    """The README's ```LANG blocks, in order."""
    root = os.path.dirname(os.path.dirname(HERE))
    with open(os.path.join(root, "README.md")) as f:
        return re.findall(r"```" + lang + r"\n(.*?)```", f.read(), re.S)


def run_python_in(d, code, timeout=300):
    """Runs code with this interpreter in directory d; (returncode, stdout + stderr)."""
    p = subprocess.run([sys.executable, "-c", code], cwd=d, capture_output=True, text=True, timeout=timeout)
    return p.returncode, p.stdout + p.stderr


def free_port():
    """A TCP port on 127.0.0.1 free now (torch.distributed's rendezvous)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# ---------------------------------------------------------------- conversions

def f32_to_bf16_bits(x):
    """fp32 -> bf16 bit patterns, round to nearest even, in uint32 arithmetic."""
    u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    r = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)
    nan = (u & 0x7FFFFFFF) > 0x7F800000
    if nan.any():  # NaN stays a (quiet) NaN
        r[nan] = ((u[nan] >> 16) | 0x40).astype(np.uint16)
    return r


def bf16_bits_to_f32(b):
    return (np.asarray(b, dtype=np.uint16).astype(np.uint32) << 16).view(np.float32)


def f32_to_lowp_bits(x, dtype):
    """The engine's p_lo: round to nearest even to dtype, as uint16 bits."""
    if dtype == "bf16":
        return f32_to_bf16_bits(x)
    return np.ascontiguousarray(x, dtype=np.float32).astype(np.float16).view(np.uint16)  # numpy: RNE


def lowp_bits_to_f32(b, dtype):
    b = np.asarray(b)
    if dtype == "bf16":
        return bf16_bits_to_f32(b.view(np.uint16))
    return b.view(np.float16).astype(np.float32)


def as_bits(a):
    """uint16 view of what read_params returns (float16 on fp16 devices)."""
    return np.ascontiguousarray(a).view(np.uint16)


# ---------------------------------------------------------------- the model

DEFAULTS = {"betas": (0.9, 0.999), "eps": 1e-8, "weight_decay": 1e-2, "adam_l2": False}


def hparams_f32(group, step):
    """hparams_for_step(): scalars in double, as torch computes them, then fp32."""
    g = dict(DEFAULTS, **group)
    lr, (b1, b2), eps, wd, l2 = g["lr"], g["betas"], g["eps"], g["weight_decay"], g["adam_l2"]
    f = np.float32
    bc1 = 1.0 - b1 ** float(step)
    bc2 = 1.0 - b2 ** float(step)
    return {
        "beta1": f(b1), "beta2": f(b2), "eps": f(eps), "wd": f(wd),
        "omb1": f(1.0 - b1), "omb2": f(1.0 - b2),
        "step_size": f(lr / bc1), "bc2": f(np.sqrt(bc2)),
        "decay": f(1.0 if l2 else 1.0 - lr * wd), "l2": bool(l2),
    }


def exact_update(p, m, v, grad_bits, dtype, hp, grad_scale):
    """One step of ckpt_update_chunk in numpy fp32. Returns (p, m, v, finite):
    finite is False when a scaled gradient or a new p, m or v is not finite
    (the device skips such a step)."""
    with np.errstate(all="ignore"):
        g = lowp_bits_to_f32(grad_bits, dtype) * np.float32(grad_scale)
        finite = bool(np.isfinite(g).all())
        if hp["l2"]:
            g = g + hp["wd"] * p
        else:
            p = p * hp["decay"]
        m = m * hp["beta1"] + g * hp["omb1"]
        v = v * hp["beta2"] + (g * g) * hp["omb2"]
        denom = np.sqrt(v) / hp["bc2"] + hp["eps"]
        p = p - hp["step_size"] * (m / denom)
        finite = finite and bool(np.isfinite(p).all() and np.isfinite(m).all() and np.isfinite(v).all())
    return p.astype(np.float32), m.astype(np.float32), v.astype(np.float32), finite


class Model:
    """The exact model of a whole device: fp32 state per tensor."""

    def __init__(self, tensors, dtype, init):
        self.dtype = dtype
        self.group = {n: g for n, _, g in tensors}
        self.state = {n: (np.asarray(init[n], np.float32).reshape(-1).copy(),
                          np.zeros(int(np.prod(s)), np.float32), np.zeros(int(np.prod(s)), np.float32))
                      for n, s, _ in tensors}

    def step(self, t, groups, grads, grad_scale=1.0):
        """Applies step t (all tensors) unless a gradient or a result is non-finite; returns finite."""
        hps = [hparams_f32(g, t) for g in groups]
        new, finite = {}, True
        for n, (p, m, v) in self.state.items():
            *pmv, ok = exact_update(p, m, v, np.asarray(grads[n]).reshape(-1), self.dtype,
                                    hps[self.group[n]], grad_scale)
            new[n] = tuple(pmv)
            finite &= ok
        if finite:
            self.state = new
        return finite


# ---------------------------------------------------------------- traces

def trace_grads(seed, step, tensors, dtype, attempt=0):
    """Deterministic gradients (uint16 bits) of step `step` for a trace."""
    rng = np.random.default_rng([seed, step, attempt])
    out = {}
    for n, s, _ in tensors:
        g = (rng.standard_normal(s) * 0.1).astype(np.float32)
        out[n] = f32_to_lowp_bits(g, dtype).reshape(s)
    return out


def trace_groups(step, n_groups):
    """Deterministic per-group hyperparameters of a step (lr schedule)."""
    return [{"lr": 1e-3 * (1 + i) * (1.0 + 0.5 * np.sin(step / 7.0)),
             "betas": (0.9 - 0.05 * i, 0.999 - 0.004 * i),
             "weight_decay": 0.0 if i == 1 else 0.01 * (i + 1)} for i in range(n_groups)]


def trace_blob(seed, step):
    return f"seed={seed} step={step} ".encode() + bytes(np.random.default_rng([seed, step, 99]).integers(
        0, 256, 40, dtype=np.uint8))


# ---------------------------------------------------------------- snapshots

def snapshot(dev):
    """Everything the committed (or latest applied) state consists of, as bytes."""
    info = dev.info()
    tens = {}
    for t in dev.tensors():
        p, m, v = dev.read_state(t["name"])
        tens[t["name"]] = (p.tobytes(), m.tobytes(), v.tobytes(), as_bits(dev.read_params(t["name"])).tobytes())
    return {"committed_step": info["committed_step"], "open_step": info["open_step"],
            "state": info["state"], "tensors": tens, "blob": dev.blob()}


def digest(snap):
    """A short digest of a snapshot's data (committed step, state, params, blob)."""
    h = hashlib.sha256()
    h.update(str(snap["committed_step"]).encode())
    for name in sorted(snap["tensors"]):
        h.update(name.encode())
        for b in snap["tensors"][name]:
            h.update(b)
    h.update(snap["blob"])
    return h.hexdigest()


# ---------------------------------------------------------------- a restore trace

# Used by test_restore and its child process (restore_child.py): the same
# seeded trace replayed in two processes must give the same bytes.
TRACE_TENSORS = [("emb", (300, 40), 0), ("w1", (64, 65), 0), ("b1", (65,), 0),
                 ("w2", (3000,), 1), ("s", (1,), 2)]
TRACE_CHUNK = 4096


def trace_format(path, seed, dtype):
    """Formats path and loads the trace's initial params (step 0)."""
    layout = ckpt.Layout()
    for n, s, g in TRACE_TENSORS:
        layout.add(n, s, g)
    ckpt.format(path, layout, dtype=dtype, chunk_params=TRACE_CHUNK)
    dev = ckpt.open(path)
    rng = np.random.default_rng([seed, 0])
    dev.load_params({n: (rng.standard_normal(s) * 0.5).astype(np.float32) for n, s, _ in TRACE_TENSORS})
    return dev


def trace_begin(dev, seed, t, junk=False):
    """Begins step t of the trace and returns its gradients. junk: other
    hyperparameters and gradients, for steps that must leave no trace."""
    groups = trace_groups(t, 3)
    if junk:
        groups = [dict(g, lr=g["lr"] * 10, weight_decay=0.5) for g in groups]
    dev.begin(groups, grad_scale=1.0 / 256 if dev.dtype == "fp16" else 1.0)
    return trace_grads(seed, t, TRACE_TENSORS, dev.dtype, attempt=1 if junk else 0)


def trace_step(dev, seed):
    """Runs and commits the next step of the trace; returns its number."""
    t = dev.committed_step + 1
    g = trace_begin(dev, seed, t)
    for n, _, _ in TRACE_TENSORS:
        dev.write_grad(n, g[n])
    result = dev.commit(trace_blob(seed, t))
    if result != "committed":
        raise AssertionError(f"trace step {t}: {result}")
    return t


def save_snapshot(snap, path):
    arrays = {"committed_step": np.array(snap["committed_step"]),
              "blob": np.frombuffer(snap["blob"], np.uint8)}
    for n, (p, m, v, lo) in snap["tensors"].items():
        for k, b in zip(("p", "m", "v", "lo"), (p, m, v, lo)):
            arrays[f"{n}|{k}"] = np.frombuffer(b, np.uint8)
    np.savez(path, **arrays)


def load_snapshot(path):
    with np.load(path) as z:
        tens = {}
        for key in z.files:
            if "|" in key:
                n, k = key.split("|")
                tens.setdefault(n, {})[k] = z[key].tobytes()
        return {"committed_step": int(z["committed_step"]), "blob": z["blob"].tobytes(),
                "tensors": {n: (d["p"], d["m"], d["v"], d["lo"]) for n, d in tens.items()}}


def committed_view(snap):
    """The parts of a snapshot that a reopen must restore."""
    return {k: snap[k] for k in ("committed_step", "blob", "tensors")}
