#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""The main demo (`make demo`): a small GPT trained with its optimizer on a dm-ckpt device.

A character-level GPT (4 layers, d_model 256, 4 heads, context 64: 3.2 M params)
learns the license texts every Debian system ships (/usr/share/common-licenses),
on the CPU, with ckpt.torch.OffloadAdamW on the userspace engine: the fp32
master params and AdamW moments live in a backing file (bf16 device), the model
holds bf16 values (in fp32 tensors; matmuls run in bf16 under CPU autocast).

Three trainings run side by side, from the same seed and the same batches:
  interrupted    OffloadAdamW; SIGKILLed by this driver halfway, restarted: it
                 resumes from the device's committed step and the trainer blob
                 that committed with it (sampler RNG state, from which every
                 step's torch seed is drawn)
  uninterrupted  OffloadAdamW, never killed
  torch          torch.optim.AdamW(foreach=False) on fp32 masters, model params
                 rounded to bf16 after every step, same bf16 gradients and
                 clipping: the algorithm the device runs, in torch
Checked at the end: interrupted+resumed losses == uninterrupted losses, bit for
bit (every step); the offloaded curve tracks torch's within noise (see
TRACK_BOUND). Writes out/demo/loss.png, the device's params as
out/demo/model.safetensors (by `ckptctl export`; loaded back into a fresh model for a validation
loss and a text sample), and out/demo/summary.json.

    PYTHONPATH=build/python /usr/bin/python3 demo/train.py [--steps N] [--out DIR]

Environment: DEMO_STEPS (steps), DEMO_SIZE=tiny (a small model, for the test
suite's smoke test), DEMO_OUT (output folder).
"""

import argparse
import json
import math
import os
import random
import selectors
import signal
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SEED = 1234
CORPUS_DIR = "/usr/share/common-licenses"

SIZES = {
    # layers, d_model, heads, context, batch, lr
    "full": dict(n_layer=4, d_model=256, n_head=4, ctx=64, batch=32, lr=3e-3),
    "tiny": dict(n_layer=2, d_model=64, n_head=4, ctx=32, batch=8, lr=3e-3),
}
DEFAULT_STEPS = {"full": 250, "tiny": 40}
WARMUP_FRAC, MIN_LR_FRAC, CLIP, DROPOUT, WEIGHT_DECAY, BETAS = 0.05, 0.1, 1.0, 0.1, 0.1, (0.9, 0.95)

# The offloaded curve must track the torch reference: mean |loss diff| over the
# last 20% of the steps below TRACK_BOUND x the batch noise of the loss there
# (the standard deviation of the loss around its trend, which is how much two
# equally good models' losses on the same batches may differ). The two runs
# compute the same algorithm and differ only by fp32 rounding (torch's kernels
# may fuse multiply-adds; the device's never do), which flips a bf16 rounding of a
# param now and then; the flips grow like any perturbation in training, so the
# curves drift apart within the noise, not away from each other.
TRACK_BOUND = 0.5
RUNS = ("interrupted", "uninterrupted", "torch")


# ------------------------------------------------------------------ data and model (worker side)

def corpus():
    """The license texts, each file once (some are symlinks), in name order, as bytes."""
    seen, parts = set(), []
    for name in sorted(os.listdir(CORPUS_DIR)):
        p = os.path.realpath(os.path.join(CORPUS_DIR, name))
        if p in seen or not os.path.isfile(p):
            continue
        seen.add(p)
        with open(p, "rb") as f:
            parts.append(f.read())
    return b"\n".join(parts)


def encode(text):
    import numpy as np
    data = np.frombuffer(text, dtype=np.uint8)
    vocab = np.unique(data)
    lut = np.zeros(256, dtype=np.int64)
    lut[vocab] = np.arange(len(vocab))
    return lut[data], vocab


def build_model(cfg, vocab_size):
    import torch
    import torch.nn as nn
    import torch.nn.functional as F

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            d = cfg["d_model"]
            self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
            self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
            self.fc, self.fc2 = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)
            self.register_buffer("mask", torch.triu(torch.ones(cfg["ctx"], cfg["ctx"], dtype=torch.bool), 1),
                                 persistent=False)

        def forward(self, x):
            b, t, d = x.shape
            h = cfg["n_head"]
            q, k, v = self.qkv(self.ln1(x)).split(d, dim=2)
            q, k, v = (z.view(b, t, h, d // h).transpose(1, 2) for z in (q, k, v))
            a = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(d // h))
            a = a.float().masked_fill(self.mask[:t, :t], float("-inf")).softmax(-1)
            y = (a.to(v.dtype) @ v).transpose(1, 2).reshape(b, t, d)
            x = x + F.dropout(self.proj(y), DROPOUT, self.training)
            return x + F.dropout(self.fc2(F.gelu(self.fc(self.ln2(x)))), DROPOUT, self.training)

    class GPT(nn.Module):
        def __init__(self):
            super().__init__()
            d = cfg["d_model"]
            self.tok = nn.Embedding(vocab_size, d)
            self.pos = nn.Embedding(cfg["ctx"], d)
            self.blocks = nn.ModuleList(Block() for _ in range(cfg["n_layer"]))
            self.ln = nn.LayerNorm(d)
            self.head = nn.Linear(d, vocab_size, bias=False)
            for name, p in self.named_parameters():
                if name.endswith(".weight") and p.dim() == 2:
                    nn.init.normal_(p, 0.0, 0.02)
                    if name.endswith("proj.weight") or name.endswith("fc2.weight"):
                        p.data.mul_(1 / math.sqrt(2 * cfg["n_layer"]))
                elif name.endswith(".bias"):
                    nn.init.zeros_(p)

        def forward(self, idx):
            t = idx.shape[1]
            x = F.dropout(self.tok(idx) + self.pos(torch.arange(t)), DROPOUT, self.training)
            for blk in self.blocks:
                x = blk(x)
            return self.head(self.ln(x))

    return GPT()


def param_groups(model):
    """AdamW groups as GPT trainers use them: decay the matrices, not biases/norms/embeddings."""
    decay, no_decay = [], []
    for n, p in model.named_parameters():
        (decay if p.dim() == 2 and not n.startswith(("tok.", "pos.")) else no_decay).append((n, p))
    return [{"params": decay, "weight_decay": WEIGHT_DECAY}, {"params": no_decay, "weight_decay": 0.0}]


def lr_lambda(steps):
    warm = max(1, int(WARMUP_FRAC * steps))

    def f(i):  # i = step - 1
        if i < warm:
            return (i + 1) / warm
        r = (i - warm) / max(1, steps - warm)
        return MIN_LR_FRAC + (1 - MIN_LR_FRAC) * 0.5 * (1 + math.cos(math.pi * min(1.0, r)))
    return f


def worker(args):
    """One training process: --run interrupted|uninterrupted (OffloadAdamW on a device
    file; resumes if the file exists) or torch (the in-memory reference)."""
    import numpy as np
    import torch
    import torch.nn.functional as F

    torch.set_num_threads(1)  # deterministic kernels, and three runs share two cores
    cfg = SIZES[args.size]
    ids, vocab = encode(corpus())
    n_val = len(ids) // 10
    train = torch.from_numpy(ids[:-n_val])
    torch.manual_seed(SEED)
    model = build_model(cfg, len(vocab))
    groups = param_groups(model)
    log_path = os.path.join(args.out, f"{args.run}.log")

    if args.run == "torch":
        # fp32 masters in torch's AdamW, the model holds their bf16 rounding.
        masters = {n: p.detach().clone() for g in groups for n, p in g["params"]}
        opt = torch.optim.AdamW([{"params": [masters[n] for n, _ in g["params"]],
                                  "weight_decay": g["weight_decay"]} for g in groups],
                                lr=cfg["lr"], betas=BETAS, eps=1e-8, foreach=False)
        pairs = [(masters[n], p) for g in groups for n, p in g["params"]]
        with torch.no_grad():
            for m, p in pairs:
                p.copy_(m.to(torch.bfloat16))
        start, rng = 0, np.random.default_rng(SEED)
    else:
        import ckpt.torch
        dev = os.path.join(args.out, f"{args.run}.img")
        opt = ckpt.torch.OffloadAdamW(groups, dev, lr=cfg["lr"], betas=BETAS, eps=1e-8, dtype="bf16")
        start = opt.committed_step
        rng = np.random.default_rng(SEED)
        if start:
            blob = json.loads(opt.blob())
            assert blob["step"] == start, (blob, start)
            rng.bit_generator.state = blob["rng"]
            print(f"RESUMED {args.run} {start}", flush=True)
        opt.set_blob(lambda: json.dumps({"step": t, "rng": rng.bit_generator.state}).encode())
    for g in opt.param_groups:
        g["initial_lr"] = cfg["lr"]
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_lambda(args.steps), last_epoch=start - 1)

    model.train()
    B, T = cfg["batch"], cfg["ctx"]
    t_model = t_opt = 0.0
    with open(log_path, "a") as log:
        log.write(f"# start {start}\n")
        log.flush()
        for t in range(start + 1, args.steps + 1):
            c0 = time.perf_counter()
            # The batch and the step's torch seed come from the numpy generator,
            # whose state is all the trainer blob needs (torch's MT19937 state is
            # 5 KiB, more than a blob holds; reseeding per step makes it a function
            # of the committed blob).
            offs = rng.integers(0, len(train) - T - 1, size=B)
            torch.manual_seed(int(rng.integers(0, 2 ** 62)))
            idx = torch.stack([train[o:o + T + 1] for o in offs.tolist()])
            with torch.autocast("cpu", dtype=torch.bfloat16):
                logits = model(idx[:, :-1])
            loss = F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), idx[:, 1:].reshape(-1))
            loss.backward()
            # Logged before the commit: a kill after the commit loses no loss.
            log.write(f"{t} {loss.item().hex()}\n")
            log.flush()
            c1 = time.perf_counter()
            if args.run == "torch":
                for m, p in pairs:
                    m.grad = p.grad.to(torch.bfloat16).to(torch.float32)
                torch.nn.utils.clip_grad_norm_([m for m, _ in pairs], CLIP)
                opt.step()
                with torch.no_grad():
                    for m, p in pairs:
                        p.copy_(m.to(torch.bfloat16))
                result = "committed"
            else:
                opt.clip_grad_norm_(CLIP)
                opt.step()
                result = opt.last_result
            sched.step()
            opt.zero_grad(set_to_none=True)
            model.zero_grad(set_to_none=True)
            c2 = time.perf_counter()
            t_model, t_opt = t_model + c1 - c0, t_opt + c2 - c1
            print(f"STEP {args.run} {t} {loss.item():.4f} {result}", flush=True)
    if args.run != "torch":
        opt.close()
    n = max(1, args.steps - start)
    print(f"DONE {args.run} {1000 * t_model / n:.0f} {1000 * t_opt / n:.0f}", flush=True)


# ------------------------------------------------------------------ the driver

def read_log(path):
    """[(start, {step: loss})] per process lifetime, from a run's log."""
    parts = []
    with open(path) as f:
        for line in f:
            if line.startswith("# start"):
                parts.append((int(line.split()[2]), {}))
            elif line.strip():
                s, v = line.split()
                parts[-1][1][int(s)] = float.fromhex(v)
    return parts


class Progress:
    def __init__(self, steps):
        self.steps, self.state, self.tty = steps, {r: (0, None) for r in RUNS}, sys.stdout.isatty()
        self.last_print, self.t0 = -1, time.time()

    def update(self, run, step, loss):
        self.state[run] = (step, loss)
        done = sum(s for s, _ in self.state.values()) / (len(RUNS) * self.steps)
        bar = "#" * int(30 * done) + "." * (30 - int(30 * done))
        runs = "  ".join(f"{r} {s:>4}/{self.steps} loss {l:.3f}" if l is not None else f"{r} {s:>4}/{self.steps}"
                         for r, (s, l) in self.state.items())
        line = f"[{bar}] {100 * done:3.0f}% {time.time() - self.t0:4.0f}s  {runs}"
        if self.tty:
            sys.stdout.write("\r" + line[:200] + "\x1b[K")
            sys.stdout.flush()
        elif int(done * 20) != self.last_print:  # every 5% in a log
            self.last_print = int(done * 20)
            print(line, flush=True)

    def message(self, text):
        if self.tty:
            sys.stdout.write("\r\x1b[K")
        print(text, flush=True)


def driver(args):
    out = os.path.abspath(args.out)
    os.makedirs(out, exist_ok=True)
    for r in RUNS:
        for ext in (".log", ".img"):
            if os.path.exists(os.path.join(out, r + ext)):
                os.unlink(os.path.join(out, r + ext))
    cfg = SIZES[args.size]
    text = corpus()
    print(f"dm-ckpt demo: a character-level GPT ({cfg['n_layer']} layers, d_model {cfg['d_model']}, "
          f"{cfg['n_head']} heads, context {cfg['ctx']}, batch {cfg['batch']}) on {len(text)} bytes of "
          f"{CORPUS_DIR}, {args.steps} steps, CPU", flush=True)
    print(f"  runs: interrupted (OffloadAdamW, SIGKILLed halfway and restarted), uninterrupted "
          f"(OffloadAdamW), torch (torch.optim.AdamW reference); devices and outputs in {out}",
          flush=True)
    env = dict(os.environ)
    try:  # the workers import the same ckpt package as this driver
        import ckpt
        pkg = os.path.dirname(os.path.dirname(os.path.abspath(ckpt.__file__)))
    except ImportError:
        pkg = os.path.join(ROOT, "build", "python")
        if not os.path.exists(os.path.join(pkg, "ckpt", "libckpt.so")):
            raise SystemExit("demo: cannot import ckpt: build first (make all) and set PYTHONPATH=build/python")
        sys.path.insert(0, pkg)
    env["PYTHONPATH"] = os.pathsep.join(p for p in [pkg, env.get("PYTHONPATH", "")] if p)
    env.setdefault("OMP_NUM_THREADS", "1")

    def spawn(run):
        cmd = [sys.executable, os.path.abspath(__file__), "--worker", "--run", run, "--steps",
               str(args.steps), "--size", args.size, "--out", out]
        return subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True, env=env, bufsize=1)

    kill_rng = random.Random()  # the kill point is deliberately not reproducible
    kill_at = args.steps // 2 + kill_rng.randint(0, max(1, args.steps // 20))
    sel = selectors.DefaultSelector()
    procs = {}
    for r in RUNS:
        procs[r] = spawn(r)
        sel.register(procs[r].stdout, selectors.EVENT_READ, r)
    progress = Progress(args.steps)
    killed, resumed_at, t0, timing = None, None, time.time(), {}
    while procs:
        for key, _ in sel.select():
            run = key.data
            line = key.fileobj.readline()
            if not line:
                sel.unregister(key.fileobj)
                rc = procs.pop(run).wait()
                if run == "interrupted" and killed is not None and resumed_at is None and rc == -signal.SIGKILL:
                    progress.message(f"  interrupted: SIGKILLed (it had reported step {killed}), restarting it")
                    procs[run] = spawn(run)
                    sel.register(procs[run].stdout, selectors.EVENT_READ, run)
                    resumed_at = -1
                elif rc != 0:
                    for p in procs.values():
                        p.kill()
                    raise SystemExit(f"demo: the {run} run failed (exit status {rc})")
                continue
            f = line.split()
            if f[0] == "STEP":
                step, loss = int(f[2]), float(f[3])
                progress.update(run, step, loss)
                if run == "interrupted" and killed is None and step >= kill_at:
                    # Land somewhere inside the next step: gradient writes, commit, anything.
                    time.sleep(kill_rng.uniform(0, 0.3))
                    procs[run].send_signal(signal.SIGKILL)
                    killed = step
            elif f[0] == "DONE":
                timing[run] = (int(f[2]), int(f[3]))
            elif f[0] == "RESUMED":
                resumed_at = int(f[2])
                progress.message(f"  interrupted: resumed from the device's committed step {resumed_at} "
                                 f"and its trainer blob")
    progress.message(f"  trained in {time.time() - t0:.0f} s (three runs sharing the CPU); per step: "
                     f"forward+backward {timing['uninterrupted'][0]} ms, OffloadAdamW.step {timing['uninterrupted'][1]} ms "
                     f"(write bf16 grads, AdamW on the device, commit, read params back), "
                     f"torch AdamW step {timing['torch'][1]} ms")
    return report(args, out, cfg, killed, resumed_at)


def smooth(y, k):
    import numpy as np
    k = max(1, min(k, len(y)))
    c = np.cumsum(np.insert(np.asarray(y, dtype=np.float64), 0, 0.0))
    s = (c[k:] - c[:-k]) / k
    return np.concatenate([np.full(k - 1, np.nan), s])


def report(args, out, cfg, killed, resumed_at):
    import numpy as np
    n = args.steps
    parts = read_log(os.path.join(out, "interrupted.log"))
    if len(parts) != 2 or resumed_at is None or resumed_at < 1:
        raise SystemExit(f"demo: the interrupted run did not resume from a committed step ({parts and [p[0] for p in parts]})")
    (s1, before), (s2, after) = parts
    merged = {t: v for t, v in before.items() if t <= s2}
    merged.update(after)
    redone = sorted(t for t in before if t > s2)   # computed before the kill, not committed
    uninterrupted = read_log(os.path.join(out, "uninterrupted.log"))[0][1]
    reference = read_log(os.path.join(out, "torch.log"))[0][1]
    steps = np.arange(1, n + 1)
    a = np.array([merged[t] for t in steps])
    b = np.array([uninterrupted[t] for t in steps])
    c = np.array([reference[t] for t in steps])
    identical = bool(np.array_equal(a.view(np.uint64), b.view(np.uint64)))
    redone_identical = all(before[t] == after[t] for t in redone)
    tail = slice(int(0.8 * n), n)
    mean_diff = float(np.mean(np.abs(b[tail] - c[tail])))
    k = max(5, n // 20)
    noise = float(np.nanstd((b - smooth(b, k))[tail]))  # batch noise around the moving average
    tracks = mean_diff < TRACK_BOUND * noise
    first_diff = int(np.argmax(b != c)) + 1 if np.any(b != c) else None

    # Export the device's params and load them into a fresh model: the checkpoint is usable.
    import torch
    import torch.nn.functional as F
    import ckpt.torch
    st = os.path.join(out, "model.safetensors")
    exporter = export(os.path.join(out, "interrupted.img"), st)
    ids, vocab = encode(corpus())
    torch.set_num_threads(1)
    torch.manual_seed(SEED)
    model = build_model(cfg, len(vocab))
    ckpt.torch.load_safetensors_into(model, st)
    model.eval()
    val = torch.from_numpy(ids[-(len(ids) // 10):])
    T = cfg["ctx"]
    starts = torch.arange(0, len(val) - T - 1, max(T, (len(val) - T - 1) // 64))[:64]
    idx = torch.stack([val[s:s + T + 1] for s in starts.tolist()])
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        logits = model(idx[:, :-1])
    val_loss = float(F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), idx[:, 1:].reshape(-1)))
    sample = generate(model, vocab, cfg, b"This License ", 160)

    summary = {
        "steps": n, "size": args.size, "kill_sent_after_reported_step": killed, "resumed_from_step": s2,
        "steps_recomputed_after_resume": redone,
        "resumed_identical_to_uninterrupted": identical, "recomputed_steps_identical": redone_identical,
        "loss_first": float(b[0]), "loss_last_10pct_mean": float(np.mean(b[int(0.9 * n):])),
        "torch_loss_last_10pct_mean": float(np.mean(c[int(0.9 * n):])),
        "first_step_differing_from_torch": first_diff,
        "mean_abs_diff_vs_torch_last_20pct": mean_diff, "loss_noise_last_20pct": noise,
        "track_bound": TRACK_BOUND, "tracks_torch": bool(tracks),
        "val_loss_exported": val_loss, "n_params": int(sum(p.numel() for p in model.parameters())),
        "losses": {"interrupted": a.tolist(), "uninterrupted": b.tolist(), "torch": c.tolist()},
        "sample": sample,
    }
    with open(os.path.join(out, "summary.json"), "w") as f:
        json.dump(summary, f, indent=1)
    png = os.path.join(out, "loss.png")
    plot(png, steps, a, b, c, summary, cfg)

    print(f"  interrupted+resumed vs uninterrupted: {'bit-identical at every step' if identical else 'DIFFERENT'}"
          f" (resumed from committed step {s2}"
          + (f"; steps {redone[0]}..{redone[-1]} had run before the kill without committing, recomputed: "
             f"{'identical' if redone_identical else 'DIFFERENT'}" if redone else "") + ")")
    print(f"  loss {b[0]:.3f} -> {summary['loss_last_10pct_mean']:.3f} (mean of the last 10%); "
          f"torch.optim.AdamW reference {summary['torch_loss_last_10pct_mean']:.3f}")
    print(f"  vs torch: first differing loss at step {first_diff}; mean |diff| over the last 20% "
          f"{mean_diff:.4f}, batch noise {noise:.4f}: {'within' if tracks else 'NOT within'} "
          f"{TRACK_BOUND} x noise")
    print(f"  exported checkpoint: validation loss {val_loss:.3f}; sample: {sample!r}")
    print(f"  plot:       {png}")
    print(f"  checkpoint: {st} (fp32 master params, safetensors, by {exporter})")
    with ckpt.open(os.path.join(out, "interrupted.img")) as dev:
        print(f"  device:     {os.path.join(out, 'interrupted.img')} (committed step {dev.committed_step}; "
              f"`ckptctl info` shows it)")
    print(f"  summary:    {os.path.join(out, 'summary.json')}")
    ok = identical and redone_identical and tracks
    if not ok:
        print("demo: FAILED a check", file=sys.stderr)
    return 0 if ok else 1


def export(dev, st):
    """The device's fp32 masters as safetensors: `ckptctl export` (next to the ckpt
    package in the build tree), else ckpt.torch.export_safetensors (same tensors)."""
    import ckpt.torch
    tool = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(ckpt.__file__)))),
                        "tools", "ckptctl")
    if os.access(tool, os.X_OK):
        p = subprocess.run([tool, "export", dev, "--to", st], capture_output=True, text=True)
        if p.returncode == 0:
            return f"ckptctl export {os.path.basename(dev)} --to {os.path.basename(st)}"
        print(f"  (ckptctl export failed: {p.stderr.strip()}; using the Python exporter)")
    ckpt.torch.export_safetensors(dev, st, what="master")
    return "ckpt.torch.export_safetensors"


def generate(model, vocab, cfg, prompt, n):
    import numpy as np
    import torch
    lut = {int(v): i for i, v in enumerate(vocab)}
    ids = [lut.get(ch, 0) for ch in prompt]
    g = torch.Generator().manual_seed(SEED)
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        for _ in range(n):
            x = torch.tensor([ids[-cfg["ctx"]:]])
            p = torch.softmax(model(x)[0, -1].float() / 0.8, -1)
            ids.append(int(torch.multinomial(p, 1, generator=g)))
    return bytes(np.asarray(vocab)[ids].tolist()).decode("utf-8", "replace")


def plot(png, steps, a, b, c, s, cfg):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    k = max(5, len(steps) // 40)
    fig, (ax, ax2) = plt.subplots(2, 1, figsize=(10, 7.5), sharex=True,
                                  gridspec_kw={"height_ratios": [3, 1.3]})
    ax.plot(steps, c, color="tab:gray", lw=0.6, alpha=0.35)
    ax.plot(steps, b, color="tab:blue", lw=0.6, alpha=0.35)
    ax.plot(steps, smooth(c, k), color="tab:gray", lw=2.2,
            label="torch.optim.AdamW (fp32 masters, bf16 params), reference")
    ax.plot(steps, smooth(b, k), color="tab:blue", lw=1.6, label="OffloadAdamW, uninterrupted")
    ax.plot(steps, smooth(a, k), color="tab:red", lw=1.0, ls="--",
            label=f"OffloadAdamW, SIGKILLed and resumed from committed step {s['resumed_from_step']} "
                  f"(bit-identical to uninterrupted: {s['resumed_identical_to_uninterrupted']})")
    ax.axvline(s["resumed_from_step"], color="tab:red", lw=0.8, ls=":")
    ax.text(s["resumed_from_step"], 0.5, " SIGKILL / resume", color="tab:red", fontsize=8,
            transform=ax.get_xaxis_transform())
    ax.set_ylabel(f"training loss (nats/char; moving average of {k} steps, raw faint)")
    ax.legend(loc="upper right", fontsize=8)
    ax.set_title(f"dm-ckpt demo: char-level GPT, {s['n_params'] / 1e6:.1f} M params, bf16 device "
                 f"(userspace engine), {len(steps)} steps\n"
                 f"vs torch: mean |loss diff| over the last 20% = {s['mean_abs_diff_vs_torch_last_20pct']:.4f} "
                 f"(batch noise {s['loss_noise_last_20pct']:.4f}, bound {s['track_bound']} x noise: "
                 f"{'within' if s['tracks_torch'] else 'NOT within'})", fontsize=10)
    ax2.plot(steps, b - c, color="tab:blue", lw=0.7, label="uninterrupted - torch")
    ax2.plot(steps, a - b, color="tab:red", lw=1.2, label="interrupted+resumed - uninterrupted")
    ax2.axhline(0, color="black", lw=0.5)
    ax2.set_xlabel("step")
    ax2.set_ylabel("loss difference")
    ax2.legend(loc="upper left", fontsize=8)
    fig.tight_layout()
    fig.savefig(png, dpi=110)
    plt.close(fig)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=None)
    ap.add_argument("--size", choices=sorted(SIZES), default=os.environ.get("DEMO_SIZE", "full"))
    ap.add_argument("--out", default=os.environ.get("DEMO_OUT", os.path.join(ROOT, "out", "demo")))
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--run", choices=RUNS, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.steps is None:
        args.steps = int(os.environ.get("DEMO_STEPS", DEFAULT_STEPS[args.size]))
    if args.steps < 10:
        ap.error("--steps: at least 10")
    if args.worker:
        worker(args)
        return 0
    return driver(args)


if __name__ == "__main__":
    sys.exit(main())
