# SPDX-License-Identifier: MIT
"""A Hugging Face Trainer run with OffloadAdamW, for test_huggingface.

    hf_child.py DIR MODEL [--kill-at N]

Trains a small randomly initialised MODEL ("llama" or "gpt2") for 12 steps
(micro-batches of 8, accumulation 2, max_grad_norm 1.0, bf16 autocast, a
linear schedule with warmup, a checkpoint every 4 steps) on token ids from a
fixed generator, with the optimizer state on DIR/opt.img. --kill-at N:
SIGKILLs itself once global step N has committed (between checkpoints). A run
on a DIR whose device exists resumes from resume_checkpoint(). At the end it
saves the device's fp32 masters and the model's params to DIR/final.pt.
"""
import os
import signal
import sys

import torch
from transformers import (GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM, Trainer,
                          TrainerCallback, TrainingArguments, get_linear_schedule_with_warmup)

from ckpt.huggingface import DeviceStepCallback, resume_checkpoint
from ckpt.torch import OffloadAdamW

STEPS, SAVE_STEPS, LR = 12, 4, 3e-3


def model_of(kind):
    torch.manual_seed(0)
    if kind == "llama":
        return LlamaForCausalLM(LlamaConfig(vocab_size=256, hidden_size=64, intermediate_size=128,
                                            num_hidden_layers=2, num_attention_heads=4,
                                            num_key_value_heads=2, max_position_embeddings=64))
    return GPT2LMHeadModel(GPT2Config(vocab_size=256, n_embd=64, n_layer=2, n_head=4, n_positions=64,
                                      resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0))


class Tokens(torch.utils.data.Dataset):
    """Sequences with something to learn: x[t+1] = x[t] + k (mod 256), k in 1..4."""

    def __init__(self, n=512, t=32):
        g = torch.Generator().manual_seed(1)
        start = torch.randint(0, 256, (n, 1), generator=g)
        k = torch.randint(1, 5, (n, 1), generator=g)
        self.x = (start + k * torch.arange(t)) % 256

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        return {"input_ids": self.x[i], "labels": self.x[i]}


class KillAt(TrainerCallback):
    def __init__(self, step):
        self.step = step

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step == self.step:
            os.kill(os.getpid(), signal.SIGKILL)


def args_of(out, **kw):
    return TrainingArguments(**dict(dict(
        output_dir=out, max_steps=STEPS, per_device_train_batch_size=8, gradient_accumulation_steps=2,
        max_grad_norm=1.0, bf16=True, learning_rate=LR, weight_decay=0.0, logging_steps=1,
        save_strategy="steps", save_steps=SAVE_STEPS, report_to=[], use_cpu=True, seed=0,
        dataloader_num_workers=0, disable_tqdm=True), **kw))


def main():
    out, kind = sys.argv[1], sys.argv[2]
    kill_at = int(sys.argv[4]) if len(sys.argv) > 4 and sys.argv[3] == "--kill-at" else None
    torch.set_num_threads(1)
    model = model_of(kind)
    opt = OffloadAdamW(model.named_parameters(), os.path.join(out, "opt.img"), lr=LR, weight_decay=0.0,
                       dtype="bf16")
    sched = get_linear_schedule_with_warmup(opt, 2, STEPS)
    callbacks = [DeviceStepCallback(opt)] + ([KillAt(kill_at)] if kill_at else [])
    trainer = Trainer(model=model, args=args_of(out), train_dataset=Tokens(), optimizers=(opt, sched),
                      callbacks=callbacks)
    trainer.train(resume_from_checkpoint=resume_checkpoint(trainer))
    torch.save({"masters": opt.master_params(), "params": {n: p.detach().clone() for n, p in model.named_parameters()},
                "step": opt.committed_step, "global_step": trainer.state.global_step},
               os.path.join(out, "final.pt"))
    opt.close()


if __name__ == "__main__":
    main()
