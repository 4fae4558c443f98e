# SPDX-License-Identifier: MIT
"""OffloadAdamW as DeepSpeed's client optimizer, the real DeepSpeed (torch 2's venv only).

DeepSpeed's CPU accelerator over gloo, one rank. ZeRO stage 0 with
ckpt.deepspeed.config(): a bf16 model trained by engine.backward/step with
gradient accumulation and clipping is bit for bit the same as OffloadAdamW
driven by hand with DeepSpeed's own clip_grad_norm_; save_checkpoint holds a
pointer at the device and load_checkpoint resumes bit-identically; the
configurations in which DeepSpeed would keep fp32 masters itself (a bf16 or
fp16 section, ZeRO stages 1 and 2) are refused with the reason, where before
they trained nothing at all.

Run: PYTHONPATH=<build>/python DS_ACCELERATOR=cpu <venv>/bin/python -m unittest -v test_deepspeed
"""
import os
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
os.environ.setdefault("DS_ACCELERATOR", "cpu")

import torch  # noqa: E402
import deepspeed  # noqa: E402
from deepspeed.runtime.utils import clip_grad_norm_ as ds_clip_grad_norm_  # noqa: E402

import ckpt.deepspeed  # noqa: E402
from ckpt.torch import OffloadAdamW  # noqa: E402
from ckpt_testlib import free_port, readme_blocks, run_python_in, tempdir  # noqa: E402

torch.set_num_threads(1)
MICRO, ACCUM, CLIP, LR = 8, 2, 0.5, 1e-2


def model_of():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.GELU(), torch.nn.Linear(64, 4)).to(torch.bfloat16)


def batches(n):
    g = torch.Generator().manual_seed(1)
    w = torch.randn(16, 4, generator=g)
    for _ in range(n):
        x = torch.randn(MICRO, 16, generator=g)
        yield x.to(torch.bfloat16), (x @ w).to(torch.bfloat16)


def loss_of(model, x, y):
    return ((model(x).float() - y.float()) ** 2).mean()


def engine_of(model, opt, **cfg):
    config = ckpt.deepspeed.config(train_micro_batch_size_per_gpu=MICRO, gradient_accumulation_steps=ACCUM,
                                   gradient_clipping=CLIP, steps_per_print=10 ** 9, **cfg)
    engine, _, _, _ = deepspeed.initialize(model=model, optimizer=opt, config=config)
    return engine


def train_engine(engine, data):
    losses = []
    for x, y in data:
        loss = loss_of(engine, x, y)
        engine.backward(loss)
        engine.step()
        losses.append(loss.item())
    return losses


def snapshot(opt, model):
    return ({n: t.clone() for n, t in opt.master_params().items()},
            {n: p.detach().clone() for n, p in model.named_parameters()})


class DeepSpeedTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1",
                          MASTER_PORT=str(free_port()))
        deepspeed.init_distributed(dist_backend="gloo")

    def assert_same(self, a, b):
        for x, y in zip(a, b):
            self.assertEqual(x.keys(), y.keys())
            for n in x:
                self.assertTrue(torch.equal(x[n], y[n]), n)

    def test_stage0_is_offload_adamw_driven_by_hand(self):
        steps = 6
        with tempdir() as d:
            model = model_of()
            opt = OffloadAdamW(model.named_parameters(), os.path.join(d, "ds.img"), lr=LR, dtype="bf16")
            engine = engine_of(model, opt)
            self.assertIs(engine.optimizer, opt)          # not wrapped
            losses = train_engine(engine, batches(steps * ACCUM))
            self.assertEqual(opt.committed_step, steps)
            self.assertLess(sum(losses[-ACCUM:]), 0.5 * sum(losses[:ACCUM]))   # it learns
            ds = snapshot(opt, model)
            opt.close()
            # by hand, without DeepSpeed and without the hooks' writes
            model = model_of()
            opt = OffloadAdamW(model.named_parameters(), os.path.join(d, "hand.img"), lr=LR, dtype="bf16",
                               hooks=False)
            for i, (x, y) in enumerate(batches(steps * ACCUM)):
                (loss_of(model, x, y) / ACCUM).backward()
                if i % ACCUM == ACCUM - 1:
                    ds_clip_grad_norm_(model.parameters(), max_norm=CLIP)
                    opt.step()
                    opt.zero_grad()
            self.assert_same(ds, snapshot(opt, model))
            opt.close()

    def test_checkpoint_is_a_pointer_and_resumes(self):
        with tempdir() as d:
            img, saved = os.path.join(d, "ds.img"), os.path.join(d, "ds-ckpt")
            model = model_of()
            opt = OffloadAdamW(model.named_parameters(), img, lr=LR, dtype="bf16")
            engine = engine_of(model, opt)
            data = list(batches(6 * ACCUM))
            train_engine(engine, data[:4 * ACCUM])
            engine.save_checkpoint(saved, tag="s4")
            files = os.listdir(os.path.join(saved, "s4"))
            size = sum(os.path.getsize(os.path.join(saved, "s4", f)) for f in files)
            state = sum(12 * p.numel() for p in model.parameters())
            self.assertLess(size, state + 64 << 10)   # the model, a pointer: no fp32 state
            train_engine(engine, data[4 * ACCUM:5 * ACCUM])
            engine.save_checkpoint(saved, tag="s5")
            train_engine(engine, data[5 * ACCUM:])
            whole = snapshot(opt, model)
            opt.close()
            # a process killed after step 5: the device has step 5 and its
            # checkpoint; the one of step 4 is refused, not loaded
            model = model_of()
            opt = OffloadAdamW(model.named_parameters(), img, lr=LR)
            opt.load_state_dict(opt.state_dict())
            self.assertEqual(opt.committed_step, 6)
            opt.load_state_dict(torch.load(os.path.join(saved, "s5", "mp_rank_00_model_states.pt"),
                                           weights_only=False)["optimizer"], rollback=True)
            self.assertEqual(opt.committed_step, 5)
            opt.close()
            model = model_of()
            opt = OffloadAdamW(model.named_parameters(), img, lr=LR)
            engine = engine_of(model, opt)
            with self.assertRaisesRegex(ValueError, "step 4, the device is at committed step 5"):
                engine.load_checkpoint(saved, tag="s4")
            # the checkpoint of the device's step resumes, and the last step is
            # the uninterrupted run's
            engine.load_checkpoint(saved, tag="s5")
            self.assertEqual(engine.global_steps, 5)
            train_engine(engine, data[5 * ACCUM:])
            self.assertEqual(engine.global_steps, 6)
            self.assert_same(whole, snapshot(opt, model))
            opt.close()

    def test_wrapping_configurations_are_refused(self):
        for cfg, why in (({"bf16": {"enabled": True}}, "its params are not the ones"),
                         ({"zero_optimization": {"stage": 1}, "bf16": {"enabled": True},
                           "zero_allow_untested_optimizer": True}, "its params are not the ones"),
                         ({"zero_optimization": {"stage": 2}, "zero_allow_untested_optimizer": True},
                          "its params are not the ones")):
            with self.subTest(cfg), tempdir() as d:
                model = model_of()
                opt = OffloadAdamW(model.named_parameters(), os.path.join(d, "ds.img"), lr=LR, dtype="bf16")
                config = dict(train_micro_batch_size_per_gpu=MICRO, **cfg)
                with self.assertRaisesRegex(ValueError, why):
                    engine, _, _, _ = deepspeed.initialize(model=model, optimizer=opt, config=config)
                    train_engine(engine, batches(ACCUM))
                self.assertEqual(opt.committed_step, 0)
                opt.close()
        for kw, why in (({"bf16": {"enabled": True}}, "'bf16' section wraps"),
                        ({"fp16": {"enabled": True}}, "'fp16' section wraps"),
                        ({"zero_optimization": {"stage": 2}}, "ZeRO stage 2 keeps fp32 masters")):
            with self.subTest(kw), self.assertRaisesRegex(ValueError, why):
                ckpt.deepspeed.config(**kw)
        self.assertEqual(ckpt.deepspeed.config(bf16={"enabled": False})["bf16"], {"enabled": False})


class ReadmeTest(unittest.TestCase):
    def test_readme_example_runs(self):
        (code,) = [b for b in readme_blocks("py") if "deepspeed.initialize" in b]
        code = code.replace('MASTER_PORT="29517"', f'MASTER_PORT="{free_port()}"')
        self.assertIn("ckpt.deepspeed.config(", code)
        with tempdir() as d:
            rc, out = run_python_in(d, code)
            self.assertEqual(rc, 0, out[-3000:])
            self.assertIn("device at step 4\n", out)     # 8 micro-batches, 2 a step
            self.assertTrue(os.path.isdir(os.path.join(d, "ds-run")))


if __name__ == "__main__":
    unittest.main()
