# SPDX-License-Identifier: MIT
"""ckpt.torch.OffloadAdamW speaks torch.optim.AdamW's API.

- maximize=True against torch.optim.AdamW(maximize=True) and the exact replay
  of the engine fed the negated gradients;
- foreach, fused, capturable, differentiable accepted (capturable refused on
  CPU params, as torch refuses it), amsgrad refused, saying why;
- a torch.optim.AdamW state_dict moves onto a device (load_state_dict) bit for
  bit, and the training continues as torch's does; the device's state moves
  back (to_torch_state_dict) bit for bit and torch continues as the device
  does; params at steps of their own (a frozen layer, a bias without a
  gradient in some steps) keep torch's counts and go on as torch's do; a
  device past step 0 and bad values are refused with the device unchanged;
- a state_dict of the step before the committed one offers the rollback, and
  rollback=True performs it;
- `with OffloadAdamW(...)` closes the device; PrecisionWarning, once.

Run: PYTHONPATH=<build>/python /usr/bin/python3 -m unittest -v test_offload_torchapi
"""

import copy
import os
import sys
import unittest
import warnings

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import numpy as np  # noqa: E402
import torch  # noqa: E402

import ckpt  # noqa: E402
from ckpt.torch import OffloadAdamW, PrecisionWarning, to_torch_state_dict  # noqa: E402
from ckpt_testlib import Model, f32_to_bf16_bits, snapshot, tempdir  # noqa: E402
from test_offload_adamw import batch, bf16_round, groups_of, loss_of, make_model, tol_ratio  # noqa: E402

torch.set_num_threads(1)


def torch_groups(params_by_name, groups):
    """groups_of()'s groups over other tensors (torch's reference params)."""
    return [dict({k: v for k, v in g.items() if k != "params"},
                 params=[params_by_name[n] for n, _ in g["params"]]) for g in groups]


class TorchApiTest(unittest.TestCase):
    def setUp(self):
        self._tmp = tempdir()
        self.dir = self._tmp.name
        caught = warnings.catch_warnings()
        caught.__enter__()
        self.addCleanup(caught.__exit__, None, None, None)
        warnings.simplefilter("ignore", PrecisionWarning)   # fp32 models; tested below

    def tearDown(self):
        self._tmp.cleanup()

    def path(self, name="state.img"):
        return os.path.join(self.dir, name)

    def opt(self, params, name="state.img", **kw):
        opt = OffloadAdamW(params, self.path(name), **kw)
        self.addCleanup(opt.close)
        return opt

    def continue_both(self, model, opt, ref, ref_opt, exact, steps, first, rng):
        """steps more steps of the device and of torch with the same bf16 gradients;
        the masters within the oracle's tolerance of torch's params, bit for bit
        the exact replay. Returns the worst tolerance ratio."""
        by_name = dict(model.named_parameters())
        names = opt.names()
        worst = 0.0
        for t in range(first, first + steps):
            loss_of(model, *batch(rng)).backward()
            bits = {n: f32_to_bf16_bits(by_name[n].grad.numpy()) for n in names}
            for n in names:
                ref[n].grad = bf16_round(by_name[n].grad)
            hp = [{k: g[k] for k in ("lr", "betas", "eps", "weight_decay")} for g in opt.param_groups]
            if opt.param_groups[0].get("maximize"):
                bits = {n: b ^ np.uint16(0x8000) for n, b in bits.items()}
            opt.step()
            opt.zero_grad()
            ref_opt.step()
            self.assertEqual(opt.committed_step, t)
            self.assertTrue(exact.step(t, hp, bits))
            for n in names:
                p, m, v = (x.numpy().reshape(-1) for x in opt.read_state(n))
                for got, want, what in zip((p, m, v), exact.state[n], "pmv"):
                    self.assertTrue(np.array_equal(got.view(np.uint32), want.view(np.uint32)),
                                    f"step {t} {n}: {what} is not the engine's exact update")
                r = tol_ratio(p, ref[n].detach().numpy().reshape(-1))
                self.assertLessEqual(r, 1.0, f"step {t} {n}: master vs torch {r:.2f} x tolerance")
                worst = max(worst, r)
                self.assertTrue(torch.equal(by_name[n].detach(), bf16_round(opt.read_state(n)[0])))
        return worst

    # ------------------------------------------------------------ maximize

    def test_maximize_matches_torch(self):
        model = make_model(2)
        init = {n: p.detach().clone() for n, p in model.named_parameters()}
        groups = groups_of(model)
        opt = self.opt(groups, lr=3e-3, maximize=True)
        names = opt.names()
        self.assertTrue(all(g["maximize"] for g in opt.param_groups))
        ref = {n: torch.nn.Parameter(init[n].clone()) for n in names}
        ref_opt = torch.optim.AdamW(torch_groups(ref, groups), lr=3e-3, maximize=True, foreach=False)
        layout = [(t["name"], t["shape"], t["group"]) for t in opt.device.tensors()]
        exact = Model(layout, "bf16", {n: init[n].numpy() for n in names})
        rng = np.random.default_rng(5)
        self.continue_both(model, opt, ref, ref_opt, exact, 15, 1, rng)
        # and it maximizes: the loss went up
        x, y = batch(np.random.default_rng(0), 256)
        fresh = make_model(2)
        self.assertGreater(float(loss_of(model, x, y)), float(loss_of(fresh, x, y)))

    def test_maximize_per_group(self):
        """Only the group that asks for it is maximized: its params move the other way."""
        a, b = make_model(3), make_model(3)
        opt_a = self.opt([{"params": list(a.named_parameters())[:2], "maximize": True},
                          {"params": list(a.named_parameters())[2:]}], "a.img", lr=1e-2, weight_decay=0.0)
        opt_b = self.opt([{"params": list(b.named_parameters())[:2]},
                          {"params": list(b.named_parameters())[2:]}], "b.img", lr=1e-2, weight_decay=0.0)
        self.assertEqual([g["maximize"] for g in opt_a.param_groups], [True, False])
        x, y = batch(np.random.default_rng(1))
        for m, o in ((a, opt_a), (b, opt_b)):
            loss_of(m, x, y).backward()
            o.step()
        for n in opt_a.names():
            pa, pb = opt_a.read_state(n)[0], opt_b.read_state(n)[0]
            init = dict(make_model(3).named_parameters())[n].detach()
            if n in opt_a.names()[:2]:   # first step: the update is -lr*sign(g), negated
                self.assertTrue(torch.allclose(pa - init, -(pb - init), atol=1e-7), n)
            else:
                self.assertTrue(torch.equal(pa, pb), n)

    # ------------------------------------------------------------ torch's other arguments

    def test_torch_arguments_accepted(self):
        model = make_model()
        kw = dict(foreach=True, fused=False, capturable=False, differentiable=False)
        opt = self.opt(model.named_parameters(), lr=1e-3, **kw)
        for k, v in kw.items():
            self.assertEqual(opt.param_groups[0][k], v)
        self.assertIs(opt.param_groups[0]["amsgrad"], False)
        loss_of(model, *batch(np.random.default_rng(0))).backward()
        opt.step()
        self.assertEqual(opt.committed_step, 1)
        # they do not change the result: the same step without them
        other = make_model()
        plain = self.opt(other.named_parameters(), "plain.img", lr=1e-3)
        loss_of(other, *batch(np.random.default_rng(0))).backward()
        plain.step()
        for n in opt.names():
            self.assertTrue(torch.equal(opt.read_state(n)[0], plain.read_state(n)[0]), n)

    def test_zero_grad_and_step_hooks_are_torchs(self):
        """zero_grad()'s default is the running torch's (1.13: zero the gradients,
        2: set them to None); torch 2's step pre/post hooks run around step()."""
        model = make_model()
        opt = self.opt(model.named_parameters(), lr=1e-3)
        ref = torch.optim.AdamW(make_model().parameters())
        for o in (opt, ref):
            ps = [p for g in o.param_groups for p in g["params"]]
            for p in ps:
                p.grad = torch.ones_like(p)
            o.zero_grad()
            if torch.__version__.startswith("1."):
                self.assertTrue(all(p.grad is not None and not p.grad.any() for p in ps))
            else:
                self.assertTrue(all(p.grad is None for p in ps))
        calls = []
        hooks = hasattr(torch.optim.Optimizer, "register_step_pre_hook")    # torch 2
        if hooks:
            opt.register_step_pre_hook(lambda o, args, kw: calls.append(("pre", o.committed_step)))
            opt.register_step_post_hook(lambda o, args, kw: calls.append(("post", o.committed_step)))
        loss_of(model, *batch(np.random.default_rng(0))).backward()
        opt.step()
        self.assertEqual(calls, [("pre", 0), ("post", 1)] if hooks else [])
        opt.zero_grad(set_to_none=False)
        self.assertTrue(all(p.grad is not None and not p.grad.any() for p in model.parameters()))

    def test_replaced_params_are_refused(self):
        """A wrapper that swaps param_groups' params for copies (DeepSpeed's fp16,
        bf16 and ZeRO optimizers) would train nothing: step() refuses, the device
        unchanged."""
        model = make_model()
        opt = self.opt(model.named_parameters(), lr=1e-3)
        loss_of(model, *batch(np.random.default_rng(0))).backward()
        g = opt.param_groups[0]
        g["params"] = [p.detach().clone().float() for p in g["params"]]
        with self.assertRaisesRegex(ValueError, "param group 0: its params are not the ones .*ckpt.deepspeed"):
            opt.step()
        self.assertEqual(opt.committed_step, 0)

    def test_capturable_on_cpu_is_refused(self):
        with self.assertRaisesRegex(ValueError, "capturable=True: '0.weight' is on cpu; torch.optim.AdamW "
                                                "refuses it too"):
            OffloadAdamW(make_model().named_parameters(), self.path(), capturable=True)
        self.assertFalse(os.path.exists(self.path()))

    def test_amsgrad_is_refused(self):
        model = make_model()
        with self.assertRaisesRegex(ValueError, "amsgrad=True is not supported: .*max_exp_avg_sq.*only "
                                                "exp_avg and exp_avg_sq"):
            OffloadAdamW(model.named_parameters(), self.path(), amsgrad=True)
        with self.assertRaisesRegex(ValueError, "param group 1: amsgrad=True"):
            OffloadAdamW([{"params": list(model.named_parameters())[:1]},
                          {"params": list(model.named_parameters())[1:], "amsgrad": True}], self.path())
        self.assertFalse(os.path.exists(self.path()))
        opt = self.opt(model.named_parameters())
        opt.param_groups[0]["amsgrad"] = True
        with self.assertRaisesRegex(ValueError, "param group 0: amsgrad=True"):
            opt.step()
        self.assertEqual(opt.committed_step, 0)
        opt.param_groups[0]["amsgrad"] = False
        # a torch state_dict with AMSGrad's state
        ref = torch.optim.AdamW(model.parameters(), amsgrad=True)
        loss_of(model, *batch(np.random.default_rng(0))).backward()
        ref.step()
        with self.assertRaisesRegex(ValueError, "amsgrad=True is not supported"):
            opt.load_state_dict(ref.state_dict())
        self.assertEqual(opt.committed_step, 0)

    # ------------------------------------------------------------ torch -> device -> torch

    def torch_run(self, seed, groups_fn, steps, rng, **kw):
        """A model trained by torch.optim.AdamW for steps steps on bf16 gradients."""
        model = make_model(seed)
        groups = groups_fn(model)
        ref_opt = torch.optim.AdamW([dict({k: v for k, v in g.items() if k != "params"},
                                          params=[p for _, p in g["params"]]) for g in groups],
                                    foreach=False, **kw)
        for _ in range(steps):
            loss_of(model, *batch(rng)).backward()
            for p in model.parameters():
                p.grad = bf16_round(p.grad)
            ref_opt.step()
            ref_opt.zero_grad()
        return model, groups, ref_opt

    def test_torch_state_moves_onto_the_device(self):
        # the model's fp32 weights loaded before the optimizer is made, or after
        for weights_first in (True, False):
            with self.subTest(weights_first=weights_first):
                self.torch_state_moves(weights_first)

    def torch_state_moves(self, weights_first):
        rng = np.random.default_rng(11)
        k = 7
        trained, groups, ref_opt = self.torch_run(4, lambda m: groups_of(m, lr=4e-3), k, rng, lr=2e-3)
        sd = ref_opt.state_dict()
        torch.save(sd, self.path("adamw.pt"))
        sd = torch.load(self.path("adamw.pt"))
        model = make_model(99)
        if weights_first:
            model.load_state_dict(trained.state_dict())
        opt = self.opt(groups_of(model, wd=0.3), f"moved-{weights_first}.img", lr=5.0)
        if not weights_first:
            model.load_state_dict(trained.state_dict())
        self.assertEqual(opt.committed_step, 0)
        opt.load_state_dict(sd)
        self.assertEqual(opt.committed_step, k)
        self.assertEqual(opt.param_groups[0]["lr"], 2e-3)
        self.assertEqual(opt.param_groups[0]["weight_decay"], 0.05)
        self.assertEqual(opt.param_groups[1]["lr"], 4e-3)
        self.assertEqual(opt.param_groups[1]["betas"], (0.8, 0.99))
        # bit for bit torch's state; the model gets the masters' rounding
        by_name = dict(model.named_parameters())
        torch_by_name = dict(trained.named_parameters())
        names = opt.names()
        index = {p: i for i, p in enumerate(p for g in ref_opt.param_groups for p in g["params"])}
        for n in names:
            st = ref_opt.state[torch_by_name[n]]
            p, m, v = opt.read_state(n)
            for got, want in ((p, torch_by_name[n]), (m, st["exp_avg"]), (v, st["exp_avg_sq"])):
                self.assertTrue(np.array_equal(got.numpy().view(np.uint32),
                                               want.detach().numpy().view(np.uint32)), n)
            self.assertTrue(torch.equal(by_name[n].detach(), bf16_round(p)))
            self.assertEqual(int(sd["state"][index[torch_by_name[n]]]["step"]), k)
        # both continue: the device as torch does
        ref = {n: torch_by_name[n] for n in names}
        layout = [(t["name"], t["shape"], t["group"]) for t in opt.device.tensors()]
        exact = Model(layout, "bf16", {n: torch_by_name[n].detach().numpy() for n in names})
        for n in names:
            st = ref_opt.state[torch_by_name[n]]
            exact.state[n] = tuple(x.detach().numpy().reshape(-1).copy()
                                   for x in (torch_by_name[n], st["exp_avg"], st["exp_avg_sq"]))
        worst = self.continue_both(model, opt, ref, ref_opt, exact, 10, k + 1, rng)
        self.assertLess(worst, 1.0)

    def test_torch_state_with_lagging_params_moves_onto_the_device(self):
        """torch's AdamW keeps a step count per param: a frozen layer never has
        a gradient (no state at all), a bias has none on every third step.
        Loaded, every param keeps torch's count and state bit for bit, and
        both runs go on equal, with the same params left without gradients."""
        frozen, sometimes = ("0.weight", "0.bias"), "3.bias"
        hp = dict(lr=1e-2, weight_decay=0.1, foreach=False)
        rng = np.random.default_rng(14)

        def backward(model, t):
            """bf16 gradients of model at step t; None where torch skips."""
            loss_of(model, *batch(rng)).backward()
            for n, p in model.named_parameters():
                if p.grad is not None:
                    p.grad = None if n == sometimes and t % 3 == 0 else bf16_round(p.grad)

        trained = make_model(5)
        ref = dict(trained.named_parameters())
        names = list(ref)
        for n in frozen:
            ref[n].requires_grad_(False)
        ref_opt = torch.optim.AdamW([ref[n] for n in names], **hp)
        k = 7
        for t in range(1, k + 1):
            backward(trained, t)
            ref_opt.step()
            ref_opt.zero_grad()
        torch.save(ref_opt.state_dict(), self.path("adamw.pt"))
        sd = torch.load(self.path("adamw.pt"))
        self.assertEqual(len(sd["state"]), len(names) - len(frozen))
        self.assertEqual(int(sd["state"][names.index(sometimes)]["step"]), k - k // 3)

        model = make_model(99)
        model.load_state_dict(trained.state_dict())
        by_name = dict(model.named_parameters())
        for n in frozen:
            by_name[n].requires_grad_(False)
        opt = self.opt(model.named_parameters(), "lagging.img", lr=5.0)
        opt.load_state_dict(sd)
        self.assertEqual(opt.committed_step, k)

        def check(t):
            for n in names:
                st = ref_opt.state.get(ref[n], {})
                self.assertEqual(opt.device.tensor_step(n), int(st["step"]) if st else 0, f"step {t} {n}")
                p, m, v = (x.numpy().reshape(-1) for x in opt.read_state(n))
                if t == k:      # as loaded: torch's state bit for bit
                    want = [ref[n].detach()] + [st.get(w, torch.zeros_like(ref[n]))
                                                for w in ("exp_avg", "exp_avg_sq")]
                    for got, w in zip((p, m, v), want):
                        self.assertTrue(np.array_equal(got.view(np.uint32),
                                                       w.detach().numpy().reshape(-1).view(np.uint32)), n)
                r = tol_ratio(p, ref[n].detach().numpy().reshape(-1))
                self.assertLessEqual(r, 1.0, f"step {t} {n}: master vs torch {r:.2f} x tolerance")

        check(k)
        for t in range(k + 1, k + 11):
            backward(model, t)
            for n in names:
                g = by_name[n].grad
                ref[n].grad = None if g is None else g.clone()
            opt.step()
            opt.zero_grad()
            ref_opt.step()
            ref_opt.zero_grad()
            self.assertEqual(opt.committed_step, t)
            check(t)
        self.assertEqual(opt.device.tensor_step("0.weight"), 0)
        self.assertEqual(opt.device.tensor_step(sometimes), (k + 10) - (k + 10) // 3)

    def test_device_state_moves_to_torch(self):
        model = make_model(6)
        groups = groups_of(model, lr=4e-3)
        opt = self.opt(groups, lr=2e-3, maximize=False)
        rng = np.random.default_rng(12)
        for _ in range(6):
            loss_of(model, *batch(rng)).backward()
            opt.step()
            opt.zero_grad()
        sd = to_torch_state_dict(opt)
        torch.save(sd, self.path("adamw.pt"))
        sd = torch.load(self.path("adamw.pt"))
        names = opt.names()
        ref = {n: torch.nn.Parameter(p.clone()) for n, p in opt.master_params().items()}
        ref_opt = torch.optim.AdamW(torch_groups(ref, groups), lr=1.0, foreach=False)
        ref_opt.load_state_dict(sd)
        self.assertEqual([g["lr"] for g in ref_opt.param_groups], [2e-3, 4e-3])
        self.assertEqual(ref_opt.param_groups[1]["betas"], (0.8, 0.99))
        layout = [(t["name"], t["shape"], t["group"]) for t in opt.device.tensors()]
        exact = Model(layout, "bf16", {n: ref[n].detach().numpy() for n in names})
        for n in names:
            st = ref_opt.state[ref[n]]
            self.assertEqual(float(st["step"]), 6.0)
            p, m, v = opt.read_state(n)
            self.assertTrue(np.array_equal(st["exp_avg"].numpy().view(np.uint32), m.numpy().view(np.uint32)))
            self.assertTrue(np.array_equal(st["exp_avg_sq"].numpy().view(np.uint32), v.numpy().view(np.uint32)))
            exact.state[n] = tuple(x.numpy().reshape(-1).copy() for x in (p, m, v))
        worst = self.continue_both(model, opt, ref, ref_opt, exact, 10, 7, rng)
        self.assertLess(worst, 1.0)

    def test_adam_l2_does_not_export(self):
        opt = self.opt(make_model().named_parameters(), adam_l2=True)
        with self.assertRaisesRegex(ValueError, "adam_l2=True: that is torch.optim.Adam's algorithm"):
            to_torch_state_dict(opt)

    def test_import_refusals_leave_the_device_unchanged(self):
        rng = np.random.default_rng(13)
        trained, groups, ref_opt = self.torch_run(4, groups_of, 3, rng)
        model = make_model(4)
        model.load_state_dict(trained.state_dict())
        opt = self.opt(groups_of(model))
        before = snapshot(opt.device)
        good = copy.deepcopy(ref_opt.state_dict())

        def refused(sd, exc, regex):
            with self.assertRaisesRegex(exc, regex):
                opt.load_state_dict(sd)
            self.assertEqual(snapshot(opt.device), before)
            self.assertEqual(opt.param_groups[0]["lr"], 1e-3)

        # values the update cannot have made
        sd = copy.deepcopy(ref_opt.state_dict())
        sd["state"][1]["exp_avg_sq"].view(-1)[3] = -1.0
        refused(sd, ckpt.CkptError, "E_HPARAM.*exp_avg_sq element 3 is -1")
        sd = copy.deepcopy(ref_opt.state_dict())
        sd["state"][0]["exp_avg"][0, 0] = float("nan")
        refused(sd, ckpt.CkptError, "E_HPARAM.*exp_avg element 0 is nan")
        sd = copy.deepcopy(ref_opt.state_dict())
        sd["state"][0]["exp_avg"] = sd["state"][0]["exp_avg"][:3]
        refused(sd, ckpt.CkptError, "E_SIZE")
        sd = copy.deepcopy(ref_opt.state_dict())
        del sd["state"][3]["exp_avg"]
        refused(sd, ValueError, r"'1.weight': the state_dict's state of param 3 has no \['exp_avg'\]")
        sd = copy.deepcopy(ref_opt.state_dict())
        sd["state"][0]["step"] = torch.tensor(2.5)
        refused(sd, ValueError, "step 2.5 is not a step count")
        # torch's own refusals
        refused(dict(good, param_groups=good["param_groups"][:1]), ValueError,
                "different number of parameter groups")
        sd = copy.deepcopy(ref_opt.state_dict())
        sd["param_groups"][1]["params"] = sd["param_groups"][1]["params"][:-1]
        refused(sd, ValueError, "doesn't match the size")
        sd = copy.deepcopy(ref_opt.state_dict())
        sd["param_groups"][0]["lr"] = -1.0
        refused(sd, ValueError, "state_dict param group 0: Invalid learning rate")
        refused({"param_groups": []}, ValueError, "not a state_dict of an OffloadAdamW")
        # a device past its first step
        opt.load_state_dict(good)
        self.assertEqual(opt.committed_step, 3)
        with self.assertRaisesRegex(ValueError, "imported only into a device before its first step; .* is at "
                                                "committed step 3"):
            opt.load_state_dict(good)

    def test_empty_torch_state(self):
        """A torch.optim.AdamW that has not stepped: step 0, zero moments, its hyperparameters."""
        model = make_model()
        opt = self.opt(model.named_parameters())
        opt.load_state_dict(torch.optim.AdamW(make_model().parameters(), lr=0.25).state_dict())
        self.assertEqual(opt.committed_step, 0)
        self.assertEqual(opt.param_groups[0]["lr"], 0.25)
        for n in opt.names():
            _, m, v = opt.read_state(n)
            self.assertFalse(m.any() or v.any())

    # ------------------------------------------------------------ rollback

    def test_state_dict_of_the_previous_step_rolls_back(self):
        model = make_model()
        opt = self.opt(groups_of(model), lr=1e-2)
        rng = np.random.default_rng(0)
        for _ in range(2):
            loss_of(model, *batch(rng)).backward()
            opt.step(blob=b"two")
            opt.zero_grad()
        sd = opt.state_dict()
        at2 = snapshot(opt.device)
        model_at2 = {n: p.detach().clone() for n, p in model.named_parameters()}
        loss_of(model, *batch(rng)).backward()
        opt.param_groups[0]["lr"] = 0.5
        opt.step(blob=b"three")
        with self.assertRaisesRegex(ValueError, r"state_dict is of step 2, the device is at committed step 3: "
                                                r"load_state_dict\(state_dict, rollback=True\) rolls the device "
                                                r"back to step 2, dropping step 3$"):
            opt.load_state_dict(sd)
        self.assertEqual(opt.committed_step, 3)
        opt.load_state_dict(sd, rollback=True)
        self.assertEqual(opt.committed_step, 2)
        self.assertEqual(opt.blob(), b"two")
        self.assertEqual(opt.param_groups[0]["lr"], 1e-2)
        after = snapshot(opt.device)
        self.assertEqual(after["tensors"], at2["tensors"])
        for n, p in model.named_parameters():
            self.assertTrue(torch.equal(p.detach(), model_at2[n]), n)
        # training goes on from step 2
        loss_of(model, *batch(rng)).backward()
        opt.step()
        self.assertEqual(opt.committed_step, 3)
        # two steps back is not offered
        with self.assertRaisesRegex(ValueError, "state_dict is of step 2, the device is at committed step 3"):
            opt.load_state_dict(sd)
        loss_of(model, *batch(rng)).backward()
        opt.step()
        with self.assertRaisesRegex(ValueError, "reopen the device instead"):
            opt.load_state_dict(sd, rollback=True)

    def test_rollback_says_why_it_cannot(self):
        model = make_model()
        opt = self.opt(model.named_parameters())
        loss_of(model, *batch(np.random.default_rng(0))).backward()
        opt.step()
        sd = opt.state_dict()
        # an aborted step overwrites the previous step's slot
        opt.step()
        opt.device.begin([{"lr": 1e-3}])
        for t in opt.device.tensors():
            opt.device.write_grad(t["name"], np.zeros(t["numel"], np.uint16))
        opt.device.abort()
        with self.assertRaisesRegex(ValueError, "rolls the device back to step 1, dropping step 2; but it "
                                                "cannot: .*overwritten"):
            opt.load_state_dict(sd)
        with self.assertRaisesRegex(ValueError, "rollback to step 1 refused: .*overwritten"):
            opt.load_state_dict(sd, rollback=True)
        self.assertEqual(opt.committed_step, 2)
        opt.step()   # the optimizer still drives the device
        self.assertEqual(opt.committed_step, 3)

    def test_rollback_of_a_device_it_did_not_open(self):
        model = make_model()
        OffloadAdamW(model.named_parameters(), self.path()).close()
        dev = ckpt.open(self.path())
        self.addCleanup(dev.close)
        opt = OffloadAdamW(model.named_parameters(), dev)
        loss_of(model, *batch(np.random.default_rng(0))).backward()
        opt.step()
        sd = opt.state_dict()
        params = [p.detach().clone() for p in model.parameters()]
        opt.step()
        opt.load_state_dict(sd, rollback=True)   # the live device rolls back (ckpt_rollback)
        self.assertEqual(opt.committed_step, 1)
        for p, q in zip(model.parameters(), params):
            self.assertTrue(torch.equal(p, q))
        with self.assertRaisesRegex(ValueError, "rollback to step 0 refused: .*once"):
            opt.load_state_dict(dict(sd, ckpt=dict(sd["ckpt"], step=0)), rollback=True)
        self.assertEqual(opt.committed_step, 1)

    # ------------------------------------------------------------ context manager, warnings

    def test_context_manager_closes_the_device(self):
        model = make_model()
        with OffloadAdamW(model.named_parameters(), self.path()) as opt:
            loss_of(model, *batch(np.random.default_rng(0))).backward()
            opt.step()
            dev = opt.device
        with self.assertRaisesRegex(ckpt.CkptError, "device is closed"):
            dev.info()
        # closed on an exception too, and the device opens again (no lock left)
        with self.assertRaises(ZeroDivisionError):
            with OffloadAdamW(model.named_parameters(), self.path()) as opt:
                dev = opt.device
                1 / 0
        with self.assertRaisesRegex(ckpt.CkptError, "device is closed"):
            dev.info()
        with OffloadAdamW(model.named_parameters(), self.path()) as opt:
            self.assertEqual(opt.committed_step, 1)

    def test_precision_warning(self):
        def caught(fn):
            with warnings.catch_warnings(record=True) as w:
                warnings.simplefilter("always")
                fn()
            return [str(x.message) for x in w if issubclass(x.category, PrecisionWarning)]

        def train(model, name, dtype, steps=3):
            opt = self.opt(model.named_parameters(), name, dtype=dtype)
            for _ in range(steps):
                for p in model.parameters():
                    p.grad = torch.ones_like(p)
                opt.step()

        # fp32 model, bf16 device: once, saying what it costs
        msgs = caught(lambda: train(make_model(), "a.img", "bf16"))
        self.assertEqual(len(msgs), 1, msgs)
        self.assertRegex(msgs[0], r"6 params \('0.weight', '0.bias', '1.weight', \.\.\. \(6 in all\)\) are "
                                  r"torch.float32 on a bf16 device: every step reads them back rounded to bf16 "
                                  r".*4 bytes a param instead of 2\. "
                                  r"A model in torch.bfloat16 matches the device\.$")
        # bf16 model, fp16 device: range
        msgs = caught(lambda: train(make_model().to(torch.bfloat16), "b.img", "fp16"))
        self.assertEqual(len(msgs), 1, msgs)
        self.assertIn("torch.bfloat16 on a fp16 device: gradients lose bf16's range", msgs[0])
        self.assertIn("overflow and the step is skipped", msgs[0])
        # fp16 model, bf16 device
        msgs = caught(lambda: train(make_model().to(torch.float16), "c.img", "bf16"))
        self.assertEqual(len(msgs), 1, msgs)
        self.assertIn("lose 3 of fp16's 11 significant bits", msgs[0])
        # the device's dtype: nothing
        self.assertEqual(caught(lambda: train(make_model().to(torch.bfloat16), "d.img", "bf16")), [])
        self.assertEqual(caught(lambda: train(make_model().to(torch.float16), "e.img", "fp16")), [])


if __name__ == "__main__":
    unittest.main()
