# SPDX-License-Identifier: MIT
# SPDX-License-Identifier: MIT
"""PyTorch integration: an AdamW whose state and step live on a dm-ckpt device.

    import ckpt.torch
    with ckpt.torch.OffloadAdamW(model.named_parameters(), "state.img", lr=3e-4) as opt:
        for batch in data:
            loss = model(batch)
            loss.backward()
            opt.step(blob=trainer_state_bytes)  # writes grads, commits, reads params back
            opt.zero_grad()

OffloadAdamW is a torch.optim.Optimizer with torch.optim.AdamW's arguments
(maximize; foreach, fused, capturable, differentiable accepted; amsgrad
refused): param_groups (lr, betas, eps, weight_decay, maximize are read from
them at every step, so LR schedulers work), zero_grad,
state_dict/load_state_dict, step(closure). The fp32 master params and the
moments are on the device; the model holds the low-precision params (bf16/fp16
values, in whatever dtype its tensors have). Every committed step is a
checkpoint: constructing the optimizer again on the same device resumes from
its committed step (and `optimizer.blob()` returns the trainer blob that
committed with it).

A torch.optim.AdamW's state moves onto a device with load_state_dict(), and
back with to_torch_state_dict().

LossScaler is torch.cuda.amp.GradScaler's dynamic loss scaling for fp16
devices, where the device itself detects non-finite gradients.
export_safetensors writes a device's params as a safetensors checkpoint.

The package: optimizer (OffloadAdamW), drivers (the sharded step), scaler
(LossScaler and torch's GradScaler), convert (dtypes, torch state_dicts,
safetensors).
"""

from .convert import export_safetensors, load_safetensors_into, lowp_to_torch, to_torch_state_dict, torch_to_lowp
from .optimizer import LayoutMismatchError, OffloadAdamW, PrecisionWarning
from .scaler import LossScaler

__all__ = ["OffloadAdamW", "LossScaler", "LayoutMismatchError", "PrecisionWarning", "export_safetensors",
           "load_safetensors_into", "lowp_to_torch", "torch_to_lowp", "to_torch_state_dict"]
