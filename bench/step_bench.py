#!/usr/bin/python3
# SPDX-License-Identifier: MIT
"""OffloadAdamW's exposed step time over torch.optim.AdamW's step in RAM.

    bench/step_bench.py --before /work/main/build/python --after build/python

For each model (params, tensors) and each libckpt build (--before, --after),
in interleaved repetitions (before, after, before, after, ...), a child
process times, over --steps steps after one warm-up step:
  - torch: torch.optim.AdamW (its default, foreach) on fp32 params in RAM, its
    step(), on BENCH_THREADS threads (default 1: on 2 shared cores more threads
    only add variance);
  - offload: OffloadAdamW on bf16 params, the device a file on --dir
    (/dev/shm), the time from the end of backward to the end of step(): what
    the trainer waits for (with hooks, the gradient writes run in backward).
The backward is a real one (loss = sum(p * c)), so hooks fire as in training.
Prints the median ratio offload / torch per model and build, with the spread
(min-max over repetitions), what the last step moved through the device
(OffloadAdamW.last_step_bytes: gradient and param bytes per param, control
bytes, status-page reads), and one JSON line.
"""

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

from benchkit import bytes_line

CHILD = r"""
import os, sys, time, json, warnings
import torch
torch.set_num_threads(int(os.environ.get("BENCH_THREADS", "1")))
import ckpt.torch as ct
params, tensors, steps, path, hooks = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], sys.argv[5]
per = params // tensors
g = torch.Generator().manual_seed(0)

def model(dtype):
    ps = [torch.nn.Parameter((torch.randn(per, generator=g) * 0.02).to(dtype)) for _ in range(tensors)]
    cs = [torch.randn(per, generator=g).to(dtype) for _ in range(tensors)]
    return ps, cs

def backward(ps, cs):
    loss = sum((p * c).sum() for p, c in zip(ps, cs))
    loss.backward()

out = {}
ps, cs = model(torch.float32)
opt = torch.optim.AdamW(ps, lr=1e-4)
ts = []
for i in range(steps + 1):
    backward(ps, cs)
    t0 = time.perf_counter(); opt.step(); ts.append(time.perf_counter() - t0)
    opt.zero_grad(set_to_none=False)
out["torch"] = sorted(ts[1:])[len(ts[1:]) // 2]
del ps, cs, opt

ps, cs = model(torch.bfloat16)
kw = {} if hooks == "default" else {"hooks": hooks == "on"}
with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    opt = ct.OffloadAdamW([(f"t{i}", p) for i, p in enumerate(ps)], path, lr=1e-4, **kw)
ts, bw = [], []
for i in range(steps + 1):
    t0 = time.perf_counter()
    backward(ps, cs)
    t1 = time.perf_counter(); opt.step(); t2 = time.perf_counter()
    ts.append(t2 - t1); bw.append(t1 - t0)
    opt.zero_grad(set_to_none=False)
out["offload"] = sorted(ts[1:])[len(ts[1:]) // 2]
out["offload_backward"] = sorted(bw[1:])[len(bw[1:]) // 2]
out["hooked"] = bool(getattr(opt, "last_step_hooked", False))
out["bytes"] = dict(getattr(opt, "last_step_bytes", None) or {})
opt.close()
print(json.dumps(out))
"""


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--before", help="PYTHONPATH of the build before (main's build/python)")
    ap.add_argument("--after", required=True, help="PYTHONPATH of the build after (build/python)")
    ap.add_argument("--dir", default="/dev/shm")
    ap.add_argument("--models", default="10e6:48,10e6:2000,50e6:48,50e6:2000",
                    help="params:tensors,... (default %(default)s)")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--steps", type=int, default=5)
    a = ap.parse_args()

    builds = []
    tmp = tempfile.mkdtemp(prefix="ckpt-step-bench-", dir=a.dir)
    try:
        # a copy of each package: a rebuild during the run changes nothing
        for name, src in (("before", a.before), ("after", a.after)):
            if src:
                if not os.path.isfile(os.path.join(src, "ckpt", "__init__.py")):
                    sys.exit(f"{src}: no ckpt package (ckpt/__init__.py) there")
                dst = os.path.join(tmp, name)
                shutil.copytree(src, dst)
                builds.append((name, dst))
        models = [(int(float(p)), int(t)) for p, t in (m.split(":") for m in a.models.split(","))]
        res = {}
        for rep in range(a.reps):
            for params, tensors in models:
                for name, pp in builds:
                    img = os.path.join(tmp, "dev.img")
                    if os.path.exists(img):
                        os.unlink(img)
                    env = dict(os.environ, PYTHONPATH=pp)
                    r = subprocess.run([sys.executable, "-c", CHILD, str(params), str(tensors), str(a.steps),
                                        img, "default"], env=env, capture_output=True, text=True)
                    if r.returncode:
                        sys.exit(f"{name} {params}:{tensors}: child failed:\n{r.stderr}")
                    o = json.loads(r.stdout.strip().splitlines()[-1])
                    o["ratio"] = o["offload"] / o["torch"]
                    res.setdefault((params, tensors, name), []).append(o)
                    print(f"rep {rep} {params / 1e6:.0f}M x {tensors} {name}: torch {o['torch'] * 1e3:.1f} ms, "
                          f"offload step {o['offload'] * 1e3:.1f} ms (backward {o['offload_backward'] * 1e3:.1f} ms, "
                          f"hooked {o['hooked']}), ratio {o['ratio']:.2f}; last step moved "
                          f"{bytes_line(o.get('bytes', {}), params)}", flush=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)

    print(f"\n{'model':>14} {'build':>7} {'torch ms':>9} {'offload ms':>11} {'ratio':>6} {'spread':>12}")
    summary = {}
    for (params, tensors, name), os_ in sorted(res.items()):
        rs = [o["ratio"] for o in os_]
        med = statistics.median(rs)
        print(f"{params / 1e6:>8.0f}M x{tensors:<4} {name:>7} {statistics.median(o['torch'] for o in os_) * 1e3:>9.1f} "
              f"{statistics.median(o['offload'] for o in os_) * 1e3:>11.1f} {med:>6.2f} "
              f"{min(rs):>5.2f}-{max(rs):<5.2f}")
        summary[f"exposed_step_vs_torch_ram_{params // 1_000_000}m_{tensors}t_{name}"] = round(med, 3)
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
