# SPDX-License-Identifier: MIT
"""Sharded OffloadAdamW (ZeRO-1 over torch.distributed, gloo on 127.0.0.1).

Ranks run as processes (shard_child.py). What they leave on their devices is
compared with one device fed the same averaged gradients (the same LossScaler,
clip_grad_norm_, skipped step and overflow), bit for bit: masters, moments,
low-precision params, step counts and the trainer blob (rank 0's, on every
rank). Ranks are SIGKILLed before and after their commits and at random
moments; every restart resumes all ranks at one step and the run ends as the
uninterrupted one does. Ranks two steps apart are refused.
"""

import json
import multiprocessing
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import time
import traceback
import unittest
import warnings

import numpy as np
import torch

from ckpt_testlib import CKPTCTL, free_port, read_file, tempdir

import ckpt
import ckpt.torch
import shard_child as sc

ITERS = 7


def _rank_main(argv, out, err, pace):
    """A forked rank: shard_child.main with its output in files (torch is already
    imported in this process, so a launch costs no import)."""
    os.environ["SHARD_PACE"] = str(pace)
    sys.stdout = open(out, "w", buffering=1)
    sys.stderr = open(err, "w", buffering=1)
    code = 0
    try:
        sc.main(argv)
    except BaseException:  # noqa: BLE001 - the parent reads it from err
        traceback.print_exc()
        code = 1
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


class Run:
    """The processes of one launch of WORLD ranks, forked from this one."""

    def __init__(self, d, world, kill=None, pace=0.0, iters=ITERS):
        port = free_port()
        args = [str(iters)] + ([kill] if kill else [])
        ctx = multiprocessing.get_context("fork")
        self.files = [(os.path.join(d, f"rank{r}.out"), os.path.join(d, f"rank{r}.err"))
                      for r in range(world)]
        for f in self.files:    # the last launch's: wait_line must see this one's
            for path in f:
                if os.path.exists(path):
                    os.remove(path)
        self.procs = [ctx.Process(target=_rank_main, args=([d, str(r), str(world), str(port)] + args,
                                                           *self.files[r], pace))
                      for r in range(world)]
        for p in self.procs:
            p.start()

    def output(self, rank):
        def read(path):
            if not os.path.exists(path):
                return ""
            with open(path) as f:
                return f.read()
        return tuple(read(f) for f in self.files[rank])

    def wait_line(self, rank, word, timeout=120):
        """Waits until rank's output has a line starting with word."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if re.search(rf"^{word}", self.output(rank)[0], re.M):
                return True
            if not self.procs[rank].is_alive():
                return False
            time.sleep(0.02)
        return False

    def wait(self, timeout=120):
        """[(exit code, stdout, stderr)] of every rank (-9: SIGKILLed); kills what is
        left at timeout."""
        deadline = time.monotonic() + timeout
        for p in self.procs:
            p.join(max(0.1, deadline - time.monotonic()))
        self.kill()
        for p in self.procs:
            p.join()
        return [(p.exitcode, *self.output(r)) for r, p in enumerate(self.procs)]

    def kill(self, ranks=None):
        for r, p in enumerate(self.procs):
            if (ranks is None or r in ranks) and p.is_alive():
                os.kill(p.pid, signal.SIGKILL)


def lines(text, word):
    return [int(x) for x in re.findall(rf"^{word} (\d+)$", text, re.M)]


def reference_world(d, world, state="fp32"):
    """One device fed every iteration's gradients averaged over the world ranks
    (world: a number, or a function of the iteration for a run resumed on
    another number of ranks)."""
    world_at = world if callable(world) else (lambda it: world)
    # fp32 params holding the same bf16 values (the masters), so that p.grad can
    # be the fp32 average itself; the device rounds it to bf16 as every rank does.
    named = [(n, torch.nn.Parameter(p.detach().to(torch.float32))) for n, p in sc.shard_model()]
    params = dict(named)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ckpt.torch.PrecisionWarning)
        opt = ckpt.torch.OffloadAdamW(sc.shard_groups(named), os.path.join(d, "one.img"), lr=1e-2,
                                      weight_decay=0.1, dtype="bf16", chunk_params=4096, state=state)
    scaler = ckpt.torch.LossScaler(init_scale=2.0 ** 4, growth_interval=2)
    opt.norms = {}      # step -> last_grad_norm
    it = {"it": 1}
    opt.set_blob(lambda: json.dumps({"it": it["it"] + 1, "scaler": scaler.state_dict()}).encode())
    while it["it"] <= ITERS:
        world = world_at(it["it"])
        per_rank = [sc.shard_grads(it["it"], r, world, scaler.get_scale()) for r in range(world)]
        for n, p in params.items():
            if n in per_rank[0]:
                total = sum(g[n].to(torch.bfloat16).to(torch.float32) for g in per_rank)
                p.grad = total / world
            else:
                p.grad = None
        scaler.unscale_(opt)
        opt.clip_grad_norm_(sc.MAX_NORM)
        scaler.step(opt)
        scaler.update()
        if opt.last_result == "committed":
            opt.norms[opt.committed_step] = opt.last_grad_norm
        it["it"] += 1
    return opt


def bits(a):
    return np.ascontiguousarray(a).view(np.uint32 if a.dtype == np.float32 else np.uint16)


class ShardTest(unittest.TestCase):
    def compare(self, d, world, ref):
        """Every rank's device against the one-device reference, bit for bit; the
        ranks' pieces cover every param exactly once."""
        covered = {n: np.zeros(p.numel(), np.int32) for n, p in sc.shard_model()}
        want_step, want_blob = ref.committed_step, ref.blob()
        for r in range(world):
            with ckpt.open(os.path.join(d, f"state-{r}.img")) as dev:
                self.assertEqual(dev.committed_step, want_step, f"rank {r}")
                self.assertEqual(dev.blob(), want_blob, f"rank {r}: the blob is rank 0's")
                for t in dev.tensors():
                    m = re.fullmatch(r"(\w+)\[(\d+):(\d+)\]", t["name"])
                    name, a, b = (m[1], int(m[2]), int(m[3])) if m else (t["name"], 0, t["numel"])
                    covered[name][a:b] += 1
                    got = dev.read_state(t["name"])
                    want = ref.device.read_state(name)
                    for what, g, w in zip(("p", "exp_avg", "exp_avg_sq"), got, want):
                        np.testing.assert_array_equal(bits(g.reshape(-1)), bits(w.reshape(-1)[a:b]),
                                                      f"rank {r} {t['name']} {what}")
                    np.testing.assert_array_equal(bits(dev.read_params(t["name"]).reshape(-1)),
                                                  bits(ref.device.read_params(name).reshape(-1)[a:b]))
                    self.assertEqual(dev.tensor_step(t["name"]), ref.device.tensor_step(name))
        for n, c in covered.items():
            self.assertTrue((c == 1).all(), f"{n}: covered {np.unique(c)} times")

    def check_ok(self, results):
        for r, (rc, out, err) in enumerate(results):
            self.assertEqual(rc, 0, f"rank {r} failed:\n{out}\n{err}")
        done = {lines(out, "done")[0] for _, out, _ in results}
        self.assertEqual(len(done), 1, f"ranks ended at different steps: {done}")

    def test_ranks_equal_one_device(self):
        """2 and 4 ranks: bit-identical to one device fed the averaged gradients,
        including a step skipped everywhere for an Inf on one rank."""
        for world in (2, 4):
            with self.subTest(world=world), tempdir() as d:
                results = Run(d, world).wait()
                self.check_ok(results)
                ref = reference_world(d, world)
                # one overflowed iteration: a step fewer than iterations
                self.assertEqual(ref.committed_step, ITERS - 1)
                self.compare(d, world, ref)
                # the global gradient norm from the devices' sums: the same
                # float on every rank, one device's to fp64 rounding
                norms = [dict(re.findall(r"^norm (\d+) (\S+)$", out, re.M)) for _, out, _ in results]
                self.assertEqual(len(norms[0]), ITERS - 1)
                for r in range(1, world):
                    self.assertEqual(norms[r], norms[0], f"rank {r}")
                for step, norm in norms[0].items():
                    self.assertAlmostEqual(float(norm) / ref.norms[int(step)], 1.0, delta=1e-12,
                                           msg=f"step {step}")
                ref.close()

    def test_kills_resume_at_one_step(self):
        """Two ranks killed between their commits (one committed, the other not),
        after a commit, and at a random moment (one rank or both): every restart
        resumes both at one step, and the run ends bit-identical to an
        uninterrupted one. A rank two steps behind is refused."""
        seed = int(os.environ.get("CKPT_SHARD_SEED", random.randrange(1 << 30)))
        rng = random.Random(seed)
        msg = f"(CKPT_SHARD_SEED={seed})"
        world = 2
        with tempdir() as d:
            paths = [os.path.join(d, f"state-{r}.img") for r in range(world)]

            def committed():
                out = []
                for path in paths:
                    with ckpt.open(path) as dev:
                        out.append(dev.committed_step)
                return out

            def launch(kill=None, random_kill=False):
                run = Run(d, world, kill, pace=0.2 if random_kill else 0.0)
                if random_kill:     # during the iterations left (0.2 s each)
                    self.assertTrue(run.wait_line(0, "resumed"), msg)
                    time.sleep(rng.uniform(0, 0.8))
                    run.kill([rng.randrange(world)] if rng.random() < 0.5 else None)
                results = run.wait(timeout=120)
                resumed = [lines(out, "resumed") for _, out, _ in results]
                # one step on every rank that got that far
                self.assertLessEqual(len({tuple(x) for x in resumed if x}), 1, f"{resumed} {msg}")
                if kill:
                    r = int(kill.split(":")[1])
                    self.assertEqual(results[r][0], -signal.SIGKILL, f"{results[r]} {msg}")
                return max(resumed)

            # Rank 1 dies at iteration 2 (step 2) before its commit, rank 0 commits.
            self.assertEqual(launch("2:1:before"), [0])
            self.assertEqual(committed(), [2, 1])
            aside = os.path.join(d, "aside.img")
            shutil.copyfile(paths[1], aside)
            # Rank 0 rolls back; then dies after its commit of iteration 5 (step 4:
            # iteration 4 overflowed), rank 1 at step 3 or 4.
            self.assertEqual(launch("5:0:after"), [1])
            c = committed()
            self.assertEqual(c[0], 4)
            self.assertIn(c[1], (3, 4))
            with tempdir() as rd:
                ref = reference_world(rd, world)

                def run_to_the_end(c):
                    results = Run(d, world).wait()
                    self.check_ok(results)
                    self.assertEqual([lines(out, "resumed") for _, out, _ in results], [[min(c)]] * world,
                                     msg)
                    self.compare(d, world, ref)

                # CKPT_SHARD_KILLS random kills (make crash-campaign runs many):
                # a run that reached its end is checked and starts over
                for _ in range(int(os.environ.get("CKPT_SHARD_KILLS", "1"))):
                    if min(c) == ITERS - 1:
                        run_to_the_end(c)
                        for path in paths:
                            os.remove(path)
                        c = [0] * world
                    self.assertEqual(launch(random_kill=True), [min(c)], msg)
                    c = committed()
                    self.assertLessEqual(max(c) - min(c), 1, f"{c} {msg}")
                run_to_the_end(c)
                ref.close()

            # Rank 1's device of step 1 beside rank 0's of step ITERS - 1: refused
            # on every rank, nothing rolled back.
            shutil.copyfile(aside, paths[1])
            for r, (rc, out, err) in enumerate(Run(d, world).wait(timeout=120)):
                self.assertNotEqual(rc, 0, f"rank {r} {out}")
                self.assertIn("more than one step apart", err, f"rank {r}")
            self.assertEqual(committed(), [ITERS - 1, 1])
    def test_missing_rank_device_is_refused(self):
        """A rank's device missing beside the others' is refused on every rank,
        never made anew at step 0 while the others resume (or roll back); a
        sharded open that fails leaves no device it created behind."""
        world = 2
        with tempdir() as d:
            paths = [os.path.join(d, f"state-{r}.img") for r in range(world)]
            self.check_ok(Run(d, world).wait())
            os.remove(paths[1])
            with open(paths[0], "rb") as f:
                before = f.read()
            for r, (rc, out, err) in enumerate(Run(d, world).wait(timeout=120)):
                self.assertNotEqual(rc, 0, f"rank {r} {out}")
                self.assertIn("rank(s) [1] of 2 have no device at their path", err, f"rank {r}")
            self.assertFalse(os.path.exists(paths[1]), "rank 1's device was made anew")
            with open(paths[0], "rb") as f:
                self.assertEqual(f.read(), before, "rank 0's device changed")
            # Every device missing, so every rank creates its own; rank 1's path is
            # taken meanwhile by something it cannot open (a dangling symlink): the
            # open fails on every rank and rank 0's new device is removed again.
            os.remove(paths[0])
            os.symlink(os.path.join(d, "nowhere", "x.img"), paths[1])
            for r, (rc, out, err) in enumerate(Run(d, world).wait(timeout=120)):
                self.assertNotEqual(rc, 0, f"rank {r} {out}")
            self.assertFalse(os.path.exists(paths[0]), "the failed open left rank 0's new device")
            self.assertEqual(sorted(n for n in os.listdir(d) if not n.startswith("rank")), ["state-1.img"])

    def test_resume_on_other_world_sizes(self):
        """A run resumed on another number of ranks, 2 -> 3 and 3 -> 1 when the
        new ranks open (reshard_from), 4 -> 2 and 1 -> 4 by ckptctl reshard,
        with fp32 and 8-bit moments, ends bit-identical to one device fed each
        iteration's gradients averaged over the ranks of that time; the old
        devices are only read, and a device of another world size is refused
        without reshard_from."""
        half = 3
        for n, m, how, state in ((2, 3, "open", "fp32"), (4, 2, "ckptctl", "8bit"), (3, 1, "open", "8bit"),
                                 (1, 4, "ckptctl", "fp32")):
            with self.subTest(n=n, m=m, how=how, state=state), tempdir() as d:
                old, new = os.path.join(d, "old"), os.path.join(d, "new")
                os.mkdir(old)
                os.mkdir(new)
                os.environ["SHARD_STATE"] = state
                try:
                    self.check_ok(Run(old, n, iters=half).wait())
                    images = {f: read_file(os.path.join(old, f)) for f in os.listdir(old) if f.endswith(".img")}
                    self.assertEqual(len(images), n)
                    if m != n:      # refused, never opened as it is, without reshard_from
                        for r, (rc, out, err) in enumerate(Run(old, m).wait()):
                            self.assertNotEqual(rc, 0, f"rank {r} {out}")
                    if how == "ckptctl":
                        subprocess.run([CKPTCTL, "reshard", *(os.path.join(old, f) for f in sorted(images)),
                                        "--to", os.path.join(new, "state-{rank}.img"), "--world", str(m)],
                                       check=True, capture_output=True)
                    else:
                        os.environ["SHARD_FROM"] = os.path.join(old, "state-{rank}.img" if n > 1 else
                                                                "state-0.img")
                    results = Run(new, m).wait()
                finally:
                    os.environ.pop("SHARD_FROM", None)
                    os.environ.pop("SHARD_STATE", None)
                self.check_ok(results)
                self.assertEqual([lines(out, "resumed") for _, out, _ in results], [[half]] * m)
                with tempdir() as rd:
                    ref = reference_world(rd, lambda it: n if it <= half else m, state)
                    self.compare(new, m, ref)
                    ref.close()
                for f, data in images.items():
                    self.assertEqual(read_file(os.path.join(old, f)), data, f"{f} changed")

    def test_devices_cut_evenly_before_0_4_open_as_before(self):
        """Devices of dm-ckpt before 0.4 (pieces cut at n r / W, no share
        recorded) open with the rule they were cut by and train as ever: bit-
        identical to one device."""
        world = 2
        with tempdir() as d:
            named = sc.shard_model()
            whole = ckpt.Layout()
            values = {}
            for gi, g in enumerate(sc.shard_groups(named)):
                for n, p in g["params"]:
                    whole.add(n, tuple(p.shape), gi)
                    values[n] = p.detach().to(torch.float32).reshape(-1).numpy()
            for r in range(world):
                old = ckpt.Layout()     # what 0.3 formatted: plain tensors named as pieces
                for name, shape, group in whole.shard(r, world, rule="even").tensors:
                    old.add(name, shape, group)
                path = os.path.join(d, f"state-{r}.img")
                ckpt.format(path, old, dtype="bf16", chunk_params=4096)
                with ckpt.open(path) as dev:
                    pieces = {}
                    for t in dev.tensors():
                        m = re.fullmatch(r"(\w+)\[(\d+):(\d+)\]", t["name"])
                        pieces[t["name"]] = values[m[1]][int(m[2]):int(m[3])] if m else values[t["name"]]
                    dev.load_params(pieces)
                self.assertIsNone(ckpt.image_info(path)["shard"])
            self.assertIn("[", ckpt.image_info(os.path.join(d, "state-1.img"))["tensors"][0]["name"])
            self.check_ok(Run(d, world).wait())
            with tempdir() as rd:
                ref = reference_world(rd, world)
                self.compare(d, world, ref)
                ref.close()

    def test_duplicate_paths_are_refused(self):
        with self.assertRaisesRegex(ValueError, "ranks 0 and 1 are given the same path"):
            ckpt.torch.drivers._Shard.path_of(type("S", (), {"rank": 1, "world": 2})(),
                                      ["/tmp/a.img", "/tmp/../tmp/a.img"])


if __name__ == "__main__":
    unittest.main()
