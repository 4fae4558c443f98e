#!/usr/bin/env python3
"""ckpt.torch.OffloadAdamW in a PyTorch training loop; run it twice to see it resume.

    PYTHONPATH=build/python /usr/bin/python3 examples/torch_offload.py [state.img] [--steps N]

The first run formats state.img for the model's params (their current values
become the fp32 masters) and trains; every step is committed with a small
trainer blob. Interrupt it any time (Ctrl-C, kill -9): the next run opens the
same file, gets the model's params back from the device and carries on from
the committed step, with the data position from the blob.
"""
import argparse
import json
import os
import tempfile

import numpy as np
import torch

import ckpt.torch

ap = argparse.ArgumentParser()
ap.add_argument("path", nargs="?", default=os.path.join(tempfile.gettempdir(), "torch_offload.img"))
ap.add_argument("--steps", type=int, default=200)
args = ap.parse_args()

torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(32, 128), torch.nn.GELU(), torch.nn.Linear(128, 1))
# Two param groups, as usual for AdamW: no weight decay on biases.
named = list(model.named_parameters())
groups = [{"params": [(n, p) for n, p in named if p.dim() > 1], "weight_decay": 0.05},
          {"params": [(n, p) for n, p in named if p.dim() <= 1], "weight_decay": 0.0}]
opt = ckpt.torch.OffloadAdamW(groups, args.path, lr=3e-3, dtype="bf16")
start = opt.committed_step
position = json.loads(opt.blob())["position"] if start else 0
print(f"{args.path}: {'resuming from committed step ' + str(start) if start else 'new device'}")

for g in opt.param_groups:                       # schedulers work as with torch's optimizers
    g.setdefault("initial_lr", g["lr"])
sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda i: 0.5 * (1 + np.cos(np.pi * i / args.steps)),
                                          last_epoch=start - 1)
w_true = torch.linspace(-1, 1, 32)
for step in range(start + 1, args.steps + 1):
    rng = np.random.default_rng(position)        # the data at this position
    x = torch.from_numpy(rng.standard_normal((64, 32)).astype(np.float32))
    y = (torch.tanh(x @ w_true / 3) + 0.1 * (x[:, :4] ** 2).sum(1)).unsqueeze(1)
    loss = torch.nn.functional.mse_loss(model(x), y)
    loss.backward()
    position += 1
    opt.clip_grad_norm_(1.0)                     # folded into the device's grad_scale
    opt.step(blob=json.dumps({"position": position}).encode())
    opt.zero_grad()
    sched.step()
    if step % 20 == 0 or step == args.steps:
        print(f"step {step:4d}  loss {loss.item():.4f}  lr {opt.param_groups[0]['lr']:.2e}  {opt.last_result}")
print(f"committed step {opt.committed_step}; fp32 masters of 0.weight[0, :4]: "
      f"{opt.read_state('0.weight')[0][0, :4].tolist()}")
opt.close()
