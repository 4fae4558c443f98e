#!/usr/bin/python3
# SPDX-License-Identifier: MIT
"""End to end: a training step with OffloadAdamW against torch's AdamW in RAM and
against a ZeRO-Infinity-style swap of the fp32 state, on /dev/shm and on a disk.

    make bench-e2e                      (after make all)
    bench/e2e_bench.py --quick          (a smoke run of a minute or two)

Models: the demo's GPT (demo/train.py, random tokens, vocabulary 256, context
64) at about 10M, 50M and 200M params, and a deep narrow GPT of 2000 tensors
(33M params); and optimizer-bound, gpt50m on one sequence of 8 tokens, so
that the step dominates the iteration, with fp32 params ("gpt50m-ob") and the
whole model in bf16 ("gpt50m-ob-bf16": torch's AdamW then keeps bf16 state),
against the RAM contenders and the device's on /dev/shm only. Elsewhere the
model's params are fp32 for every contender, so forward and
backward are the same computation for all; a training step is forward +
backward + optimizer step + zero_grad, on BENCH_THREADS torch threads
(default 1), under bf16 autocast where the CPU multiplies bf16 natively, in
fp32 elsewhere (--autocast). Contenders:
  ram-*       torch.optim.AdamW in RAM, fused=True ("fused", torch 2's CPU
              kernel), foreach=True ("foreach") and foreach=False ("loop"),
              each with glibc malloc tuned for large tensors (no mmap, no
              trim) and with jemalloc (LD_PRELOAD); the fastest median step
              per model is the RAM baseline.
  bnb-8bit, torchao-8bit
              bitsandbytes' AdamW8bit and torchao's AdamW8bit in RAM (their
              CPU paths), for their step time; their quality against the
              device's 8-bit states is bench/q8_quality.py's.
  zero-inf    DeepSpeed's ZeRO-Infinity (ZeRO stage 3, the optimizer state
              offloaded to NVMe through its async I/O, its CPU Adam) on one
              rank of its CPU accelerator, on the disk only (O_DIRECT); as
              swap, "zero-inf ckpt/1" saves DeepSpeed's checkpoint (a copy of
              the swapped state, fsync'd) every step, "ckpt/10" every tenth.
  swap        the fp32 master, exp_avg and exp_avg_sq in a file on the device
              (O_DIRECT where the file system has it, as the engine), in
              groups of --swap-group params: a thread reads the next groups
              while torch's AdamW (torch.optim._functional.adamw) updates
              this one and the new params go to the model; another writes
              the group back behind. Checkpointed: the same step also writes
              the new state to a second file, fdatasync'd at the end of the
              step. A process alternates both steps;
              "swap ckpt/1" is the checkpointing step, "swap ckpt/10" nine
              plain steps and one checkpointing step, averaged.
  offload-*   OffloadAdamW on a bf16 device file in the same directory:
              fp32 or 8-bit moments ("8bit"), bf16 masters ("bf16m"), with
              gradient hooks (the default) or without ("nohooks"); "clip"
              and "devclip" clip every step (torch's clip_grad_norm_ on
              p.grad, opt.clip_grad_norm_): a clipped step against an
              unclipped one (clipped_step_vs_unclipped*).
Swap and offload children run with --alloc's allocator (default glibc, tuned
as for the RAM ones: on Debian's torch its forward and backward are faster).

Each configuration runs in a fresh child process; repetitions are
interleaved (rep 0 of every configuration, then rep 1, ...); every figure is
a median over repetitions of the child's median step, with min..max. Printed:
the table (forward+backward, the exposed step = end of backward to end of
step(), the whole step), the targets with their measured values, and as the
last line one JSON object. A PNG of the table goes to --png.
"""

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

BENCH = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(BENCH)
sys.path.insert(0, BENCH)
from benchkit import fmt_spread, spread  # noqa: E402

VOCAB, CTX = 256, 64
# name: demo GPT config (layers, width, heads); the tiny ones are for --quick and the smoke test
MODELS = {
    "gpt10m": dict(n_layer=6, d_model=384, n_head=6),
    "gpt50m": dict(n_layer=10, d_model=640, n_head=10),
    "gpt200m": dict(n_layer=16, d_model=1024, n_head=16),
    "gpt2000t": dict(n_layer=166, d_model=128, n_head=4),      # 1997 tensors
    "tiny": dict(n_layer=2, d_model=64, n_head=4),
    "small": dict(n_layer=2, d_model=192, n_head=4),         # enough state for DeepSpeed to swap it
    "tiny2000t": dict(n_layer=166, d_model=16, n_head=2),
}
# Optimizer-bound runs: gpt50m on one sequence of 8 tokens, so that the step,
# not forward and backward, takes most of the iteration; with fp32 params (the
# device bf16) and with the whole model in bf16 (torch's AdamW then keeps bf16
# state; no autocast). Only the RAM contenders and the device's on /dev/shm.
OPT_BOUND = {  # name: (model, batch, tokens, param dtype)
    "gpt50m-ob": ("gpt50m", 1, 8, "fp32"),
    "gpt50m-ob-bf16": ("gpt50m", 1, 8, "bf16"),
    "tiny-ob-bf16": ("tiny", 1, 8, "bf16"),
}
OPT_BOUND_CONTENDERS = ["offload-fp32", "offload-8bit", "offload-8bit-bf16m"]
ALL_MODELS = list(MODELS) + list(OPT_BOUND)
RAM = ["ram-fused-glibc", "ram-foreach-glibc", "ram-loop-glibc",
       "ram-fused-jemalloc", "ram-foreach-jemalloc", "ram-loop-jemalloc"]
# 8-bit AdamW in RAM (step time; their quality: bench/q8_quality.py): not RAM baselines
Q8_ANCHORS = ["bnb-8bit", "torchao-8bit"]
OFFLOAD = {  # name: (state, master, hooks, clip)
    "offload-fp32": ("fp32", "fp32", True, None),
    "offload-fp32-nohooks": ("fp32", "fp32", False, None),
    "offload-fp32-clip": ("fp32", "fp32", True, "torch"),
    "offload-fp32-devclip": ("fp32", "fp32", True, "device"),
    "offload-8bit": ("8bit", "fp32", True, None),
    "offload-8bit-nohooks": ("8bit", "fp32", False, None),
    "offload-8bit-bf16m": ("8bit", "bf16", True, None),
}
# max_norm of the clipping contenders: every step clips (an LLM's 1.0 clips most
# early steps); "torch": torch.nn.utils.clip_grad_norm_ on p.grad in place, as
# Accelerate, the Trainer and DeepSpeed clip; "device": opt.clip_grad_norm_, the
# coefficient folded into the device's grad_scale
CLIP_NORM = 1e-3
CONTENDERS = RAM + Q8_ANCHORS + ["zero-inf", "swap"] + list(OFFLOAD)
IN_RAM = RAM + Q8_ANCHORS
ON_DISK_ONLY = ["zero-inf"]     # DeepSpeed's async I/O opens its swap files O_DIRECT: not on tmpfs
# every rep's child alternates a plain step and a checkpointing one: its rows
SPLIT = {"swap": ("swap ckpt/1", "swap ckpt/10"), "zero-inf": ("zero-inf ckpt/1", "zero-inf ckpt/10")}
JEMALLOC = "/usr/lib/x86_64-linux-gnu/libjemalloc.so.2"
ALLOC_ENV = {
    # glibc: large tensors from the heap (no mmap per tensor), never trimmed
    "glibc": {"MALLOC_MMAP_MAX_": "0", "MALLOC_TRIM_THRESHOLD_": str(1 << 40), "MALLOC_TOP_PAD_": str(1 << 28)},
    # jemalloc as perf-notes measured it: no oversize arena, never decays
    "jemalloc": {"LD_PRELOAD": JEMALLOC, "MALLOC_CONF": "oversize_threshold:0,dirty_decay_ms:-1,muzzy_decay_ms:-1"},
}
LR, WD = 1e-4, 0.01
TARGETS = {  # key: (target, higher is better)
    "exposed_step_vs_torch_ram_50m": (0.5, False),
    "speedup_vs_swap_ckpt_every_step_disk": (1.8, True),
    "speedup_vs_swap_ckpt_every_10_disk": (1.3, True),
    "engine_fraction_of_device_shm": (0.9, True),
    "engine_fraction_of_device_disk": (0.9, True),
    "iteration_vs_torch2_ram_50m_shm": (1.1, False),
    "speedup_vs_zero_inf_ckpt_every_step_disk": (2.5, True),
    "speedup_vs_zero_inf_ckpt_every_10_disk": (1.5, True),
    "host_bytes_per_param_vs_deepspeed": (0.5, False),
    "clipped_step_vs_unclipped": (1.1, False),
    "clipped_step_vs_unclipped_device_clip": (1.1, False),
    "iteration_vs_torch2_ram_optimizer_bound": (1.15, False),
    "iteration_vs_torch2_ram_optimizer_bound_bf16_model": (1.15, False),
}


# ---------------------------------------------------------------- child side

def shape_of(name, batch):
    """(GPT config, sequences, tokens each, param dtype) of a model name."""
    base, batch, tokens, dtype = OPT_BOUND.get(name, (name, batch, CTX, "fp32"))
    return MODELS[base], batch, tokens, dtype


def build_gpt(name):
    import torch
    sys.path.insert(0, os.path.join(ROOT, "demo"))
    import train as demo
    torch.manual_seed(0)
    gpt, _, _, dtype = shape_of(name, 1)
    model = demo.build_model(dict(gpt, ctx=CTX), VOCAB)
    return model.bfloat16() if dtype == "bf16" else model


class SwapAdamW:
    """AdamW over fp32 state kept in a file, as ZeRO-Infinity swaps it: per group
    of params, read p/m/v (one contiguous record), update with torch's AdamW,
    copy the new params into the model, write the record back; reads run ahead
    and writes behind on their own threads. step(ckpt=True) also writes each
    new record to a checkpoint file and fdatasyncs it before returning."""

    def __init__(self, params, path, ckpt_path, group_params):
        import mmap
        import queue
        import threading
        import torch
        self.torch, self.queue, self.threading = torch, queue, threading
        self.params = [p for p in params]
        group_params = max(1024, group_params // 1024 * 1024)
        self.groups = []        # (offset in the file, params, [(param, param offset, group offset, len)])
        pi, poff, off = 0, 0, 0
        while pi < len(self.params):
            pieces, k = [], 0
            while k < group_params and pi < len(self.params):
                p = self.params[pi]
                take = min(p.numel() - poff, group_params - k)
                pieces.append((p, poff, k, take))
                k += take
                poff += take
                if poff == p.numel():
                    pi, poff = pi + 1, 0
            padded = (k + 1023) // 1024 * 1024         # records on 4 KiB boundaries (O_DIRECT)
            self.groups.append((off, padded, pieces))
            off += 12 * padded
        self.fds = [self._open(path), self._open(ckpt_path)]
        slots = 4               # two read ahead, one updated, one written back
        self.slots = []
        for _ in range(slots):
            mm = mmap.mmap(-1, 12 * group_params)
            t = torch.frombuffer(mm, dtype=torch.float32)
            self.slots.append((mm, t))
        self.g = torch.empty(group_params)
        self.steps = [torch.zeros(()) for _ in self.groups]
        # the initial state: the model's params, zero moments, in both files
        for off, padded, pieces in self.groups:
            mm, t = self.slots[0]
            t.zero_()
            for p, po, go, ln in pieces:
                t[go:go + ln].copy_(p.detach().reshape(-1)[po:po + ln])
            for fd in self.fds:
                os.pwritev(fd, [memoryview(mm)[:12 * padded]], off)
        for fd in self.fds:
            os.fdatasync(fd)

    @staticmethod
    def _open(path):
        flags = os.O_RDWR | os.O_CREAT | os.O_TRUNC
        try:
            return os.open(path, flags | os.O_DIRECT, 0o600)
        except OSError:         # tmpfs: no O_DIRECT (the engine falls back the same way)
            return os.open(path, flags, 0o600)

    def close(self):
        for fd in self.fds:
            os.close(fd)

    def _reader(self, free, ready):
        for k, (off, padded, _) in enumerate(self.groups):
            s = free.get()
            mm, _ = self.slots[s]
            got = os.preadv(self.fds[0], [memoryview(mm)[:12 * padded]], off)
            assert got == 12 * padded, got
            ready.put((k, s))

    def _writer(self, fd, todo, done, sync, errors):
        """Writes each group of todo to fd, then passes it to done; fdatasync at the end if sync."""
        try:
            while True:
                item = todo.get()
                if item is None:
                    break
                k, s = item
                off, padded, _ = self.groups[k]
                assert os.pwritev(fd, [memoryview(self.slots[s][0])[:12 * padded]], off) == 12 * padded
                done.put(item)
            if sync:
                os.fdatasync(fd)
        except BaseException as e:      # noqa: BLE001 - reported by step()
            errors.append(e)
        finally:
            done.put(None)

    def step(self, ckpt=False):
        """One step; ckpt=True: the checkpoint file is written by a second writer
        thread behind the first (each record once to each file), then fdatasync'd."""
        torch, F, Queue = self.torch, self.torch.optim._functional, self.queue.Queue
        free, ready, written, errors = Queue(), Queue(), Queue(), []
        for s in range(len(self.slots)):
            free.put(s)
        chain = [written, Queue()] + ([Queue()] if ckpt else [])   # the last one's groups are done
        threads = [self.threading.Thread(target=self._reader, args=(free, ready))]
        threads += [self.threading.Thread(target=self._writer, args=(self.fds[i], chain[i], chain[i + 1], i == 1,
                                                                     errors)) for i in range(len(chain) - 1)]
        recycle = self.threading.Thread(target=lambda: [free.put(it[1]) for it in iter(chain[-1].get, None)])
        threads.append(recycle)
        for th in threads:
            th.start()
        try:
            for _ in self.groups:
                k, s = ready.get()
                _, padded, pieces = self.groups[k]
                t = self.slots[s][1]
                p, m, v, g = t[:padded], t[padded:2 * padded], t[2 * padded:3 * padded], self.g[:padded]
                for prm, po, go, ln in pieces:
                    g[go:go + ln].copy_(prm.grad.reshape(-1)[po:po + ln])
                with torch.no_grad():
                    F.adamw([p], [g], [m], [v], [], [self.steps[k]], foreach=False, amsgrad=False,
                            beta1=0.9, beta2=0.999, lr=LR, weight_decay=WD, eps=1e-8, maximize=False)
                    for prm, po, go, ln in pieces:
                        prm.view(-1)[po:po + ln].copy_(p[go:go + ln])
                written.put((k, s))
        finally:
            written.put(None)
            for th in threads:
                th.join()
        if errors:
            raise errors[0]

    def zero_grad(self, set_to_none=False):
        for p in self.params:
            if p.grad is not None:
                p.grad.zero_()


class ZeroInfinity:
    """DeepSpeed's own ZeRO-Infinity on one rank: ZeRO stage 3 with the optimizer
    state (fp32 masters, exp_avg, exp_avg_sq) offloaded to NVMe at path, swapped
    by DeepSpeed's async I/O (libaio, O_DIRECT) around its CPU Adam (DeepSpeedCPUAdam,
    AVX2/AVX-512), on DeepSpeed's CPU accelerator over gloo; fp32 params, as the
    other contenders. step(ckpt=True) also saves DeepSpeed's checkpoint (which
    copies the swapped state), made durable (every file fsync'd) before it returns:
    DeepSpeed's save does not sync, the other contenders' checkpoints do. The
    ops come built from scripts/venv.sh (TORCH_EXTENSIONS_DIR)."""

    def __init__(self, model, path, ckpt_dir):
        os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1",
                          MASTER_PORT=str(29500 + os.getpid() % 1000))
        os.environ.setdefault("TORCH_EXTENSIONS_DIR", subprocess.run(
            [os.path.join(ROOT, "scripts", "venv.sh"), "--ops"], capture_output=True, text=True,
            check=True).stdout.strip())
        import logging
        import deepspeed
        deepspeed.utils.logger.setLevel(logging.WARNING)
        deepspeed.init_distributed(dist_backend="gloo")
        swap = os.path.join(path, "swap")
        os.makedirs(swap)
        conf = {"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 1,
                "optimizer": {"type": "AdamW", "params": {"lr": LR, "weight_decay": WD}},
                "zero_optimization": {"stage": 3, "offload_optimizer": {
                    "device": "nvme", "nvme_path": swap, "pin_memory": False, "buffer_count": 4,
                    "fast_init": False}},
                "aio": {"block_size": 1 << 20, "queue_depth": 8, "thread_count": 1,
                        "single_submit": False, "overlap_events": True}}
        self.engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(),
                                                    config=conf)
        self.ckpt_dir, self.saved = ckpt_dir, 0

    def backward(self, loss):
        self.engine.backward(loss)

    def drop_old_checkpoint(self):
        """Outside the timed step: the checkpoint before the last one goes."""
        shutil.rmtree(os.path.join(self.ckpt_dir, f"t{self.saved - 2}"), ignore_errors=True)

    def step(self, ckpt=False):
        self.engine.step()
        if ckpt:
            tag = f"t{self.saved}"
            self.saved += 1
            self.engine.save_checkpoint(self.ckpt_dir, tag=tag)
            for d, _, files in os.walk(os.path.join(self.ckpt_dir, tag)):
                for f in files:
                    fd = os.open(os.path.join(d, f), os.O_RDONLY)
                    os.fsync(fd)
                    os.close(fd)
            for d in (os.path.join(self.ckpt_dir, tag), self.ckpt_dir):
                fd = os.open(d, os.O_RDONLY)
                os.fsync(fd)
                os.close(fd)

    def zero_grad(self, set_to_none=False):
        self.engine.zero_grad()


def rss():
    """This process's resident memory now, in bytes."""
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmRSS:"))


def proc_io():
    """This process's bytes through the block layer (all its threads)."""
    with open("/proc/self/io") as f:
        d = dict(line.split(": ") for line in f.read().splitlines())
    return int(d["read_bytes"]), int(d["write_bytes"])


def child(cfg):
    """One configuration: cfg = {model, contender, dir, steps, batch, swap_group};
    prints one JSON line of per-step medians (seconds) and byte counts."""
    import warnings
    import torch
    import torch.nn.functional as F
    torch.set_num_threads(int(os.environ.get("BENCH_THREADS", "1")))
    model = build_gpt(cfg["model"])
    _, batch, tokens, dtype = shape_of(cfg["model"], cfg["batch"])
    params = sum(p.numel() for p in model.parameters())
    gen = torch.Generator().manual_seed(1)
    # the model and its gradients: what every contender holds before its optimizer
    x = torch.randint(0, VOCAB, (batch, tokens), generator=torch.Generator().manual_seed(0))
    autocast = cfg.get("autocast", "bf16") == "bf16" and dtype == "fp32"
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        F.cross_entropy(model(x).view(-1, VOCAB).float(), x.view(-1)).backward()
    model.zero_grad(set_to_none=False)
    base_rss = rss()
    c = cfg["contender"]
    paths = [os.path.join(cfg["dir"], f"{c}.{n}") for n in ("img", "ckpt")] if cfg["dir"] else []
    out = {"params": params, "tensors": len(list(model.parameters()))}
    clip = None
    fwd = model
    try:
        if c.startswith("ram-"):
            kind = c.split("-")[1]
            fused = {"fused": True} if kind == "fused" else {}     # torch 1.13's AdamW has none
            opt = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=WD, foreach=kind == "foreach",
                                    **fused)
            kinds = ["step"]
        elif c == "bnb-8bit":
            import bitsandbytes as bnb
            opt = bnb.optim.AdamW8bit(model.parameters(), lr=LR, weight_decay=WD)
            kinds = ["step"]
        elif c == "torchao-8bit":
            from torchao.optim import AdamW8bit
            opt = AdamW8bit(model.parameters(), lr=LR, weight_decay=WD)
            kinds = ["step"]
        elif c == "zero-inf":
            os.makedirs(paths[1])
            opt = ZeroInfinity(model, paths[1], os.path.join(paths[1], "checkpoints"))
            fwd = opt.engine
            kinds = ["step", "ckpt"]
        elif c == "swap":
            opt = SwapAdamW(model.parameters(), paths[0], paths[1], cfg["swap_group"])
            kinds = ["step", "ckpt"]
        else:
            import ckpt.torch as ct
            state, master, hooks, clip = OFFLOAD[c]
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")     # the fp32 model's PrecisionWarning
                opt = ct.OffloadAdamW(model.named_parameters(), paths[0], lr=LR, weight_decay=WD, dtype="bf16",
                                      state=state, master=master, hooks=hooks)
            kinds = ["step"]
        times = {k: {"fb": [], "exposed": [], "iter": []} for k in kinds}
        io = {}
        for i in range(cfg["steps"] + 1):
            for kind in kinds:      # a warm-up step of each kind, then the timed ones, alternating
                x = torch.randint(0, VOCAB, (batch, tokens), generator=gen)
                y = torch.randint(0, VOCAB, (batch, tokens), generator=gen)
                if hasattr(opt, "drop_old_checkpoint"):
                    opt.drop_old_checkpoint()
                io0 = proc_io()
                t0 = time.perf_counter()
                with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
                    loss = F.cross_entropy(fwd(x).view(-1, VOCAB).float(), y.view(-1))
                if hasattr(opt, "backward"):
                    opt.backward(loss)
                else:
                    loss.backward()
                t1 = time.perf_counter()
                if clip == "torch":
                    torch.nn.utils.clip_grad_norm_(model.parameters(), CLIP_NORM)
                elif clip == "device":
                    opt.clip_grad_norm_(CLIP_NORM)
                if kind == "ckpt":
                    opt.step(ckpt=True)
                else:
                    opt.step()
                t2 = time.perf_counter()
                opt.zero_grad(set_to_none=False)
                t3 = time.perf_counter()
                io[kind] = [b - a for a, b in zip(io0, proc_io())]
                if i:
                    for key, v in (("fb", t1 - t0), ("exposed", t2 - t1), ("iter", t3 - t0)):
                        times[kind][key].append(v)
        for kind, t in times.items():
            for key, v in t.items():
                out[f"{kind}_{key}"] = spread(v)[0]
            out[f"{kind}_io_read"], out[f"{kind}_io_write"] = io[kind]
        import resource
        # the optimizer's resident memory beyond the model and its gradients, at its peak
        out["host_bytes"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - base_rss
        if hasattr(opt, "last_step_bytes"):
            out["bytes"] = dict(opt.last_step_bytes or {})
            out["hooked"] = bool(opt.last_step_hooked)
            out["mode"] = getattr(opt, "last_step_mode", None)     # (builds before it: --before runs)
        if hasattr(opt, "close"):
            opt.close()
    finally:
        for p in paths:
            if os.path.isdir(p):
                shutil.rmtree(p, ignore_errors=True)
            elif os.path.exists(p):
                os.unlink(p)
    print(json.dumps(out))


# ---------------------------------------------------------------- parent side

def run_micro(build, dirs, quick):
    """The update loop against the memory bound and the engine against fio on
    the same file (as scripts/bench.sh runs them): their JSON lines, merged."""
    res = {}
    cmds = [[os.path.join(build, "bench", "ckpt_bench_update")] + (["22", "3"] if quick else []),
            [os.path.join(build, "bench", "ckpt_bench_engine")] + [f"{k}={d}" for k, d in dirs.items()]
            + (["--params", str(1 << 22), "--rounds", "2"] if quick else [])]
    for cmd in cmds:
        if not os.access(cmd[0], os.X_OK):
            sys.exit(f"e2e_bench: {cmd[0]} is missing: run make all first")
        print("==", " ".join(cmd), flush=True)
        r = subprocess.run(cmd, capture_output=True, text=True)
        print(r.stdout, end="", flush=True)
        if r.returncode:
            sys.exit(f"e2e_bench: {cmd[0]} failed:\n{r.stderr}")
        res.update(json.loads(r.stdout.strip().splitlines()[-1]))
    return res


def configs(models, devices, contenders):
    """Every (model, device, contender) of one repetition, in run order: the RAM
    contenders once per model, the others per device (an optimizer-bound
    model: torch's AdamW in RAM and the device's on /dev/shm only)."""
    out = []
    for m in models:
        out += [(m, "ram", c) for c in contenders if c in IN_RAM and (m not in OPT_BOUND or c in RAM)]
        out += [(m, d, c) for d in devices for c in contenders if c not in IN_RAM
                and (d == "disk" or c not in ON_DISK_ONLY)
                and (m not in OPT_BOUND or (d == "shm" and c in OPT_BOUND_CONTENDERS))]
    return out


def run_child(cfg, env_extra):
    env = dict(os.environ, **env_extra)
    cmd = [sys.executable, os.path.abspath(__file__), "--child", json.dumps(cfg)]
    r = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if r.returncode:
        sys.exit(f"e2e_bench: {cfg['model']} {cfg['contender']} on {cfg['dir'] or 'RAM'} failed:\n{r.stderr}")
    return json.loads(r.stdout.strip().splitlines()[-1])


def alloc_of(contender, default):
    """The allocator of a contender's child: its own (RAM) or the default."""
    return next((a for a in ALLOC_ENV if contender.endswith("-" + a)), default)


def rows_of(res):
    """Table rows: (model, device, name, [per-rep dicts of fb/exposed/iter]),
    swap split into its two schedules."""
    rows = []
    for (m, d, c), reps in res.items():
        if c in SPLIT:
            for name, w in zip(SPLIT[c], (1.0, 0.1)):
                rows.append((m, d, name, [{k: (1 - w) * r[f"step_{k}"] + w * r[f"ckpt_{k}"]
                                           for k in ("fb", "exposed", "iter")} for r in reps]))
        else:
            rows.append((m, d, c, [{k: r[f"step_{k}"] for k in ("fb", "exposed", "iter")} for r in reps]))
    return rows


def med(reps, key):
    return spread([r[key] for r in reps])[0]


def ram_baseline(rows, model):
    """The fastest RAM contender's row for a model (by median step)."""
    cand = [r for r in rows if r[0] == model and r[1] == "ram" and r[2] in RAM]
    return min(cand, key=lambda r: med(r[3], "iter")) if cand else None


def per_rep_ratio(a, b, ka, kb):
    """Median over repetitions of a[rep][ka] / b[rep][kb] (neighbours in time)."""
    n = min(len(a), len(b))
    return spread([a[i][ka] / b[i][kb] for i in range(n)])


def print_table(rows, res):
    print(f"\n{'model':<14} {'device':<5} {'contender':<21} {'fwd+bwd ms':>22} {'exposed step ms':>24} "
          f"{'step ms':>24} {'vs RAM':>6}  B/param/step")
    order = {c: i for i, c in enumerate(IN_RAM + [n for c in SPLIT for n in SPLIT[c]] + list(OFFLOAD))}
    models = ALL_MODELS
    for m, d, c, reps in sorted(rows, key=lambda r: (models.index(r[0]), r[1] != "ram", r[1] != "shm", order[r[2]])):
        base = ram_baseline(rows, m)
        vs = f"{med(reps, 'iter') / med(base[3], 'iter'):6.2f}" if base else "     -"
        note = ""
        raw = res.get((m, d, c.split(" ")[0]), [{}])[-1]
        if "bytes" in raw:
            b = raw["bytes"]    # last_step_bytes: what the trainer wrote to and read from the engine
            note = f"engine: grad {b['grad_written'] / raw['params']:.2f} + params {b['params_read'] / raw['params']:.2f}"
            want = "staged" if OFFLOAD.get(c, (0, 0, 0, None))[3] else "hooked"
            if c in OFFLOAD and OFFLOAD[c][2] and not all(r.get("mode") in (want, None)
                                                          for r in res[(m, d, c)]):
                note += f" (a last step was not {want})"
        if raw.get("step_io_write") and d == "disk":
            k = "ckpt" if c.endswith(" ckpt/1") else "step"
            note = (f"disk {(raw[f'{k}_io_read'] + raw[f'{k}_io_write']) / raw['params']:.1f}"
                    + (f"; {note}" if note else ""))
        print(f"{m:<14} {d:<5} {c:<21} {fmt_spread([r['fb'] for r in reps], 1e3):>22} "
              f"{fmt_spread([r['exposed'] for r in reps], 1e3):>24} {fmt_spread([r['iter'] for r in reps], 1e3):>24} "
              f"{vs}  {note}")


def find(rows, m, d, c):
    for r in rows:
        if r[:3] == (m, d, c):
            return r
    return None


def headline(rows, res, micro, big):
    """The JSON figures (see the module doc and docs/performance.md)."""
    out = {k: micro[k] for k in ("loop_fraction_of_bound", "engine_fraction_of_device_shm",
                                 "engine_fraction_of_device_disk") if k in micro}
    base = ram_baseline(rows, big)
    off = find(rows, big, "shm", "offload-fp32")
    if base and off:
        out["exposed_step_vs_torch_ram_50m"] = round(per_rep_ratio(off[3], base[3], "exposed", "exposed")[0], 4)
        out["exposed_step_vs_torch_ram_50m_from"] = f"{big}: offload-fp32 over {base[2]}"
    offs = [r for r in rows if r[0] == big and r[1] == "disk" and r[2] in OFFLOAD]
    if offs:
        best = min(offs, key=lambda r: med(r[3], "iter"))
        for who, key in (("swap", "swap"), ("zero-inf", "zero_inf")):
            for every, name in zip(("every_step", "every_10"), SPLIT[who]):
                sw = find(rows, big, "disk", name)
                if sw:
                    out[f"speedup_vs_{key}_ckpt_{every}_disk"] = round(
                        per_rep_ratio(sw[3], best[3], "iter", "iter")[0], 4)
                    out[f"speedup_vs_{key}_ckpt_{every}_disk_exposed"] = round(
                        per_rep_ratio(sw[3], best[3], "exposed", "exposed")[0], 4)
        out["speedup_vs_swap_from"] = f"{big}: whole steps, swap or zero-inf over {best[2]}"
    off = find(rows, big, "shm", "offload-fp32")
    if base and off:
        out["iteration_vs_torch2_ram_50m_shm"] = round(per_rep_ratio(off[3], base[3], "iter", "iter")[0], 4)
        out["iteration_vs_torch2_ram_50m_shm_from"] = f"{big}: offload-fp32 over {base[2]}"
    for c in Q8_ANCHORS:
        r = find(rows, big, "ram", c)
        if r and base:
            out[f"{c.replace('-', '_')}_step_vs_torch_ram"] = round(
                per_rep_ratio(r[3], base[3], "exposed", "exposed")[0], 4)
    for d in ("shm", "disk"):
        plain = find(rows, big, d, "offload-fp32")
        for c, key in (("offload-fp32-clip", "clipped_step_vs_unclipped"),
                       ("offload-fp32-devclip", "clipped_step_vs_unclipped_device_clip")):
            clipped = find(rows, big, d, c)
            if plain and clipped:
                k = key if d == "shm" else f"{key}_disk"
                out[k] = round(per_rep_ratio(clipped[3], plain[3], "iter", "iter")[0], 4)
    # optimizer-bound: the first such model of each param dtype in the run
    for m, (_, _, _, dtype) in OPT_BOUND.items():
        key = "iteration_vs_torch2_ram_optimizer_bound" + ("_bf16_model" if dtype == "bf16" else "")
        ob_base = ram_baseline(rows, m)
        if key in out or not ob_base:
            continue
        for c in OPT_BOUND_CONTENDERS:
            r = find(rows, m, "shm", c)
            if r:
                k = key if c == "offload-fp32" else f"{key}.{c}"
                out[k] = round(per_rep_ratio(r[3], ob_base[3], "iter", "iter")[0], 4)
        if key in out:
            out[f"{key}_from"] = f"{m}: offload-fp32 over {ob_base[2]}"
    out["device_bytes_per_param_step"] = device_bytes(res, big)
    out["host_bytes_per_param"] = host_bytes(res, big)
    ds = out["host_bytes_per_param"].get("zero-inf")
    if ds and "offload-fp32" in out["host_bytes_per_param"]:
        out["host_bytes_per_param_vs_deepspeed"] = round(out["host_bytes_per_param"]["offload-fp32"] / ds, 4)
    return out


def host_bytes(res, model):
    """The peak resident memory of each contender's child beyond the model and
    its gradients (its RSS after a first backward), per param, median over
    repetitions, for model on the disk (RAM contenders: in RAM)."""
    out = {}
    for (m, d, c), reps in res.items():
        if m == model and d in ("disk", "ram") and all("host_bytes" in r for r in reps):
            out[c] = round(spread([r["host_bytes"] / r["params"] for r in reps])[0], 2)
    return out


def device_bytes(res, model):
    """Bytes per param per step through the disk's block layer, of each state
    format: the child's /proc/self/io (all its threads: the engine's workers
    reading one slot's state records and writing the other's, headers and
    padding included, writing the new low-precision params, the commit's
    metadata, and the trainer's read-back of the params) over the last
    timed step, median over repetitions, for model. Gradients written to the engine do
    not reach the disk (last_step_bytes counts them: 2 B/param)."""
    out = {}
    names = {"offload-fp32": "fp32", "offload-8bit": "8bit", "offload-8bit-bf16m": "8bit_bf16_master",
             "swap": "swap_fp32", "zero-inf": "zero_inf"}
    for (m, d, c), reps in res.items():
        if m == model and d == "disk" and c in names:
            v = [(r["step_io_read"] + r["step_io_write"]) / r["params"] for r in reps]
            out[names[c]] = round(spread(v)[0], 3)
            if c in SPLIT:
                out[f"{names[c]}_ckpt"] = round(spread([(r["ckpt_io_read"] + r["ckpt_io_write"]) / r["params"]
                                                      for r in reps])[0], 3)
    return out


def print_targets(j, cpu_avx512):
    loop_target = 0.95 if cpu_avx512 else 0.9
    print("\ntargets (measured, target, result):")
    # the compressed state's target (8-bit moments, and with bf16 masters): 14 B/param or fewer
    flat = dict(j, **{f"device_bytes_per_param_step.{n}": v
                      for n, v in j.get("device_bytes_per_param_step", {}).items()})
    targets = [("loop_fraction_of_bound", (loop_target, True))] + list(TARGETS.items()) + [
        (f"device_bytes_per_param_step.{n}", (14, False)) for n in ("8bit", "8bit_bf16_master")]
    for key, (target, higher) in targets:
        if key not in flat:
            print(f"  {key:<46} not measured in this run")
            continue
        v = flat[key]
        ok = v >= target if higher else v <= target
        miss = (target - v) if higher else (v - target)
        print(f"  {key:<46} {v:8.3f}  {'>=' if higher else '<='} {target:<5} "
              f"{'met' if ok else f'missed by {miss:.3f} ({miss / target:.0%})'}")


def plot(rows, path):
    """Bars per model and contender, one column per device: the whole step
    (top) and the exposed step (bottom), medians with min..max."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    devices = [d for d in ("shm", "disk") if any(r[1] == d for r in rows)]
    models = sorted({r[0] for r in rows}, key=ALL_MODELS.index)
    names = ["RAM baseline"] + [n for c in SPLIT for n in SPLIT[c]] + list(OFFLOAD)
    fig, axes = plt.subplots(2, len(devices), figsize=(6 * len(devices), 7), squeeze=False)
    w = 0.8 / len(names)
    for row, key, what in ((0, "iter", "training step"), (1, "exposed", "exposed step")):
        for ax, d in zip(axes[row], devices):
            for k, name in enumerate(names):
                ys, lo, hi = [], [], []
                for m in models:
                    r = ram_baseline(rows, m) if name == "RAM baseline" else find(rows, m, d, name)
                    med_, mn, mx = spread([x[key] * 1e3 for x in r[3]]) if r else (0, 0, 0)
                    ys.append(med_), lo.append(med_ - mn), hi.append(mx - med_)
                ax.bar([i + k * w for i in range(len(models))], ys, w, yerr=[lo, hi], label=name)
            ax.set_xticks([i + 0.4 - w / 2 for i in range(len(models))], models)
            ax.set_yscale("log")
            ax.set_ylabel(f"{what}, ms")
            ax.set_title(f"{what} (median, min..max), device on {d}", fontsize=9)
    axes[0][0].legend(fontsize=7)
    fig.tight_layout()
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fig.savefig(path, dpi=72)
    print(f"wrote {path}")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--models", default="gpt10m,gpt50m,gpt200m,gpt2000t,gpt50m-ob,gpt50m-ob-bf16",
                    help="of " + ", ".join(ALL_MODELS))
    ap.add_argument("--devices", default="shm,disk", help="shm and/or disk")
    ap.add_argument("--contenders", default=",".join(CONTENDERS), help="of " + ", ".join(CONTENDERS))
    ap.add_argument("--shm-dir", default="/dev/shm")
    ap.add_argument("--disk-dir", default=os.environ.get("CKPT_BENCH_DISK", "/var/tmp"))
    ap.add_argument("--reps", type=int, default=3, help="interleaved repetitions (default %(default)s)")
    ap.add_argument("--reps-200m", type=int, default=2, help="repetitions of gpt200m (default %(default)s)")
    ap.add_argument("--steps", type=int, default=3, help="timed steps per child, after one warm-up")
    ap.add_argument("--batch", type=int, default=2, help=f"sequences of {CTX} tokens per step")
    ap.add_argument("--swap-group", type=int, default=2 << 20, help="params per swap group")
    ap.add_argument("--autocast", choices=("bf16", "none", "auto"), default="auto",
                    help="forward and backward under CPU autocast to bf16 (as the demo) or in fp32; "
                         "auto: bf16 where the CPU multiplies bf16 natively (AVX512-BF16, AMX), "
                         "fp32 elsewhere (torch 2 emulates bf16 matmuls there, 90x slower)")
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--alloc", choices=list(ALLOC_ENV), default="glibc",
                    help="the allocator of the swap and offload children (default %(default)s)")
    ap.add_argument("--micro", choices=("run", "none"), default="run",
                    help="run ckpt_bench_update and ckpt_bench_engine (default) or not")
    ap.add_argument("--png", default=None, help="default BUILD/bench/e2e.png")
    ap.add_argument("--raw", default=None, help="every child's figures, saved as they come (default "
                    "BUILD/bench/e2e-raw.json)")
    ap.add_argument("--report", metavar="RAW", help="no run: the report of a saved run")
    ap.add_argument("--headline-model", default="gpt50m", help="the model of the JSON ratios")
    ap.add_argument("--quick", action="store_true",
                    help="a smoke run: tiny models, 1 repetition, 2 steps, small micro benchmarks")
    a = ap.parse_args()
    if a.child:
        return child(json.loads(a.child))
    if a.quick:
        a.models = a.models if a.models != ap.get_default("models") else "tiny,tiny2000t,tiny-ob-bf16"
        a.reps, a.steps = 1, 2
        a.headline_model = "tiny" if a.headline_model == ap.get_default("headline_model") else a.headline_model
    if a.autocast == "auto":
        with open("/proc/cpuinfo") as f:
            flags = f.read()
        a.autocast = "bf16" if " avx512_bf16" in flags or " amx_bf16" in flags else "none"
    models = a.models.split(",")
    devices = a.devices.split(",")
    contenders = a.contenders.split(",")
    for what, vals, known in (("model", models, ALL_MODELS), ("device", devices, ("shm", "disk")),
                              ("contender", contenders, CONTENDERS)):
        bad = [v for v in vals if v not in known]
        if bad:
            sys.exit(f"e2e_bench: unknown {what} {', '.join(bad)} (known: {', '.join(known)})")
    dirs = {"shm": a.shm_dir, "disk": a.disk_dir}
    for d in devices:
        if not os.path.isdir(dirs[d]):
            sys.exit(f"e2e_bench: {dirs[d]} ({d}) is not a directory")
    if any(alloc_of(c, a.alloc) == "jemalloc" for c in contenders) and not os.path.exists(JEMALLOC):
        sys.exit(f"e2e_bench: {JEMALLOC} is missing (libjemalloc2; scripts/deps.sh installs it)")
    # the children import ckpt from the build (make bench-e2e sets no PYTHONPATH)
    os.environ["PYTHONPATH"] = os.pathsep.join(
        p for p in (os.path.abspath(os.path.join(a.build, "python")), os.environ.get("PYTHONPATH")) if p)
    out_dir = os.path.join(a.build, "bench")
    png, raw = a.png or os.path.join(out_dir, "e2e.png"), a.raw or os.path.join(out_dir, "e2e-raw.json")
    if a.report:
        with open(a.report) as f:
            return report(json.load(f), png)
    with open("/proc/loadavg") as f:
        load = f.read().split()[0]
    print(f"e2e_bench: {', '.join(models)} on {', '.join(devices)}; {a.reps} repetitions, {a.steps} steps "
          f"each, batch {a.batch}x{CTX}, autocast {a.autocast}, "
          f"BENCH_THREADS={os.environ.get('BENCH_THREADS', '1')}, "
          f"swap and offload with {a.alloc}; "
          f"load average {load}", flush=True)
    run = {"models": models, "headline_model": a.headline_model if a.headline_model in models else models[0],
           "autocast": a.autocast,
           "load_average_start": float(load), "alloc": a.alloc, "micro": {}, "results": []}
    if a.micro == "run":
        run["micro"] = run_micro(a.build, {d: dirs[d] for d in devices}, a.quick)
    measure(a, run, raw, models, devices, contenders, dirs)
    report(run, png)


def measure(a, run, raw, models, devices, contenders, dirs):
    """Every configuration, a.reps interleaved times, each in a fresh child;
    run["results"] gets [model, device, contender, child's JSON], and the whole
    run is saved to raw after each child (--report redoes the report from it)."""
    os.makedirs(os.path.dirname(os.path.abspath(raw)), exist_ok=True)
    tmp = {d: tempfile.mkdtemp(prefix="ckpt-e2e-", dir=dirs[d]) for d in devices}
    t_start = time.time()
    try:
        for rep in range(max(a.reps, a.reps_200m if "gpt200m" in models else 0)):
            for m, d, c in configs(models, devices, contenders):
                if rep >= (a.reps_200m if m == "gpt200m" else a.reps):
                    continue
                cfg = {"model": m, "contender": c, "dir": tmp.get(d), "steps": a.steps, "batch": a.batch,
                       "swap_group": a.swap_group, "autocast": a.autocast}
                o = run_child(cfg, ALLOC_ENV[alloc_of(c, a.alloc)])
                run["results"].append([m, d, c, o])
                with open(raw, "w") as f:
                    json.dump(run, f)
                extra = (f", ckpt step {o['ckpt_iter'] * 1e3:.1f} ms" if "ckpt_iter" in o else "")
                print(f"[{time.time() - t_start:6.0f} s] rep {rep} {m} ({o['params'] / 1e6:.1f}M x {o['tensors']}) "
                      f"{d} {c}: fwd+bwd {o['step_fb'] * 1e3:.1f} ms, exposed {o['step_exposed'] * 1e3:.1f} ms, "
                      f"step {o['step_iter'] * 1e3:.1f} ms{extra}", flush=True)
        with open("/proc/loadavg") as f:
            run["load_average_end"] = float(f.read().split()[0])
        with open(raw, "w") as f:
            json.dump(run, f)
    finally:
        for t in tmp.values():
            shutil.rmtree(t, ignore_errors=True)


def report(run, png):
    """The table, the targets, the PNG and the JSON line of a run."""
    res = {}
    for m, d, c, o in run["results"]:
        res.setdefault((m, d, c), []).append(o)
    rows = rows_of(res)
    print_table(rows, res)
    j = headline(rows, res, run["micro"], run["headline_model"])
    with open("/proc/cpuinfo") as f:
        avx512 = " avx512f" in f.read()
    print_targets(j, avx512)
    plot(rows, png)
    j["load_average"] = [run["load_average_start"], run.get("load_average_end")]
    print(json.dumps(j))


if __name__ == "__main__":
    main()
