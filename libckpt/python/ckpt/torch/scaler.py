# SPDX-License-Identifier: MIT
"""Loss scaling: ckpt.torch.LossScaler for fp16 devices, and what OffloadAdamW
reads and tells torch's GradScaler."""

import warnings

import numpy as np
import torch


def _amp_unscaled(grad_scaler, opt):
    """Whether grad_scaler.unscale_(opt) ran since its last update()."""
    return grad_scaler._per_optimizer_states[id(opt)]["stage"].name == "UNSCALED"


def _amp_found_inf(grad_scaler, opt, overflow):
    """Records for grad_scaler.update() whether the device skipped the step.

    GradScaler's own per-optimizer record, as its unscale_() leaves it: update()
    backs off if any is nonzero. After an unscale_(opt) the record is already
    there (non-finite .grad values, which the device skipped on too); the
    device's finding is added to it."""
    state = grad_scaler._per_optimizer_states[id(opt)]
    found = state["found_inf_per_device"]
    scale = grad_scaler._scale      # made by the first scale(), on the scaler's device
    if found:
        if overflow:
            next(iter(found.values())).fill_(1.0)
    else:
        found[scale.device] = torch.full((), float(overflow), dtype=torch.float32, device=scale.device)


# torch 2 warns, at each GradScaler.step(opt) of an optimizer that takes
# grad_scaler, that it will stop passing it; OffloadAdamW.step(grad_scaler=)
# needs it.
warnings.filterwarnings("ignore", message="GradScaler is going to stop passing itself",
                        category=FutureWarning)


class LossScaler:
    """Dynamic loss scaling for fp16 devices, torch.cuda.amp.GradScaler's algorithm.

        scaler = LossScaler()
        scaler.scale(loss).backward()
        scaler.unscale_(opt)                 # optional, before opt.clip_grad_norm_()
        opt.clip_grad_norm_(1.0)             # optional
        scaler.step(opt)                     # opt.step(grad_scale=1/scale)
        scaler.update()

    The gradients go to the device still scaled (fp16 needs the scale for its
    range); the device multiplies them by 1/scale (x the clip coefficient) in fp32
    and detects non-finite values itself: the commit then says "overflow", the
    step is skipped, and update() backs off: scale *= backoff_factor, and the
    count of good steps restarts. After growth_interval consecutive good steps,
    scale *= growth_factor (kept if finite). The scale is an fp32 value, as in
    GradScaler. state_dict() has GradScaler's keys.

    Resuming: state_dict() always describes the scale the *next* step will use.
    Called during scaler.step() (from the optimizer's blob hook, just before the
    commit) it returns the state update() will leave if the step commits, which
    is the only case in which that blob is committed; so a trainer that puts
    scaler.state_dict() in its blob resumes with exactly the scale of an
    uninterrupted run.
    """

    def __init__(self, init_scale=2.0 ** 16, growth_factor=2.0, backoff_factor=0.5,
                 growth_interval=2000, enabled=True):
        if not growth_factor > 1.0:
            raise ValueError("growth_factor must be > 1")
        if not 0.0 < backoff_factor < 1.0:
            raise ValueError("backoff_factor must be in (0, 1)")
        self._scale = np.float32(init_scale)
        self._growth_factor = float(growth_factor)
        self._backoff_factor = float(backoff_factor)
        self._growth_interval = int(growth_interval)
        self._growth_tracker = 0
        self._enabled = bool(enabled)
        self._found_inf = None      # after step(): True/False; during step(): "pending"
        self._unscaled = set()

    def is_enabled(self):
        return self._enabled

    def get_scale(self):
        return float(self._scale) if self._enabled else 1.0

    def get_growth_factor(self):
        return self._growth_factor

    def get_backoff_factor(self):
        return self._backoff_factor

    def get_growth_interval(self):
        return self._growth_interval

    def scale(self, outputs):
        """outputs x scale (tensors, or nested lists/tuples of them)."""
        if not self._enabled:
            return outputs
        if isinstance(outputs, torch.Tensor):
            return outputs * torch.tensor(float(self._scale), dtype=torch.float32, device=outputs.device)
        if isinstance(outputs, (list, tuple)):
            return type(outputs)(self.scale(o) for o in outputs)
        raise ValueError("outputs must be a tensor or an iterable of tensors")

    def _inv_scale(self):
        return 1.0 / float(self._scale) if self._enabled else 1.0

    def unscale_(self, optimizer):
        """Tells the optimizer that its next step's gradients are scaled: its
        clip_grad_norm_() then measures unscaled norms. The gradients are not touched."""
        if id(optimizer) in self._unscaled:
            raise RuntimeError("unscale_() has already been called on this optimizer since the "
                               "last update().")
        optimizer.set_grad_unscale(self._inv_scale())
        self._unscaled.add(id(optimizer))

    def step(self, optimizer, *args, **kwargs):
        """optimizer.step(grad_scale=1/scale x clip): returns its result, or None if
        the device skipped the step (overflow)."""
        if "grad_scale" in kwargs:
            raise RuntimeError("LossScaler.step() sets grad_scale itself")
        self._found_inf = "pending"
        try:
            ret = optimizer.step(*args, grad_scale=self._inv_scale(), **kwargs)
        except BaseException:
            self._found_inf = None
            raise
        self._found_inf = optimizer.last_result == "overflow"
        return None if self._found_inf else ret

    def _next(self, found_inf):
        """(scale, growth_tracker) after update() with found_inf: GradScaler's
        _amp_update_scale_."""
        scale, tracker = self._scale, self._growth_tracker
        if found_inf:
            return np.float32(scale * np.float32(self._backoff_factor)), 0
        tracker += 1
        if tracker == self._growth_interval:
            with np.errstate(over="ignore"):
                grown = np.float32(scale * np.float32(self._growth_factor))
            return (grown if np.isfinite(grown) else scale), 0
        return scale, tracker

    def update(self, new_scale=None):
        """After step(): backs off on overflow, grows after growth_interval good steps.
        new_scale (a float) sets the scale instead, like GradScaler.update(new_scale)."""
        if not self._enabled:
            return
        if new_scale is not None:
            self._scale = np.float32(float(new_scale))
        else:
            if self._found_inf is None or self._found_inf == "pending":
                raise RuntimeError("update() without a preceding step()")
            self._scale, self._growth_tracker = self._next(self._found_inf)
        self._found_inf = None
        self._unscaled.clear()

    @property
    def found_inf(self):
        """Whether the last step() overflowed (None before a step)."""
        return None if self._found_inf == "pending" else self._found_inf

    def state_dict(self):
        if not self._enabled:
            return {}
        if self._found_inf is None:
            scale, tracker = self._scale, self._growth_tracker
        else:   # between step() and update(): the state update() will leave
            scale, tracker = self._next(self._found_inf is True)
        return {"scale": float(scale), "growth_factor": self._growth_factor,
                "backoff_factor": self._backoff_factor, "growth_interval": self._growth_interval,
                "_growth_tracker": int(tracker)}

    def load_state_dict(self, state_dict):
        if not self._enabled:
            return
        if len(state_dict) == 0:
            raise RuntimeError("The source state dict is empty, possibly because it was saved "
                               "from a disabled instance of LossScaler.")
        self._scale = np.float32(state_dict["scale"])
        self._growth_factor = float(state_dict["growth_factor"])
        self._backoff_factor = float(state_dict["backoff_factor"])
        self._growth_interval = int(state_dict["growth_interval"])
        self._growth_tracker = int(state_dict["_growth_tracker"])
        self._found_inf = None
        self._unscaled.clear()
