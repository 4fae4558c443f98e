# SPDX-License-Identifier: MIT
"""Kill a training process (SIGKILL) and restart it: it resumes from the device's
committed step and the trainer blob, and its losses are those of a run that was
never killed, bit for bit.

The trainer (this file run with --child) trains a tiny MLP with dropout on an
fp16 device with ckpt.torch.LossScaler (a growth interval of 3, and an
occasional loss spike, so steps overflow, are skipped and back off, and the
scale grows again). Its blob holds everything else a step depends on: the
numpy PCG64 state of the batch sampler, from which every iteration's torch seed
(dropout) is drawn, the iteration count, and the scaler's state. Killed:
- by the parent, three times in one run, each at a random moment of a random
  iteration (the parent paces the child one iteration at a time, so a fast
  child cannot finish before the third kill);
- by itself at precise points: between two gradient writes, and right after a
  commit before anything else happened, and during an overflowing iteration.

Run: PYTHONPATH=<build>/python /usr/bin/python3 -m unittest -v test_offload_resume
"""

import json
import os
import random
import signal
import subprocess
import sys
import time
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

ITERATIONS = 40
SEED = 77


def child(path, log_path, die_at=None, die_how=None):
    """The trainer. Logs "iteration step loss scale" before each commit and
    prints "IT iteration" after it."""
    import numpy as np
    import torch
    import ckpt.torch

    torch.set_num_threads(1)
    torch.manual_seed(SEED)
    model = torch.nn.Sequential(torch.nn.Linear(12, 24), torch.nn.GELU(), torch.nn.Dropout(0.3),
                                torch.nn.Linear(24, 3))
    opt = ckpt.torch.OffloadAdamW(model.named_parameters(), path, lr=5e-3, dtype="fp16",
                                  chunk_params=2048)
    scaler = ckpt.torch.LossScaler(init_scale=2.0 ** 15, growth_interval=3)
    rng = np.random.default_rng(SEED)
    it = 0
    if opt.committed_step:
        blob = json.loads(opt.blob())
        rng.bit_generator.state = blob["rng"]
        scaler.load_state_dict(blob["scaler"])
        it = blob["iteration"]
    opt.set_blob(lambda: json.dumps({"iteration": it + 1, "rng": rng.bit_generator.state,
                                     "scaler": scaler.state_dict()}).encode())
    if die_how == "mid-write":
        real = opt.device.write_grad
        count = {"n": 0}

        def write_grad(name, a):
            if it == die_at:
                count["n"] += 1
                if count["n"] == 3:
                    os.kill(os.getpid(), signal.SIGKILL)
            real(name, a)
        opt.device.write_grad = write_grad
    with open(log_path, "a") as log:
        while it < ITERATIONS:
            if die_how == "paced" and not sys.stdin.readline():
                return   # the parent is gone
            x = torch.from_numpy(rng.standard_normal((16, 12)).astype(np.float32))
            y = torch.from_numpy(rng.integers(0, 3, 16))
            spike = 1e4 if rng.random() < 0.1 else 1.0   # an occasional overflow
            torch.manual_seed(int(rng.integers(0, 2 ** 62)))
            loss = torch.nn.functional.cross_entropy(model(x), y)
            scaler.scale(loss * spike).backward()
            log.write(f"{it} {opt.committed_step + 1} {loss.item().hex()} {scaler.get_scale()}\n")
            log.flush()
            scaler.step(opt)
            if die_how == "after-commit" and it == die_at:
                os.kill(os.getpid(), signal.SIGKILL)
            scaler.update()
            opt.zero_grad()
            it += 1
            print(f"IT {it} {opt.last_result}", flush=True)
    opt.close()


def read_log(path):
    """{iteration: (step, loss, scale)} (later lines of a re-run iteration win)."""
    out = {}
    with open(path) as f:
        for line in f:
            i, t, loss, scale = line.split()
            out[int(i)] = (int(t), float.fromhex(loss), float(scale))
    return out


def final_state(path):
    import ckpt
    with ckpt.open(path) as dev:
        return dev.committed_step, dev.blob(), {
            t["name"]: tuple(a.tobytes() for a in dev.read_state(t["name"])) for t in dev.tensors()}


class KillAndResume(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        from ckpt_testlib import tempdir
        cls._tmp = tempdir()
        cls.dir = cls._tmp.name
        cls.ref = cls.run_child("ref")
        cls.ref_log = read_log(os.path.join(cls.dir, "ref.log"))

    @classmethod
    def tearDownClass(cls):
        cls._tmp.cleanup()

    @classmethod
    def spawn(cls, name, *extra, stdin=None):
        return subprocess.Popen([sys.executable, os.path.abspath(__file__), "--child",
                                 os.path.join(cls.dir, name + ".img"), os.path.join(cls.dir, name + ".log"),
                                 *extra], stdin=stdin, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True)

    @classmethod
    def run_child(cls, name, *extra):
        p = cls.spawn(name, *extra)
        out, err = p.communicate(timeout=120)
        return p.returncode, out, err

    def check_same_as_reference(self, name):
        log = read_log(os.path.join(self.dir, name + ".log"))
        self.assertEqual(sorted(log), sorted(self.ref_log))
        for i in sorted(log):
            self.assertEqual(log[i], self.ref_log[i], f"iteration {i}: (step, loss, scale) differ")
        self.assertEqual(final_state(os.path.join(self.dir, name + ".img")),
                         final_state(os.path.join(self.dir, "ref.img")))

    def test_reference_run_overflows_and_grows(self):
        rc, out, err = self.ref
        self.assertEqual(rc, 0, err)
        results = [ln.split()[2] for ln in out.splitlines() if ln.startswith("IT")]
        self.assertEqual(len(results), ITERATIONS)
        self.assertGreaterEqual(results.count("overflow"), 3, results)
        scales = [s for _, _, s in self.ref_log.values()]
        self.assertTrue(any(b > a for a, b in zip(scales, scales[1:])), scales)   # grew
        self.assertTrue(any(b < a for a, b in zip(scales, scales[1:])), scales)   # backed off

    def test_killed_by_the_parent(self):
        """SIGKILL at random moments, three times, each time restarted."""
        rnd = random.Random(int(time.time()))
        kills = 0
        while True:
            p = self.spawn("parent", "-1", "paced", stdin=subprocess.PIPE)
            run_for = rnd.randint(1, 8)  # iterations this process completes before its kill
            took = 0.05                  # how long the last iteration took
            for n in range(ITERATIONS + 1):
                p.stdin.write("go\n")
                p.stdin.flush()
                if kills < 3 and n == run_for:
                    # anywhere in this iteration, or just after it
                    time.sleep(rnd.uniform(0, 1.5 * took))
                    p.send_signal(signal.SIGKILL)
                    break
                start = time.monotonic()
                line = p.stdout.readline()
                took = time.monotonic() - start
                if not line.startswith("IT") or int(line.split()[1]) == ITERATIONS:
                    break
            p.stdin.close()
            p.wait(timeout=120)
            p.stdout.close()
            err = p.stderr.read()
            p.stderr.close()
            if p.returncode == 0:
                break
            self.assertEqual(p.returncode, -signal.SIGKILL, err)
            kills += 1
        self.assertEqual(kills, 3)
        self.check_same_as_reference("parent")

    def test_killed_between_gradient_writes(self):
        self.killed_at("midwrite", 9, "mid-write")

    def test_killed_right_after_a_commit(self):
        self.killed_at("aftercommit", 14, "after-commit")

    def test_killed_in_an_overflowing_iteration(self):
        overflow_its = [i for i in sorted(self.ref_log)
                        if i + 1 in self.ref_log and self.ref_log[i + 1][0] == self.ref_log[i][0]]
        self.assertTrue(overflow_its)
        self.killed_at("overflow", overflow_its[len(overflow_its) // 2], "after-commit")

    def killed_at(self, name, it, how):
        rc, _, err = self.run_child(name, str(it), how)
        self.assertEqual(rc, -signal.SIGKILL, err)
        rc, _, err = self.run_child(name)
        self.assertEqual(rc, 0, err)
        self.check_same_as_reference(name)


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        a = sys.argv[2:]
        child(a[0], a[1], int(a[2]) if len(a) > 2 else None, a[3] if len(a) > 3 else None)
    else:
        unittest.main()
