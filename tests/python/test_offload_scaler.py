# SPDX-License-Identifier: MIT
"""ckpt.torch.LossScaler: torch.cuda.amp.GradScaler's dynamic loss scaling for fp16 devices.

GradScaler's documented behaviour (torch/cuda/amp/grad_scaler.py, 1.13): "If
inf/NaN gradients occur in an iteration, optimizer.step() is skipped and the
scale is multiplied by backoff_factor; if no inf/NaN gradients occur for
growth_interval consecutive iterations, the scale is multiplied by
growth_factor"; its update (the _amp_update_scale_ kernel) restarts the count
of good iterations at 0 after either event and keeps the old scale if the grown
one is not finite. Defaults init_scale=2**16, growth_factor=2,
backoff_factor=0.5, growth_interval=2000. torch 1.13 has that kernel for CUDA
only, so the reference below is written from that description; what can be
checked against torch itself is (defaults, state_dict format) is.

The device detects the non-finite gradients (fp16(g x scale) overflows) and
skips the step itself; the test compares the whole run, step results, scales
and fp32 masters, with a torch AdamW that skips the same steps.

Run: PYTHONPATH=<build>/python /usr/bin/python3 -m unittest -v test_offload_scaler
"""

import inspect
import os
import sys
import unittest
from unittest import mock

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import numpy as np  # noqa: E402
import torch  # noqa: E402

from ckpt.torch import LossScaler, OffloadAdamW  # noqa: E402
from ckpt_testlib import tempdir  # noqa: E402

torch.set_num_threads(1)


class DocumentedGradScaler:
    """GradScaler.update() as documented (see the module docstring)."""

    def __init__(self, init_scale=2.0 ** 16, growth_factor=2.0, backoff_factor=0.5, growth_interval=2000):
        self.scale = np.float32(init_scale)
        self.gf, self.bf, self.gi = growth_factor, backoff_factor, growth_interval
        self.tracker = 0

    def update(self, found_inf):
        if found_inf:
            self.scale = np.float32(self.scale * np.float32(self.bf))
            self.tracker = 0
        else:
            self.tracker += 1
            if self.tracker == self.gi:
                with np.errstate(over="ignore"):
                    grown = np.float32(self.scale * np.float32(self.gf))
                if np.isfinite(grown):
                    self.scale = grown
                self.tracker = 0


class FakeOptimizer:
    """Stands for OffloadAdamW in the pure update-rule test: reports a given result."""

    def __init__(self):
        self.result, self.grad_scales, self.unscale = None, [], None

    def step(self, grad_scale=None):
        self.grad_scales.append(grad_scale)
        self.last_result = self.result

    def set_grad_unscale(self, f):
        self.unscale = f


def model_and_data(seed=0):
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Tanh(), torch.nn.Linear(32, 4))
    rng = np.random.default_rng(seed)
    return model, rng


# torch 2's GradScaler runs on the CPU (torch.amp.GradScaler("cpu")); torch
# 1.13's is CUDA's only, disabled on a CPU-only torch (its state_dict code is
# plain Python, enabled for the test by a patch; its update() has no CPU kernel).
TORCH_AMP = hasattr(torch, "amp") and hasattr(torch.amp, "GradScaler")
GradScaler = torch.amp.GradScaler if TORCH_AMP else torch.cuda.amp.GradScaler


def cpu_grad_scaler(**kw):
    if TORCH_AMP:
        return torch.amp.GradScaler("cpu", **kw)
    with mock.patch("torch.cuda.amp.grad_scaler.amp_definitely_not_available", lambda: False):
        return torch.cuda.amp.GradScaler(**kw)


class LossScalerTest(unittest.TestCase):
    def test_defaults_and_state_dict_are_gradscalers(self):
        sig = inspect.signature(GradScaler.__init__).parameters
        mine = inspect.signature(LossScaler.__init__).parameters
        for k in ("init_scale", "growth_factor", "backoff_factor", "growth_interval", "enabled"):
            self.assertEqual(mine[k].default, sig[k].default, k)
        gs = cpu_grad_scaler(init_scale=1024.0, growth_interval=7)
        self.assertTrue(gs.is_enabled())
        gs.load_state_dict(dict(gs.state_dict(), _growth_tracker=3))
        theirs = gs.state_dict()
        s = LossScaler()
        s.load_state_dict(theirs)
        self.assertEqual(s.state_dict(), theirs)
        self.assertEqual(s.get_scale(), 1024.0)
        s2 = LossScaler(init_scale=8.0, growth_interval=5)
        gs.load_state_dict(s2.state_dict())
        self.assertEqual(gs.state_dict(), s2.state_dict())

    def test_update_rule(self):
        """A long random sequence of overflows: the same scales as documented GradScaler."""
        rng = np.random.default_rng(0)
        for kw in ({}, {"growth_interval": 3}, {"growth_interval": 1, "growth_factor": 4.0,
                                                 "backoff_factor": 0.25, "init_scale": 2.0 ** 120}):
            with self.subTest(**kw):
                mine, ref, opt = LossScaler(**kw), DocumentedGradScaler(**kw), FakeOptimizer()
                for i in range(3000):
                    found_inf = bool(rng.random() < (0.002 if not kw else 0.2))
                    opt.result = "overflow" if found_inf else "committed"
                    scale = mine.get_scale()
                    self.assertEqual(scale, float(ref.scale), i)
                    self.assertEqual(mine.scale(torch.tensor(3.0)).item(), 3.0 * scale)
                    ret = mine.step(opt)
                    self.assertEqual(opt.grad_scales[-1], 1.0 / scale)
                    self.assertIs(mine.found_inf, found_inf)
                    self.assertIsNone(ret)
                    # between step and update, state_dict() is the state after update
                    pre = mine.state_dict()
                    mine.update()
                    ref.update(found_inf)
                    self.assertEqual(pre, mine.state_dict())
                    self.assertEqual(mine.state_dict()["_growth_tracker"], ref.tracker)
                self.assertTrue(np.isfinite(mine.get_scale()))

    def test_unscale_then_step(self):
        s, opt = LossScaler(init_scale=256.0), FakeOptimizer()
        s.unscale_(opt)
        self.assertEqual(opt.unscale, 1 / 256)
        with self.assertRaises(RuntimeError):
            s.unscale_(opt)
        opt.result = "committed"
        s.step(opt)
        s.update()
        s.unscale_(opt)  # allowed again after update()
        with self.assertRaises(RuntimeError):
            LossScaler().update()  # no step

    def test_new_scale_and_disabled(self):
        s = LossScaler()
        s.update(new_scale=12.0)
        self.assertEqual(s.get_scale(), 12.0)
        d = LossScaler(enabled=False)
        t = torch.tensor(2.0)
        self.assertIs(d.scale(t), t)
        self.assertEqual(d.get_scale(), 1.0)
        self.assertEqual(d.state_dict(), {})

    def test_fp16_run_against_torch(self):
        """An fp16 device with LossScaler against torch AdamW skipping the same steps.

        The loss scale starts at 2**16, too large for these gradients in fp16: the
        first steps overflow and back off, as with GradScaler; with
        growth_interval=4 the scale then grows until it overflows again.
        """
        with tempdir() as d:
            model, rng = model_and_data()
            init = {n: p.detach().clone() for n, p in model.named_parameters()}
            opt = OffloadAdamW(model.named_parameters(), os.path.join(d, "s.img"), lr=1e-2, dtype="fp16")
            names = opt.names()
            by_name = dict(model.named_parameters())
            ref = {n: torch.nn.Parameter(init[n].clone()) for n in names}
            ref_opt = torch.optim.AdamW([ref[n] for n in names], lr=1e-2, foreach=False)
            scaler, ref_scaler = LossScaler(growth_interval=4), DocumentedGradScaler(growth_interval=4)
            results = []
            committed = 0
            for i in range(60):
                x = torch.from_numpy(rng.standard_normal((64, 16)).astype(np.float32))
                y = torch.from_numpy(rng.standard_normal((64, 4)).astype(np.float32))
                loss = ((model(x) - y) ** 2).sum()   # a sum: gradients of order 10-100
                scaler.scale(loss).backward()
                S = scaler.get_scale()
                # what the device gets: fp16(g * S); non-finite -> the step is skipped
                g16 = {n: by_name[n].grad.to(torch.float16) for n in names}
                found_inf = not all(bool(torch.isfinite(g).all()) for g in g16.values())
                before = {n: p.detach().clone() for n, p in model.named_parameters()}
                scaler.step(opt)
                self.assertEqual(opt.last_result, "overflow" if found_inf else "committed", i)
                results.append(opt.last_result)
                if found_inf:
                    self.assertEqual(opt.committed_step, committed)
                    for n, p in model.named_parameters():
                        self.assertTrue(torch.equal(p.detach(), before[n]), n)
                else:
                    committed += 1
                    self.assertEqual(opt.committed_step, committed)
                    for n in names:
                        ref[n].grad = g16[n].to(torch.float32) * np.float32(1.0 / S)
                    ref_opt.step()
                scaler.update()
                ref_scaler.update(found_inf)
                self.assertEqual(scaler.get_scale(), float(ref_scaler.scale), i)
                opt.zero_grad()
            n_over = results.count("overflow")
            self.assertGreaterEqual(n_over, 3, results)        # the initial back-off...
            self.assertEqual(results[:2], ["overflow", "overflow"])
            self.assertIn("overflow", results[10:], results)   # ...and after growing again
            self.assertGreater(committed, 30)
            for n in names:
                p = opt.read_state(n)[0].numpy()
                r = ref[n].detach().numpy()
                # the AdamW tolerance of test_offload_adamw (RTOL 5e-6, ATOL_REL 1e-6)
                tol = 5e-6 * np.abs(r) + 1e-6 * np.abs(r).max()
                self.assertTrue(np.all(np.abs(p - r) <= tol), f"{n}: {np.abs(p - r).max()}")
            opt.close()


class TorchGradScalerTest(unittest.TestCase):
    """OffloadAdamW under torch's own GradScaler: GradScaler.step(opt) hands the
    scaler to step(), the device unscales and finds the overflows, update() hears
    of them."""

    def run_fp16(self, scaler_kind, hooks=True, unscale_and_clip=False, steps=40):
        """(results, scales, fp32 masters) of an fp16 device trained under a scaler."""
        with tempdir() as d:
            model, rng = model_and_data()
            opt = OffloadAdamW(model.named_parameters(), os.path.join(d, "s.img"), lr=1e-2,
                               dtype="fp16", hooks=hooks)
            scaler = LossScaler(growth_interval=4) if scaler_kind == "ckpt" else \
                torch.amp.GradScaler("cpu", growth_interval=4)
            results, scales = [], []
            for _ in range(steps):
                x = torch.from_numpy(rng.standard_normal((64, 16)).astype(np.float32))
                y = torch.from_numpy(rng.standard_normal((64, 4)).astype(np.float32))
                scales.append(float(scaler.get_scale()))
                scaler.scale(((model(x) - y) ** 2).sum()).backward()
                if unscale_and_clip:
                    scaler.unscale_(opt)
                    torch.nn.utils.clip_grad_norm_(model.parameters(), 10.0)
                scaler.step(opt)
                scaler.update()
                results.append(opt.last_result)
                opt.zero_grad()
            masters = {n: opt.read_state(n)[0].clone() for n in opt.names()}
            opt.close()
            return results, scales, masters

    def assert_same_masters(self, a, b):
        self.assertEqual(a.keys(), b.keys())
        for n in a:
            self.assertTrue(torch.equal(a[n], b[n]), n)

    @unittest.skipUnless(TORCH_AMP, "torch 1.13: see test_torch_1_13_grad_scaler_is_disabled_on_the_cpu")
    def test_torch_grad_scaler_equals_loss_scaler(self):
        """The same run, bit for bit, as under LossScaler: the first steps
        overflow in fp16 only (fp32 x 2**16 is finite), so GradScaler backs off
        only because step() told it the device skipped."""
        mine = self.run_fp16("ckpt")
        theirs = self.run_fp16("torch")
        self.assertEqual(mine[0][:2], ["overflow", "overflow"])
        self.assertIn("committed", mine[0])
        self.assertEqual(theirs[0], mine[0])
        self.assertEqual(theirs[1], mine[1])
        self.assert_same_masters(theirs[2], mine[2])
        # hooks=False writes every gradient in step(): the same bytes
        self.assert_same_masters(self.run_fp16("torch", hooks=False)[2], theirs[2])

    @unittest.skipUnless(TORCH_AMP, "torch 1.13: see test_torch_1_13_grad_scaler_is_disabled_on_the_cpu")
    def test_unscale_and_torch_clip(self):
        """scaler.unscale_(opt) and torch's clip_grad_norm_ edit .grad after
        backward: the device gets the unscaled, clipped gradients (grad_scale 1),
        with hooks as without; no overflow, so the scale grows every 4 steps."""
        with_hooks = self.run_fp16("torch", unscale_and_clip=True, steps=12)
        without = self.run_fp16("torch", hooks=False, unscale_and_clip=True, steps=12)
        self.assertEqual(with_hooks[0], ["committed"] * 12)
        self.assertEqual(with_hooks[1], [2.0 ** (16 + i // 4) for i in range(12)])
        self.assertEqual(without[:2], with_hooks[:2])
        self.assert_same_masters(with_hooks[2], without[2])

    @unittest.skipUnless(TORCH_AMP, "torch 1.13: see test_torch_1_13_grad_scaler_is_disabled_on_the_cpu")
    def test_torch_grad_scaler_without_the_keyword(self):
        """GradScaler's newer contract, which it follows where step()'s signature
        hides grad_scaler (a wrapper such as Accelerate's): it sets opt.grad_scale
        and opt.found_inf around step(). On a bf16 device (no overflow) the run
        is LossScaler's bit for bit; an overflow only the device sees warns."""
        def wrapped(opt):
            step = opt.step

            def no_keyword(*args, **kw):
                return step(*args, **kw)
            opt.step = no_keyword

        runs = []
        for kind in ("ckpt", "torch"):
            with tempdir() as d:
                model, rng = model_and_data()
                opt = OffloadAdamW(model.named_parameters(), os.path.join(d, "s.img"), lr=1e-2, dtype="bf16")
                scaler = LossScaler(growth_interval=4) if kind == "ckpt" else \
                    torch.amp.GradScaler("cpu", growth_interval=4)
                if kind == "torch":
                    wrapped(opt)
                for _ in range(10):
                    x = torch.from_numpy(rng.standard_normal((64, 16)).astype(np.float32))
                    y = torch.from_numpy(rng.standard_normal((64, 4)).astype(np.float32))
                    scaler.scale(((model(x) - y) ** 2).sum()).backward()
                    scaler.step(opt)
                    scaler.update()
                    self.assertEqual(opt.last_result, "committed")
                    opt.zero_grad()
                runs.append(({n: opt.read_state(n)[0].clone() for n in opt.names()}, float(scaler.get_scale())))
                opt.close()
        self.assertEqual(runs[0][1], runs[1][1])
        self.assertEqual(runs[0][1], 2.0 ** 16 * 4)     # grew at steps 4 and 8
        self.assert_same_masters(runs[0][0], runs[1][0])
        with tempdir() as d:
            model, rng = model_and_data()
            opt = OffloadAdamW(model.named_parameters(), os.path.join(d, "s.img"), lr=1e-2, dtype="fp16")
            wrapped(opt)
            scaler = torch.amp.GradScaler("cpu")
            x = torch.from_numpy(rng.standard_normal((64, 16)).astype(np.float32))
            scaler.scale(((model(x)) ** 2).sum() * 100).backward()
            with self.assertWarnsRegex(RuntimeWarning, "cannot be told"):
                scaler.step(opt)
            self.assertEqual(opt.last_result, "overflow")
            opt.close()

    @unittest.skipIf(TORCH_AMP, "torch 2: the GradScaler runs on the CPU (the tests above)")
    def test_torch_1_13_grad_scaler_is_disabled_on_the_cpu(self):
        """torch 1.13's GradScaler is disabled without CUDA: scale() is the loss,
        step(opt) a plain opt.step()."""
        with tempdir() as d:
            model, rng = model_and_data()
            opt = OffloadAdamW(model.named_parameters(), os.path.join(d, "s.img"), lr=1e-2, dtype="fp16")
            gs = torch.cuda.amp.GradScaler()
            self.assertFalse(gs.is_enabled())
            x = torch.from_numpy(rng.standard_normal((64, 16)).astype(np.float32))
            loss = (model(x) ** 2).mean()
            self.assertIs(gs.scale(loss), loss)
            loss.backward()
            gs.step(opt)
            gs.update()
            self.assertEqual((opt.last_result, opt.committed_step), ("committed", 1))
            opt.close()


if __name__ == "__main__":
    unittest.main()
