# SPDX-License-Identifier: MIT
"""OffloadAdamW in Hugging Face's Trainer: checkpoints that point at the device.

    opt = OffloadAdamW(model.named_parameters(), "run/opt.img", lr=3e-4)
    sched = get_linear_schedule_with_warmup(opt, 100, 10_000)
    trainer = Trainer(model=model, args=args, train_dataset=data,
                      optimizers=(opt, sched), callbacks=[DeviceStepCallback(opt)])
    trainer.train(resume_from_checkpoint=resume_checkpoint(trainer))

The Trainer saves `optimizer.state_dict()` into each checkpoint: OffloadAdamW's
is a pointer at the device's committed step (a few KiB), not a copy of the
state. Every optimizer step commits on the device, so after a crash (SIGKILL,
power cut) the device is usually ahead of the last Trainer checkpoint; the
device keeps one committed state, and the optimizer refuses a pointer to an
older one. resume_checkpoint() therefore completes a Trainer checkpoint for
the device's committed step, from the last one the Trainer saved: the model's
params are the device's (opening the optimizer copied them in), the pointer is
the device's step, the LR scheduler is stepped on to it, and the Trainer's
state says that global step, so the Trainer skips the batches already trained
on and the run goes on as if never interrupted. What the completed checkpoint
cannot have is what only the lost process knew: log_history after the last
saved checkpoint, and the RNG state at the device's step (the last saved
checkpoint's is kept; the data order does not depend on it, a model with
dropout does).

With Accelerate, `with accumulate(accelerator, model, opt):` in place of
`with accelerator.accumulate(model):` keeps the gradients of every
micro-batch but the last off the device as well; accelerator.save_state
saves the pointer, load_state of the device's step resumes (an older one is
refused: the device holds one state).

DeviceStepCallback commits the Trainer's global step with every device step
(the trainer blob), so the device's step maps to the Trainer's even where steps
were skipped (an fp16 overflow commits nothing). It also keeps the gradients of
every micro-batch but the last of an accumulated step off the device
(OffloadAdamW.accumulating()), as DDP's no_sync() keeps them off the wire.
"""

import contextlib
import json
import os
import shutil

import torch
from transformers import TrainerCallback, TrainerState
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR, get_last_checkpoint

from .torch import OffloadAdamW
from .torch.optimizer import _pointer_of

__all__ = ["DeviceStepCallback", "accumulate", "resume_checkpoint"]

# The Trainer's file names in a checkpoint (transformers.trainer)
OPTIMIZER_NAME = "optimizer.pt"
SCHEDULER_NAME = "scheduler.pt"
TRAINER_STATE_NAME = "trainer_state.json"
BLOB_KEY = "hf_global_step"


def _offload_optimizer(optimizer):
    """The OffloadAdamW under Accelerate's wrapper, if any."""
    opt = getattr(optimizer, "optimizer", optimizer)
    if not isinstance(opt, OffloadAdamW):
        raise TypeError(f"expected an OffloadAdamW (or Accelerate's wrapper of one), got {type(opt).__name__}")
    return opt


class DeviceStepCallback(TrainerCallback):
    """Commits the Trainer's global step with each device step (see the module)."""

    def __init__(self, optimizer):
        self.opt = _offload_optimizer(optimizer)
        self._state = None
        self._accum = 1
        self._micro = 0
        self._cm = None

    def _blob(self):
        # called by step() just before the commit, before the Trainer counts
        # the step: the step being committed is global_step + 1
        return json.dumps({BLOB_KEY: self._state.global_step + 1}).encode()

    def on_train_begin(self, args, state, control, **kwargs):
        self._state = state
        self._accum = max(1, int(args.gradient_accumulation_steps))
        self.opt.set_blob(self._blob)

    def on_step_begin(self, args, state, control, **kwargs):
        # the first micro-batch of a step; on_substep_end follows each but the last
        self._state = state
        self._micro = 0
        self._hold()

    def on_substep_end(self, args, state, control, **kwargs):
        self._micro += 1
        self._hold()

    def on_step_end(self, args, state, control, **kwargs):
        self._release()

    def on_train_end(self, args, state, control, **kwargs):
        self._release()
        self.opt.set_blob(None)

    def _hold(self):
        """Inside accumulating() for every micro-batch but the last."""
        if self._micro < self._accum - 1:
            if self._cm is None:
                self._cm = self.opt.accumulating()
                self._cm.__enter__()
        else:
            self._release()

    def _release(self):
        if self._cm is not None:
            cm, self._cm = self._cm, None
            cm.__exit__(None, None, None)


def _blob_global_step(opt):
    blob = opt.blob()
    if not blob:
        return None
    try:
        return int(json.loads(blob.decode())[BLOB_KEY])
    except (ValueError, KeyError, TypeError, UnicodeDecodeError):
        return None


def resume_checkpoint(trainer, output_dir=None):
    """The checkpoint from which trainer.train(resume_from_checkpoint=...) goes
    on at the device's committed step: the last one saved in output_dir
    (default trainer.args.output_dir) where it points at that step, else a
    checkpoint-N completed from it (see the module). None: nothing to resume
    (no checkpoint and a device at step 0).

    The optimizer must have been opened from its path before (it copied the
    device's params into the model). Raises ValueError when the device cannot
    be matched with the checkpoints: a device at a step but no checkpoint saved
    (save a first one early: save_steps), a device behind the last checkpoint,
    or a device ahead without DeviceStepCallback's record of the global step.
    """
    opt = _offload_optimizer(trainer.optimizer)
    out = output_dir or trainer.args.output_dir
    step = int(opt.committed_step)
    last = get_last_checkpoint(out) if os.path.isdir(out) else None
    if last is None:
        if step == 0:
            return None
        raise ValueError(f"the device is at committed step {step} but {out} holds no Trainer checkpoint "
                         f"to complete (the first one is saved at save_steps)")
    saved = torch.load(os.path.join(last, OPTIMIZER_NAME), weights_only=True)
    pointer = _pointer_of(saved)
    if pointer is None:
        raise ValueError(f"{last}/{OPTIMIZER_NAME} is not an OffloadAdamW state_dict")
    at = int(pointer["step"])
    if at == step:
        return last
    if at > step:
        raise ValueError(f"{last} points at device step {at}, the device is at {step}: not this run's device?")
    state = TrainerState.load_from_json(os.path.join(last, TRAINER_STATE_NAME))
    global_step = _blob_global_step(opt)
    if global_step is None:
        raise ValueError(f"the device is at step {step}, {last} at {at}, and its blob has no Trainer global "
                         f"step: train with DeviceStepCallback to resume between checkpoints")
    if global_step <= state.global_step:
        raise ValueError(f"the device's global step {global_step} is not after {last}'s {state.global_step}")

    # The LR scheduler at the device's step: the saved one stepped on (the
    # Trainer steps it once per global step, skipped optimizer steps included)
    sched = trainer.lr_scheduler
    if sched is None:
        sched = trainer.create_scheduler(trainer.args.max_steps, optimizer=opt)
    sched.load_state_dict(torch.load(os.path.join(last, SCHEDULER_NAME), weights_only=True))
    for _ in range(global_step - state.global_step):
        sched.step()

    new = os.path.join(out, f"{PREFIX_CHECKPOINT_DIR}-{global_step}")
    tmp = new + ".partial"
    shutil.rmtree(tmp, ignore_errors=True)
    shutil.copytree(last, tmp)
    trainer.save_model(tmp)                  # the model holds the device's params
    torch.save(opt.state_dict(), os.path.join(tmp, OPTIMIZER_NAME))
    torch.save(sched.state_dict(), os.path.join(tmp, SCHEDULER_NAME))
    state.global_step = global_step
    state.save_to_json(os.path.join(tmp, TRAINER_STATE_NAME))
    os.replace(tmp, new)    # a crash before this leaves only a .partial, which is redone
    return new


@contextlib.contextmanager
def accumulate(accelerator, model, optimizer):
    """accelerator.accumulate(model), and inside OffloadAdamW.accumulating() for
    every micro-batch but the last of a step: their backward adds to .grad
    without writing it to the device (written, it would be written again)."""
    opt = _offload_optimizer(optimizer)
    with accelerator.accumulate(model):
        if accelerator.sync_gradients:
            yield
        else:
            with opt.accumulating():
                yield
