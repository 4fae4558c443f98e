# SPDX-License-Identifier: MIT
"""OffloadAdamW: torch.optim.AdamW whose state and step live on a dm-ckpt device
(the package's docstring, ckpt.torch, tells how to use it)."""

import collections.abc
import contextlib
import inspect
import math
import os
import secrets
import warnings

import numpy as np
import torch

from .. import CkptError, Device, Layout
from .._abi import _SHARD_RULE_EVEN
from .. import format as _format
from .. import image_info as _image_info
from .. import open as _open
from .. import rename_new as _rename_new
from .. import reshard as _reshard
from .. import restore as _restore
from .convert import lowp_to_torch, torch_to_lowp
from .drivers import _Local, _Shard, _skip_grad
from .scaler import _amp_found_inf, _amp_unscaled

# What the device applies; maximize is applied to the gradient on its way there.
_HPARAM_KEYS = ("lr", "betas", "eps", "weight_decay", "adam_l2")

_AMSGRAD_REFUSED = ("amsgrad=True is not supported: AMSGrad divides by the running maximum of "
                    "exp_avg_sq (max_exp_avg_sq), and the device keeps only exp_avg and exp_avg_sq "
                    "per param")


class LayoutMismatchError(ValueError):
    """The device holds other tensors (names, shapes or groups) than the optimizer's params."""


class PrecisionWarning(UserWarning):
    """The model's params are in another dtype than the device's (warned once per optimizer)."""


def _check_group(g, where=""):
    """A param group's hyperparameters as torch.optim.AdamW checks them, and no amsgrad."""
    _check_hparams(g["lr"], g["betas"], g["eps"], g["weight_decay"], where)
    if g.get("amsgrad"):
        raise ValueError(where + _AMSGRAD_REFUSED)


def _check_hparams(lr, betas, eps, weight_decay, where=""):
    """torch.optim.AdamW's checks, with its messages (NaN fails them all)."""
    if not 0.0 <= lr:
        raise ValueError(f"{where}Invalid learning rate: {lr}")
    if not 0.0 <= eps:
        raise ValueError(f"{where}Invalid epsilon value: {eps}")
    if not 0.0 <= betas[0] < 1.0:
        raise ValueError(f"{where}Invalid beta parameter at index 0: {betas[0]}")
    if not 0.0 <= betas[1] < 1.0:
        raise ValueError(f"{where}Invalid beta parameter at index 1: {betas[1]}")
    if not 0.0 <= weight_decay:
        raise ValueError(f"{where}Invalid weight_decay value: {weight_decay}")


def _split_names(params):
    """torch's params argument, optionally with names, as (groups, names per group).

    Accepts an iterable of tensors, of (name, tensor) pairs (named_parameters()),
    or of dicts whose "params" are either. Unnamed params get "g{group}.p{index}".
    """
    if isinstance(params, torch.Tensor):
        raise TypeError("params should be an iterable of tensors, (name, tensor) pairs or dicts, "
                        "not a tensor")
    groups = list(params)
    if not groups:
        raise ValueError("optimizer got an empty parameter list")
    if not isinstance(groups[0], dict):
        groups = [{"params": groups}]
    out, names = [], []
    for gi, g in enumerate(groups):
        if not isinstance(g, dict):
            raise TypeError(f"param group {gi}: mixing dicts and tensors in params")
        g = dict(g)
        ps = g["params"]
        ps = [ps] if isinstance(ps, torch.Tensor) else list(ps)
        tensors, gnames = [], []
        for i, p in enumerate(ps):
            if isinstance(p, tuple) and len(p) == 2 and isinstance(p[0], str):
                gnames.append(p[0])
                tensors.append(p[1])
            else:
                gnames.append(f"g{gi}.p{i}")
                tensors.append(p)
        g["params"] = tensors
        out.append(g)
        names.append(gnames)
    return out, names


class _NodeHook:
    """A hook on a param's AccumulateGrad node and the node itself, kept alive
    together (torch < 2.1 frees the node, and its hooks, with its last graph)."""

    def __init__(self, node, handle):
        self.node, self.handle = node, handle

    def remove(self):
        self.handle.remove()
        self.node = None


# torch.optim.Optimizer.zero_grad's default, which torch 2 changed to True
_ZERO_GRAD_SET_TO_NONE = inspect.signature(torch.optim.Optimizer.zero_grad).parameters["set_to_none"].default


def _pointer_of(state_dict):
    """The device pointer of an OffloadAdamW state_dict: its "ckpt" entry, else
    its first param group's copy (torch.distributed.checkpoint's helpers keep
    only the groups); None for a torch state_dict."""
    if state_dict.get("ckpt") is not None:
        return state_dict["ckpt"]
    groups = state_dict.get("param_groups") or [{}]
    return groups[0].get("ckpt")


class _DeviceState(collections.abc.Mapping):
    """opt.state as torch's AdamW has it, {param: {"step", "exp_avg", "exp_avg_sq"}},
    read from the device's committed step on each access (read-only: the state
    is the device's). A sharded optimizer holds the params with a piece on its
    rank, the piece's moments flat. Never empty once the device is open, as
    the state it stands for: torch.distributed.checkpoint's state_dict helpers
    take an empty state for one to create by a step of zero gradients at lr 0,
    which here would commit a step (moments decayed, counts moved on)."""

    def __init__(self, opt):
        self._opt = opt

    def _local(self):
        opt = self._opt
        if opt.device is None:
            return {}
        return {opt._flat[i][1]: dn for dn, i, _, _, _, _ in opt._pieces}

    def __getitem__(self, param):
        dn = self._local()[param]
        _, m, v = self._opt.read_state(dn)
        return {"step": torch.tensor(float(self._opt.device.tensor_step(dn))), "exp_avg": m, "exp_avg_sq": v}

    def __iter__(self):
        return iter(self._local())

    def __len__(self):
        return len(self._local())


def _reshard_sources(reshard_from, path):
    """The paths of every rank's device of the run reshard_from names: a list
    as given; a path holding "{rank}", for the ranks its rank 0 records (a
    device of dm-ckpt before 0.4 records none: the ranks whose paths exist);
    any other path, one unsharded device. None of them may be path."""
    if isinstance(reshard_from, (list, tuple)):
        paths = [os.fspath(p) for p in reshard_from]
    else:
        reshard_from = os.fspath(reshard_from)
        if "{rank}" not in reshard_from:
            paths = [reshard_from]
        else:
            def at(r):
                return reshard_from.replace("{rank}", str(r))
            rec = _image_info(at(0))["shard"]
            if rec is not None:
                paths = [at(r) for r in range(rec["world"])]
            else:
                paths = []
                while os.path.exists(at(len(paths))):
                    paths.append(at(len(paths)))
    if not paths:
        raise ValueError("reshard_from names no device")
    real = os.path.realpath(path)
    for p in paths:
        if os.path.realpath(p) == real:
            raise ValueError(f"reshard_from: {p!r} is this run's own device path; the resharded "
                             f"devices go to new paths (the old ones are only read)")
    return paths


class OffloadAdamW(torch.optim.Optimizer):
    """AdamW (torch.optim.AdamW's algorithm) run by a dm-ckpt device.

    params: like torch's (tensors, or dicts of param groups), and names may come
        along as (name, tensor) pairs (`model.named_parameters()`); unnamed params
        are named "g{group}.p{index}". Device group k is param group k.
    device_or_path: a path or an open ckpt.Device.
        - A path that does not exist: a backing file is formatted for exactly these
          params (dtype, chunk_params, size), and the params' current values become
          the fp32 masters (step 0). The file appears atomically (it is prepared
          under a temporary name), so a crash never leaves a half-made device,
          and never replaces a file: when another process has created the path
          meanwhile (a job launched twice), its image is resumed from as an
          existing path is (while that process trains, its lock refuses the
          open). Sharded, the ranks create their devices together or not at
          all: some ranks' devices missing beside the others' is refused.
        - An existing path (a backing file, or a kernel target: /dev/mapper/NAME,
          or its NVMe-oF namespace /dev/nvmeXnY on another node; libckpt picks
          by the device's status page), or a Device: the layout must match (names, shapes,
          groups; else LayoutMismatchError), and the optimizer resumes from the
          committed step: the device's params are copied into the model.
          `init_from_model=True` loads the model's values instead, which is only
          allowed while the device is at step 0 (e.g. formatted by ckptctl).
    dtype: "bf16" or "fp16" when formatting (default "bf16"); for an existing
        device, None (the default) accepts its dtype and a value must match it.
    state: "fp32" (default) or "8bit" when formatting: exp_avg and exp_avg_sq
        stored as block-wise 8-bit codes (6 B of state per param instead of
        12; docs/design.md, "8-bit moments"); an existing device keeps its own.
    master: "fp32" (default) or "bf16" when formatting: bf16 master params
        rounded stochastically at every step, the params the model gets back
        (with state="8bit" and dtype "bf16": 4 B of state per param;
        docs/design.md, "bf16 masters").
    lr, betas, eps, weight_decay, maximize: per-group defaults as in
        torch.optim.AdamW (maximize=True negates the gradient before the update,
        as torch does); adam_l2=True gives Adam with L2 weight decay
        (torch.optim.Adam).
    foreach, fused, capturable, differentiable: accepted, and kept in
        param_groups, so that code written for torch.optim.AdamW runs; they choose
        among torch's implementations of one algorithm and do not change the
        result here (the device runs its own). capturable=True is refused for
        params that are not on CUDA, as torch refuses it.
    amsgrad=True is refused (ValueError): the device keeps no max_exp_avg_sq.
    process_group: with torch.distributed initialized (this group, or the default
        one) and more than one rank, the state is sharded as ZeRO-1 shards it: each
        rank keeps a contiguous slice of the flattened params on its own device
        (device_or_path holds "{rank}", or is a list of one path per rank), the
        gradients are averaged over the ranks, and every step commits on every
        rank or on none; on open the ranks resume from their lowest committed
        step (docs/scale.md).
    reshard_from: the devices of an earlier run on another number of ranks
        (a path holding "{rank}", a list of every rank's path, or one unsharded
        device's path), to resume it on this one: where this run has no
        devices yet, each rank makes its own from them (ckpt.reshard: the
        masters, moments, step counts, step and trainer blob, bit for bit),
        and they are used only once every rank has made its own; the old
        devices are only read. Where this run's devices exist, they are
        opened as always. Never implied: a device of another world size is
        refused without it.

    A PrecisionWarning (once per optimizer) says what it costs when the params
    are not in the device's dtype. `with OffloadAdamW(...) as opt:` closes the
    device at the end of the block (close()).

    state_dict() points at the device's committed step; load_state_dict()
    takes one of those (the hyperparameters; one of the step before the
    committed one rolls the device back with rollback=True), or a
    torch.optim.AdamW state_dict, whose moments and steps it imports onto a
    device before its first step. to_torch_state_dict(opt) is the way back.

    step(closure=None, *, grad_scale=None, blob=None) writes every p.grad in the
    device's dtype (a param whose .grad is None is skipped as torch skips it;
    images formatted before per-block step counts give it a zero gradient), multiplied on the device by
    grad_scale x the clip coefficient of clip_grad_norm_(); commits with the
    trainer blob; reads the params back into the model. `last_result` is the
    commit's result: "committed", or "overflow" (a non-finite gradient: the step
    was skipped, nothing changed, as GradScaler skips it). Under torch's
    GradScaler (scaler.step(opt)) or ckpt.torch.LossScaler, the gradients go to
    the device still scaled and the device unscales them in fp32.

    hooks=True (the default): each param's gradient goes to the device as soon
    as backward has accumulated it (register_post_accumulate_grad_hook where
    torch has it, else a hook on the param's AccumulateGrad node, as DDP does),
    so the device updates during backward and step() only writes what is left,
    commits and reads back. The first gradient of a backward opens the step with
    the param groups' values then and the previous step's grad_scale (without
    its clip coefficient); step() checks that nothing it decides differs (the
    hyperparameters, grad_scale, a clip coefficient below 1, a param
    accumulated twice, a .grad dropped since, or any gradient that no longer
    rounds to the words written: edits through .data or numpy included) and
    otherwise aborts that step and writes every gradient again, as with
    hooks=False: the result is the same either way, only the time differs.
    The step after such a one is staged: the hooks only round each gradient
    into its buffer, step() writes it once with the final scale (a trainer
    that clips every step pays no second write); a staged step that needed no
    change sends the next one back to writing during backward.
    last_step_mode: "hooked", "staged", "redone" or "written".
    last_grad_norm: the total (L2) norm of the last step's gradients as the
    device took them (rounded to its dtype) times the step's grad_scale without
    the clip coefficient (so unscaled under a loss scaler: what
    clip_grad_norm_ would return), a float the device summed as the gradients
    arrived (no pass over them here); inf or nan for a step skipped on a
    non-finite gradient; None when the device did not report it (a sharded
    step that overflowed is aborted before its commit).
    Until step() commits, reads of state (read_state, master_params,
    to_torch_state_dict) return the committed step's, as with hooks=False.
    Gradient accumulation: run the backward of every micro-batch but the last
    inside `with opt.accumulating():` (as DDP's no_sync()); a gradient changed
    after the last backward otherwise (rather than through opt.clip_grad_norm_()
    and LossScaler) costs the step its writes from backward. hooks=False writes
    every gradient in step(), and so does a sharded optimizer (process_group):
    its rank writes its slice of the gradients averaged over the ranks, which
    exist only once every rank's backward has ended.
    """

    def __init__(self, params, device_or_path, lr=1e-3, betas=(0.9, 0.999), eps=1e-8,
                 weight_decay=1e-2, dtype=None, chunk_params=65536, *, amsgrad=False,
                 maximize=False, foreach=None, capturable=False, differentiable=False, fused=None,
                 adam_l2=False, size=None, init_from_model=False, process_group=None,
                 state="fp32", master="fp32", hooks=True, reshard_from=None):
        _check_hparams(lr, betas, eps, weight_decay)
        if reshard_from is not None and init_from_model:
            raise ValueError("init_from_model and reshard_from: a device takes the model's values or "
                             "another run's state, not both")
        if amsgrad:
            raise ValueError(_AMSGRAD_REFUSED)
        if dtype not in (None, "bf16", "fp16"):
            raise ValueError(f"dtype must be 'bf16' or 'fp16', not {dtype!r}")
        groups, names = _split_names(params)
        defaults = dict(lr=lr, betas=tuple(betas), eps=eps, weight_decay=weight_decay,
                        amsgrad=False, maximize=bool(maximize), foreach=foreach,
                        capturable=bool(capturable), differentiable=bool(differentiable),
                        fused=fused, adam_l2=bool(adam_l2))
        self._frozen = False
        super().__init__(groups, defaults)
        self._frozen = True
        self.state = _DeviceState(self)
        self._names = names
        for i, g in enumerate(self.param_groups):
            _check_group(g, f"param group {i}: ")
        flat = [(n, p, gi) for gi, (g, ns) in enumerate(zip(self.param_groups, names))
                for n, p in zip(ns, g["params"])]
        seen = set()
        for n, p, gi in flat:
            if n in seen:
                raise ValueError(f"two params are named {n!r}")
            seen.add(n)
            if p.is_sparse:
                raise ValueError(f"{n!r}: sparse params are not supported")
            if self.param_groups[gi]["capturable"] and not p.is_cuda:
                raise ValueError(f"capturable=True: {n!r} is on {p.device}; torch.optim.AdamW "
                                 f"refuses it too (params must be CUDA tensors)")
        # A param with a zero-size dimension has nothing to keep or update (torch
        # takes it and does nothing): it stays off the device.
        flat = [(n, p, gi) for n, p, gi in flat if p.numel()]
        self._flat = flat
        self._own_params = [list(g["params"]) for g in self.param_groups]
        self._shard = _Shard.of(process_group, flat)
        self._driver = self._shard or _Local()     # step(opt, groups, scale, blob_now)
        self._pieces = self._shard.pieces if self._shard else [
            (n, i, 0, p.numel(), tuple(int(d) for d in p.shape), gi) for i, (n, p, gi) in enumerate(flat)]
        self._layout = [(dn, shape, gi) for dn, _, _, _, shape, gi in self._pieces]
        self._avg = None            # the step's averaged gradients (sharded)

        self.last_result = None
        self.last_grad_norm = None  # the device's, of the last step's gradients
        self._step_sumsq = None
        self._grad_unscale = None   # 1/loss scale for the next step (LossScaler.unscale_)
        self._clip_coef = 1.0       # from clip_grad_norm_, for the next step
        self._blob_hook = None
        self._owned = False
        self._precision_warned = False
        self.path = None
        self.last_step_hooked = False   # whether the last step() kept the writes made during backward
        # how the last step's gradients reached the device: "hooked" (written
        # during backward, each update ran then), "staged" (rounded during
        # backward, written by step()), "redone" (written during backward, then
        # aborted and written again by step()), "written" (by step())
        self.last_step_mode = None
        self._stage_next = False        # the last step changed what backward gave: stage the next
        self._accumulating = False
        self._hooked = None             # the step opened from backward: see _hook_begin
        self._last_scale = 1.0          # the last step's grad_scale without its clip coefficient
        self._hook_handles = []
        self.last_step_bytes = None     # {"grad_written", "params_read", "control", "status_reads"}

        self.device = None
        self._created = None            # (st_dev, st_ino) of the image this open created
        try:
            if self._shard:
                # The ranks create their devices together or not at all; every
                # rank opens its own device; then they agree on the step.
                create = self._shard.agree_create(lambda: self._rank_path(device_or_path))

                def open_rank():
                    self._prepare(device_or_path, reshard_from, create)
                    self._open(device_or_path, dtype, chunk_params, size, init_from_model, state, master,
                               create)
                self._shard.agree(open_rank, "open its device")
                self._resumed_step = self._shard.agree_step(self.device)
            else:
                self._prepare(device_or_path, reshard_from, None)
                self._open(device_or_path, dtype, chunk_params, size, init_from_model, state, master)
            self.uuid = self.device.uuid()
            # the device has the groups up to the last one holding a tensor
            # of it: a trailing group with none (empty, or zero-size params
            # only) has no hyperparameters there
            self._dev_groups = self.device.info()["n_groups"]
            if not self._shard:
                self._make_buffers()
            self._read_back()
            self._bytes_seen = self._byte_counts()
            self._check_precision()
            # Sharded, a rank writes its slice of the gradients averaged over the
            # ranks, known only once every rank's backward has ended: no hooks.
            if hooks and not self._shard:
                self._install_hooks()
        except BaseException:
            self._remove_created()
            self.close()
            raise

    def _rank_path(self, device_or_path):
        if isinstance(device_or_path, Device):
            raise ValueError("a sharded OffloadAdamW opens its rank's device from a path: give a "
                             "path holding {rank}, or a list of one path per rank")
        return _Shard.path_of(self._shard, device_or_path)

    def _prepare(self, device_or_path, reshard_from, create):
        """Before the open: the sources of a reshard (self._sources), or the
        shard rule of the existing device (a rank's share must be this run's;
        a device of dm-ckpt before 0.4 was cut evenly)."""
        self._sources = None
        if isinstance(device_or_path, Device):
            return
        path = self._rank_path(device_or_path)
        exists = os.path.exists(path) if create is None else not create
        if not exists:
            if reshard_from is not None:
                self._sources = _reshard_sources(reshard_from, path)
            return
        rec = _image_info(path)["shard"]
        rank, world = (self._shard.rank, self._shard.world) if self._shard else (0, 1)
        if rec is not None and (rec["rank"], rec["world"]) != (rank, world):
            raise RuntimeError(f"{path} holds rank {rec['rank']}'s share of a run on {rec['world']} ranks; "
                               f"this run has {world}: resume it on {rec['world']} ranks, or make this run's "
                               f"devices from it at new paths (reshard_from=, or ckptctl reshard)")
        # the rule the device was cut by: recorded, or (no record) dm-ckpt before 0.4's
        rule = "even" if rec is None or rec["rule"] == _SHARD_RULE_EVEN else "q8"
        if self._shard and self._shard.rule != rule:
            self._shard.use_rule(self._flat, rule)
            self._pieces = self._shard.pieces
            self._layout = [(dn, shape, gi) for dn, _, _, _, shape, gi in self._pieces]

    def _open(self, device_or_path, dtype, chunk_params, size, init_from_model, state, master, create=None):
        """create: whether the ranks agreed to create their devices (sharded);
        None: a path that does not exist is created."""
        if isinstance(device_or_path, Device) and not self._shard:
            self.device = device_or_path
            self.path = getattr(device_or_path, "path", None)
            created = False
        else:
            self.path = self._rank_path(device_or_path)
            if create is None:
                create = not os.path.exists(self.path)
            # Another process may have created the path meanwhile: then it
            # is resumed from, like any existing path.
            created = create and self._create(self.path, dtype or "bf16", chunk_params, size, state, master)
            # it reads the params back after every step: from the
            # engine's memory rather than the device
            self.device = _open(self.path, param_cache=True)
            self._owned = True
            self._drop_stale_step()
        self._check_layout(dtype)
        if created:
            self._resumed_step = self.device.committed_step     # 0, or a reshard's step
        elif init_from_model:
            if self.device.committed_step != 0:
                raise ValueError(f"init_from_model: the device is at committed step "
                                 f"{self.device.committed_step}; only a device at step 0 "
                                 f"takes the model's values")
            self.device.load_params(self._model_values())
            self._resumed_step = 0
        else:
            self._resumed_step = self.device.committed_step

    def _drop_stale_step(self):
        """A kernel target keeps a step open when the trainer that opened it
        stops mid-step (killed, out of memory): the next trainer would be
        refused its BEGIN. That step is dropped, as the engine's dies with its
        process: the run resumes from the committed step, as after a crash."""
        st = self.device.status()
        if st["state"] == "open":
            warnings.warn(f"{self.path}: step {st['open_step']} was left open by a trainer that "
                          f"stopped mid-step; aborted, resuming from committed step "
                          f"{st['committed_step']}", RuntimeWarning, stacklevel=3)
            self.device.abort()

    # -- creation and checks
    def _model_values(self):
        return {dn: self._flat[i][1].detach().to(torch.float32).cpu().reshape(-1)[a:b].numpy()
                for dn, i, a, b, _, _ in self._pieces}

    def _create(self, path, dtype, chunk_params, size, state, master):
        """Formats an image for these params under a temporary name beside path,
        loads the model's values into it, and renames it to path, which is never
        replaced (ckpt_rename_new): an image another process created there meanwhile (a job
        launched twice, a duplicate path) is that process's, and this returns
        False (path is then resumed from). True when this created path."""
        if self._shard:
            layout = self._shard.layout     # the rank's share, recorded in the image
        else:
            layout = Layout()
            for n, shape, gi in self._layout:
                layout.add(n, shape, gi)
        d = os.path.dirname(os.path.abspath(path))
        tmp = os.path.join(d, f".{os.path.basename(path)}.tmp-{os.getpid()}-{secrets.token_hex(4)}")
        try:
            try:
                if self._sources:
                    rank, world = (self._shard.rank, self._shard.world) if self._shard else (0, 1)
                    _reshard(self._sources, tmp, rank, world,
                             params=[(n, tuple(p.shape), gi) for n, p, gi in self._flat])
                else:
                    _format(tmp, layout, dtype=dtype, chunk_params=chunk_params, size=size, state=state,
                            master=master)
                    with _open(tmp) as dev:
                        dev.load_params(self._model_values())
            except CkptError as e:  # the temporary name is ours: the user asked for path
                raise CkptError(e.code, e.message.replace(tmp, path)) from None
            if not _rename_new(tmp, path):
                return False
        finally:
            if os.path.lexists(tmp):
                os.unlink(tmp)
        st = os.stat(path)
        self._created = (st.st_dev, st.st_ino)
        return True

    def _remove_created(self):
        """A sharded open that failed leaves no image it created: the next open
        would find some ranks' images and not the others' (and refuse). Only
        while this holds the device open as its writer: once the image is at
        its path another process may open it first (a job launched twice,
        whose open of the path made this one's fail as in use), and removing it
        then would leave that process training into a file at no path."""
        if self._created and self.path and self._owned and getattr(self, "device", None) is not None:
            with contextlib.suppress(OSError):
                st = os.stat(self.path)
                if (st.st_dev, st.st_ino) == self._created:
                    os.unlink(self.path)
        self._created = None

    def _check_layout(self, dtype):
        have = [(t["name"], tuple(int(d) for d in t["shape"]), int(t["group"]))
                for t in self.device.tensors()]
        where = self.path or "the device"
        if dtype is not None and dtype != self.device.dtype:
            raise LayoutMismatchError(f"{where} is a {self.device.dtype} device, the optimizer "
                                      f"was asked for {dtype}")
        if have == self._layout:
            return
        want_d = {n: (s, g) for n, s, g in self._layout}
        have_d = {n: (s, g) for n, s, g in have}
        problems = []
        missing = [n for n in want_d if n not in have_d]
        extra = [n for n in have_d if n not in want_d]
        if missing:
            problems.append(f"not on the device: {_short(missing)}")
        if extra:
            problems.append(f"on the device but not among the params: {_short(extra)}")
        for n in want_d:
            if n in have_d:
                (ws, wg), (hs, hg) = want_d[n], have_d[n]
                if ws != hs:
                    problems.append(f"{n!r}: shape {list(ws)} in the model, {list(hs)} on the device")
                if wg != hg:
                    problems.append(f"{n!r}: param group {wg} in the optimizer, group {hg} on the device")
        if not problems:
            problems.append("same tensors in a different order: "
                            f"{_short([n for n, _, _ in self._layout])} vs {_short([n for n, _, _ in have])}")
        raise LayoutMismatchError(f"{where} does not hold these params ({len(have)} tensors on the "
                                  f"device, {len(self._layout)} params): " + "; ".join(problems[:8])
                                  + ("; ..." if len(problems) > 8 else ""))

    def _check_precision(self):
        """A PrecisionWarning, once, when params are not in the device's dtype."""
        if self._precision_warned:
            return
        dtype = self.device.dtype
        lowp = torch.bfloat16 if dtype == "bf16" else torch.float16
        other = {}
        for n, p, _ in self._flat:
            if p.dtype != lowp:
                other.setdefault(p.dtype, []).append(n)
        if not other:
            return
        self._precision_warned = True
        costs = []
        for d, ns in other.items():
            what = f"{len(ns)} params ({_short(ns, 3)}) are {d} on a {dtype} device: "
            if d in (torch.float32, torch.float64):
                what += (f"every step reads them back rounded to {dtype} (the fp32 masters stay on the "
                         f"device), so they keep {dtype}'s precision in {torch.finfo(d).bits // 8} bytes a param "
                         f"instead of 2")
            elif d == torch.bfloat16:
                what += ("gradients lose bf16's range on their way to the device (beyond 65504 they "
                         "overflow and the step is skipped, below 6e-8 they flush to zero), and the "
                         "params come back rounded from fp16's 11 significant bits to bf16's 8")
            elif d == torch.float16:
                what += ("gradients lose 3 of fp16's 11 significant bits on their way to the device, "
                         "and params beyond fp16's range (65504) come back as inf")
            else:
                what += f"every step reads them back as {dtype} values"
            costs.append(what)
        warnings.warn("; ".join(costs) + f". A model in {lowp} matches the device.",
                      PrecisionWarning, stacklevel=3)

    def add_param_group(self, param_group):
        if getattr(self, "_frozen", False):
            raise RuntimeError("OffloadAdamW: the device's layout is fixed when it is formatted; "
                               "param groups cannot be added later")
        super().add_param_group(param_group)

    # -- what the trainer sees
    @property
    def dtype(self):
        return self.device.dtype

    @property
    def committed_step(self):
        return self.device.committed_step

    @property
    def resumed_step(self):
        """The committed step the device was at when the optimizer opened it."""
        return self._resumed_step

    def blob(self):
        """The trainer blob committed with the device's committed step (b"" at step 0)."""
        return self.device.blob()

    def set_blob(self, blob_or_fn):
        """The trainer blob committed with every following step: bytes, or a callable
        called just before each commit and returning bytes (<= 2 KiB). None: no blob."""
        self._blob_hook = blob_or_fn

    def names(self):
        """The device tensor name of every param, in the order of param_groups (sharded:
        of every piece of a param this rank's device holds, "name" or "name[a:b]")."""
        return [dn for dn, _, _, _, _, _ in self._pieces]

    def master_params(self):
        """{name: fp32 master tensor} read from the device (a copy; sharded: this rank's
        pieces, by names())."""
        return {dn: torch.from_numpy(self.device.read_state(dn)[0]) for dn in self.names()}

    @property
    def rank(self):
        """This process's rank in the optimizer's process group (0 when not sharded)."""
        return self._shard.rank if self._shard else 0

    @property
    def world_size(self):
        """Ranks sharing the optimizer state (1 when not sharded)."""
        return self._shard.world if self._shard else 1

    def read_state(self, name):
        """(param, exp_avg, exp_avg_sq) of one tensor at the committed step (also
        between backward and step(), while the hooks' step is open), fp32 torch tensors."""
        return tuple(torch.from_numpy(a) for a in self.device.read_state(name))

    def close(self):
        """Closes the device if the optimizer opened it (from a path)."""
        self._hook_abort()
        for h in self._hook_handles:
            h.remove()
        self._hook_handles = []
        if self._owned and getattr(self, "device", None) is not None:
            self.device.close()
        self._owned = False

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def zero_grad(self, set_to_none=_ZERO_GRAD_SET_TO_NONE):
        """torch's, with the default of the torch running (False in 1.13, True in 2)."""
        self._avg = None
        super().zero_grad(set_to_none=set_to_none)

    # -- gradient scale
    def set_grad_unscale(self, factor):
        """The inverse loss scale the next step multiplies gradients by (LossScaler.unscale_)."""
        self._grad_unscale = float(factor)

    def clip_grad_norm_(self, max_norm, norm_type=2.0):
        """torch.nn.utils.clip_grad_norm_ for offloaded gradients.

        Computes the total norm of the gradients as the device will apply them
        (p.grad rounded to the device's dtype, x the pending 1/loss scale), as
        torch's clip_grad_norm_ does over the same values, and folds its clip coefficient,
        min(1, max_norm / (norm + 1e-6)), into the next step's grad_scale instead of
        rewriting p.grad (fp16 gradients must stay scaled on their way to the device).
        Returns the total norm (a tensor, like torch's). A non-finite norm leaves the
        coefficient at 1: the device sees the non-finite gradient and skips the step.
        """
        norm_type = float(norm_type)
        norms = [self._grad_norm(i, g, norm_type) for i, g in enumerate(self._grads()) if g is not None]
        if not norms:
            return torch.tensor(0.0)
        if norm_type == math.inf:
            total = torch.stack(norms).max()
        else:
            total = torch.linalg.vector_norm(torch.stack(norms), norm_type)
        total = total * (self._grad_unscale if self._grad_unscale is not None else 1.0)
        t = float(total)
        if math.isfinite(t):
            self._clip_coef = min(1.0, float(max_norm) / (t + 1e-6))
        return total

    def _grad_norm(self, i, g, norm_type):
        """The norm of gradient g of param i rounded to the device's dtype, in
        fp32. Unsharded, rounded into a buffer made once (the one step()'s
        check of the hooks' writes uses, or the param's own when there are no
        hooks: step() writes that one again), not a temporary per tensor."""
        lowp = torch.bfloat16 if self.device.dtype == "bf16" else torch.float16
        if self._shard or g.is_sparse or g.is_cuda:
            r = g.to(lowp)
        else:
            n = g.numel()
            r = self._gcheck[:n] if hasattr(self, "_gcheck") else self._gbuf[i]
            r.copy_(g.reshape(-1))
        if norm_type == math.inf:
            return r.abs().max().to(torch.float32)
        return torch.linalg.vector_norm(r, norm_type, dtype=torch.float32)

    # -- the step

    # torch's GradScaler (torch.amp.GradScaler, torch.cuda.amp.GradScaler)
    # calls step(grad_scaler=itself) instead of unscaling the gradients and
    # looking for non-finite ones on the host: the device unscales in fp32, and
    # only it sees a gradient that overflows once rounded to the device's dtype
    # (an fp32 gradient x 2**16 is finite, in fp16 it may not be). step() tells
    # the scaler what the device found, so update() backs off. torch 2 also
    # has a contract without the keyword (used where step's signature hides
    # it, and announced as the future one): the scaler sets self.grad_scale
    # (its scale, None once unscaled) and self.found_inf around step(), and
    # the optimizer cannot report an overflow back: step() warns if one happens.
    _step_supports_amp_scaling = True

    @torch.no_grad()
    def step(self, closure=None, *, grad_scale=None, blob=None, grad_scaler=None):
        """One AdamW step on the device; returns closure()'s loss if a closure is given.

        grad_scale: what the device multiplies every gradient by (default: the
        pending 1/loss scale of LossScaler.unscale_, else 1), times the coefficient
        of a preceding clip_grad_norm_(). blob: bytes committed with the step
        (default: the set_blob() hook's). grad_scaler: passed by torch's
        GradScaler.step(opt) (not by hand): 1/its scale is the grad_scale, or 1
        after its unscale_(opt) (which unscaled the .grad tensors themselves).
        """
        amp_scale = getattr(self, "grad_scale", None) if grad_scaler is None else None
        if grad_scaler is not None or amp_scale is not None:
            if grad_scale is not None:
                raise ValueError("step(): grad_scale and a GradScaler's scale together")
            if grad_scaler is not None:
                grad_scale = 1.0 if _amp_unscaled(grad_scaler, self) else 1.0 / grad_scaler.get_scale()
            else:
                grad_scale = 1.0 / float(amp_scale)
        # A scheduler or a per-group value may have set what the constructor
        # refuses; the device would refuse it too (E_HPARAM), this says why.
        try:
            for i, g in enumerate(self.param_groups):
                _check_group(g, f"param group {i}: ")
            self._check_params()
        except ValueError:
            self._hook_abort()
            raise
        self._check_precision()
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        scale = grad_scale if grad_scale is not None else (
            self._grad_unscale if self._grad_unscale is not None else 1.0)
        base = float(scale)
        scale = base * self._clip_coef
        self._grad_unscale, self._clip_coef = None, 1.0
        groups = [{k: g[k] for k in _HPARAM_KEYS} for g in self.param_groups]
        self._last_scale = base

        def blob_now():     # just before the commit
            b = self._blob_hook() if blob is None and callable(self._blob_hook) else \
                (self._blob_hook if blob is None else blob)
            return b"" if b is None else bytes(b)

        self._step_sumsq = None
        self.last_result = self._driver.step(self, groups, scale, blob_now)
        self.last_grad_norm = None if self._step_sumsq is None else \
            math.sqrt(self._step_sumsq) * abs(base)
        if grad_scaler is not None:
            _amp_found_inf(grad_scaler, self, self.last_result == "overflow")
        elif amp_scale is not None and self.last_result == "overflow" and not float(self.found_inf):
            warnings.warn("the device skipped a step on a gradient that overflows its dtype, which the "
                          "GradScaler calling step() without grad_scaler= (its newer contract; a wrapper "
                          "such as Accelerate's hides the keyword) cannot be told: its scale does not "
                          "back off. ckpt.torch.LossScaler backs off on the device's overflows",
                          RuntimeWarning, stacklevel=2)
        if self.last_result == "committed":
            self._read_back()
        now = self._byte_counts()
        self.last_step_bytes = {k: now[k] - self._bytes_seen[k] for k in now}
        self._bytes_seen = now
        return loss

    def _check_params(self):
        """The params step() updates are the ones it was made with. A wrapper
        that swaps param_groups' params for copies of its own (DeepSpeed's
        fp16/bf16 optimizers and ZeRO stages 1-3 hand the optimizer fp32 masters
        it keeps itself, then copy those into the model) would see no update
        at all: the device updates the model's params, the copies never move."""
        for i, (g, mine) in enumerate(zip(self.param_groups, self._own_params)):
            if len(g["params"]) != len(mine) or any(a is not b for a, b in zip(g["params"], mine)):
                raise ValueError(
                    f"param group {i}: its params are not the ones OffloadAdamW was made with "
                    f"(a wrapper replaced them with copies: DeepSpeed's fp16, bf16 and ZeRO "
                    f"optimizers do); the device updates the model's own params and keeps their "
                    f"fp32 masters itself. With DeepSpeed, use ckpt.deepspeed.config()")
        if len(self.param_groups) != len(self._own_params):
            raise ValueError("param groups were added or removed after OffloadAdamW was made")

    def _byte_counts(self):
        """What the device handle moved (the same count on the engine and the
        kernel target, kept by the client: no status read): gradient bytes
        written, param bytes read, control bytes (commands and status pages) and
        status-page reads."""
        t = self.device.traffic()
        return {"grad_written": t["grad_bytes"], "params_read": t["param_bytes"],
                "control": t["control_bytes"], "status_reads": t["status_reads"]}

    # -- gradients on their way to the device
    def _groups(self):
        """What the device's step depends on per group (maximize: the sign of what is written)."""
        return [tuple(g[k] for k in _HPARAM_KEYS) + (g["maximize"],) for g in self.param_groups]

    def _make_buffers(self):
        """One flat low-precision buffer for every param's gradient and one for the
        params read back, views per param, made once (pinned when the params are on
        CUDA: their copies then run on a side stream, non-blocking). Each param's
        read-back view starts on a 4 KiB boundary, so the device reads into it
        directly (O_DIRECT) and only a tail shorter than 4 KiB goes through a
        bounce buffer."""
        lowp = torch.bfloat16 if self.device.dtype == "bf16" else torch.float16
        sizes = [p.numel() for _, p, _ in self._flat]
        cuda = any(p.is_cuda for _, p, _ in self._flat)
        self._cuda = cuda
        self._stream = torch.cuda.Stream() if cuda else None
        self._gflat = torch.empty(sum(sizes), dtype=lowp, pin_memory=cuda)
        page = 4096 // 2
        starts = [0]
        for k in sizes:
            starts.append(starts[-1] + (k + page - 1) // page * page)
        raw = torch.empty(starts[-1] + page, dtype=lowp, pin_memory=cuda)
        shift = (-raw.data_ptr() % 4096) // 2
        self._pflat = raw[shift:shift + starts[-1]]
        self._gbuf, self._gwords, self._pbuf, self._pwords = [], [], [], []
        off = 0
        for k, start in zip(sizes, starts):
            for b, bufs, words in ((self._gflat[off:off + k], self._gbuf, self._gwords),
                                   (self._pflat[start:start + k], self._pbuf, self._pwords)):
                bufs.append(b)
                words.append(b.view(torch.int16).numpy().view(np.uint16))
            off += k
        self._pnames = [n for n, _, _ in self._flat]

    def _write_grad(self, i):
        """p.grad as the device takes it (_round_grad) in its reused buffer, written
        to the device (which copies it; the buffer keeps it until the next write:
        _sent_unchanged compares with it)."""
        n, p, _ = self._flat[i]
        if p.grad.is_sparse:
            raise RuntimeError(f"{n!r}: OffloadAdamW does not support sparse gradients")
        self._round_grad(i, self._gbuf[i])
        self.device.write_grad(n, self._gwords[i])

    def _round_grad(self, i, buf):
        """p.grad rounded to the device's dtype, negated for maximize, into buf:
        what the device is sent for param i, and what step() compares a write
        made from backward with."""
        _, p, gi = self._flat[i]
        g = p.grad.detach().reshape(-1)
        if g.is_cuda:
            # Reviewed, not run here (no CUDA on the test machine): the copy to
            # the pinned buffer runs on the side stream once backward's stream
            # has produced the gradient, and is waited for before the device
            # reads the buffer.
            s = self._stream
            s.wait_stream(torch.cuda.current_stream(g.device))
            with torch.cuda.stream(s):
                buf.copy_(g, non_blocking=True)
                g.record_stream(s)
            s.synchronize()
        else:
            buf.copy_(g)
        if self.param_groups[gi]["maximize"]:
            buf.neg_()

    def _begin(self, groups, scale):
        """Opens a step with the hyperparameters of the groups the device has (a
        rank's device: the groups up to the last one among its pieces)."""
        self.device.begin(groups[:self._dev_groups], grad_scale=scale)

    def _sent_unchanged(self, i):
        """Whether p.grad still rounds to the words written from backward. The words
        themselves are compared: a write through .data or numpy (torch 1.13's
        clip_grad_value_, a hand-made average) bumps no version counter, and an
        edit that rounds to the same words changes nothing the device would get."""
        p = self._flat[i][1]
        g = p.grad
        if g is None or g.is_sparse or g.numel() != p.numel():
            return False    # step() writes it again and says what is wrong
        self._round_grad(i, self._gcheck[:p.numel()])
        # numpy's comparison: a quarter of torch.equal's time on int16 words
        return np.array_equal(self._gcheck_words[:p.numel()], self._gwords[i])

    def _install_hooks(self):
        # step()'s check of the writes made from backward rounds each p.grad
        # again into this (one param at a time)
        self._gcheck = torch.empty(max(b.numel() for b in self._gbuf), dtype=self._gflat.dtype,
                                   pin_memory=self._cuda)
        self._gcheck_words = self._gcheck.view(torch.int16).numpy().view(np.uint16)
        for i, (_, p, _) in enumerate(self._flat):
            if not p.requires_grad:
                continue
            fn = self._grad_hook(i)
            if hasattr(p, "register_post_accumulate_grad_hook"):
                self._hook_handles.append(p.register_post_accumulate_grad_hook(lambda _p, fn=fn: fn()))
            else:
                # torch < 2.1: the param's AccumulateGrad node, kept alive by
                # holding it (as DDP does); its hooks run after .grad is set.
                with torch.enable_grad():
                    acc = p.expand_as(p).grad_fn.next_functions[0][0]
                self._hook_handles.append(_NodeHook(acc, acc.register_hook(lambda *_a, fn=fn: fn())))

    def _grad_hook(self, i):
        def hook():
            if self._accumulating:
                return
            h = self._hooked
            if h is None:
                h = self._hook_begin()
            if not h["ok"]:
                return
            if i in h["written"]:   # a second backward into the same step
                h["ok"] = False
                return
            try:
                if h["staged"]:
                    self._round_grad(i, self._gbuf[i])
                else:
                    self._write_grad(i)
                h["written"].add(i)
            except Exception:       # step() writes it again, and says what is wrong
                h["ok"] = False
        return hook

    def _hook_begin(self):
        """Starts the step from backward, with the values step() most likely uses:
        opens it on the device (each gradient is then written as backward gives
        it), or, when the last step found them changed after backward (a clip,
        most often: a trainer that clips does so step after step), only rounds
        each gradient into its buffer, for step() to write with the final scale."""
        groups = self._groups()
        scale = self._last_scale
        h = {"groups": groups, "scale": scale, "written": set(), "ok": True,
             "staged": self._stage_next}
        if not h["staged"]:
            try:
                self._begin([{k: g[k] for k in _HPARAM_KEYS} for g in self.param_groups], scale)
            except Exception:
                h["ok"] = False
                h["failed_begin"] = True
        self._hooked = h
        return h

    def _hook_abort(self):
        h, self._hooked = self._hooked, None
        if h is not None and not h["staged"] and not h.get("failed_begin") \
                and getattr(self, "device", None) is not None:
            self._abort()

    @contextlib.contextmanager
    def accumulating(self):
        """Backward passes inside add to .grad without writing it to the device:
        every micro-batch but the last of an accumulated step (DDP's no_sync())."""
        prev, self._accumulating = self._accumulating, True
        try:
            yield
        finally:
            self._accumulating = prev

    def _abort(self):
        """Aborts the open step. A failure of an earlier gradient write is
        reported by the next call, once, instead of doing it (the kernel
        target's client writes asynchronously): then the abort is sent again."""
        for _ in range(2):
            try:
                self.device.abort()
                return
            except CkptError:
                pass

    def _grads(self):
        """Every param's gradient as the device applies it (None: no gradient):
        p.grad, or sharded, the gradient averaged over the ranks (computed once a step)."""
        if not self._shard:
            for n, p, _ in self._flat:
                if p.grad is not None and p.grad.is_sparse:
                    raise RuntimeError(f"{n!r}: OffloadAdamW does not support sparse gradients")
            return [None if p.grad is None else p.grad.detach() for _, p, _ in self._flat]
        if self._avg is None:
            self._avg = self._shard.average(self._flat)
        return self._avg

    def _write_grads(self, grads):
        """The open step's gradient writes: this device's pieces of grads."""
        dev, dtype = self.device, self.device.dtype
        for dn, i, a, b, _, gi in self._pieces:
            g = grads[i]
            if g is None:
                _skip_grad(dev, dn, b - a)
                continue
            if b - a != g.numel():
                g = g.reshape(-1)[a:b]
            dev.write_grad(dn, torch_to_lowp(g, dtype, negate=self.param_groups[gi]["maximize"]))

    def _read_back(self):
        dtype = self.device.dtype
        if self._shard:
            flat = lowp_to_torch(self._shard.gather_params(self), dtype)
            for (_, p, _), off in zip(self._flat, self._shard.offsets):
                p.data.copy_(flat[off:off + p.numel()].view(p.shape))
            return
        self.device.read_params_multi(self._pnames, self._pwords)
        for i, (n, p, _) in enumerate(self._flat):
            src = self._pbuf[i].view(p.shape)
            if p.is_cuda:
                # Reviewed, not run here: from the pinned buffer on the side
                # stream, non-blocking; the compute stream waits for it.
                s = self._stream
                with torch.cuda.stream(s):
                    p.data.copy_(src, non_blocking=True)
                torch.cuda.current_stream(p.device).wait_stream(s)
            else:
                p.data.copy_(src)
        if self._cuda:
            self._stream.synchronize()   # the pinned buffer is read again next step

    # -- torch's checkpoint protocol
    def _identity(self):
        return {"path": os.path.abspath(self.path) if self.path else None, "uuid": self.uuid,
                "dtype": self.device.dtype,
                "layout": [[n, list(s), g] for n, s, g in self._layout]}

    def _param_steps(self):
        """{name: step count} of every param on the device, torch's
        state["step"]: the committed steps that updated it (a param skipped for
        want of a gradient does not count)."""
        return {n: int(self.device.tensor_step(n)) for n, _, _ in self._flat}

    def state_dict(self):
        """torch's format, pointing at the device: {"state": {}, "param_groups": [...],
        "ckpt": {"step", "path", "uuid", "dtype", "layout"}}, the pointer also in
        the first param group (torch.distributed.checkpoint's get/set_optimizer_
        state_dict keep the groups alone). The tensors stay on the device; the
        dict says which device and which committed step it means.
        to_torch_state_dict(opt) is a torch.optim.AdamW state_dict with the tensors."""
        groups, index = [], 0
        for g, ns in zip(self.param_groups, self._names):
            d = {k: v for k, v in g.items() if k != "params"}
            d["params"] = list(range(index, index + len(g["params"])))
            d["names"] = list(ns)
            index += len(g["params"])
            groups.append(d)
        pointer = dict(self._identity(), step=int(self.device.committed_step))
        if groups:
            # torch.distributed.checkpoint's state_dict helpers keep "state"
            # and "param_groups" alone: the pointer goes with them too
            groups[0]["ckpt"] = pointer
        return {"state": {}, "param_groups": groups, "ckpt": pointer}

    def load_state_dict(self, state_dict, *, rollback=False):
        """Loads a state_dict() of this device, or imports a torch.optim.AdamW state_dict.

        A state_dict() of this device (its "ckpt" entry): at the committed step,
        its hyperparameters come back into param_groups; of the step before the
        committed one, rollback=True makes that step the committed one again (the
        device keeps the previous step until the next one commits; the optimizer
        must have opened the device from its path), and the model gets its params.
        A state_dict of another device, layout or step is refused.

        A torch.optim.AdamW state_dict (no "ckpt" entry): its exp_avg, exp_avg_sq
        and step of every param and its param groups' hyperparameters. The fp32
        masters are the model's params (a param the model still holds as the
        device's rounding keeps the device's master: the model's fp32 values when
        the optimizer formatted the device), and the model gets their rounding
        back; fp32 weights hand over exactly. Only into a device before its first
        step (a new path). A param at a smaller step than the others (frozen, or
        without a gradient in some steps) keeps its own step count.
        """
        self._hook_abort()
        meta = _pointer_of(state_dict)
        if self._shard and (meta is None or rollback):
            raise ValueError("a sharded OffloadAdamW resumes where its ranks agree when it opens "
                             "their devices; it imports no torch state_dict and rolls back no step "
                             "on its own")
        if meta is None:
            return self._import_torch(state_dict)
        mine = self._identity()
        if meta.get("uuid") and mine["uuid"] and meta["uuid"] != mine["uuid"]:
            raise ValueError(f"state_dict is of device {meta['uuid']} ({meta.get('path')}), "
                             f"this optimizer drives device {mine['uuid']} ({mine['path']})")
        if not (meta.get("uuid") and mine["uuid"]) and meta.get("path") != mine["path"]:
            warnings.warn(f"state_dict names device {meta.get('path')}, this optimizer drives "
                          f"{mine['path']} (no uuid to compare)")
        if meta.get("dtype") != mine["dtype"] or meta.get("layout") != mine["layout"]:
            raise ValueError("state_dict is of another layout or dtype than this device's")
        saved = self._saved_groups(state_dict)
        step, want = int(self.device.committed_step), int(meta.get("step", -1))
        if want == step - 1 and step > 0:
            if not rollback:
                raise ValueError(self._rollback_offer(want, step))
            self._rollback(want)
        elif want != step:
            raise ValueError(f"state_dict is of step {meta.get('step')}, the device is at committed "
                             f"step {step}: the device holds one state (and the one before it), reopen "
                             f"the device instead of loading an older state_dict")
        self._set_groups(saved)

    def _saved_groups(self, state_dict):
        """state_dict's param groups, checked as torch checks them, and their values."""
        saved = state_dict["param_groups"]
        if len(saved) != len(self.param_groups):
            raise ValueError("loaded state dict has a different number of parameter groups")
        for i, (s, g) in enumerate(zip(saved, self.param_groups)):
            if len(s["params"]) != len(g["params"]):
                raise ValueError("loaded state dict contains a parameter group that doesn't match "
                                 "the size of optimizer's group")
            _check_group(dict(g, **{k: v for k, v in s.items() if k != "params"}),
                         f"state_dict param group {i}: ")
        return saved

    def _set_groups(self, saved):
        for s, g in zip(saved, self.param_groups):
            for k, v in s.items():
                if k not in ("params", "names", "ckpt"):
                    g[k] = tuple(v) if k == "betas" else v

    def _rollback_offer(self, want, step):
        why = ""
        if self.path:
            rb = _restore(self.path)["report"]["rollback"]
            if not rb["available"]:
                why = f"; but it cannot: {rb['reason']}"
        return (f"state_dict is of step {want}, the device is at committed step {step}: "
                f"load_state_dict(state_dict, rollback=True) rolls the device back to step {want}, "
                f"dropping step {step}{why}")

    def _rollback(self, want):
        try:
            self.device.rollback()
        except CkptError as e:
            raise ValueError(f"rollback to step {want} refused: {e}") from e
        self._read_back()

    def _masters_for_import(self):
        """{name: fp32 masters}: the device's, for a param the model still holds as
        their rounding (the device has the model's values at full precision); the
        model's, for one it has changed since (its weights loaded after the optimizer
        was made)."""
        dtype, out = self.device.dtype, {}
        for n, p, _ in self._flat:
            rounded = lowp_to_torch(self.device.read_params(n), dtype).view(p.shape).to(p.dtype)
            if torch.equal(p.detach().cpu(), rounded):
                out[n] = self.device.read_state(n)[0]
            else:
                out[n] = p.detach().to(torch.float32).cpu().numpy()
        return out

    def _import_torch(self, state_dict):
        """load_state_dict of a torch.optim.AdamW state_dict (see there)."""
        if "param_groups" not in state_dict or "state" not in state_dict:
            raise ValueError("not a state_dict of an OffloadAdamW (no 'ckpt' entry) or of a "
                             "torch.optim.AdamW (no 'state' and 'param_groups')")
        saved = self._saved_groups(state_dict)
        committed = int(self.device.committed_step)
        if committed != 0:
            raise ValueError(f"a torch.optim.AdamW state_dict is imported only into a device before "
                             f"its first step; {self.path or 'the device'} is at committed step "
                             f"{committed} (give the optimizer a new path, then load_state_dict)")
        masters = self._masters_for_import()
        state = {}
        for s, g, ns in zip(saved, self.param_groups, self._names):
            for pid, p, n in zip(s["params"], g["params"], ns):
                if n not in masters:    # zero-size: not on the device
                    continue
                st = state_dict["state"].get(pid, {})
                if "max_exp_avg_sq" in st:
                    raise ValueError(f"{n!r}: " + _AMSGRAD_REFUSED)
                if not st:      # torch has no state for a param before its first update
                    z = np.zeros(p.numel(), np.float32)
                    state[n] = (masters[n], z, z, 0)
                    continue
                missing = [k for k in ("step", "exp_avg", "exp_avg_sq") if k not in st]
                if missing:
                    raise ValueError(f"{n!r}: the state_dict's state of param {pid} has no {missing}")
                step = float(st["step"])
                if not (step >= 0 and step == int(step)):
                    raise ValueError(f"{n!r}: step {step} is not a step count")
                m, v = (torch.as_tensor(st[k]).detach().to("cpu", torch.float32).numpy()
                        for k in ("exp_avg", "exp_avg_sq"))
                state[n] = (masters[n], m, v, int(step))
        self.device.load_state(state, self.device.blob())
        self._set_groups(saved)
        self._read_back()

    def __repr__(self):
        r = super().__repr__()
        return r.replace("OffloadAdamW (", f"OffloadAdamW ({self.path or 'device'}, {self.device.dtype}, "
                                           f"committed step {self.device.committed_step};", 1)


def _short(names, n=6):
    s = ", ".join(repr(x) for x in names[:n])
    return s + (f", ... ({len(names)} in all)" if len(names) > n else "")
