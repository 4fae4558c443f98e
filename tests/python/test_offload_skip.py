# SPDX-License-Identifier: MIT
"""ckpt.torch.OffloadAdamW skips params without a gradient, as torch.optim.AdamW does.

A small model with a frozen layer (requires_grad=False: never a gradient) and
a bias whose .grad is None on every third step, 30 steps against
torch.optim.AdamW(foreach=False) fed the same bf16 gradients: every master
within test_offload_adamw's tolerance of torch's param, the frozen params and
their moments unchanged bit for bit (no weight decay, no moment decay), and
each tensor's step count on the device equal to torch's state["step"] (the
bias correction of a param updated after a skip uses its own count).

Run: PYTHONPATH=<build>/python /usr/bin/python3 -m unittest -v test_offload_skip
"""

import os
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import numpy as np  # noqa: E402
import torch  # noqa: E402

import ckpt.torch  # noqa: E402
from ckpt.torch import OffloadAdamW  # noqa: E402
from ckpt_testlib import tempdir  # noqa: E402
from test_offload_adamw import batch, bf16_round, loss_of, make_model, tol_ratio  # noqa: E402

torch.set_num_threads(1)


class OffloadSkipTest(unittest.TestCase):
    def setUp(self):
        self._tmp = tempdir()
        self.addCleanup(self._tmp.cleanup)

    def test_params_without_grad_are_not_touched(self):
        model = make_model(2)
        frozen = ["0.weight", "0.bias"]      # the first Linear
        sometimes = "3.bias"                 # no grad on every third step
        by_name = dict(model.named_parameters())
        for n in frozen:
            by_name[n].requires_grad_(False)
        init = {n: p.detach().clone() for n, p in model.named_parameters()}
        opt = OffloadAdamW(model.named_parameters(), os.path.join(self._tmp.name, "s.img"),
                           lr=1e-2, weight_decay=0.1)
        self.addCleanup(opt.close)
        names = opt.names()
        ref = {n: torch.nn.Parameter(init[n].clone(), requires_grad=n not in frozen) for n in names}
        ref_opt = torch.optim.AdamW([ref[n] for n in names], lr=1e-2, weight_decay=0.1, foreach=False)
        masters0 = {n: opt.read_state(n)[0].numpy().copy() for n in frozen}
        model0 = {n: by_name[n].detach().clone() for n in frozen}
        rng = np.random.default_rng(11)
        worst = 0.0
        for t in range(1, 31):
            x, y = batch(rng)
            loss_of(model, x, y).backward()
            if t % 3 == 0:
                by_name[sometimes].grad = None
            for n in names:
                g = by_name[n].grad
                ref[n].grad = None if g is None else bf16_round(g)
            opt.step()
            opt.zero_grad()
            ref_opt.step()
            self.assertEqual(opt.last_result, "committed")
            for n in names:
                p, m, v = (a.numpy() for a in opt.read_state(n))
                r = tol_ratio(p, ref[n].detach().numpy())
                self.assertLessEqual(r, 1.0, f"step {t} {n}: master vs torch {r:.2f} x tolerance")
                worst = max(worst, r)
                st = ref_opt.state.get(ref[n], {})
                self.assertEqual(opt.device.tensor_step(n), int(st["step"]) if st else 0, f"step {t} {n}")
            for n in frozen:
                p, m, v = (a.numpy() for a in opt.read_state(n))
                self.assertTrue(np.array_equal(p.view(np.uint32), masters0[n].view(np.uint32)), n)
                self.assertFalse(m.any() or v.any(), n)
                self.assertTrue(torch.equal(by_name[n].detach(), model0[n]), n)
        self.assertEqual(opt.device.tensor_step("0.weight"), 0)
        self.assertEqual(opt.device.tensor_step(sometimes), 20)
        self.assertEqual(opt.device.tensor_step("3.weight"), 30)
        self.assertLess(worst, 1.0)
        # the exported torch state_dict carries each param's own step
        exported = ckpt.torch.to_torch_state_dict(opt)["state"]
        for i, n in enumerate(names):
            st = ref_opt.state.get(ref[n], {})
            self.assertEqual(int(exported[i]["step"]), int(st["step"]) if st else 0, n)


if __name__ == "__main__":
    unittest.main()
