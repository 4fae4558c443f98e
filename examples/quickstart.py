#!/usr/bin/env python3
"""The README's example: a toy model whose optimizer state lives on a device."""
import os, sys, tempfile
import numpy as np
import ckpt

path = sys.argv[1] if len(sys.argv) > 1 else os.path.join(tempfile.mkdtemp(), "state.img")
layout = ckpt.Layout()
layout.add("w", (256, 128))                     # group 0: weight decay
layout.add("b", (128,), group=1)                # group 1: none
ckpt.format(path, layout, dtype="bf16")
bf16 = lambda x: (np.asarray(x, np.float32).view(np.uint32) >> 16).astype(np.uint16)
with ckpt.open(path) as dev:
    dev.load_params({"w": np.random.randn(256, 128) * 0.02, "b": np.zeros(128)})
    for step in range(1, 11):
        dev.begin([{"lr": 1e-2, "weight_decay": 0.1}, {"lr": 1e-2, "weight_decay": 0.0}])
        dev.write_grad("w", bf16(np.random.randn(256, 128)))
        dev.write_grad("b", bf16(np.random.randn(128)))
        print(step, dev.commit(blob=f"data position {step * 32}".encode()))
    p, exp_avg, exp_avg_sq = dev.read_state("w")
with ckpt.open(path) as dev:                    # restore: just open it again
    print("committed step", dev.committed_step, "blob", dev.blob())
