# SPDX-License-Identifier: MIT
"""dm-ckpt: AdamW in the storage path.

A dm-ckpt device keeps the fp32 optimizer state (master params, exp_avg,
exp_avg_sq) of a model; a step writes fp16/bf16 gradients and reads back the
updated fp16/bf16 params. Every committed step is durable: reopening the
device restores it.

    layout = ckpt.Layout()
    layout.add("w", (1024, 1024), group=0)
    ckpt.format("state.img", layout, dtype="bf16")
    with ckpt.open("state.img") as dev:
        dev.load_params("w", w0)                     # fp32 masters, step 0
        dev.begin([{"lr": 1e-3, "weight_decay": 0.01}])
        dev.write_grad("w", grad_bits)               # uint16 bf16 bit patterns
        dev.commit(b"trainer state")                 # "committed" or "overflow"
        w = dev.read_params("w")

A Device may be shared by threads: its calls are serialized, close() waits
for the one in flight, and calls after close() raise CkptError E_STATE.

bf16 values travel as uint16 bit patterns (numpy has no bfloat16); fp16
devices take and return numpy float16 (uint16 bit patterns work too).

Everything here goes through libckpt's C ABI (ckpt.h): the error names, dtype
codes and commit results are the library's, read at import; Device.status(),
Device.uuid(), ckpt.image_uuid() and Device.export() (a safetensors file) are
its entry points, as are Device.load_state() (a whole optimizer state from
outside) and ckpt.restore() (ckptctl restore's report, and its rollback).
"""

from ._abi import ERRORS, CkptError, __version__
from .device import (CkptWarning, Device, Layout, format, image_info, image_uuid, open,  # noqa: A004
                     rename_new, reshard, restore)

__all__ = ["__version__", "CkptError", "CkptWarning", "Layout", "Device", "format", "open",
           "image_info", "image_uuid", "restore", "rename_new", "reshard", "ERRORS"]
