#!/usr/bin/python3
# SPDX-License-Identifier: MIT
"""8-bit optimizer states against the 8-bit AdamWs users run, on a real run.

    make bench-q8                         (torch 2's venv; hours on 2 cores)
    bench/q8_quality.py --size tiny --steps 20 --seeds 1     (a smoke run)

The demo's character LM (demo/train.py: its corpus, model, param groups, lr
schedule, betas, clipping at 1.0, bf16 autocast where the CPU has native bf16,
--autocast), trained from the same init
and on the same batches by each optimizer, for --steps steps and each of
--seeds seeds (the seed draws the init and the batches). Optimizers:
  torch-fp32          torch.optim.AdamW on fp32 masters (the model holds their
                      bf16 rounding, as the demo's reference): the quality bar
  bnb-8bit            bitsandbytes' AdamW8bit on the same fp32 masters
  torchao-8bit        torchao's AdamW8bit on the same fp32 masters
  offload-fp32, offload-8bit, offload-8bit-bf16m
                      OffloadAdamW on a bf16 device (fp32 moments; 8-bit
                      moments; 8-bit moments and bf16 masters)
Each run ends with the loss on 32 fixed held-out batches (the corpus' last
10%; the primary measure), the same over the tokens whose character occurs
in the training part ("seen": a character that never does is the output
layer's row that only ever gets the gradient pushing its logit down, and its
loss measures how far an optimizer pushed it, not what it learned), and the
mean training loss of the last 5% of the steps. Printed per optimizer and
measure: the mean over the seeds and its spread, and the targets: the
device's 8-bit states against the best 8-bit anchor, as a difference over
the batch noise (the standard deviation over seeds of the reference's, the
spread two equally good runs show): within noise when at most 1. The last
line is one JSON object.
"""

import argparse
import json
import math
import os
import statistics
import sys
import tempfile
import time
import warnings

BENCH = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(BENCH)
sys.path.insert(0, os.path.join(ROOT, "demo"))

OPTIMIZERS = ["torch-fp32", "bnb-8bit", "torchao-8bit", "offload-fp32", "offload-8bit", "offload-8bit-bf16m"]
ANCHORS_8BIT = ["bnb-8bit", "torchao-8bit"]
OURS_8BIT = ["offload-8bit", "offload-8bit-bf16m"]
OFFLOAD = {"offload-fp32": ("fp32", "fp32"), "offload-8bit": ("8bit", "fp32"),
           "offload-8bit-bf16m": ("8bit", "bf16")}
EVAL_BATCHES = 32
# what each run ends with: (its title in the table, its key in the JSON, the suffix of its target keys)
METRICS = {"held_out": ("held-out loss", "held_out_loss", ""),
           "held_out_seen": ("held-out loss seen", "held_out_loss_seen", "_seen"),
           "train": ("train loss final", "train_loss_final", "_train")}


def run(name, size, steps, seed, tmp, autocast):
    """One training run; returns ({metric: loss}, seconds per step)."""
    import numpy as np
    import torch
    import torch.nn.functional as F
    import train as demo

    torch.set_num_threads(1)
    cfg = demo.SIZES[size]
    ids, vocab = demo.encode(demo.corpus())
    n_val = len(ids) // 10
    train, val = torch.from_numpy(ids[:-n_val]), torch.from_numpy(ids[-n_val:])
    torch.manual_seed(seed)
    model = demo.build_model(cfg, len(vocab))
    groups = demo.param_groups(model)
    lr_at = demo.lr_lambda(steps)
    B, T = cfg["batch"], cfg["ctx"]

    if name in OFFLOAD:
        import ckpt.torch
        state, master = OFFLOAD[name]
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")     # the fp32 model's PrecisionWarning
            opt = ckpt.torch.OffloadAdamW(groups, os.path.join(tmp, f"{name}-{seed}.img"), lr=cfg["lr"],
                                          betas=demo.BETAS, eps=1e-8, dtype="bf16", state=state, master=master)
        pairs = None
    else:
        masters = {n: p.detach().clone() for g in groups for n, p in g["params"]}
        mgroups = [{"params": [masters[n] for n, _ in g["params"]], "weight_decay": g["weight_decay"]}
                   for g in groups]
        kw = dict(lr=cfg["lr"], betas=demo.BETAS, eps=1e-8)
        if name == "torch-fp32":
            opt = torch.optim.AdamW(mgroups, foreach=False, **kw)
        elif name == "bnb-8bit":
            import bitsandbytes as bnb
            opt = bnb.optim.AdamW8bit(mgroups, **kw)
        elif name == "torchao-8bit":
            from torchao.optim import AdamW8bit
            opt = AdamW8bit(mgroups, **kw)
        pairs = [(masters[n], p) for g in groups for n, p in g["params"]]
        with torch.no_grad():
            for m, p in pairs:
                p.copy_(m.to(torch.bfloat16))

    def set_lr(v):
        for g in opt.param_groups:      # torchao keeps lr as a tensor
            if torch.is_tensor(g["lr"]):
                g["lr"].fill_(v)
            else:
                g["lr"] = v

    def loss_of(idx, reduction="mean"):
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            logits = model(idx[:, :-1])
        return F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), idx[:, 1:].reshape(-1),
                               reduction=reduction)

    rng = np.random.default_rng(seed)
    model.train()
    t0 = time.perf_counter()
    tail = []       # the training loss of the last 5% of the steps
    for t in range(1, steps + 1):
        offs = rng.integers(0, len(train) - T - 1, size=B)
        torch.manual_seed(int(rng.integers(0, 2 ** 62)))
        loss = loss_of(torch.stack([train[o:o + T + 1] for o in offs.tolist()]))
        loss.backward()
        if t > steps - max(1, steps // 20):
            tail.append(float(loss))
        set_lr(cfg["lr"] * lr_at(t - 1))
        if pairs is None:
            opt.clip_grad_norm_(demo.CLIP)
            opt.step()
            if opt.last_result != "committed":
                raise SystemExit(f"q8_quality: {name} step {t}: {opt.last_result}")
        else:
            for m, p in pairs:
                m.grad = p.grad.to(torch.bfloat16).to(torch.float32)
            torch.nn.utils.clip_grad_norm_([m for m, _ in pairs], demo.CLIP)
            opt.step()
            with torch.no_grad():
                for m, p in pairs:
                    p.copy_(m.to(torch.bfloat16))
        opt.zero_grad(set_to_none=True)
        model.zero_grad(set_to_none=True)
    per_step = (time.perf_counter() - t0) / steps
    if pairs is None:
        opt.close()
    model.eval()
    erng = np.random.default_rng(0)     # the same held-out batches for every run
    seen = torch.bincount(train, minlength=len(vocab)) > 0
    with torch.no_grad():
        idx = [torch.stack([val[o:o + T + 1] for o in erng.integers(0, len(val) - T - 1, size=B).tolist()])
               for _ in range(EVAL_BATCHES)]
        tok = torch.cat([loss_of(i, "none") for i in idx])
        known = seen[torch.cat([i[:, 1:].reshape(-1) for i in idx])]
    return {"held_out": float(tok.mean()), "held_out_seen": float(tok[known].mean()),
            "train": sum(tail) / len(tail)}, per_step


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--size", default="full", help="the demo's model size (full, tiny)")
    ap.add_argument("--steps", type=int, default=2000)
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--optimizers", default=",".join(OPTIMIZERS), help="of " + ", ".join(OPTIMIZERS))
    ap.add_argument("--dir", default="/dev/shm", help="where the devices' images go")
    ap.add_argument("--autocast", choices=("bf16", "none", "auto"), default="auto",
                    help="the demo's bf16 autocast, or fp32; auto: bf16 where the CPU multiplies "
                         "bf16 natively (AVX512-BF16, AMX)")
    a = ap.parse_args()
    if a.autocast == "auto":
        with open("/proc/cpuinfo") as f:
            flags = f.read()
        a.autocast = "bf16" if " avx512_bf16" in flags or " amx_bf16" in flags else "none"
    names = a.optimizers.split(",")
    bad = [n for n in names if n not in OPTIMIZERS]
    if bad:
        sys.exit(f"q8_quality: unknown optimizer {', '.join(bad)}")
    res = {n: [] for n in names}
    print(f"q8_quality: the demo's {a.size} model, {a.steps} steps, {a.seeds} seeds, autocast {a.autocast}",
          flush=True)
    with tempfile.TemporaryDirectory(prefix="ckpt-q8-", dir=a.dir) as tmp:
        for seed in range(1, a.seeds + 1):      # interleaved: every optimizer on a seed, then the next
            for n in names:
                loss, per_step = run(n, a.size, a.steps, 1000 + seed, tmp, a.autocast == "bf16")
                res[n].append(loss)
                print(f"seed {seed} {n:<20} held-out loss {loss['held_out']:.4f}, on seen characters "
                      f"{loss['held_out_seen']:.4f}, training {loss['train']:.4f}  ({per_step * 1e3:.1f} ms/step)",
                      flush=True)
    out = {}
    anchors = [n for n in ANCHORS_8BIT if n in res]
    ours = [n for n in OURS_8BIT if n in res]
    for metric, (title, json_key, suffix) in METRICS.items():
        print(f"\n{'optimizer':<20} {title:>28} {'min..max':>18}")
        for n, v in res.items():
            v = [r[metric] for r in v]
            print(f"{n:<20} {statistics.mean(v):28.4f} {min(v):8.4f}..{max(v):.4f}")
        mean = {n: round(statistics.mean(r[metric] for r in v), 5) for n, v in res.items()}
        out[json_key] = mean
        noise = None
        if "torch-fp32" in res and len(res["torch-fp32"]) > 1:
            noise = out["batch_noise" + suffix] = round(statistics.stdev(r[metric] for r in res["torch-fp32"]), 5)
        if anchors and ours:
            best_anchor = min(anchors, key=lambda n: mean[n])
            for n in ours:
                delta = mean[n] - mean[best_anchor]
                key = "q8_final_loss_vs_best_8bit_anchor" + ("" if n == "offload-8bit" else "_bf16_master") + suffix
                out[key] = round(delta, 5)
                if noise is not None:
                    ratio = delta / noise if noise else math.inf
                    out[key + "_in_noise"] = round(ratio, 3)
                    print(f"  {key:<55} {delta:+.4f} over {best_anchor} = {ratio:+.2f} x batch noise "
                          f"({'met' if ratio <= 1 else 'missed'}: within noise at <= 1)")
    print(json.dumps(out))


if __name__ == "__main__":
    main()
