# SPDX-License-Identifier: MIT
"""OffloadAdamW with what torch 2 added around optimizers (torch 2's venv only).

torch.distributed.checkpoint: the optimizer as a Stateful in dcp.save/load
holds a pointer at the device's committed step (no tensor of its state in the
checkpoint), and a pointer of another step is refused on load, as
load_state_dict refuses it; get/set_optimizer_state_dict carry the pointer and
never move the device (they take an empty opt.state for one to create by a
zero-gradient step, which here would commit a step).

torch.compile: a compiled model, and its backward under compiled autograd,
keep the gradient hooks' writes (last_step_hooked) and end bit for bit where
hooks=False ends, with gradient accumulation.

Run: PYTHONPATH=<build>/python <venv>/bin/python -m unittest -v test_torch2
"""
import contextlib
import os
import shutil
import sys
import unittest
import warnings

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402
import torch.distributed.checkpoint as dcp  # noqa: E402
from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict, set_optimizer_state_dict  # noqa: E402

from ckpt.torch import OffloadAdamW, to_torch_state_dict  # noqa: E402
from ckpt_testlib import tempdir  # noqa: E402

torch.set_num_threads(1)
LR = 1e-2


def model_of():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Linear(32, 4)).to(torch.bfloat16)


def batches(n, seed=1):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(8, 16, generator=g).to(torch.bfloat16) for _ in range(n)]


def train(model, opt, data):
    for x in data:
        model(x).float().pow(2).mean().backward()
        opt.step()
        opt.zero_grad()


def device_bytes(opt):
    return {n: [t.clone() for t in opt.read_state(n)] for n in opt.names()}


class DistributedCheckpointTest(unittest.TestCase):
    def setUp(self):
        warnings.filterwarnings("ignore", message=".*torch.distributed is disabled.*")

    def test_stateful_is_a_pointer(self):
        with tempdir() as d:
            model = model_of()
            opt = OffloadAdamW(model.named_parameters(), os.path.join(d, "opt.img"), lr=LR, dtype="bf16")
            train(model, opt, batches(4))
            dcp.save({"model": model, "optim": opt}, checkpoint_id=os.path.join(d, "dcp"))
            meta = dcp.FileSystemReader(os.path.join(d, "dcp")).read_metadata().state_dict_metadata
            optim = {k: v for k, v in meta.items() if k.startswith("optim.")}
            self.assertIn("optim.ckpt.step", optim)
            self.assertEqual([k for k, v in optim.items() if hasattr(v, "size")], [],
                             "the optimizer's entries are a pointer: no tensor of its state")
            self.assertEqual(sorted(k for k, v in meta.items() if hasattr(v, "size")),
                             sorted("model." + n for n, _ in model.named_parameters()))
            opt.close()

    def test_resume_from_dcp_at_the_devices_step(self):
        with tempdir() as d:
            img, saved = os.path.join(d, "opt.img"), os.path.join(d, "dcp")
            data = batches(7)
            model = model_of()
            opt = OffloadAdamW(model.named_parameters(), img, lr=LR, dtype="bf16")
            train(model, opt, data[:3])
            dcp.save({"model": model, "optim": opt}, checkpoint_id=os.path.join(saved, "3"))
            train(model, opt, data[3:4])
            dcp.save({"model": model, "optim": opt}, checkpoint_id=os.path.join(saved, "4"))
            opt.close()
            killed = os.path.join(d, "killed.img")       # the device as a kill after step 4 leaves it
            shutil.copyfile(img, killed)
            model = model_of()
            opt = OffloadAdamW(model.named_parameters(), img, lr=LR / 2, dtype="bf16")
            train(model, opt, data[4:])
            whole = device_bytes(opt), {n: p.detach().clone() for n, p in model.named_parameters()}
            # the device at step 7 loads no older pointer, and nothing moves
            with self.assertRaisesRegex(ValueError, "state_dict is of step 4, the device is at committed step 7"):
                dcp.load({"optim": opt}, checkpoint_id=os.path.join(saved, "4"))
            self.assert_same(whole[0], device_bytes(opt))
            opt.close()

            # the killed run resumes from its latest checkpoint, lr and all
            model = model_of()
            opt = OffloadAdamW(model.named_parameters(), killed, lr=LR * 3, dtype="bf16")
            before = device_bytes(opt)
            with self.assertRaisesRegex(ValueError, "state_dict is of step 3, the device is at committed step 4"):
                dcp.load({"optim": opt}, checkpoint_id=os.path.join(saved, "3"))
            self.assertEqual(opt.committed_step, 4)
            self.assert_same(before, device_bytes(opt))
            dcp.load({"model": model, "optim": opt}, checkpoint_id=os.path.join(saved, "4"))
            self.assertEqual(opt.param_groups[0]["lr"], LR)
            opt.param_groups[0]["lr"] = LR / 2
            train(model, opt, data[4:])
            self.assert_same(whole[0], device_bytes(opt))
            for n, p in model.named_parameters():
                self.assertTrue(torch.equal(p, whole[1][n]), n)
            opt.close()

    def test_state_dict_helpers_move_nothing(self):
        with tempdir() as d:
            model = model_of()
            opt = OffloadAdamW(model.named_parameters(), os.path.join(d, "opt.img"), lr=LR, dtype="bf16")
            self.assertTrue(opt.state)          # the device's, before the first step too
            train(model, opt, batches(3))
            before = device_bytes(opt)
            params = {n: p.detach().clone() for n, p in model.named_parameters()}
            osd = get_optimizer_state_dict(model, opt)
            self.assertEqual(opt.committed_step, 3, "get_optimizer_state_dict committed a step")
            self.assert_same(before, device_bytes(opt))
            for n, p in model.named_parameters():
                self.assertTrue(torch.equal(p, params[n]), n)
            self.assertEqual(osd["param_groups"][0]["ckpt"]["step"], 3)
            self.assertEqual(osd["param_groups"][0]["params"], [n for n, _ in model.named_parameters()])
            opt.param_groups[0]["lr"] = 1.0
            set_optimizer_state_dict(model, opt, osd)
            self.assertEqual(opt.param_groups[0]["lr"], LR)
            self.assertEqual(opt.committed_step, 3)
            self.assert_same(before, device_bytes(opt))
            train(model, opt, batches(1, seed=2))
            with self.assertRaisesRegex(ValueError, "state_dict is of step 3, the device is at committed step 4"):
                set_optimizer_state_dict(model, opt, osd)
            opt.close()

    def test_state_is_the_devices_committed_state(self):
        with tempdir() as d:
            model = model_of()
            opt = OffloadAdamW(model.named_parameters(), os.path.join(d, "opt.img"), lr=LR, dtype="bf16")
            train(model, opt, batches(2))
            torch_sd = to_torch_state_dict(opt)
            params = [p for g in opt.param_groups for p in g["params"]]
            self.assertEqual(len(opt.state), len(params))
            for i, p in enumerate(params):
                for k in ("step", "exp_avg", "exp_avg_sq"):
                    self.assertTrue(torch.equal(opt.state[p][k], torch_sd["state"][i][k]), (i, k))
            with self.assertRaises(TypeError):
                opt.state[params[0]] = {}
            opt.close()

    def assert_same(self, a, b):
        self.assertEqual(a.keys(), b.keys())
        for n in a:
            for x, y in zip(a[n], b[n]):
                self.assertTrue(torch.equal(x, y), n)


class CompileTest(unittest.TestCase):
    """torch.compile (inductor) on a model trained with gradient accumulation:
    the hooks write during the compiled backward and under compiled autograd."""

    def run_compiled(self, d, tag, hooks, compiled_autograd):
        model = model_of()
        opt = OffloadAdamW(model.named_parameters(), os.path.join(d, tag + ".img"), lr=LR, dtype="bf16",
                           hooks=hooks)
        torch._dynamo.config.compiled_autograd = compiled_autograd

        @torch.compile
        def forward_backward(x):       # backward inside: compiled autograd takes it
            loss = model(x).float().pow(2).mean() / 2
            loss.backward()
            return loss

        counters = torch._dynamo.utils.counters
        counters.clear()
        hooked = []
        try:
            for i, x in enumerate(batches(8)):
                with opt.accumulating() if i % 2 == 0 else contextlib.nullcontext():
                    forward_backward(x)
                if i % 2 == 1:
                    opt.step()
                    opt.zero_grad()
                    hooked.append(opt.last_step_hooked)
        finally:
            torch._dynamo.config.compiled_autograd = False
            torch._dynamo.reset()
        self.assertEqual(bool(counters["compiled_autograd"]["captures"]), compiled_autograd)
        masters = {n: t.clone() for n, t in opt.master_params().items()}
        opt.close()
        return masters, hooked

    def test_hooks_under_compile_and_compiled_autograd(self):
        with tempdir() as d:
            for ca in (False, True):
                # compiled autograd's backward rounds as its own graph does:
                # the reference is hooks=False under the same compilation
                want, hooked = self.run_compiled(d, f"plain-{ca}", hooks=False, compiled_autograd=ca)
                self.assertEqual(hooked, [False] * 4)
                got, hooked = self.run_compiled(d, f"hooks-{ca}", hooks=True, compiled_autograd=ca)
                self.assertEqual(hooked, [True] * 4, f"compiled_autograd={ca}")
                for n in want:
                    self.assertTrue(torch.equal(got[n], want[n]), f"compiled_autograd={ca}: {n}")


if __name__ == "__main__":
    unittest.main()
