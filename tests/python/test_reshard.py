# SPDX-License-Identifier: MIT
"""ckpt.reshard and ckptctl reshard: a sharded run's images onto another number
of ranks.

The rule that cuts a layout (ckpt.Layout.shard) cuts a param only at multiples
of 256 params (one 8-bit block) from its start and gives every param to exactly
one rank. A chain of reshards 2 -> 3 -> 1 -> 4 -> 2 keeps the concatenated
masters, moments and step counts bit for bit in every state format (fp32,
8-bit moments, 8-bit moments with bf16 masters), with the step and the trainer
blob. What is not one run's whole state is refused and leaves nothing behind;
images cut evenly (dm-ckpt before 0.4) are resharded where that is exact
(fp32), given the shapes they do not record, and refused where it is not
(8-bit blocks split). ckptctl reshard killed at random moments leaves the old
images as they were and never a new path holding less than a complete image.

Run: PYTHONPATH=<build>/python /usr/bin/python3 -m unittest -v test_reshard
"""

import os
import random
import signal
import subprocess
import time
import unittest

import numpy as np

from ckpt_testlib import CKPTCTL, read_file, tempdir

import ckpt

PARAMS = [("w1", (3000,), 0), ("w2", (50, 40), 0), ("e", (7, 300), 0), ("b", (7,), 1)]
FORMATS = [("fp32", "fp32"), ("8bit", "fp32"), ("8bit", "bf16")]
STEPS = 3


def whole(params=PARAMS):
    layout = ckpt.Layout()
    for name, shape, group in params:
        layout.add(name, shape, group)
    return layout


def bf16_words(rng, n):
    return (rng.standard_normal(n).astype(np.float32).view(np.uint32) >> 16).astype(np.uint16)


def make_run(d, world, state="fp32", master="fp32", layouts=None, seed=0, steps=STEPS, blob=b"trainer"):
    """world images of one run, trained STEPS steps with random gradients ("b"
    skipped at step 2, so its step count lags): [paths]."""
    rng = np.random.default_rng(seed)
    paths = []
    for r in range(world):
        path = os.path.join(d, f"state-{r}.img")
        layout = layouts[r] if layouts else whole().shard(r, world)
        ckpt.format(path, layout, chunk_params=4096, state=state, master=master)
        with ckpt.open(path) as dev:
            for s in range(1, steps + 1):
                dev.begin([{"lr": 1e-2}, {"lr": 3e-3}][:dev.info()["n_groups"]])
                for t in dev.tensors():
                    if t["name"] == "b" and s == 2:
                        dev.skip("b")
                    else:
                        dev.write_grad(t["name"], bf16_words(rng, t["numel"]))
                dev.commit(blob)
        paths.append(path)
    return paths


def state_of(paths):
    """{param: ([p, m, v bits], {step counts}), "__step__", "__blob__"} of the
    images of a run, its pieces put together."""
    parts, steps, blobs = {}, set(), set()
    for path in paths:
        with ckpt.open(path) as dev:
            steps.add(dev.committed_step)
            blobs.add(dev.blob())
            for t in dev.tensors():
                name = t["name"].split("[")[0]
                a = int(t["name"].split("[")[1].split(":")[0]) if "[" in t["name"] else 0
                parts.setdefault(name, []).append((a, dev.read_state(t["name"]), dev.tensor_step(t["name"])))
    out = {"__step__": steps, "__blob__": blobs}
    for name, ps in parts.items():
        ps.sort(key=lambda x: x[0])
        out[name] = ([np.concatenate([x[1][k].reshape(-1) for x in ps]).view(np.uint32).tobytes()
                      for k in range(3)], {x[2] for x in ps})
    return out


def reshard_all(sources, d, world, **kw):
    os.makedirs(d)
    paths = [os.path.join(d, f"state-{r}.img") for r in range(world)]
    for r, p in enumerate(paths):
        report = ckpt.reshard(sources, p, r, world, **kw)
        assert report["rank"] == r and report["world"] == world, report
    return paths


class ShardRule(unittest.TestCase):
    def test_bounds_cut_at_blocks_and_cover_every_param(self):
        numels = [int(np.prod(s)) for _, s, _ in PARAMS]
        starts = np.cumsum([0] + numels)
        for world in (1, 2, 3, 4, 7):
            with self.subTest(world=world):
                held = {name: np.zeros(n, np.int32) for (name, _, _), n in zip(PARAMS, numels)}
                for r in range(world):
                    desc = whole().shard(r, world).describe()
                    if world == 1:
                        self.assertNotIn("shard", desc)
                        bounds = [0, sum(numels)]
                    else:
                        rec = desc["shard"]
                        self.assertEqual((rec["rank"], rec["world"], rec["params"]), (r, world, sum(numels)))
                        bounds = rec["bounds"]
                    for b in bounds[1:-1]:   # at a block boundary of the param it falls in
                        i = np.searchsorted(starts, b, side="right") - 1
                        self.assertEqual((b - starts[i]) % 256, 0, f"bound {b}")
                    for t in desc["tensors"]:
                        piece = t.get("piece")
                        name, a = (piece["param"], piece["begin"]) if piece else (t["name"], 0)
                        n = int(np.prod(t["shape"]))
                        if piece:
                            self.assertEqual(t["name"], f"{name}[{a}:{a + n}]")
                            self.assertEqual(tuple(piece["shape"]), dict((p, s) for p, s, _ in PARAMS)[name])
                        held[name][a:a + n] += 1
                for name, h in held.items():
                    self.assertTrue((h == 1).all(), f"{name} held {np.unique(h)} times")

    def test_even_rule_and_refusals(self):
        desc = whole().shard(1, 2, rule="even").describe()
        n = sum(int(np.prod(s)) for _, s, _ in PARAMS)
        self.assertEqual(desc["shard"]["bounds"], [0, n // 2, n])
        self.assertEqual(desc["tensors"][0]["name"], f"w2[{n // 2 - 3000}:2000]")
        small = whole([("a", (300,), 0), ("b", (10,), 0)])
        with self.assertRaisesRegex(ckpt.CkptError, "leave rank 0 none"):
            small.shard(0, 3)
        with self.assertRaisesRegex(ckpt.CkptError, "rank 2 of 2"):
            whole().shard(2, 2)
        with self.assertRaisesRegex(ckpt.CkptError, "already"):
            whole().shard(0, 2).shard(0, 2)


class Reshard(unittest.TestCase):
    def test_chain_keeps_every_state_bit_for_bit(self):
        """2 -> 3 -> 1 -> 4 -> 2: masters, moments and step counts unchanged,
        every time, in every state format; step and blob carried; the images
        read are never written."""
        for state, master in FORMATS:
            with self.subTest(state=state, master=master), tempdir() as d:
                first = make_run(d, 2, state, master)
                want = state_of(first)
                self.assertEqual(want["__step__"], {STEPS})
                counts = want["b"][1]
                self.assertEqual(counts, {STEPS - 1}, "b's count lags: it was skipped once")
                src, before = first, [read_file(p) for p in first]
                for hop, world in enumerate((3, 1, 4, 2)):
                    paths = reshard_all(src[::-1], os.path.join(d, f"hop{hop}"), world)
                    self.assertEqual(state_of(paths), want, f"after the reshard onto {world}")
                    info = ckpt.image_info(paths[0])
                    self.assertEqual((info["state"], info["master"]), (state, master))
                    if world > 1:
                        self.assertEqual(info["shard"]["world"], world)
                    else:
                        self.assertIsNone(info["shard"])
                    src = paths
                self.assertEqual([read_file(p) for p in first], before)

    def test_what_is_not_one_runs_state_is_refused(self):
        with tempdir() as d:
            run = make_run(d, 2)
            out = os.path.join(d, "new.img")

            def refused(sources, pattern, **kw):
                with self.assertRaisesRegex(ckpt.CkptError, pattern):
                    ckpt.reshard(sources, out, 0, 1, **kw)
                self.assertFalse(os.path.lexists(out), "a refused reshard left its image")

            refused(run[:1], "rank 0 of 2 ranks, and 1 images are given")
            refused([run[0], run[0]], "are both rank 0")
            other = os.path.join(d, "other")
            os.mkdir(other)
            small = make_run(other, 2, layouts=[whole(PARAMS[:3]).shard(r, 2) for r in range(2)])
            refused([run[0], small[1]], "different layouts")
            ahead = os.path.join(d, "ahead")
            os.mkdir(ahead)
            later = make_run(ahead, 2, steps=STEPS + 1)
            refused([run[0], later[1]], r"committed steps \[3, 4\]")
            blob = os.path.join(d, "blob")
            os.mkdir(blob)
            refused([run[0], make_run(blob, 2, blob=b"another")[1]], "different trainer blobs")
            with open(out, "wb") as f:
                f.write(b"mine")
            with self.assertRaisesRegex(ckpt.CkptError, "exists"):
                ckpt.reshard(run, out, 0, 1)
            with open(out, "rb") as f:
                self.assertEqual(f.read(), b"mine")

    def test_images_cut_evenly_before_0_4(self):
        """Images of dm-ckpt before 0.4 (pieces cut at n r / W, no shard record,
        no shape of a cut param): fp32 resharded exactly once the shapes are
        given; 8-bit moments, whose blocks the even cut split, refused."""
        for state, exact in (("fp32", True), ("8bit", False)):
            with self.subTest(state=state), tempdir() as d:
                layouts = []
                for r in range(2):
                    old = ckpt.Layout()     # what 0.3 formatted: plain tensors named as pieces
                    for name, shape, group in whole().shard(r, 2, rule="even").tensors:
                        old.add(name, shape, group)
                    layouts.append(old)
                run = make_run(d, 2, state, layouts=layouts)
                self.assertIsNone(ckpt.image_info(run[0])["shard"])
                out = os.path.join(d, "new.img")
                with self.assertRaisesRegex(ckpt.CkptError, "'w2' is cut into pieces .* before 0.4"):
                    ckpt.reshard(run, out, 0, 1)
                if exact:
                    ckpt.reshard(run, out, 0, 1, params=PARAMS)
                    self.assertEqual(state_of([out]), state_of(run))
                else:
                    with self.assertRaisesRegex(ckpt.CkptError, "split 8-bit blocks"):
                        ckpt.reshard(run, out, 0, 1, params=PARAMS)
                    self.assertFalse(os.path.lexists(out))


class AtOpen(unittest.TestCase):
    def groups(self, shapes=None):
        import torch
        shapes = shapes or {n: s for n, s, _ in PARAMS}
        named = [(n, torch.nn.Parameter(torch.zeros(shapes[n], dtype=torch.bfloat16))) for n, _, _ in PARAMS]
        return [{"params": named[:3]}, {"params": named[3:], "lr": 3e-3}]

    def test_resume_refused_leaves_nothing_and_a_share_opened_whole_is_refused(self):
        import ckpt.torch
        with tempdir() as d:
            run = make_run(d, 2)
            old = os.path.join(d, "state-{rank}.img")
            new = os.path.join(d, "new.img")
            names = sorted(os.listdir(d))
            other = dict((n, s) for n, s, _ in PARAMS)
            other["w2"] = (40, 50)
            with self.assertRaisesRegex(ckpt.CkptError, "'w2' has shape"):
                ckpt.torch.OffloadAdamW(self.groups(other), new, reshard_from=old)
            self.assertEqual(sorted(os.listdir(d)), names, "a refused resume left files")
            with self.assertRaisesRegex(ValueError, "this run's own device path"):
                ckpt.torch.OffloadAdamW(self.groups(), new, reshard_from=[run[0], new])
            with self.assertRaisesRegex(RuntimeError, "holds rank 0's share of a run on 2 ranks"):
                ckpt.torch.OffloadAdamW(self.groups(), run[0])
            with ckpt.torch.OffloadAdamW(self.groups(), new, reshard_from=old) as opt:
                self.assertEqual((opt.committed_step, opt.blob()), (STEPS, b"trainer"))
            self.assertEqual(state_of([new]), state_of(run))
            # where this run's device exists, it is opened as always
            with ckpt.torch.OffloadAdamW(self.groups(), new, reshard_from=old) as opt:
                self.assertEqual(opt.committed_step, STEPS)


class Ckptctl(unittest.TestCase):
    def ckptctl(self, *args, ok=True):
        p = subprocess.run([CKPTCTL, *args], capture_output=True, text=True)
        if ok:
            self.assertEqual(p.returncode, 0, p.stderr)
        else:
            self.assertNotEqual(p.returncode, 0, p.stdout)
        return p

    def test_reshard_to_paths_and_template(self):
        with tempdir() as d:
            run = make_run(d, 3, "8bit")
            want = state_of(run)
            a, b = os.path.join(d, "a.img"), os.path.join(d, "b.img")
            self.ckptctl("reshard", *run, "--to", a, b)
            self.assertEqual(state_of([a, b]), want)
            self.ckptctl("reshard", a, b, "--to", os.path.join(d, "single.img"))
            self.assertEqual(state_of([os.path.join(d, "single.img")]), want)
            p = self.ckptctl("reshard", os.path.join(d, "single.img"), "--to", os.path.join(d, "n-{rank}.img"),
                             "--world", "4")
            self.assertIn("onto 4 ranks", p.stdout)
            self.assertEqual(state_of([os.path.join(d, f"n-{r}.img") for r in range(4)]), want)
            names = sorted(os.listdir(d))
            p = self.ckptctl("reshard", *run, "--to", os.path.join(d, "x-{rank}.img"), ok=False)
            self.assertIn("--world", p.stderr)
            p = self.ckptctl("reshard", *run, "--to", os.path.join(d, "x.img"), a, ok=False)
            self.assertIn("exists", p.stderr)
            p = self.ckptctl("reshard", run[0], "--to", os.path.join(d, "x.img"), ok=False)
            self.assertIn("give every rank's image", p.stderr)
            self.assertEqual(sorted(os.listdir(d)), names, "a refused reshard left files")

    def test_killed_reshard_leaves_old_images_and_no_partial_new_one(self):
        """SIGKILL at random moments (CKPT_RESHARD_KILLS of them; make
        crash-campaign runs many): the old images are byte for byte what they
        were, and every new path that exists holds a complete image with the
        whole state of its rank; the paths and leftovers removed, the reshard
        runs again to the end."""
        seed = int(os.environ.get("CKPT_RESHARD_SEED", random.randrange(1 << 30)))
        rng = random.Random(seed)
        msg = f"(CKPT_RESHARD_SEED={seed})"
        big = [("w1", (1 << 20,), 0), ("w2", (700, 1000), 0), ("b", (7,), 1)]
        with tempdir() as d:
            run = make_run(d, 2, "8bit", layouts=[whole(big).shard(r, 2) for r in range(2)], steps=1)
            before = [read_file(p) for p in run]
            new = os.path.join(d, "new")
            os.mkdir(new)
            to = os.path.join(new, "state-{rank}.img")
            start = time.monotonic()
            self.ckptctl("reshard", *run, "--to", to, "--world", "3")
            took = time.monotonic() - start
            want = [state_of([to.format(rank=r)]) for r in range(3)]
            for name in os.listdir(new):
                os.remove(os.path.join(new, name))
            for _ in range(int(os.environ.get("CKPT_RESHARD_KILLS", "3"))):
                p = subprocess.Popen([CKPTCTL, "reshard", *run, "--to", to, "--world", "3"],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                time.sleep(rng.uniform(0, took))
                p.send_signal(signal.SIGKILL)
                p.wait()
                self.assertEqual([read_file(q) for q in run], before, f"an old image changed {msg}")
                for r in range(3):
                    path = to.format(rank=r)
                    if os.path.exists(path):
                        self.assertEqual(state_of([path]), want[r], f"rank {r} {msg}")
                for name in os.listdir(new):
                    os.remove(os.path.join(new, name))
            self.ckptctl("reshard", *run, "--to", to, "--world", "3")
            self.assertEqual([state_of([to.format(rank=r)]) for r in range(3)], want)


if __name__ == "__main__":
    unittest.main()
