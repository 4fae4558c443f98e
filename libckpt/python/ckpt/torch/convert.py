# SPDX-License-Identifier: MIT
"""Between torch and the device: low-precision words, torch.optim.AdamW
state_dicts, safetensors checkpoints."""

import numpy as np
import torch

from .. import Device
from .. import open as _open
from .. import safetensors as _safetensors


def torch_to_lowp(t, dtype, negate=False):
    """A tensor as the device's gradient words: bf16 -> uint16 bit patterns, fp16 ->
    numpy float16. Rounding is torch's (round to nearest even). negate: -t, as
    maximize=True wants; negation is exact in bf16/fp16, so it follows the rounding."""
    lowp = torch.bfloat16 if dtype == "bf16" else torch.float16
    x = t.detach().to("cpu", lowp)
    x = (x.neg() if negate else x).contiguous()
    if dtype == "bf16":
        return x.view(torch.int16).numpy().view(np.uint16)
    return x.numpy()


def lowp_to_torch(a, dtype):
    """What Device.read_params returns (uint16 bf16 bits or float16) as a torch tensor
    of dtype torch.bfloat16 / torch.float16 (sharing memory with a)."""
    a = np.ascontiguousarray(a)
    if dtype == "bf16":
        return torch.from_numpy(a.view(np.int16)).view(torch.bfloat16)
    return torch.from_numpy(a.view(np.float16))


def to_torch_state_dict(opt):
    """The committed state of an OffloadAdamW as a torch.optim.AdamW state_dict.

    {"state": {i: {"step", "exp_avg", "exp_avg_sq"}}, "param_groups": [...]}
    with fp32 moments read from the device and param indices in the order of
    opt.param_groups, which torch.optim.AdamW(...).load_state_dict() accepts
    for the same params. torch's state_dict holds no params: give the torch
    model the fp32 masters, opt.master_params() (the model on the device holds
    their rounding). torch then starts from the device's state bit for bit (and
    goes on as the device would, to the rounding of its own order of operations).
    A group with adam_l2=True (torch.optim.Adam's algorithm) is refused.
    """
    if opt._shard:
        raise ValueError("a sharded OffloadAdamW holds a slice of the state on each rank; "
                         "to_torch_state_dict needs the whole state on one device")
    groups, state, index = [], {}, 0
    steps = opt._param_steps()
    for gi, (g, ns) in enumerate(zip(opt.param_groups, opt._names)):
        if g.get("adam_l2"):
            raise ValueError(f"param group {gi} has adam_l2=True: that is torch.optim.Adam's "
                             f"algorithm, not AdamW's")
        d = {k: v for k, v in g.items() if k not in ("params", "adam_l2")}
        d["params"] = list(range(index, index + len(ns)))
        for i, n in zip(d["params"], ns):
            if n not in steps:  # zero-size: no state, as torch has none before an update
                continue
            _, m, v = opt.read_state(n)
            state[i] = {"step": torch.tensor(float(steps[n])), "exp_avg": m, "exp_avg_sq": v}
        index += len(ns)
        groups.append(d)
    return {"state": state, "param_groups": groups}


def export_safetensors(device_or_path, out, what="master", metadata=None, force=False):
    """Writes a device's params to a safetensors file and returns its path.

    what="master": the fp32 master params (F32); "lowp": the low-precision
    params the model trains with (BF16 / F16). The metadata records the device's
    committed step, dtype and uuid, with the keys of `ckptctl export DEV --to
    FILE`, which writes the same F32 tensors from the command line (and checks
    every record's checksum on the way). out is never a dm-ckpt image unless
    force=True, nor one a trainer has open (Device.export).
    """
    own = not isinstance(device_or_path, Device)
    dev = _open(device_or_path) if own else device_or_path
    try:
        return dev.export(out, what=what, metadata=metadata, force=force)
    finally:
        if own:
            dev.close()


def load_safetensors_into(module, path, strict=True):
    """Loads a safetensors checkpoint (F32/F16/BF16; a file, a sharded one's
    index or a model folder) into module's params by name."""
    arrays, dtypes, _ = _safetensors.load_file(path, with_metadata=True)
    state = {}
    for n, a in arrays.items():
        a = np.array(a)  # out of the read-only map, one tensor at a time
        t = lowp_to_torch(a, "bf16") if dtypes[n] == "BF16" else torch.from_numpy(a)
        state[n] = t
    return module.load_state_dict(state, strict=strict)
