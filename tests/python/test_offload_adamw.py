# SPDX-License-Identifier: MIT
"""ckpt.torch.OffloadAdamW: a torch.optim.Optimizer whose AdamW runs on a device.

- 100 steps of a small model against torch.optim.AdamW(foreach=False) fed the
  same bf16 gradients: the device's fp32 masters (read_state) within the
  oracle's tolerance of torch's params, bit for bit equal to the exact numpy
  replay of the engine's update (so the optimizer sent exactly the lr, betas,
  eps, weight decay and gradients of its param_groups), and the model's params
  the bf16 rounding of the masters (see test_matches_torch_adamw for the 1-ulp
  argument);
- a fresh path is formatted for the params (names, shapes, groups), the model's
  values become the masters; reopening resumes (committed step, blob, params
  back into the model); a different model is refused with a clear error;
- state_dict/load_state_dict point at the device's committed step;
- LR schedulers (StepLR, LambdaLR) change the lr the device applies;
- clip_grad_norm_ folds torch's clip coefficient into the device's grad_scale.

Run: PYTHONPATH=<build>/python /usr/bin/python3 -m unittest -v test_offload_adamw
"""

import math
import os
import sys
import unittest
import warnings

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import numpy as np  # noqa: E402
import torch  # noqa: E402

import ckpt  # noqa: E402
import ckpt.torch  # noqa: E402
from ckpt.torch import LayoutMismatchError, OffloadAdamW  # noqa: E402
from ckpt_testlib import Model, f32_to_bf16_bits, tempdir  # noqa: E402

torch.set_num_threads(1)

# Tolerance of the fp32 masters against torch's params, as in test_oracle (see
# its TOLERANCE note): |d| <= RTOL*|torch| + ATOL_REL*max|torch over the tensor|.
# torch's CPU AdamW and the device compute the same formulas with a different
# op order (addcmul_ computes v + (value*g)*g, the device v + (g*g)*value) and
# torch's vectorized kernels may contract to FMA, so each step differs by ~1 ulp
# per operation; the differences random-walk over the steps and are largest
# relative to near-zero values (cancellation), hence the term in the tensor's
# scale. Measured here over 100 steps: max ratio to the tolerance ~0.1.
RTOL = 5e-6
ATOL_REL = 1e-6


def tol_ratio(got, ref):
    ref = np.asarray(ref, np.float64)
    d = np.abs(np.asarray(got, np.float64) - ref)
    mx = max(np.abs(ref).max(), 1e-30)
    return float((d / (RTOL * np.abs(ref) + ATOL_REL * mx)).max())


def bf16_round(t):
    return t.detach().to(torch.bfloat16).to(torch.float32)


def make_model(seed=0, hidden=48):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(20, hidden), torch.nn.LayerNorm(hidden), torch.nn.GELU(),
                               torch.nn.Linear(hidden, 8))


def groups_of(model, wd=0.05, lr=None):
    """Two param groups: matrices with weight decay, vectors without."""
    named = list(model.named_parameters())
    g0 = {"params": [(n, p) for n, p in named if p.dim() == 2], "weight_decay": wd}
    g1 = {"params": [(n, p) for n, p in named if p.dim() != 2], "weight_decay": 0.0,
          "betas": (0.8, 0.99), "eps": 1e-6}
    if lr is not None:
        g1["lr"] = lr
    return [g0, g1]


def batch(rng, n=32):
    x = torch.from_numpy(rng.standard_normal((n, 20)).astype(np.float32))
    y = torch.from_numpy(rng.standard_normal((n, 8)).astype(np.float32))
    return x, y


def loss_of(model, x, y):
    return ((model(x) - torch.tanh(y)) ** 2).mean()


class OffloadAdamWTest(unittest.TestCase):
    def setUp(self):
        self._tmp = tempdir()
        self.dir = self._tmp.name

    def tearDown(self):
        self._tmp.cleanup()

    def path(self, name="state.img"):
        return os.path.join(self.dir, name)

    # ------------------------------------------------------------ against torch

    def test_matches_torch_adamw(self):
        """100 steps against torch.optim.AdamW and the exact replay of the engine."""
        model = make_model()
        init = {n: p.detach().clone() for n, p in model.named_parameters()}
        groups = groups_of(model, lr=4e-3)
        opt = OffloadAdamW(groups, self.path(), lr=2e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01)
        self.addCleanup(opt.close)
        names = opt.names()
        by_name = dict(model.named_parameters())
        layout = [(n, tuple(by_name[n].shape), gi) for gi, g in enumerate(opt.param_groups)
                  for n in [nn for nn, pp in groups[gi]["params"]]]
        self.assertEqual([t[0] for t in layout], names)

        # torch: fp32 params starting at the model's init, the same groups
        ref = {n: torch.nn.Parameter(init[n].clone()) for n in names}
        ref_opt = torch.optim.AdamW([dict({k: v for k, v in g.items() if k != "params"},
                                          params=[ref[n] for n, _ in g["params"]]) for g in groups],
                                    lr=2e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01, foreach=False)
        exact = Model(layout, "bf16", {n: init[n].numpy() for n in names})
        # the model starts from the bf16 rounding of its init
        for n in names:
            self.assertTrue(torch.equal(by_name[n].detach(), bf16_round(init[n])), n)

        rng = np.random.default_rng(7)
        worst = 0.0
        flips = total = 0
        for t in range(1, 101):
            x, y = batch(rng)
            loss_of(model, x, y).backward()
            bits = {n: f32_to_bf16_bits(by_name[n].grad.numpy()).reshape(by_name[n].shape) for n in names}
            for n in names:   # torch gets the same bf16 gradients the device gets
                ref[n].grad = bf16_round(by_name[n].grad)
            hp = [{k: g[k] for k in ("lr", "betas", "eps", "weight_decay")} for g in opt.param_groups]
            opt.step()
            opt.zero_grad()
            ref_opt.step()
            self.assertEqual(opt.last_result, "committed")
            self.assertEqual(opt.committed_step, t)
            self.assertTrue(exact.step(t, hp, bits))
            for n in names:
                p, m, v = opt.read_state(n)
                # 1. bit for bit the engine's documented arithmetic with the
                #    hyperparameters of param_groups and the gradients of p.grad
                self.assertTrue(np.array_equal(p.numpy().reshape(-1).view(np.uint32),
                                               exact.state[n][0].view(np.uint32)), f"step {t} {n}: p")
                self.assertTrue(np.array_equal(m.numpy().reshape(-1).view(np.uint32),
                                               exact.state[n][1].view(np.uint32)), f"step {t} {n}: m")
                # 2. torch's AdamW to fp32 rounding
                r = tol_ratio(p.numpy(), ref[n].detach().numpy())
                self.assertLessEqual(r, 1.0, f"step {t} {n}: master vs torch {r:.2f} x tolerance")
                worst = max(worst, r)
                # 3. the model holds the bf16 rounding of the master, exactly...
                self.assertTrue(torch.equal(by_name[n].detach(), bf16_round(p)), f"step {t} {n}")
                # ...and of torch's param within one bf16 ulp: the masters agree to
                # ~1e-6 relative, so their bf16 roundings differ only when a master
                # sits within that distance of a rounding midpoint (1 in ~10^4 elements),
                # and then by exactly one ulp (2^-8 relative).
                mine, theirs = by_name[n].detach(), bf16_round(ref[n])
                d = (mine - theirs).abs()
                ulp = theirs.abs().clamp_min(1e-30) * 2.0 ** -7
                self.assertTrue(bool((d <= ulp).all()), f"step {t} {n}: more than 1 bf16 ulp from torch")
                flips += int((d > 0).sum())
                total += d.numel()
        if os.environ.get("CKPT_TEST_VERBOSE"):
            print(f"\nmasters vs torch: worst {worst:.3f} x tolerance; {flips} of {total} "
                  f"bf16 param values 1 ulp from torch's")
        self.assertLess(flips, max(5, total // 1000), f"{flips} of {total} bf16 params differ from torch's")
        self.assertLess(worst, 1.0)

    def test_fp16_device_with_clipping(self):
        """fp16 device, a loss scale and clip_grad_norm_ against torch's unscale + clip."""
        model = make_model(1)
        init = {n: p.detach().clone() for n, p in model.named_parameters()}
        opt = OffloadAdamW(model.named_parameters(), self.path(), lr=3e-3, dtype="fp16")
        self.addCleanup(opt.close)
        self.assertEqual(opt.dtype, "fp16")
        names = opt.names()
        by_name = dict(model.named_parameters())
        ref = {n: torch.nn.Parameter(init[n].clone()) for n in names}
        ref_opt = torch.optim.AdamW([ref[n] for n in names], lr=3e-3, foreach=False)
        rng = np.random.default_rng(3)
        S = 1024.0
        clipped, worst = 0, 0.0
        for t in range(1, 41):
            x, y = batch(rng)
            (loss_of(model, x, y) * S * (5.0 if t % 3 == 0 else 1.0)).backward()
            for n in names:   # torch: the fp16 gradient, unscaled in fp32
                ref[n].grad = by_name[n].grad.to(torch.float16).to(torch.float32) * np.float32(1 / S)
            opt.set_grad_unscale(1 / S)
            norm = opt.clip_grad_norm_(0.2)
            ref_norm = torch.nn.utils.clip_grad_norm_([ref[n] for n in names], 0.2)
            self.assertAlmostEqual(float(norm), float(ref_norm), delta=1e-6 * float(ref_norm))
            clipped += float(ref_norm) > 0.2
            opt.step()
            opt.zero_grad()
            ref_opt.step()
            for n in names:
                p = opt.read_state(n)[0].numpy()
                # torch multiplies the gradient by 1/S, then by the clip coefficient
                # (two fp32 roundings), the device by fp32(coefficient / S) (one): a
                # 1-ulp difference of the gradient, within the AdamW tolerance
                r = tol_ratio(p, ref[n].detach().numpy())
                self.assertLessEqual(r, 1.0, f"step {t} {n}: {r:.2f} x tolerance")
                worst = max(worst, r)
                self.assertTrue(torch.equal(by_name[n].detach(),
                                            torch.from_numpy(p).to(torch.float16).to(torch.float32)))
        self.assertGreater(clipped, 5)
        if os.environ.get("CKPT_TEST_VERBOSE"):
            print(f"\nfp16 + clipping: masters vs torch: worst {worst:.3f} x tolerance")

    # ------------------------------------------------------------ format, reopen, layout

    def test_fresh_path_formats_for_the_params(self):
        model = make_model()
        init = {n: p.detach().clone() for n, p in model.named_parameters()}
        path = self.path("sub.img")
        opt = OffloadAdamW(groups_of(model), path, chunk_params=4096)
        self.assertTrue(os.path.exists(path))
        self.assertEqual([f for f in os.listdir(self.dir) if f != "sub.img"], [])  # no temp left
        dev = opt.device
        self.assertEqual(dev.committed_step, 0)
        self.assertEqual(dev.info()["chunk_params"], 4096)
        self.assertEqual(dev.info()["n_groups"], 2)
        want = [(n, tuple(p.shape), 0 if p.dim() == 2 else 1) for n, p in model.named_parameters()]
        want.sort(key=lambda x: x[2])  # group 0 first, then group 1, in model order
        self.assertEqual([(t["name"], t["shape"], t["group"]) for t in dev.tensors()], want)
        for n, p in model.named_parameters():
            self.assertTrue(np.array_equal(dev.read_state(n)[0], init[n].numpy()), n)
            self.assertTrue(torch.equal(p.detach(), bf16_round(init[n])), n)
        opt.close()

    def test_no_space_names_the_path(self):
        """The image is prepared under a temporary name: a failure names the
        path asked for, and leaves nothing."""
        path = self.path("big.img")
        with self.assertRaises(ckpt.CkptError) as cm:
            OffloadAdamW(groups_of(make_model()), path, size=1 << 60)
        self.assertIn(f"not enough space for {path}:", cm.exception.message)
        self.assertNotIn(".tmp-", cm.exception.message)
        self.assertEqual(os.listdir(self.dir), [])

    def test_zero_size_param(self):
        """A param with a zero-size dimension, which torch.optim.AdamW takes, stays
        off the device: the others train as they would without it."""
        torch.manual_seed(0)
        w = torch.nn.Parameter(torch.randn(8, 4).to(torch.bfloat16))
        w2 = torch.nn.Parameter(w.detach().clone())
        e = torch.nn.Parameter(torch.zeros(0, 4, dtype=torch.bfloat16))
        a = OffloadAdamW([("w", w), ("e", e)], self.path("a.img"), chunk_params=4096)
        self.addCleanup(a.close)
        b = OffloadAdamW([("w", w2)], self.path("b.img"), chunk_params=4096)
        self.addCleanup(b.close)
        for _ in range(3):
            g = torch.randn(8, 4).to(torch.bfloat16)
            w.grad, w2.grad, e.grad = g.clone(), g.clone(), torch.zeros_like(e)
            a.step()
            b.step()
        self.assertEqual(a.committed_step, 3)
        self.assertTrue(torch.equal(w, w2))
        self.assertEqual(e.shape, (0, 4))
        self.assertEqual(a.names(), ["w"])
        self.assertEqual(sorted(ckpt.torch.to_torch_state_dict(a)["state"]), [0])

    def test_last_group_without_a_tensor_on_the_device(self):
        """A last param group of zero-size params only has no tensor on the device,
        which so has a group fewer than the optimizer: steps open with the groups
        the device has, from step() and from backward's hooks alike."""
        torch.manual_seed(0)
        w = torch.nn.Parameter(torch.randn(8, 4))
        w2 = torch.nn.Parameter(w.detach().clone())
        e = torch.nn.Parameter(torch.zeros(0, 4))
        a = OffloadAdamW([{"params": [w]}, {"params": [e], "weight_decay": 0.0}], self.path("a.img"),
                         chunk_params=4096)
        self.addCleanup(a.close)
        b = OffloadAdamW([w2], self.path("b.img"), chunk_params=4096)
        self.addCleanup(b.close)
        self.assertEqual(a.device.info()["n_groups"], 1)
        x = torch.randn(4)
        for _ in range(3):
            ((w @ x).sum() + e.sum()).backward()
            a.step()
            a.zero_grad()
            (w2 @ x).sum().backward()
            b.step()
            b.zero_grad()
            self.assertTrue(a.last_step_hooked)
        self.assertEqual(a.committed_step, 3)
        self.assertTrue(torch.equal(w, w2))

    def test_generated_names(self):
        a, b, c = (torch.nn.Parameter(torch.randn(s)) for s in ((3, 4), (5,), (2, 2, 2)))
        opt = OffloadAdamW([{"params": [a, b]}, {"params": [c], "lr": 1e-2}], self.path())
        self.addCleanup(opt.close)
        self.assertEqual(opt.names(), ["g0.p0", "g0.p1", "g1.p0"])
        self.assertEqual([t["group"] for t in opt.device.tensors()], [0, 0, 1])
        opt2 = OffloadAdamW([a, b, c], self.path("flat.img"))
        self.addCleanup(opt2.close)
        self.assertEqual(opt2.names(), ["g0.p0", "g0.p1", "g0.p2"])

    def test_reopen_resumes(self):
        model = make_model()
        path = self.path()
        opt = OffloadAdamW(groups_of(model), path, lr=1e-2)
        rng = np.random.default_rng(0)
        for t in range(1, 6):
            loss_of(model, *batch(rng)).backward()
            opt.step(blob=b"trainer %d" % t)
            opt.zero_grad()
        after = {n: p.detach().clone() for n, p in model.named_parameters()}
        sd = opt.state_dict()
        opt.close()

        fresh = make_model(seed=99)  # other values: the device's must win
        opt2 = OffloadAdamW(groups_of(fresh), path, lr=1e-2)
        self.addCleanup(opt2.close)
        self.assertEqual(opt2.committed_step, 5)
        self.assertEqual(opt2.resumed_step, 5)
        self.assertEqual(opt2.blob(), b"trainer 5")
        for n, p in fresh.named_parameters():
            self.assertTrue(torch.equal(p.detach(), after[n]), n)
        opt2.load_state_dict(sd)
        # and it keeps going from step 6
        loss_of(fresh, *batch(rng)).backward()
        opt2.step()
        self.assertEqual(opt2.committed_step, 6)

    def test_reopen_with_a_device_object(self):
        model = make_model()
        path = self.path()
        OffloadAdamW(model.parameters(), path).close()
        with ckpt.open(path) as dev:
            opt = OffloadAdamW(make_model().parameters(), dev)
            self.assertEqual(opt.path, path)
            loss_of(model, *batch(np.random.default_rng(0))).backward()
            opt.close()  # does not close a device it was given
            self.assertEqual(dev.committed_step, 0)

    def test_layout_mismatch_is_refused(self):
        path = self.path()
        model = make_model()
        OffloadAdamW(groups_of(model), path).close()
        cases = {
            "shape": (groups_of(make_model(hidden=40)), "shape [40, 20] in the model, [48, 20] on the device"),
            "names": ([{"params": [("x." + n, p) for n, p in g["params"]], **{k: v for k, v in g.items()
                                                                               if k != "params"}}
                       for g in groups_of(model)], "not on the device: 'x.0.weight'"),
            "groups": (list(model.named_parameters()), "param group 0 in the optimizer, group 1 on the device"),
            "missing": ([groups_of(model)[0]], "on the device but not among the params: '0.bias'"),
        }
        for what, (params, msg) in cases.items():
            with self.subTest(what):
                with self.assertRaises(LayoutMismatchError) as cm:
                    OffloadAdamW(params, path)
                self.assertIn(msg, str(cm.exception))
                self.assertIn(path, str(cm.exception))
        with self.assertRaises(LayoutMismatchError) as cm:
            OffloadAdamW(groups_of(model), path, dtype="fp16")
        self.assertIn("bf16 device", str(cm.exception))
        # the refused opens changed nothing
        with ckpt.open(path) as dev:
            self.assertEqual(dev.committed_step, 0)

    def test_add_param_group_is_refused(self):
        opt = OffloadAdamW(make_model().parameters(), self.path())
        self.addCleanup(opt.close)
        with self.assertRaises(RuntimeError):
            opt.add_param_group({"params": [torch.nn.Parameter(torch.zeros(3))]})

    def test_init_from_model(self):
        path = self.path()
        layout = ckpt.Layout()
        model = make_model()
        for n, p in model.named_parameters():
            layout.add(n, tuple(p.shape), 0)
        ckpt.format(path, layout, dtype="bf16")  # as ckptctl format would: zeros
        init = {n: p.detach().clone() for n, p in model.named_parameters()}
        opt = OffloadAdamW(model.named_parameters(), path, init_from_model=True)
        for n, p in model.named_parameters():
            if n.endswith("weight"):
                self.assertGreater(float(p.abs().sum()), 0, n)
            self.assertTrue(np.array_equal(opt.device.read_state(n)[0], init[n].numpy()), n)
            self.assertTrue(torch.equal(p.detach(), bf16_round(init[n])), n)
        loss_of(model, *batch(np.random.default_rng(0))).backward()
        opt.step()
        opt.close()
        with self.assertRaises(ValueError):
            OffloadAdamW(model.named_parameters(), path, init_from_model=True)

    # ------------------------------------------------------------ torch semantics

    def test_state_dict(self):
        model = make_model()
        path = self.path()
        opt = OffloadAdamW(groups_of(model), path, lr=1e-2)
        self.addCleanup(opt.close)
        rng = np.random.default_rng(0)
        for _ in range(3):
            loss_of(model, *batch(rng)).backward()
            opt.step()
        sd = opt.state_dict()
        self.assertEqual(sd["state"], {})
        meta = sd["ckpt"]
        self.assertEqual(meta["step"], 3)
        self.assertEqual(meta["path"], os.path.abspath(path))
        self.assertRegex(meta["uuid"], r"^[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$")
        self.assertEqual(meta["dtype"], "bf16")
        self.assertEqual([g["params"] for g in sd["param_groups"]], [[0, 1], [2, 3, 4, 5]])
        self.assertEqual(sd["param_groups"][1]["names"], ["0.bias", "1.weight", "1.bias", "3.bias"])
        self.assertEqual(sd["param_groups"][0]["lr"], 1e-2)
        self.assertEqual(sd["param_groups"][1]["betas"], (0.8, 0.99))
        self.assertNotIn("exp_avg", repr(sd))  # the big tensors stay on the device
        torch.save(sd, os.path.join(self.dir, "opt.pt"))
        sd = torch.load(os.path.join(self.dir, "opt.pt"))

        # hyperparameters come back
        opt.param_groups[0]["lr"] = 5.0
        opt.load_state_dict(sd)
        self.assertEqual(opt.param_groups[0]["lr"], 1e-2)

        # a state_dict of another step is refused
        loss_of(model, *batch(rng)).backward()
        opt.step()
        with self.assertRaisesRegex(ValueError, "step 3, the device is at committed step 4"):
            opt.load_state_dict(sd)

        # of another device too
        other = OffloadAdamW(groups_of(make_model()), self.path("other.img"))
        self.addCleanup(other.close)
        sd_other = dict(sd, ckpt=dict(sd["ckpt"], step=0))
        with self.assertRaisesRegex(ValueError, "is of device"):
            other.load_state_dict(sd_other)
        # a torch.optim.AdamW state_dict is imported (test_offload_torchapi), if it fits
        with self.assertRaisesRegex(ValueError, "different number of parameter groups"):
            opt.load_state_dict(torch.optim.AdamW(model.parameters()).state_dict())

    def test_lr_schedulers_reach_the_device(self):
        """StepLR and LambdaLR change param_groups' lr; the device applies it (bit-exact replay)."""
        for kind in ("StepLR", "LambdaLR"):
            with self.subTest(kind):
                model = make_model()
                init = {n: p.detach().clone() for n, p in model.named_parameters()}
                opt = OffloadAdamW(groups_of(model, lr=2e-2), self.path(kind + ".img"), lr=1e-2)
                self.addCleanup(opt.close)
                if kind == "StepLR":
                    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=3, gamma=0.5)
                    want = lambda t, base: base * 0.5 ** ((t - 1) // 3)  # noqa: E731
                else:
                    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda i: 1.0 / (1 + i))
                    want = lambda t, base: base / t  # noqa: E731
                layout = [(t["name"], t["shape"], t["group"]) for t in opt.device.tensors()]
                exact = Model(layout, "bf16", {n: init[n].numpy() for n, _, _ in layout})
                by_name = dict(model.named_parameters())
                rng = np.random.default_rng(1)
                with warnings.catch_warnings():
                    warnings.simplefilter("error")  # e.g. "lr_scheduler.step() before optimizer.step()"
                    for t in range(1, 11):
                        loss_of(model, *batch(rng)).backward()
                        lrs = [g["lr"] for g in opt.param_groups]
                        self.assertTrue(math.isclose(lrs[0], want(t, 1e-2)), (t, lrs))
                        self.assertTrue(math.isclose(lrs[1], want(t, 2e-2)), (t, lrs))
                        bits = {n: f32_to_bf16_bits(by_name[n].grad.numpy()) for n, _, _ in layout}
                        hp = [{k: g[k] for k in ("lr", "betas", "eps", "weight_decay")}
                              for g in opt.param_groups]
                        opt.step()
                        opt.zero_grad()
                        sched.step()
                        exact.step(t, hp, bits)
                        for n, _, _ in layout:
                            self.assertTrue(np.array_equal(opt.read_state(n)[0].numpy().reshape(-1),
                                                           exact.state[n][0]), f"{kind} step {t} {n}")
                # and a different lr would have given other bits: the device did use it
                self.assertNotEqual(want(10, 1e-2), 1e-2)

    def test_closure_and_none_grads(self):
        model = make_model()
        extra = torch.nn.Parameter(torch.ones(4))  # never gets a gradient
        params = list(model.named_parameters()) + [("extra", extra)]
        opt = OffloadAdamW(params, self.path(), lr=1e-2, weight_decay=0.5)
        self.addCleanup(opt.close)
        x, y = batch(np.random.default_rng(0))

        def closure():
            opt.zero_grad()
            loss = loss_of(model, x, y)
            loss.backward()
            return loss

        loss = opt.step(closure)
        self.assertIsInstance(loss, torch.Tensor)
        self.assertEqual(opt.committed_step, 1)
        # a None gradient is skipped as torch skips it: not even weight decay moves it
        p = opt.read_state("extra")[0].numpy()
        self.assertTrue(np.array_equal(p, np.ones_like(p)), p)

    def test_overflow_skips_the_step(self):
        model = make_model()
        opt = OffloadAdamW(model.named_parameters(), self.path(), lr=1e-2)
        self.addCleanup(opt.close)
        rng = np.random.default_rng(0)
        loss_of(model, *batch(rng)).backward()
        opt.step(blob=b"one")
        before = {n: p.detach().clone() for n, p in model.named_parameters()}
        loss_of(model, *batch(rng)).backward()
        model[0].weight.grad[0, 0] = float("inf")
        opt.step(blob=b"two")
        self.assertEqual(opt.last_result, "overflow")
        self.assertEqual(opt.committed_step, 1)
        self.assertEqual(opt.blob(), b"one")
        for n, p in model.named_parameters():
            self.assertTrue(torch.equal(p.detach(), before[n]), n)
        # the next step is step 2 again
        opt.zero_grad()
        loss_of(model, *batch(rng)).backward()
        opt.step()
        self.assertEqual((opt.last_result, opt.committed_step), ("committed", 2))

    def test_hyperparameters_torch_refuses(self):
        """ValueError, with torch's message, for what torch.optim.AdamW refuses;
        also when a param group or a scheduler sets it later."""
        model = make_model()
        bad = [(dict(lr=-1e-3), "Invalid learning rate"), (dict(lr=float("nan")), "Invalid learning rate"),
               (dict(eps=-1e-8), "Invalid epsilon value"),
               (dict(betas=(1.0, 0.999)), "Invalid beta parameter at index 0"),
               (dict(betas=(-0.1, 0.999)), "Invalid beta parameter at index 0"),
               (dict(betas=(0.9, 1.5)), "Invalid beta parameter at index 1"),
               (dict(weight_decay=-0.01), "Invalid weight_decay value")]
        for kw, msg in bad:
            with self.subTest(kw=kw):
                with self.assertRaisesRegex(ValueError, msg):
                    torch.optim.AdamW(model.parameters(), **kw)  # the reference
                with self.assertRaisesRegex(ValueError, msg):
                    OffloadAdamW(model.named_parameters(), self.path(), **kw)
                self.assertFalse(os.path.exists(self.path()))
        opt = OffloadAdamW(groups_of(model), self.path(), lr=1e-2)
        self.addCleanup(opt.close)
        before = {n: p.detach().clone() for n, p in model.named_parameters()}
        loss_of(model, *batch(np.random.default_rng(0))).backward()
        for key, value, msg in (("lr", -0.5, "Invalid learning rate"),
                                ("betas", (0.9, 1.0), "Invalid beta parameter at index 1"),
                                ("weight_decay", -1.0, "Invalid weight_decay value")):
            with self.subTest(key=key):
                saved = opt.param_groups[1][key]
                opt.param_groups[1][key] = value
                with self.assertRaisesRegex(ValueError, "param group 1: " + msg):
                    opt.step()
                opt.param_groups[1][key] = saved
                self.assertEqual(opt.device.info()["open_step"], 0)
                self.assertEqual(opt.committed_step, 0)
        for n, p in model.named_parameters():
            self.assertTrue(torch.equal(p.detach(), before[n]), n)
        opt.step()
        self.assertEqual((opt.last_result, opt.committed_step), ("committed", 1))

    def test_eps_zero_with_a_zero_gradient_is_skipped(self):
        """torch takes eps=0; with a zero gradient on zero moments the update is
        0/0: the device skips the step instead of committing NaN masters."""
        model = make_model()
        opt = OffloadAdamW(model.named_parameters(), self.path(), lr=1e-2, eps=0.0)
        self.addCleanup(opt.close)
        before = {n: p.detach().clone() for n, p in model.named_parameters()}
        for p in model.parameters():
            p.grad = torch.zeros_like(p)
        opt.step()  # zero gradients on zero moments
        self.assertEqual((opt.last_result, opt.committed_step), ("overflow", 0))
        for n, p in model.named_parameters():
            self.assertFalse(torch.isnan(p).any(), n)
            self.assertTrue(torch.equal(p.detach(), before[n]), n)
        for n, pm in opt.master_params().items():
            self.assertTrue(torch.equal(bf16_round(pm), before[n]), n)

    def test_set_blob_hook(self):
        model = make_model()
        opt = OffloadAdamW(model.parameters(), self.path())
        self.addCleanup(opt.close)
        counter = {"n": 0}

        def blob():
            counter["n"] += 1
            return b"position %d" % counter["n"]

        opt.set_blob(blob)
        for _ in range(3):
            loss_of(model, *batch(np.random.default_rng(0))).backward()
            opt.step()
        self.assertEqual(opt.blob(), b"position 3")
        opt.step(blob=b"explicit")  # an argument wins over the hook
        self.assertEqual(opt.blob(), b"explicit")

    def test_a_failed_step_is_aborted(self):
        model = make_model()
        opt = OffloadAdamW(model.parameters(), self.path())
        self.addCleanup(opt.close)
        loss_of(model, *batch(np.random.default_rng(0))).backward()
        with self.assertRaises(ckpt.CkptError):
            opt.step(blob=b"x" * 100000)  # larger than a blob may be
        self.assertEqual(opt.device.info()["open_step"], 0)
        opt.step()
        self.assertEqual(opt.committed_step, 1)


class SafetensorsExportTest(unittest.TestCase):
    def test_export_and_load(self):
        from ckpt import safetensors
        with tempdir() as d:
            model = make_model()
            path = os.path.join(d, "s.img")
            opt = OffloadAdamW(model.named_parameters(), path, lr=1e-2)
            loss_of(model, *batch(np.random.default_rng(0))).backward()
            opt.step()
            masters = opt.master_params()
            opt.close()
            out = ckpt.torch.export_safetensors(path, os.path.join(d, "m.safetensors"))
            arrays, dtypes, meta = safetensors.load_file(out, with_metadata=True)
            self.assertEqual(set(arrays), set(masters))
            self.assertEqual(set(dtypes.values()), {"F32"})
            self.assertEqual(meta["step"], "1")
            for n, a in arrays.items():
                self.assertTrue(np.array_equal(a, masters[n].numpy()), n)
            # the file layout: 8-byte LE header length, JSON header, data 8-byte aligned
            with open(out, "rb") as f:
                raw = f.read()
            n = int.from_bytes(raw[:8], "little")
            self.assertEqual((8 + n) % 8, 0)
            import json
            header = json.loads(raw[8:8 + n])
            end = max(e["data_offsets"][1] for k, e in header.items() if k != "__metadata__")
            self.assertEqual(len(raw), 8 + n + end)
            # low-precision export, loaded into a fresh model
            out2 = ckpt.torch.export_safetensors(path, os.path.join(d, "lo.safetensors"), what="lowp")
            fresh = make_model(5)
            ckpt.torch.load_safetensors_into(fresh, out2)
            for (n, p), (_, q) in zip(model.named_parameters(), fresh.named_parameters()):
                self.assertTrue(torch.equal(p.detach(), q.detach()), n)


class ExampleTest(unittest.TestCase):
    def test_torch_offload_example_resumes(self):
        import subprocess
        script = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                              "examples", "torch_offload.py")
        with tempdir() as d:
            path = os.path.join(d, "state.img")
            out = []
            for steps in (30, 50):
                p = subprocess.run([sys.executable, script, path, "--steps", str(steps)],
                                   capture_output=True, text=True, timeout=120)
                self.assertEqual(p.returncode, 0, p.stderr)
                out.append(p.stdout)
            self.assertIn("new device", out[0])
            self.assertIn("committed step 30;", out[0])
            self.assertIn("resuming from committed step 30", out[1])
            self.assertIn("committed step 50;", out[1])


if __name__ == "__main__":
    unittest.main()
