# SPDX-License-Identifier: MIT
"""OffloadAdamW as DeepSpeed's client optimizer.

    model = model.to(torch.bfloat16)
    opt = OffloadAdamW(model.named_parameters(), "run/opt.img", lr=3e-4)
    engine, opt, _, _ = deepspeed.initialize(
        model=model, optimizer=opt,
        config=ckpt.deepspeed.config(train_micro_batch_size_per_gpu=8,
                                     gradient_clipping=1.0))
    for batch in data:
        engine.backward(loss_of(engine, batch))
        engine.step()
    engine.save_checkpoint("run/ds")     # optimizer state: a pointer at the device

What DeepSpeed allows a client optimizer that keeps its own fp32 masters:

- ZeRO stage 0 with no "fp16"/"bf16" section: DeepSpeed leaves the
  optimizer as it is (no wrapper), the model keeps the dtype it was given
  (bf16 or fp16 params, the device's dtype), engine.backward/step drive
  OffloadAdamW, gradient_clipping clips .grad in place before step() (the
  device gets the clipped gradients), gradient accumulation works as usual.
  config() gives this.
- A "bf16" or "fp16" section, or ZeRO stages 1-3: DeepSpeed wraps the
  optimizer (FP16_Optimizer, BF16_Optimizer, DeepSpeedZeroOptimizer), keeps
  fp32 master copies of the params in host or GPU memory itself, swaps them
  into the optimizer's param groups and copies them into the model after
  each step: the 12 bytes a param that OffloadAdamW moves off the GPU would
  be back, and the device would update params the wrapper then overwrites.
  OffloadAdamW refuses that at deepspeed.initialize (ValueError: its params
  were replaced). Sharding the state over ranks is OffloadAdamW's own
  (process_group=, ZeRO-1's partition, docs/scale.md), under stage 0.
- fp16 loss scaling: DeepSpeed's loss scaler lives in its fp16 wrapper (and
  its CPU accelerator refuses fp16 altogether); use ckpt.torch.LossScaler,
  whose overflow check is the device's, or torch's GradScaler.
"""

__all__ = ["config"]

_WRAPPING = ("fp16", "bf16", "bfloat16", "amp")


def config(train_micro_batch_size_per_gpu=1, gradient_accumulation_steps=1, gradient_clipping=0.0, **extra):
    """A DeepSpeed config for OffloadAdamW as the client optimizer: ZeRO stage 0,
    no fp16/bf16 section (the model is in the device's dtype already).
    extra: any other DeepSpeed keys (train_batch_size, steps_per_print, ...);
    a section that would wrap the optimizer is refused (ValueError)."""
    for k in _WRAPPING:
        if k in extra and (extra[k] or {}).get("enabled", False):
            raise ValueError(f"DeepSpeed's {k!r} section wraps the optimizer in one that keeps fp32 "
                             f"masters itself; OffloadAdamW keeps them on its device (ckpt.deepspeed)")
    zero = dict(extra.pop("zero_optimization", {}) or {})
    if int(zero.get("stage", 0)) != 0:
        raise ValueError(f"ZeRO stage {zero['stage']} keeps fp32 masters of its own; with OffloadAdamW "
                         f"use stage 0 (and process_group= for sharding, docs/scale.md)")
    zero["stage"] = 0
    cfg = {"train_micro_batch_size_per_gpu": int(train_micro_batch_size_per_gpu),
           "gradient_accumulation_steps": int(gradient_accumulation_steps),
           "gradient_clipping": float(gradient_clipping),
           "zero_optimization": zero}
    cfg.update(extra)
    return cfg
