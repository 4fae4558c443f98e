# SPDX-License-Identifier: MIT
"""OffloadAdamW writing each gradient from backward (hooks=True, the default).

- gradient accumulation over micro-batches (every backward but the last in
  opt.accumulating()): the steps keep the writes made during backward
  (last_step_hooked), the masters are bit for bit those of hooks=False fed
  the same gradients, and within the oracle's tolerance of torch.optim.AdamW
  given the same bf16 gradients;
- what step() decides after backward and the writes could not know is caught
  and the step is written again, with the same result as hooks=False: a clip
  coefficient below 1, an lr changed after backward, a second backward without
  accumulating(), a .grad set to None or changed in place after backward, also
  where torch counts no version (.data, numpy, torch 1.13's clip_grad_value_);
- the step after such a one is staged (the hooks only round the gradients,
  step() writes them with its scale): a trainer that clips every step, in
  place as torch's clip_grad_norm_ (Accelerate, the Trainer, DeepSpeed) or
  through opt.clip_grad_norm_, writes each gradient once, never aborts, and
  ends bit for bit where hooks=False does; a staged step that needed no
  change sends the next one back to the hooks (last_step_mode);
- reads of state between backward and step() return the committed step's;
- a param without a gradient is skipped (its step count stays) with hooks too;
- last_grad_norm, the device's norm of the step's gradients, with and without
  hooks, clipped or not, under a grad_scale.

Run: PYTHONPATH=<build>/python /usr/bin/python3 -m unittest -v test_offload_hooks
"""

import os
import sys
import unittest
import warnings

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import numpy as np  # noqa: E402
import torch  # noqa: E402

from ckpt.torch import OffloadAdamW, PrecisionWarning, to_torch_state_dict  # noqa: E402
from ckpt_testlib import tempdir  # noqa: E402
from test_offload_adamw import batch, bf16_round, groups_of, loss_of, make_model, tol_ratio  # noqa: E402

torch.set_num_threads(1)


class OffloadHooksTest(unittest.TestCase):
    def setUp(self):
        self._tmp = tempdir()
        self.dir = self._tmp.name

    def tearDown(self):
        self._tmp.cleanup()

    def pair(self, tag="", **kw):
        """Two models from the same init, with hooks and without."""
        out = []
        warnings.simplefilter("ignore", PrecisionWarning)   # an fp32 model, as in test_offload_adamw
        for hooks in (True, False):
            model = make_model()
            opt = OffloadAdamW(groups_of(model), os.path.join(self.dir, f"h{hooks}{tag}.img"), lr=3e-3,
                               hooks=hooks, **kw)
            self.addCleanup(opt.close)
            out.append((model, opt))
        return out

    def assert_same_masters(self, a, b, what):
        for n in a.names():
            pa, ma, va = a.read_state(n)
            pb, mb, vb = b.read_state(n)
            for x, y, k in ((pa, pb, "p"), (ma, mb, "m"), (va, vb, "v")):
                self.assertTrue(torch.equal(x, y), f"{what}: {n} {k}")

    def test_accumulation_matches_torch(self):
        (hm, hopt), (pm, popt) = self.pair()
        init = make_model()
        names = hopt.names()
        ref = {n: torch.nn.Parameter(p.detach().clone()) for n, p in init.named_parameters()}
        gs = groups_of(init)
        ref_opt = torch.optim.AdamW([dict({k: v for k, v in g.items() if k != "params"},
                                          params=[ref[n] for n, _ in g["params"]]) for g in gs],
                                    lr=3e-3, foreach=False)
        rng = np.random.default_rng(3)
        for t in range(1, 16):
            micro = [batch(rng, 8) for _ in range(3)]
            for model, opt in ((hm, hopt), (pm, popt)):
                for k, (x, y) in enumerate(micro):
                    if k < len(micro) - 1:
                        with opt.accumulating():
                            loss_of(model, x, y).backward()
                    else:
                        loss_of(model, x, y).backward()
            by_name = dict(hm.named_parameters())
            for n in names:
                ref[n].grad = bf16_round(by_name[n].grad)
            hopt.step()
            popt.step()
            ref_opt.step()
            for opt in (hopt, popt):
                opt.zero_grad()
                self.assertEqual(opt.last_result, "committed")
            self.assertTrue(hopt.last_step_hooked, f"step {t} was written again")
            self.assertFalse(popt.last_step_hooked)
            # each gradient written once, each param read back once
            self.assertEqual(hopt.last_step_bytes, popt.last_step_bytes)
            self.assertEqual(hopt.last_step_bytes["params_read"], 2 * sum(p.numel() for p in hm.parameters()))
            # and one status-page read, after the COMMIT
            self.assertEqual(hopt.last_step_bytes["status_reads"], 1)
            self.assert_same_masters(hopt, popt, f"step {t}")
            for n in names:
                r = tol_ratio(hopt.read_state(n)[0].numpy(), ref[n].detach().numpy())
                self.assertLessEqual(r, 1.0, f"step {t} {n}: master vs torch {r:.2f} x tolerance")
                self.assertTrue(torch.equal(by_name[n].detach(), bf16_round(hopt.read_state(n)[0])))

    def run_both(self, pairs, rng, between, mode):
        x, y = batch(rng)
        for model, opt in pairs:
            loss_of(model, x, y).backward()
            between(model, opt)
            opt.step()
            opt.zero_grad()
            self.assertEqual(opt.last_result, "committed")
        hopt, popt = pairs[0][1], pairs[1][1]
        self.assertEqual(hopt.last_step_mode, mode)
        self.assertEqual(hopt.last_step_hooked, mode == "hooked")
        self.assertEqual(popt.last_step_mode, "written")
        self.assert_same_masters(hopt, popt, "step")

    def test_what_step_decides_later_is_caught(self):
        pairs = self.pair()
        rng = np.random.default_rng(5)
        self.run_both(pairs, rng, lambda m, o: None, "hooked")
        # clipping active: the coefficient is known only after backward
        self.run_both(pairs, rng, lambda m, o: o.clip_grad_norm_(1e-3), "redone")
        # the next step is staged; clipping inactive: the one after is hooked again
        self.run_both(pairs, rng, lambda m, o: o.clip_grad_norm_(1e6), "staged")
        self.run_both(pairs, rng, lambda m, o: o.clip_grad_norm_(1e6), "hooked")

        def lr_after_backward(m, o):
            for g in o.param_groups:
                g["lr"] = 1e-3
        self.run_both(pairs, rng, lr_after_backward, "redone")
        self.run_both(pairs, rng, lambda m, o: None, "staged")   # and it stays
        self.run_both(pairs, rng, lambda m, o: None, "hooked")

        def twice(m, o):
            x, y = batch(np.random.default_rng(11))
            loss_of(m, x, y).backward()
        self.run_both(pairs, rng, twice, "redone")
        self.run_both(pairs, rng, twice, "written")     # staged, but backward ran twice

        def drop_grad(m, o):
            m[0].bias.grad = None
        self.run_both(pairs, rng, drop_grad, "staged")

        def in_place(m, o):
            m[0].weight.grad.mul_(0.5)
        self.run_both(pairs, rng, in_place, "staged")
        self.run_both(pairs, rng, lambda m, o: None, "staged")
        self.run_both(pairs, rng, in_place, "redone")

    def test_clipping_every_step_is_staged(self):
        """A trainer that clips: the first clipped step is done twice, every later
        one is staged: each gradient written once (the same bytes as hooks=False),
        no abort, and the state bit for bit hooks=False's, whether the clip is
        torch's in place or the device's coefficient, and whether or not it clips."""
        pairs = self.pair()
        rng = np.random.default_rng(17)

        def torch_clip(max_norm):
            return lambda m, o: torch.nn.utils.clip_grad_norm_(m.parameters(), max_norm)

        def device_clip(max_norm):
            return lambda m, o: o.clip_grad_norm_(max_norm)

        self.run_both(pairs, rng, torch_clip(1e-2), "redone")
        aborted = pairs[0][1].device.status()["steps_aborted"]
        for t, clip in enumerate([torch_clip(1e-2), device_clip(1e-2), torch_clip(1e-3),
                                  device_clip(1e-3), torch_clip(1e-2)]):
            with self.subTest(step=t):
                self.run_both(pairs, rng, clip, "staged")
                hb, pb = (o.last_step_bytes for _, o in pairs)
                for k in ("grad_written", "params_read"):
                    self.assertEqual(hb[k], pb[k], k)
        self.assertEqual(pairs[0][1].device.status()["steps_aborted"], aborted)
        # a clip that changes nothing: the next step goes back to the hooks
        self.run_both(pairs, rng, device_clip(1e6), "staged")
        self.run_both(pairs, rng, torch_clip(1e6), "hooked")

    def test_device_reports_the_gradient_norm(self):
        """last_grad_norm, summed by the device as the gradients arrived: the norm
        of the gradients rounded to the device's dtype (float64 here), times
        grad_scale without the clip coefficient (what opt.clip_grad_norm_
        returned), with hooks and without, hooked, redone and staged steps;
        inf for a step skipped on an infinite gradient."""
        pairs = self.pair()
        rng = np.random.default_rng(23)
        modes = set()
        for t, (scale, max_norm) in enumerate([(1.0, None), (0.5, None), (1.0, 1e-3),
                                               (1.0, 1e-3), (0.25, 1e6), (1.0, None)]):
            x, y = batch(rng)
            for model, opt in pairs:
                loss_of(model, x, y).backward()
                want = 0.0
                for p in model.parameters():
                    g = bf16_round(p.grad).double()
                    want += float((g * g).sum())
                want = want ** 0.5 * scale
                clip = opt.clip_grad_norm_(max_norm / scale) if max_norm else None
                opt.step(grad_scale=scale)
                opt.zero_grad()
                with self.subTest(step=t, hooks=opt is pairs[0][1], mode=opt.last_step_mode):
                    self.assertEqual(opt.last_result, "committed")
                    self.assertIsInstance(opt.last_grad_norm, float)
                    self.assertAlmostEqual(opt.last_grad_norm / want, 1.0, delta=1e-12)
                    if clip is not None:
                        self.assertAlmostEqual(opt.last_grad_norm / float(clip) / scale, 1.0,
                                               delta=1e-5)
                    st = opt.device.status()
                    self.assertEqual(st["grad_sumsq_step"], st["committed_step"])
                    self.assertAlmostEqual(st["grad_sumsq"] / (opt.last_grad_norm / scale) ** 2, 1.0,
                                           delta=1e-15)
                modes.add(opt.last_step_mode)
        self.assertEqual(modes, {"hooked", "redone", "staged", "written"})
        for model, opt in pairs:
            loss_of(model, *batch(rng)).backward()
            next(model.parameters()).grad[0, 0] = float("inf")
            opt.step()
            opt.zero_grad()
            self.assertEqual(opt.last_result, "overflow")
            self.assertEqual(opt.last_grad_norm, float("inf"))

    def test_edits_without_a_version_are_caught(self):
        """Edits of the gradient after backward that bump no version counter (a
        write through .data, numpy, torch 1.13's clip_grad_value_) change what
        step() would write: the step is written again, as hooks=False writes it."""
        rng = np.random.default_rng(7)
        for kw in ({}, {"maximize": True}):
            pairs = self.pair(tag=str(len(kw)), **kw)

            def clip_value(m, o):       # p.grad.data.clamp_ in torch 1.13
                torch.nn.utils.clip_grad_value_(m.parameters(), 1e-3)

            def data_mul(m, o):
                m[0].weight.grad.data.mul_(0.5)

            def data_set(m, o):
                m[3].bias.grad.data = m[3].bias.grad.data * 0.5

            def numpy_average(m, o):    # a hand-made all-reduce over two ranks
                for p in m.parameters():
                    a = p.grad.numpy()
                    a += a
                    a /= 4

            for edit in (clip_value, data_mul, data_set, numpy_average):
                with self.subTest(kw=kw, edit=edit.__name__):
                    self.run_both(pairs, rng, edit, "redone" if edit is clip_value else "staged")
            # an edit that rounds to the same device words changes nothing written
            with self.subTest(kw=kw, edit="same rounding"):
                self.run_both(pairs, rng, lambda m, o: m[0].weight.grad.data.mul_(1.0), "staged")
                self.run_both(pairs, rng, lambda m, o: m[0].weight.grad.data.mul_(1.0), "hooked")
            for _, opt in pairs:
                opt.close()

    def test_state_read_between_backward_and_step_is_committed(self):
        """The hooks open the step during backward; until step() commits it, reads
        of state (read_state, master_params, to_torch_state_dict) return the
        committed step's, as with hooks=False: a checkpoint taken there holds a
        step that exists, whether the step then commits or is aborted."""
        pairs = self.pair()
        (hm, hopt), (pm, popt) = pairs
        rng = np.random.default_rng(13)
        self.run_both(pairs, rng, lambda m, o: None, "hooked")     # moments not zero

        def reads(opt):
            sd = to_torch_state_dict(opt)
            return ({n: [x.clone() for x in opt.read_state(n)] for n in opt.names()},
                    {n: t.clone() for n, t in opt.master_params().items()},
                    {i: {k: v.clone() for k, v in s.items()} for i, s in sd["state"].items()})

        def assert_same(a, b, what):
            for k, (da, db) in enumerate(zip(a, b)):
                self.assertEqual(da.keys(), db.keys())
                for n in da:
                    xs, ys = da[n], db[n]
                    xs, ys = (xs.values(), ys.values()) if isinstance(xs, dict) else (xs, ys)
                    for x, y in zip(xs, ys):
                        self.assertTrue(torch.equal(x, y), f"{what}: read {k}, {n}")

        committed = reads(hopt)
        x, y = batch(rng)
        for model, _ in pairs:
            loss_of(model, x, y).backward()
        self.assertEqual(hopt.device.status()["state"], "open", "the hooks opened step 2")
        self.assertEqual(hopt.device.status()["chunks_done"], hopt.device.info()["n_chunks"])
        during = reads(hopt)
        assert_same(during, committed, "hooks, step open")
        assert_same(during, reads(popt), "hooks vs hooks=False")
        for _, opt in pairs:
            opt.step()
            self.assertEqual(opt.last_result, "committed")
        self.assertTrue(hopt.last_step_hooked)
        self.assert_same_masters(hopt, popt, "step 2")
        with self.assertRaises(AssertionError):     # the reads do show the new step
            assert_same(reads(hopt), committed, "after step 2")

    def test_param_without_gradient_is_skipped(self):
        pairs = self.pair()
        rng = np.random.default_rng(9)
        for model, opt in pairs:
            model[1].weight.requires_grad_(False)   # LayerNorm's weight: no gradient
        for _ in range(3):
            self.run_both(pairs, rng, lambda m, o: None, "hooked")
        for _, opt in pairs:
            self.assertEqual(opt.device.tensor_step("1.weight"), 0)
            self.assertEqual(opt.device.tensor_step("0.weight"), 3)


if __name__ == "__main__":
    unittest.main()
