# SPDX-License-Identifier: MIT
"""API and bad-input tests of the Python binding over the userspace engine.

Every refused call must raise CkptError with the specific name (E_SIZE, ...)
AND leave everything as it was: committed step, open step and state, every
byte of the fp32 state and of the low-precision params, the trainer blob
(assertRefused compares snapshots before and after). Steps completed after a
refused call are checked bit for bit against the exact numpy model of the
update (ckpt_testlib.Model), so a refused write that changed anything would
show there too.

Run: PYTHONPATH=<build>/python /usr/bin/python3 -m unittest -v test_engine
"""

import os
import shutil
import struct
import sys
import unittest
import warnings

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import numpy as np  # noqa: E402

import ckpt  # noqa: E402
from ckpt_testlib import Model, as_bits, f32_to_lowp_bits, snapshot, tempdir  # noqa: E402

CHUNK = 4096
# w spans chunks 0-1; b (at param 6144) shares chunk 1 with w; e is group 1 (chunk 2).
TENSORS = [("w", (50, 100), 0), ("b", (17,), 0), ("e", (300,), 1)]
GROUPS = [{"lr": 1e-3, "weight_decay": 0.01}, {"lr": 3e-3, "betas": (0.8, 0.99), "weight_decay": 0.0}]


def make_layout(tensors):
    layout = ckpt.Layout()
    for n, s, g in tensors:
        layout.add(n, s, g)
    return layout


def grads_for(tensors, dtype, rng):
    return {n: f32_to_lowp_bits((rng.standard_normal(s) * 0.1).astype(np.float32), dtype).reshape(s)
            for n, s, _ in tensors}


class EngineCase(unittest.TestCase):
    dtype = "bf16"
    tensors = TENSORS
    groups = GROUPS
    chunk = CHUNK
    shuffle = False

    def setUp(self):
        self._tmp = tempdir()
        self.dir = self._tmp.name
        self.path = os.path.join(self.dir, "img")
        self.rng = np.random.default_rng(7)
        ckpt.format(self.path, make_layout(self.tensors), dtype=self.dtype, chunk_params=self.chunk)
        self.dev = ckpt.open(self.path)
        self.init = {n: (self.rng.standard_normal(s) * 0.5).astype(np.float32) for n, s, _ in self.tensors}
        self.dev.load_params(self.init)
        self.model = Model(self.tensors, self.dtype, self.init)

    def tearDown(self):
        self.dev.close()
        self._tmp.cleanup()

    # -- helpers
    def grads(self):
        return grads_for(self.tensors, self.dtype, self.rng)

    def full_step(self, blob=b"", grads=None):
        """One committed step on the device and the model; returns its grads."""
        t = self.dev.committed_step + 1
        grads = self.grads() if grads is None else grads
        self.dev.begin(self.groups)
        order = [n for n, _, _ in self.tensors]
        if self.shuffle:  # any order: partial chunks are staged until complete
            order = [order[i] for i in self.rng.permutation(len(order))]
        for n in order:
            self.dev.write_grad(n, grads[n])
        self.assertEqual(self.dev.commit(blob), "committed")
        self.assertTrue(self.model.step(t, self.groups, grads))
        self.assertEqual(self.dev.committed_step, t)
        self.assertMatchesModel()
        return grads

    def assertMatchesModel(self, dev=None):
        dev = dev or self.dev
        for n, _, _ in self.tensors:
            p, m, v = dev.read_state(n)
            for k, a, b in zip("pmv", (p, m, v), self.model.state[n]):
                self.assertTrue(np.array_equal(a.reshape(-1).view(np.uint32), b.view(np.uint32)),
                                f"{n}.{k} differs from the exact model")
            self.assertTrue(np.array_equal(as_bits(dev.read_params(n)).reshape(-1),
                                           f32_to_lowp_bits(p.reshape(-1), self.dtype)))

    def assertRefused(self, name, fn, *args, msg_has=None, **kw):
        """fn(*args) raises CkptError `name` and changes nothing."""
        before = snapshot(self.dev)
        with self.assertRaises(ckpt.CkptError) as cm:
            fn(*args, **kw)
        self.assertEqual(cm.exception.name, name, f"message: {cm.exception.message}")
        self.assertTrue(cm.exception.message, "the error must say what is wrong")
        if msg_has:
            self.assertIn(msg_has.lower(), cm.exception.message.lower())
        self.assertEqual(snapshot(self.dev), before, f"a refused call ({name}) changed the device")
        return cm.exception

    def assertReopenEquals(self, snap):
        """The committed state seen through a fresh open equals snap (one
        writer at a time: self.dev is closed for it, then opened again)."""
        self.dev.close()
        with ckpt.open(self.path) as dev2:
            self.assertEqual(snapshot(dev2), snap)
        self.dev = ckpt.open(self.path)


class TestBadInput(EngineCase):
    def test_wrong_sizes(self):
        self.full_step(b"one")
        g = self.grads()
        self.dev.begin(self.groups)
        for bad in (np.zeros(4999, np.uint16), np.zeros(5001, np.uint16), np.zeros(0, np.uint16),
                    np.zeros(17, np.uint16)):
            self.assertRefused("E_SIZE", self.dev.write_grad, "w", bad)
        self.assertRefused("E_SIZE", self.dev.write_grad, "b", np.zeros(16, np.uint16))
        # the step was untouched: finish it and check it against the model
        for n, _, _ in self.tensors:
            self.dev.write_grad(n, g[n])
        self.assertEqual(self.dev.commit(b"two"), "committed")
        self.assertTrue(self.model.step(2, self.groups, g))
        self.assertMatchesModel()
        # load_params with a wrong size: refused before the first step too
        with tempdir() as d:
            p2 = os.path.join(d, "img")
            ckpt.format(p2, make_layout(self.tensors), dtype=self.dtype, chunk_params=CHUNK)
            with ckpt.open(p2) as dev2:
                before = snapshot(dev2)
                with self.assertRaises(ckpt.CkptError) as cm:
                    dev2.load_params({"w": np.zeros(4999, np.float32)})
                self.assertEqual(cm.exception.name, "E_SIZE")
                with self.assertRaises(ckpt.CkptError) as cm:  # one good, one bad: nothing loaded
                    dev2.load_params({"b": np.ones(17, np.float32), "e": np.ones(301, np.float32)})
                self.assertEqual(cm.exception.name, "E_SIZE")
                self.assertEqual(snapshot(dev2), before)

    def test_wrong_dtype(self):
        self.full_step(b"one")
        self.dev.begin(self.groups)
        for arr in (np.zeros(5000, np.float32), np.zeros(5000, np.float16), np.zeros(5000, np.float64),
                    np.zeros(5000, np.int32)):
            e = self.assertRefused("E_DTYPE", self.dev.write_grad, "w", arr)
            self.assertIn("bf16", e.message)
        self.dev.abort()
        with tempdir() as d:  # an fp16 device takes float16 (or uint16 bits), not float32
            p2 = os.path.join(d, "img")
            ckpt.format(p2, make_layout(self.tensors), dtype="fp16", chunk_params=CHUNK)
            with ckpt.open(p2) as dev2:
                self.assertEqual(dev2.dtype, "fp16")
                dev2.begin(self.groups)
                with self.assertRaises(ckpt.CkptError) as cm:
                    dev2.write_grad("w", np.zeros(5000, np.float32))
                self.assertEqual(cm.exception.name, "E_DTYPE")
                dev2.write_grad("w", np.zeros(5000, np.float16))
                dev2.write_grad("b", np.zeros(17, np.uint16))
                dev2.write_grad("e", np.zeros(300, np.int16))
                self.assertEqual(dev2.commit(), "committed")
                self.assertEqual(dev2.read_params("w").dtype, np.float16)
        with self.assertRaises(ckpt.CkptError) as cm:
            ckpt.format(os.path.join(self.dir, "x"), make_layout(self.tensors), dtype="fp32")
        self.assertEqual(cm.exception.name, "E_DTYPE")

    def test_unknown_names(self):
        self.full_step(b"one")
        self.assertRefused("E_NAME", self.dev.read_params, "nope")
        self.assertRefused("E_NAME", self.dev.read_state, "W")
        self.dev.begin(self.groups)
        self.assertRefused("E_NAME", self.dev.write_grad, "nope", np.zeros(5000, np.uint16))
        self.assertRefused("E_NAME", self.dev.write_grad, "w ", np.zeros(5000, np.uint16))
        self.dev.abort()
        with tempdir() as d:  # load_params of an unknown name: the library's own check
            p2 = os.path.join(d, "img")
            ckpt.format(p2, make_layout(self.tensors), dtype=self.dtype, chunk_params=CHUNK)
            with ckpt.open(p2) as dev2:
                before = snapshot(dev2)
                with self.assertRaises(ckpt.CkptError) as cm:
                    dev2.load_params({"w": np.ones(5000, np.float32), "nope": np.ones(3, np.float32)})
                self.assertEqual(cm.exception.name, "E_NAME")
                self.assertIn("nope", cm.exception.message)
                self.assertEqual(snapshot(dev2), before)

    def test_gradient_twice(self):
        self.full_step(b"one")
        g = self.grads()
        self.dev.begin(self.groups)
        # b shares chunk 1 with w. b alone: chunk 1 is staged, not applied; again -> E_TWICE
        self.dev.write_grad("b", g["b"])
        self.assertRefused("E_TWICE", self.dev.write_grad, "b", g["b"])
        self.assertRefused("E_TWICE", self.dev.write_grad, "b", np.zeros(17, np.uint16))
        # w completes chunks 0 and 1 (applied); w again, and b again -> E_TWICE
        self.dev.write_grad("w", g["w"])
        self.assertRefused("E_TWICE", self.dev.write_grad, "w", g["w"])
        self.assertRefused("E_TWICE", self.dev.write_grad, "b", g["b"])
        self.dev.write_grad("e", g["e"])
        self.assertRefused("E_TWICE", self.dev.write_grad, "e", np.zeros(300, np.uint16))
        self.assertEqual(self.dev.commit(b"two"), "committed")
        self.assertTrue(self.model.step(2, self.groups, g))
        self.assertMatchesModel()
        self.assertEqual(self.dev.blob(), b"two")

    def test_commit_incomplete_keeps_step_open(self):
        self.full_step(b"one")
        committed = snapshot(self.dev)
        g = self.grads()
        self.dev.begin(self.groups)
        self.assertRefused("E_INCOMPLETE", self.dev.commit, b"x")
        self.dev.write_grad("w", g["w"])
        self.assertRefused("E_INCOMPLETE", self.dev.commit, b"x")
        self.dev.write_grad("b", g["b"])
        self.assertRefused("E_INCOMPLETE", self.dev.commit, b"x")
        info = self.dev.info()
        self.assertEqual((info["committed_step"], info["open_step"]), (1, 2))
        self.assertEqual(self.dev.blob(), b"one")
        # a crash now would restore step 1: a fresh open sees the committed state
        self.dev.close()
        self.dev = ckpt.open(self.path)
        self.assertEqual(snapshot(self.dev), committed)
        # and in the original (not reopened) case, writing the rest completes the step
        self.dev.begin(self.groups)
        for n, _, _ in self.tensors:
            self.dev.write_grad(n, g[n])
        self.assertRefused("E_BLOB", self.dev.commit, b"z" * 2049)
        self.assertEqual(self.dev.commit(b"two"), "committed")
        self.assertTrue(self.model.step(2, self.groups, g))
        self.assertMatchesModel()

    def test_begin_while_open(self):
        self.full_step(b"one")
        self.dev.begin(self.groups)
        self.dev.write_grad("e", self.grads()["e"])
        self.assertRefused("E_STATE", self.dev.begin, self.groups)
        self.assertRefused("E_STATE", self.dev.begin, [{"lr": 1.0}, {"lr": 1.0}], grad_scale=0.5)
        self.assertEqual(self.dev.info()["open_step"], 2)

    def test_load_params_while_open_and_after_first_step(self):
        self.dev.begin(self.groups)
        self.assertRefused("E_STATE", self.dev.load_params, {"w": np.zeros(5000, np.float32)})
        self.dev.abort()
        self.full_step(b"one")
        self.assertRefused("E_STATE", self.dev.load_params, {"w": np.zeros(5000, np.float32)},
                           msg_has="before the first step")
        self.assertRefused("E_STATE", self.dev.load_params, "b", np.zeros(17, np.float32))

    def test_load_params_twice_before_first_step(self):
        """Before the first step load_params may be repeated; the last load wins and
        tensors not named keep their values (moments zero)."""
        w2 = np.full((50, 100), 0.25, np.float32)
        self.dev.load_params("w", w2)
        self.model.state["w"] = (w2.reshape(-1), *self.model.state["w"][1:])
        self.assertMatchesModel()
        self.assertEqual(self.dev.committed_step, 0)
        self.full_step(b"one")

    def test_begin_wrong_groups(self):
        self.full_step(b"one")
        self.assertRefused("E_GROUPS", self.dev.begin, self.groups[:1])
        self.assertRefused("E_GROUPS", self.dev.begin, self.groups + self.groups[:1])
        self.assertRefused("E_GROUPS", self.dev.begin, [])
        # and bad hyperparameters
        self.assertRefused("E_HPARAM", self.dev.begin, [{"lr": float("nan")}, self.groups[1]])
        self.assertRefused("E_HPARAM", self.dev.begin, [{"lr": float("inf")}, self.groups[1]])
        self.assertRefused("E_HPARAM", self.dev.begin, [{"lr": 1e-3, "betas": (1.0, 0.999)}, self.groups[1]])
        for gs in (0.0, -1.0, float("inf"), float("nan")):
            self.assertRefused("E_HPARAM", self.dev.begin, self.groups, grad_scale=gs)
        self.assertRefused("E_HPARAM", self.dev.begin, [{"lr": 1e-3, "momentum": 0.9}, self.groups[1]])
        self.assertRefused("E_HPARAM", self.dev.begin, [{"betas": (0.9, 0.999)}, self.groups[1]])
        self.assertEqual(self.dev.info()["state"], 0)  # still idle
        self.full_step(b"two")

    def test_abort_discards_the_step(self):
        self.full_step(b"one")
        before = snapshot(self.dev)
        junk = self.grads()
        self.dev.begin([{"lr": 0.5, "weight_decay": 0.5}, {"lr": 0.5}])
        for n, _, _ in self.tensors:  # every chunk applied to the other slot
            self.dev.write_grad(n, junk[n])
        self.assertNotEqual(snapshot(self.dev)["tensors"], before["tensors"],
                            "an applied chunk must be readable before commit (pipelining)")
        self.dev.abort()
        self.assertEqual(snapshot(self.dev), before)
        self.assertReopenEquals(before)
        # a partial step, aborted
        self.dev.begin(self.groups)
        self.dev.write_grad("b", junk["b"])
        self.dev.write_grad("e", junk["e"])
        self.dev.abort()
        self.assertEqual(snapshot(self.dev), before)
        # the next begin is the same step number, and the junk left no trace
        self.dev.begin(self.groups)
        self.assertEqual(self.dev.info()["open_step"], 2)
        self.dev.abort()
        self.full_step(b"two")
        self.assertEqual(self.dev.committed_step, 2)  # steps_committed counts since the reopen

    def test_abort_commit_write_without_open_step(self):
        self.assertRefused("E_STATE", self.dev.abort)
        self.assertRefused("E_STATE", self.dev.commit)
        self.full_step(b"one")
        self.assertRefused("E_STATE", self.dev.abort)
        self.assertRefused("E_STATE", self.dev.commit, b"two")
        self.assertRefused("E_STATE", self.dev.write_grad, "w", np.zeros(5000, np.uint16))
        self.assertEqual(self.dev.blob(), b"one")

    def test_read_state_during_open_step_is_committed(self):
        """State reads return the committed step, whatever the open step has applied
        (the kernel target's client reads the committed slot too): what a
        checkpoint taken mid-step holds is a step that exists."""
        self.full_step(b"one")
        committed = snapshot(self.dev)["tensors"]
        g = self.grads()
        self.dev.begin(self.groups)
        for n, _, _ in self.tensors:    # every chunk applied
            self.dev.write_grad(n, g[n])
            self.assertEqual({k: t[:3] for k, t in snapshot(self.dev)["tensors"].items()},
                             {k: t[:3] for k, t in committed.items()}, f"after writing {n}")
        self.assertEqual(self.dev.status()["chunks_done"], self.dev.info()["n_chunks"])
        self.dev.abort()
        self.assertEqual(snapshot(self.dev)["tensors"], committed)
        self.full_step(b"two")          # and the committed step's state once it commits

    def test_read_params_during_open_step(self):
        """PARAM reads return the latest applied values chunk by chunk: a tensor whose
        chunks completed reads new values, one whose chunk is still partial reads old.
        State reads return the committed step's until the step commits."""
        self.full_step(b"one")
        old = {n: as_bits(self.dev.read_params(n)).copy() for n, _, _ in self.tensors}
        old_state = {n: [a.copy() for a in self.model.state[n]] for n, _, _ in self.tensors}
        g = self.grads()
        self.dev.begin(self.groups)
        self.dev.write_grad("b", g["b"])  # chunk 1 partial (w is missing)
        self.assertTrue(np.array_equal(as_bits(self.dev.read_params("b")), old["b"]))
        self.dev.write_grad("e", g["e"])  # chunk 2 complete
        self.model.step(2, self.groups, g)
        self.assertTrue(np.array_equal(as_bits(self.dev.read_params("e")).reshape(-1),
                                       f32_to_lowp_bits(self.model.state["e"][0], self.dtype)))
        self.assertTrue(np.array_equal(as_bits(self.dev.read_params("w")), old["w"]))
        self.dev.write_grad("w", g["w"])
        for n, _, _ in self.tensors:
            self.assertTrue(np.array_equal(as_bits(self.dev.read_params(n)).reshape(-1),
                                           f32_to_lowp_bits(self.model.state[n][0], self.dtype)))
            for a, b in zip(self.dev.read_state(n), old_state[n]):
                self.assertTrue(np.array_equal(a.reshape(-1).view(np.uint32), b.view(np.uint32)), n)
        self.assertEqual(self.dev.committed_step, 1)
        self.assertEqual(self.dev.commit(b"two"), "committed")
        self.assertMatchesModel()

    def test_blob(self):
        self.full_step(b"")
        self.assertEqual(self.dev.blob(), b"")
        big = bytes(np.random.default_rng(3).integers(0, 256, 2048, dtype=np.uint8))
        self.full_step(big)
        self.assertEqual(self.dev.blob(), big)
        self.dev.begin(self.groups)
        g = self.grads()
        for n, _, _ in self.tensors:
            self.dev.write_grad(n, g[n])
        self.assertRefused("E_BLOB", self.dev.commit, big + b"x")
        self.assertRefused("E_BLOB", self.dev.commit, bytes(1 << 16))
        self.assertEqual(self.dev.commit(b"\0three\0"), "committed")
        self.assertEqual(self.dev.blob(), b"\0three\0")
        self.assertTrue(self.model.step(3, self.groups, g))
        self.assertMatchesModel()
        self.dev.close()
        self.dev = ckpt.open(self.path)
        self.assertEqual(self.dev.blob(), b"\0three\0")

    def test_closed_device(self):
        self.dev.close()
        for fn, args in ((self.dev.info, ()), (self.dev.begin, (self.groups,)), (self.dev.commit, ()),
                         (self.dev.read_params, ("w",)), (self.dev.blob, ())):
            with self.assertRaises(ckpt.CkptError) as cm:
                fn(*args)
            self.assertEqual(cm.exception.name, "E_STATE")
        self.dev.close()  # twice is fine


class TestNumerics(EngineCase):
    """Edge values through the engine, checked bit for bit against the exact
    model (which, like the engine, runs without FTZ/DAZ)."""

    def step_with(self, grads, grad_scale=1.0, expect="committed"):
        t = self.dev.committed_step + 1
        before = snapshot(self.dev)
        self.dev.begin(self.groups, grad_scale=grad_scale)
        for n, _, _ in self.tensors:
            self.dev.write_grad(n, grads[n])
        self.assertEqual(self.dev.commit(f"{t}".encode()), expect)
        finite = self.model.step(t, self.groups, grads, grad_scale)
        self.assertEqual(finite, expect == "committed")
        if expect == "overflow":
            self.assertEqual(snapshot(self.dev), before)
        self.assertMatchesModel()

    def scaled(self, mag):
        return {n: f32_to_lowp_bits((self.rng.standard_normal(s) * mag).astype(np.float32), self.dtype)
                .reshape(s) for n, s, _ in self.tensors}

    def test_subnormal_and_huge_values(self):
        # bf16 1e-20: g*g (1e-40) is an fp32 subnormal; 1e-30: g*g underflows
        for mag in (1e-20, 1e-30, 1e-38):
            self.step_with(self.scaled(mag))
        # g*g overflows fp32: torch would store v = inf (and never move the
        # param again); the device skips the step like an overflow
        self.step_with(self.scaled(1e25), expect="overflow")
        self.step_with(self.scaled(1.0))

    def test_grad_scale_edges(self):
        g = self.scaled(1.0)
        # finite bf16 gradients whose scaled value is Inf: the step is skipped
        self.step_with(g, grad_scale=1e38, expect="overflow")
        self.step_with(g, grad_scale=2.0 ** -100)
        # a grad_scale that is not a positive finite fp32 once rounded is refused
        self.assertRefused("E_HPARAM", self.dev.begin, self.groups, grad_scale=1e39)
        self.assertRefused("E_HPARAM", self.dev.begin, self.groups, grad_scale=1e-50)
        self.step_with(g, grad_scale=0.75)

    def test_nonfinite_anywhere(self):
        """A non-finite value at the first or last element of any tensor skips the step."""
        inf = 0x7F80 if self.dtype == "bf16" else 0x7C00
        nan = 0xFFC1 if self.dtype == "bf16" else 0xFE01  # negative NaN with a payload
        for n, _, _ in self.tensors:
            for idx in (0, -1):
                for bad in (inf, nan):
                    g = self.scaled(0.1)
                    g[n].reshape(-1)[idx] = bad
                    self.step_with(g, expect="overflow")
        self.assertEqual(self.dev.info()["steps_skipped"], 4 * len(self.tensors))
        self.assertEqual(self.dev.committed_step, 0)
        self.step_with(self.scaled(0.1))


class TestNumericsFp16(TestNumerics):
    dtype = "fp16"

    def test_subnormal_and_huge_values(self):
        # fp16 subnormal gradients (< 6.1e-5), and 65504 with grad_scale 1e30:
        # finite, but g*g overflows fp32: v would be inf, the step is skipped
        for mag in (1e-5, 1e-7):
            self.step_with(self.scaled(mag))
        g = {n: np.full(s, 65504, np.float16) for n, s, _ in self.tensors}
        self.step_with(g, grad_scale=1e30, expect="overflow")
        self.step_with(g, grad_scale=1e10)
        self.step_with(self.scaled(1.0), grad_scale=1.0 / 3000)

    def test_grad_scale_edges(self):
        g = {n: np.full(s, 65504, np.float16) for n, s, _ in self.tensors}
        self.step_with(g, grad_scale=1e34, expect="overflow")  # 65504 * 1e34 > fp32 max
        self.step_with(g, grad_scale=1e33, expect="overflow")  # finite, but v = g * g is not
        self.step_with(g, grad_scale=1e10)


class TestImages(EngineCase):
    def assertOpenFails(self, path, name, *words):
        with self.assertRaises(ckpt.CkptError) as cm:
            ckpt.open(path)
        e = cm.exception
        self.assertEqual(e.name, name, f"message: {e.message}")
        self.assertIn(path, e.message)
        for w in words:
            self.assertIn(w, e.message.lower())
        return e

    def test_not_an_image(self):
        rnd = os.path.join(self.dir, "random")
        with open(rnd, "wb") as f:
            f.write(np.random.default_rng(1).integers(0, 256, 1 << 20, dtype=np.uint8).tobytes())
        self.assertOpenFails(rnd, "E_MAGIC", "not a usable dm-ckpt image", "magic")
        zeros = os.path.join(self.dir, "zeros")
        with open(zeros, "wb") as f:
            f.write(bytes(1 << 20))
        self.assertOpenFails(zeros, "E_MAGIC", "not a usable dm-ckpt image", "magic")
        for size in (0, 100, 8191):
            tiny = os.path.join(self.dir, f"tiny{size}")
            with open(tiny, "wb") as f:
                f.write(bytes(size))
            self.assertOpenFails(tiny, "E_NO_SB", "not a dm-ckpt image", "too small")
        with self.assertRaises(ckpt.CkptError) as cm:
            ckpt.open(os.path.join(self.dir, "missing"))
        self.assertEqual(cm.exception.name, "E_IO")
        self.assertIn("no such file", cm.exception.message.lower())
        # the files were not changed by the attempts
        with open(zeros, "rb") as f:
            self.assertEqual(f.read(), bytes(1 << 20))

    def truncated_copies(self):
        size = os.path.getsize(self.path)
        for cut in (size // 2, size - 4096, 3 * 4096):
            p = os.path.join(self.dir, f"trunc{cut}")
            shutil.copyfile(self.path, p)
            os.truncate(p, cut)
            yield p

    def committed_plo_offset(self, name):
        """Byte offset of tensor name's first committed p_lo (from the newest
        superblock copy: ckpt_sb_disk's plo_off and committed_slot)."""
        with open(self.path, "rb") as f:
            copies = [f.read(4096), f.read(4096)]
        sb = max((c for c in copies if c[:4] == b"CKPT"), key=lambda c: struct.unpack_from("<Q", c, 48)[0])
        plo_off = struct.unpack_from("<2Q", sb, 112)
        slot = struct.unpack_from("<I", sb, 160)[0]
        t = [x for x in self.dev.tensors() if x["name"] == name][0]
        return plo_off[slot] + 2 * t["offset"]

    def test_flipped_params_bit_fails_read_params(self):
        """A flipped bit in committed p_lo must not come back into a resumed
        model: the p_lo checksum in the record header catches it on open."""
        self.full_step(b"one")
        self.dev.close()
        off = self.committed_plo_offset("e") + 6
        with open(self.path, "r+b") as f:
            f.seek(off)
            c = f.read(1)[0]
            f.seek(off)
            f.write(bytes([c ^ 0x04]))
        self.dev = ckpt.open(self.path)
        with self.assertRaises(ckpt.CkptError) as cm:
            self.dev.read_params("e")
        e = cm.exception
        self.assertEqual(e.name, "E_RECORD", e.message)
        self.assertIn("'e'", e.message)
        self.assertIn("chunk 2", e.message)
        self.assertIn("p_lo checksum mismatch", e.message)
        self.dev.read_params("w")  # chunks 0 and 1 are intact

    def test_truncated_image_after_steps(self):
        self.full_step(b"one")
        self.dev.close()
        for p in self.truncated_copies():
            self.assertOpenFails(p, "E_TOO_SMALL", "smaller than the layout")
        self.dev = ckpt.open(self.path)  # the original is fine
        self.assertEqual(self.dev.committed_step, 1)

    def test_truncated_fresh_image(self):
        """A freshly formatted image (only superblock copy 1 written) truncated:
        the never-written copy 0 (bad magic) must not hide copy 1's E_TOO_SMALL
        (ckpt_sb_pick reports the more specific error; it used to say E_MAGIC)."""
        with tempdir() as d:
            p0 = os.path.join(d, "fresh")
            ckpt.format(p0, make_layout(self.tensors), dtype=self.dtype, chunk_params=CHUNK)
            size = os.path.getsize(p0)
            os.truncate(p0, size - 4096)
            self.assertOpenFails(p0, "E_TOO_SMALL", "smaller than the layout")

    def test_corrupt_newest_superblock_copy(self):
        self.full_step(b"one")
        s1 = snapshot(self.dev)
        self.full_step(b"two")
        s2 = snapshot(self.dev)
        self.dev.close()
        with open(self.path, "rb") as f:
            head = f.read(8192)
        results = {}
        for copy in (0, 1):
            for off in (8, 40, 200, 4000):  # header fields, commit record, tail of the block
                p = os.path.join(self.dir, f"flip{copy}_{off}")
                shutil.copyfile(self.path, p)
                with open(p, "r+b") as f:
                    f.seek(copy * 4096 + off)
                    f.write(bytes([head[copy * 4096 + off] ^ 0x20]))
                with ckpt.open(p) as dev:
                    results[(copy, off)] = dev.committed_step
                    want = {2: s2, 1: s1}.get(dev.committed_step)
                    self.assertIsNotNone(want, f"copy {copy} byte {off}: step {dev.committed_step}")
                    self.assertEqual(snapshot(dev), want)
        # corrupting the newest copy falls back to the other one (step 1); the
        # older copy's corruption does not matter (step 2)
        per_copy = {c: {results[(c, o)] for o in (8, 40, 200, 4000)} for c in (0, 1)}
        self.assertEqual(sorted(map(tuple, per_copy.values())), [(1,), (2,)], results)
        newest = [c for c in (0, 1) if per_copy[c] == {1}][0]
        # after the fallback the device carries on: step 2 again, durable, over
        # the corrupt copy (never over the only valid one)
        p = os.path.join(self.dir, f"flip{newest}_40")
        self.dev = ckpt.open(p)
        self.path = p
        # the model restarts from step 1's state (the snapshot), then a new step 2
        for n, _, _ in self.tensors:
            p_, m_, v_ = (np.frombuffer(b, np.float32).copy() for b in s1["tensors"][n][:3])
            self.model.state[n] = (p_, m_, v_)
        self.full_step(b"two again")
        s2b = snapshot(self.dev)
        self.dev.close()
        self.dev = ckpt.open(p)
        self.assertEqual(snapshot(self.dev), s2b)
        # both copies corrupt: a clean error, no guessing
        with open(p, "r+b") as f:
            for copy in (0, 1):
                f.seek(copy * 4096 + 40)
                b = f.read(1)
                f.seek(copy * 4096 + 40)
                f.write(bytes([b[0] ^ 0x20]))
        self.dev.close()
        self.assertOpenFails(p, "E_CRC", "checksum")

    def test_damaged_copies_are_reported(self):
        """Opening around a damaged copy is not silent: the device's warnings
        list and a CkptWarning say which copy and why (a corrupt newest
        superblock copy costs a step: it may have been a lost commit)."""
        self.full_step(b"one")
        self.full_step(b"two")
        self.dev.close()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            with ckpt.open(self.path) as dev:
                self.assertEqual(dev.warnings, [])
        self.assertEqual([w for w in caught if issubclass(w.category, ckpt.CkptWarning)], [])
        with open(self.path, "rb") as f:
            head = f.read(8192)
        seq = [int.from_bytes(head[k * 4096 + 48:k * 4096 + 56], "little") for k in (0, 1)]
        newest = 0 if seq[0] > seq[1] else 1
        p = os.path.join(self.dir, "flip")
        shutil.copyfile(self.path, p)
        with open(p, "r+b") as f:
            f.seek(newest * 4096 + 200)
            f.write(bytes([head[newest * 4096 + 200] ^ 1]))
        with self.assertWarns(ckpt.CkptWarning) as cm:
            dev = ckpt.open(p)
        with dev:
            self.assertEqual(dev.committed_step, 1)
            self.assertEqual(len(dev.warnings), 1, dev.warnings)
            self.assertIn(f"superblock copy {newest}", dev.warnings[0])
            self.assertIn("checksum mismatch", dev.warnings[0])
            self.assertIn("may have been lost", dev.warnings[0])
        self.assertIn(p, str(cm.warning))
        self.assertEqual(cm.filename, __file__)  # points at the caller of ckpt.open
        # a damaged manifest copy: the other one is used
        shutil.copyfile(self.path, p)
        with open(p, "r+b") as f:
            f.seek(4096 * 3 + 10)  # manifest copy 0 (after one block of group table)
            b = f.read(1)
            f.seek(4096 * 3 + 10)
            f.write(bytes([b[0] ^ 1]))
        with self.assertWarns(ckpt.CkptWarning):
            dev = ckpt.open(p)
        with dev:
            self.assertEqual(dev.committed_step, 2)
            self.assertEqual(len(dev.warnings), 1, dev.warnings)
            self.assertIn("manifest copy 0", dev.warnings[0])

    def test_format_size(self):
        with self.assertRaises(ckpt.CkptError) as cm:
            ckpt.format(os.path.join(self.dir, "small"), make_layout(self.tensors), dtype=self.dtype,
                        chunk_params=CHUNK, size=8192)
        self.assertEqual(cm.exception.name, "E_TOO_SMALL")
        self.assertIn("too small", cm.exception.message)
        need = os.path.getsize(self.path)
        with self.assertRaises(ckpt.CkptError) as cm:
            ckpt.format(os.path.join(self.dir, "small2"), make_layout(self.tensors), dtype=self.dtype,
                        chunk_params=CHUNK, size=need - 4096)
        self.assertEqual(cm.exception.name, "E_TOO_SMALL")
        big = os.path.join(self.dir, "big")
        ckpt.format(big, make_layout(self.tensors), dtype=self.dtype, chunk_params=CHUNK, size=need + (1 << 20))
        self.assertEqual(os.path.getsize(big), need + (1 << 20))
        with ckpt.open(big) as dev:
            self.assertEqual(dev.committed_step, 0)
            self.assertEqual([t["name"] for t in dev.tensors()], ["w", "b", "e"])
        for cp in (3000, 1024, 0, 1 << 23):
            with self.assertRaises(ckpt.CkptError) as cm:
                ckpt.format(os.path.join(self.dir, "geo"), make_layout(self.tensors), chunk_params=cp)
            self.assertEqual(cm.exception.name, "E_GEOMETRY", f"chunk_params {cp}")

    def test_format_over_an_image_starts_fresh(self):
        self.full_step(b"one")
        self.dev.close()
        ckpt.format(self.path, make_layout(self.tensors[:1]), dtype="fp16", chunk_params=2048)
        self.dev = ckpt.open(self.path)
        self.assertEqual(self.dev.committed_step, 0)
        self.assertEqual(self.dev.blob(), b"")
        self.assertEqual(self.dev.dtype, "fp16")
        p, m, v = self.dev.read_state("w")
        self.assertFalse(p.any() or m.any() or v.any())


class TestLayouts(unittest.TestCase):
    def test_layout_bad_input(self):
        cases = [
            ("duplicate name", [("w", (3,), 0), ("w", (4,), 0)]),
            ("group 64", [("w", (3,), 64)]),
            ("group 2**32-1", [("w", (3,), 2**32 - 1)]),
            ("zero dim", [("w", (3, 0, 2), 0)]),
            ("zero dim 1-d", [("w", (0,), 0)]),
            ("empty name", [("", (3,), 0)]),
            ("control character", [("a\nb", (3,), 0)]),
            ("9 dims", [("w", (1,) * 9, 0)]),
            ("2**41 elements", [("w", (2**21, 2**20), 0)]),
        ]
        for what, tensors in cases:
            layout = ckpt.Layout()
            with self.assertRaises(ckpt.CkptError, msg=what) as cm:
                for n, s, g in tensors:
                    layout.add(n, s, g)
            self.assertEqual(cm.exception.name, "E_INVAL", what)
            self.assertTrue(cm.exception.message)
            self.assertEqual(len(layout.tensors), len(tensors) - 1, what)  # the bad one is not kept
        with self.assertRaises(TypeError):
            ckpt.Layout().add(b"bytes", (3,))
        with tempdir() as d:
            with self.assertRaises(ckpt.CkptError) as cm:
                ckpt.format(os.path.join(d, "img"), ckpt.Layout())
            self.assertEqual(cm.exception.name, "E_INVAL")
            # a refused add leaves a usable layout: format it
            layout = ckpt.Layout().add("w", (3,), 63)
            with self.assertRaises(ckpt.CkptError):
                layout.add("w", (3,), 0)
            ckpt.format(os.path.join(d, "img"), layout, chunk_params=2048)
            with ckpt.open(os.path.join(d, "img")) as dev:
                self.assertEqual(dev.info()["n_groups"], 64)
                self.assertEqual(len(dev.tensors()), 1)
                dev.begin([{"lr": 1e-3}] * 64)
                dev.write_grad("w", np.zeros(3, np.uint16))
                self.assertEqual(dev.commit(), "committed")


class TestShapes(EngineCase):
    """Many tensors, tensors bigger than a chunk, and a sparse group set."""

    def run_steps(self, n):
        for i in range(n):
            self.full_step(f"s{i}".encode())
        self.dev.close()
        self.dev = ckpt.open(self.path)
        self.assertEqual(self.dev.committed_step, n)
        self.assertMatchesModel()


class TestManyTensors(TestShapes):
    chunk = 8192
    tensors = [(f"layer{i:03d}.{'weight' if i % 3 else 'bias'}", (1 + (i * 37) % 97,) if i % 3 == 0
                else (3, 1 + (i * 13) % 700), i % 3) for i in range(150)]
    groups = [{"lr": 1e-3}, {"lr": 2e-3, "weight_decay": 0.0}, {"lr": 5e-4, "betas": (0.5, 0.6)}]
    shuffle = True

    def test_many_tensors(self):
        ts = self.dev.tensors()
        self.assertEqual([(t["name"], t["shape"], t["group"]) for t in ts],
                         [(n, s, g) for n, s, g in self.tensors])
        offs = [t["offset"] for t in ts]
        self.assertEqual(len(set(offs)), len(offs))
        self.run_steps(3)


class TestBigTensors(TestShapes):
    chunk = 2048
    tensors = [("big", (3, 3001), 0), ("odd", (2049,), 0), ("one", (1,), 0), ("huge", (5, 7, 300), 1)]
    groups = [{"lr": 1e-2}, {"lr": 1e-3, "eps": 1e-4}]

    def test_tensors_bigger_than_a_chunk(self):
        ts = {t["name"]: t for t in self.dev.tensors()}
        self.assertEqual(ts["big"]["numel"], 9003)
        self.assertGreater(ts["big"]["numel"], self.dev.info()["chunk_params"] * 4)
        self.run_steps(3)


class TestSparseGroups(TestShapes):
    tensors = [("a", (1000,), 0), ("c", (700,), 2), ("a2", (10,), 0)]
    groups = [{"lr": 1e-3}, {"lr": 123.0, "weight_decay": 0.9}, {"lr": 1e-2, "betas": (0.5, 0.9)}]

    def test_groups_0_and_2(self):
        self.assertEqual(self.dev.info()["n_groups"], 3)
        self.assertRefused("E_GROUPS", self.dev.begin, self.groups[:2])
        self.assertRefused("E_GROUPS", self.dev.begin, [self.groups[0], self.groups[2]])
        # group 1 has no tensor: its (wild) hyperparameters change nothing; the
        # model applies group 2's to "c" (the exact check would see a mix-up)
        self.run_steps(2)


if __name__ == "__main__":
    unittest.main()
