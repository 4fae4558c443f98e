# SPDX-License-Identifier: MIT
"""OffloadAdamW in Hugging Face's Trainer, the real one (torch 2's venv only).

Small randomly initialised Llama and GPT-2 models (nothing downloaded), token
ids from a fixed generator: the Trainer with OffloadAdamW trains to torch
AdamW's losses; its checkpoints hold a pointer at the device's step, not a
copy of the state; a run SIGKILLed between two checkpoints and resumed with
resume_checkpoint() ends bit-identical to an uninterrupted one.

Run: PYTHONPATH=<build>/python HF_HUB_OFFLINE=1 <venv>/bin/python -m unittest -v test_huggingface
"""
import os
import subprocess
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402
from transformers import Trainer, TrainerCallback  # noqa: E402

import hf_child  # noqa: E402
from ckpt.huggingface import DeviceStepCallback, accumulate, resume_checkpoint  # noqa: E402
from ckpt.torch import OffloadAdamW  # noqa: E402
from ckpt_testlib import readme_blocks, run_python_in, tempdir  # noqa: E402

torch.set_num_threads(1)
CHILD = os.path.join(os.path.dirname(os.path.abspath(__file__)), "hf_child.py")


class Losses(TrainerCallback):
    def __init__(self):
        self.losses = []

    def on_log(self, args, state, control, logs=None, **kwargs):
        if logs and "loss" in logs:
            self.losses.append(float(logs["loss"]))


def train(kind, out, optimizer="ckpt", **trainer_kw):
    """(losses, trainer) of hf_child's run, in this process, without a resume."""
    model = hf_child.model_of(kind)
    losses = Losses()
    if optimizer == "ckpt":
        opt = OffloadAdamW(model.named_parameters(), os.path.join(out, "opt.img"), lr=hf_child.LR,
                           weight_decay=0.0, dtype="bf16")
    elif optimizer == "torch":
        opt = torch.optim.AdamW(model.parameters(), lr=hf_child.LR, weight_decay=0.0)
    else:
        opt = None
    optimizers = (opt, hf_child.get_linear_schedule_with_warmup(opt, 2, hf_child.STEPS)) if opt else (None, None)
    callbacks = [losses] + ([DeviceStepCallback(opt)] if optimizer == "ckpt" else [])
    trainer = Trainer(model=model, args=hf_child.args_of(out), train_dataset=hf_child.Tokens(),
                      optimizers=optimizers, callbacks=callbacks, **trainer_kw)
    trainer.train()
    return losses.losses, trainer


class TrainerTest(unittest.TestCase):
    def test_trains_like_torch_adamw(self):
        """Llama and GPT-2, accumulation, clipping, bf16: the losses of torch's AdamW
        (fp32 params there; the model's params here are the device's bf16 ones
        from the start, so even the first loss differs by that rounding)."""
        for kind in ("llama", "gpt2"):
            with self.subTest(kind), tempdir() as d, tempdir() as e:
                mine, trainer = train(kind, d)
                theirs, _ = train(kind, e, optimizer="torch")
                self.assertEqual(len(mine), hf_child.STEPS)
                self.assertEqual(len(theirs), hf_child.STEPS)
                for i, (a, b) in enumerate(zip(mine, theirs)):
                    self.assertLess(abs(a - b), 5e-3 * abs(b), f"step {i + 1}: {mine} against {theirs}")
                self.assertLess(sum(mine[-4:]), sum(mine[:4]))      # it learns
                opt = trainer.optimizer.optimizer
                self.assertEqual(opt.committed_step, hf_child.STEPS)
                trainer.optimizer.optimizer.close()

    def test_checkpoints_point_at_the_device(self):
        with tempdir() as d:
            _, trainer = train("llama", d)
            n_state = sum(4 * 3 * p.numel() for p in trainer.model.parameters())
            for step in range(hf_child.SAVE_STEPS, hf_child.STEPS + 1, hf_child.SAVE_STEPS):
                path = os.path.join(d, f"checkpoint-{step}", "optimizer.pt")
                saved = torch.load(path, weights_only=True)
                self.assertEqual(saved["state"], {})
                self.assertEqual(saved["ckpt"]["step"], step)
                # a pointer: kilobytes, where a copy of the fp32 state is megabytes
                self.assertLess(os.path.getsize(path), 64 << 10)
                self.assertGreater(n_state, 100 * os.path.getsize(path))
            trainer.optimizer.optimizer.close()

    def test_optimizer_cls_and_kwargs(self):
        """The Trainer builds OffloadAdamW itself from its param groups (decay and
        no decay, unnamed)."""
        with tempdir() as d:
            path = os.path.join(d, "opt.img")
            model = hf_child.model_of("gpt2")
            trainer = Trainer(model=model, args=hf_child.args_of(d, lr_scheduler_type="constant"),
                              train_dataset=hf_child.Tokens(),
                              optimizer_cls_and_kwargs=(OffloadAdamW, {"device_or_path": path, "dtype": "bf16",
                                                                       "lr": hf_child.LR}))
            trainer.train()
            opt = trainer.optimizer.optimizer
            self.assertIsInstance(opt, OffloadAdamW)
            self.assertEqual(len(opt.param_groups), 2)
            self.assertEqual(opt.committed_step, hf_child.STEPS)
            opt.close()


class ResumeTest(unittest.TestCase):
    def child(self, d, kind, *args):
        env = dict(os.environ, HF_HUB_OFFLINE="1")
        return subprocess.run([sys.executable, CHILD, d, kind, *args], env=env, capture_output=True,
                              text=True, timeout=240)

    def test_sigkill_between_checkpoints_resumes_bit_identical(self):
        for kind in ("llama", "gpt2"):
            with self.subTest(kind), tempdir() as whole, tempdir() as cut:
                p = self.child(whole, kind)
                self.assertEqual(p.returncode, 0, p.stderr[-3000:])
                p = self.child(cut, kind, "--kill-at", "6")
                self.assertEqual(p.returncode, -9, p.stderr[-3000:])
                self.assertEqual(sorted(f for f in os.listdir(cut) if f.startswith("checkpoint")),
                                 ["checkpoint-4"])
                p = self.child(cut, kind)
                self.assertEqual(p.returncode, 0, p.stderr[-3000:])
                # the completed checkpoint of the device's step, then the Trainer's own
                self.assertTrue(os.path.isdir(os.path.join(cut, "checkpoint-6")))
                a = torch.load(os.path.join(whole, "final.pt"), weights_only=True)
                b = torch.load(os.path.join(cut, "final.pt"), weights_only=True)
                self.assertEqual((b["step"], b["global_step"]), (hf_child.STEPS, hf_child.STEPS))
                for what in ("masters", "params"):
                    self.assertEqual(a[what].keys(), b[what].keys())
                    for n in a[what]:
                        self.assertTrue(torch.equal(a[what][n], b[what][n]), f"{what} {n}")

    def test_refusals(self):
        with tempdir() as d:
            # a device ahead of the checkpoints without the callback's record
            model = hf_child.model_of("gpt2")
            opt = OffloadAdamW(model.named_parameters(), os.path.join(d, "opt.img"), lr=hf_child.LR,
                               dtype="bf16")
            trainer = Trainer(model=model, args=hf_child.args_of(d, max_steps=6), train_dataset=hf_child.Tokens(),
                              optimizers=(opt, hf_child.get_linear_schedule_with_warmup(opt, 2, 6)))
            self.assertIsNone(resume_checkpoint(trainer))    # nothing yet
            trainer.train()
            last = os.path.join(d, "checkpoint-6")
            self.assertEqual(resume_checkpoint(trainer), last)   # it points at the device's step
            # one more step outside the Trainer: the device is ahead, and nothing
            # says at which global step
            batch = hf_child.Tokens()[0]
            model(input_ids=batch["input_ids"][None], labels=batch["labels"][None]).loss.backward()
            opt.step()
            self.assertEqual(opt.committed_step, 7)
            with self.assertRaisesRegex(ValueError, "DeviceStepCallback"):
                resume_checkpoint(trainer)
            # no checkpoint to complete
            with tempdir() as e:
                with self.assertRaisesRegex(ValueError, "no Trainer checkpoint"):
                    resume_checkpoint(trainer, output_dir=e)
            opt.close()


class AccelerateTest(unittest.TestCase):
    """Accelerate as its users write it: prepare, accumulate, clip_grad_norm_,
    save_state/load_state."""

    def run_accelerate(self, path, hooks=True, micro=16, save=None, load=None):
        from accelerate import Accelerator
        accelerator = Accelerator(mixed_precision="bf16", gradient_accumulation_steps=2, cpu=True)
        model = hf_child.model_of("gpt2")
        opt = OffloadAdamW(model.named_parameters(), path, lr=hf_child.LR, weight_decay=0.0, hooks=hooks)
        sched = hf_child.get_linear_schedule_with_warmup(opt, 2, micro // 2)
        loader = torch.utils.data.DataLoader(hf_child.Tokens(), batch_size=8, shuffle=False)
        model, popt, loader, sched = accelerator.prepare(model, opt, loader, sched)
        if load:
            try:
                accelerator.load_state(load)
            except BaseException:
                opt.close()
                raise
        start = 2 * opt.committed_step      # the data position of the device's step
        for i, batch in enumerate(loader):
            if i < start:
                continue
            if i == micro:
                break
            ctx = accumulate(accelerator, model, popt) if hooks else accelerator.accumulate(model)
            with ctx:
                accelerator.backward(model(**batch).loss)
                if accelerator.sync_gradients:
                    accelerator.clip_grad_norm_(model.parameters(), 1.0)
                popt.step()
                sched.step()
                popt.zero_grad()
            if save and accelerator.sync_gradients and opt.committed_step in save:
                accelerator.save_state(save[opt.committed_step])
        return opt, model

    def test_accumulate_clip_and_state(self):
        with tempdir() as d:
            a, model = self.run_accelerate(os.path.join(d, "a.img"),
                                           save={4: os.path.join(d, "s4"), 8: os.path.join(d, "s8")})
            self.assertEqual(a.committed_step, 8)
            mine = {n: t.clone() for n, t in a.master_params().items()}
            a.close()
            b, _ = self.run_accelerate(os.path.join(d, "b.img"), hooks=False)
            for n, t in b.master_params().items():
                self.assertTrue(torch.equal(mine[n], t), n)
            b.close()
            # the saved optimizer state is a pointer; an older one is refused,
            # the device's step resumes (and trains nothing more here)
            files = os.listdir(os.path.join(d, "s4"))
            opt_files = [f for f in files if f.startswith("optimizer")]
            self.assertEqual(len(opt_files), 1, files)
            self.assertLess(os.path.getsize(os.path.join(d, "s4", opt_files[0])), 64 << 10)
            with self.assertRaisesRegex(ValueError, "step 4, the device is at committed step 8"):
                self.run_accelerate(os.path.join(d, "a.img"), load=os.path.join(d, "s4"))
            c, model = self.run_accelerate(os.path.join(d, "a.img"), load=os.path.join(d, "s8"))
            self.assertEqual(c.committed_step, 8)
            for n, t in c.master_params().items():
                self.assertTrue(torch.equal(mine[n], t), n)
            c.close()


class ReadmeTest(unittest.TestCase):
    def test_readme_example_runs_and_resumes(self):
        """The README's Trainer example, twice in one directory: the second run
        resumes from the checkpoint of the device's step 8. (Resumed at
        max_steps, the Trainer trains one step more, with torch's AdamW too;
        the device follows it.)"""
        (code,) = [b for b in readme_blocks("py") if "Trainer(" in b]
        self.assertIn("resume_checkpoint(trainer)", code)
        with tempdir() as d:
            for expect in ("trained to step 8 device at 8\n", "trained to step 9 device at 9\n"):
                rc, out = run_python_in(d, code)
                self.assertEqual(rc, 0, out[-3000:])
                self.assertIn(expect, out)

    def test_readme_accelerate_example_runs_and_resumes(self):
        """The README's Accelerate example, twice in one directory: 8 steps,
        then a restart that reopens the device at step 8 and trains no more."""
        (code,) = [b for b in readme_blocks("py") if "Accelerator(" in b]
        with tempdir() as d:
            for _ in range(2):
                rc, out = run_python_in(d, code)
                self.assertEqual(rc, 0, out[-3000:])
                self.assertIn("device at step 8\n", out)
            self.assertTrue(os.listdir(os.path.join(d, "acc-run")))


if __name__ == "__main__":
    unittest.main()
