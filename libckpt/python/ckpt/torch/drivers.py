# SPDX-License-Identifier: MIT
"""How OffloadAdamW.step() drives devices, one interface (step(opt, groups,
scale, blob_now) -> "committed" | "overflow"): _Local, the optimizer's one
device, keeping the writes its gradient hooks made; _Shard, ZeRO-1 over a
torch.distributed process group, each rank on its own device."""

import os
import struct

import numpy as np
import torch

from .. import CkptError, Layout


def _skip_grad(dev, name, n):
    """A param without a gradient: torch skips it (no decay, no moment decay,
    its own step count). An image formatted before skips existed gets zeros."""
    try:
        dev.skip(name)
        return
    except CkptError as e:
        if e.name != "E_FEATURE":
            raise
    dev.write_grad(name, np.zeros(n, dtype=np.uint16))


class _Local:
    """The unsharded step: the optimizer's one device."""

    def step(self, opt, groups, scale, blob_now):
        """Keeps the writes made from backward when nothing step() decides
        differs from what the hooks assumed; otherwise (or when the hooks only
        staged the gradients) opens the step now and writes what backward
        rounded up to the first gradient changed since, and from there on
        every gradient rounded again (a clip in place changes them all: no
        compare is wasted on the rest). Writes the rest, commits. A step
        whose writes from backward could not stand has the next one staged;
        a staged step that could have stood, hooked."""
        dev = opt.device
        h, opt._hooked = opt._hooked, None
        ready = set()       # params whose buffer holds the rounding of p.grad now
        kept = h is not None and h["ok"] and h["groups"] == opt._groups() and h["scale"] == scale
        if kept:
            for i in h["written"]:
                if not opt._sent_unchanged(i):
                    kept = False
                    break
                ready.add(i)
        if h is not None:
            opt._stage_next = not kept
        if h is not None and not h["staged"] and not kept:
            opt._abort()
        hooked = kept and not h["staged"]
        opt.last_step_hooked = hooked
        if hooked:
            opt.last_step_mode = "hooked"
        elif h is None or h.get("failed_begin") or (h["staged"] and not h["ok"]):
            opt.last_step_mode = "written"
        else:   # the device updated during backward for nothing, or nothing was wasted
            opt.last_step_mode = "staged" if h["staged"] else "redone"
        try:
            if not hooked:
                opt._begin(groups, scale)
            for i, (n, p, gi) in enumerate(opt._flat):
                if hooked and i in ready:
                    continue
                if i in ready:
                    dev.write_grad(n, opt._gwords[i])
                elif p.grad is None:
                    _skip_grad(dev, n, p.numel())
                else:
                    opt._write_grad(i)
            result = dev.commit(blob_now())
            opt._step_sumsq = dev.grad_sumsq()
            return result
        except BaseException:
            opt._abort()
            raise


def whole_layout(flat):
    """The ckpt.Layout of the params (name, param, group) whole, in order."""
    layout = Layout()
    for name, p, gi in flat:
        layout.add(name, tuple(int(d) for d in p.shape), gi)
    return layout


class _Shard:
    """ZeRO-1 over a torch.distributed process group: rank r of W owns params
    [bounds[r], bounds[r + 1]) of the params flattened in param_groups order,
    on its own device, as pieces: "name" for a param it holds whole,
    "name[a:b]" (flat) for part of one. The bounds are libckpt's rule
    (ckpt.Layout.shard: cut at 8-bit block boundaries; devices made before
    dm-ckpt 0.4 record none and were cut evenly). The collectives run on CPU
    tensors (gloo), or on the current CUDA device when the group's backend is
    NCCL."""

    def __init__(self, group, flat):
        import torch.distributed as dist
        self.dist, self.group = dist, group
        self.rank = dist.get_rank(group)
        self.world = dist.get_world_size(group)
        backend = dist.get_backend(group)
        self.comm = torch.device("cuda", torch.cuda.current_device()) if backend == "nccl" \
            else torch.device("cpu")
        self.offsets, n = [], 0
        for _, p, _ in flat:
            self.offsets.append(n)
            n += p.numel()
        self.n = n
        self.use_rule(flat, "q8")

    def use_rule(self, flat, rule):
        """This rank's pieces by rule ("q8", or "even": a device of dm-ckpt
        before 0.4)."""
        self.layout = whole_layout(flat).shard(self.rank, self.world, rule)   # what a device is made of
        share = self.layout.describe()
        self.rule = rule
        self.bounds = share["shard"]["bounds"]
        self.lo, self.hi = self.bounds[self.rank], self.bounds[self.rank + 1]
        self.longest = max(b - a for a, b in zip(self.bounds, self.bounds[1:]))
        index = {name: i for i, (name, _, _) in enumerate(flat)}
        self.pieces = []
        for t in share["tensors"]:
            piece = t.get("piece")
            a = piece["begin"] if piece else 0
            numel = int(np.prod(t["shape"], dtype=np.int64))
            self.pieces.append((t["name"], index[piece["param"] if piece else t["name"]], a, a + numel,
                                tuple(t["shape"]), t["group"]))

    @classmethod
    def of(cls, process_group, flat):
        """A _Shard when torch.distributed is initialized (or process_group is given)
        with more than one rank; else None (one device holds everything)."""
        import torch.distributed as dist
        if process_group is None and not (dist.is_available() and dist.is_initialized()):
            return None
        if dist.get_world_size(process_group) == 1:
            return None
        return cls(process_group, flat)

    @staticmethod
    def path_of(shard, path):
        """This rank's path: path with {rank} replaced, or the rank's entry of a list."""
        rank, world = (shard.rank, shard.world) if shard else (0, 1)
        if isinstance(path, (list, tuple)):
            if len(path) != world:
                raise ValueError(f"{len(path)} paths given for {world} ranks")
            real = [os.path.realpath(os.fspath(p)) for p in path]
            for r, p in enumerate(real):
                if p in real[:r]:
                    raise ValueError(f"ranks {real.index(p)} and {r} are given the same path "
                                     f"{os.fspath(path[r])!r}: each rank needs its own device")
            return os.fspath(path[rank])
        path = os.fspath(path)
        if "{rank}" in path:
            return path.replace("{rank}", str(rank))
        if shard:
            raise ValueError(f"{path!r}: a sharded OffloadAdamW needs a device per rank: a path "
                             f"holding {{rank}} (e.g. 'state-{{rank}}.img') or a list of {world} paths")
        return path

    def _all(self, values, op):
        t = torch.tensor(values, dtype=torch.int64, device=self.comm)
        self.dist.all_reduce(t, op=op, group=self.group)
        return [int(x) for x in t.tolist()]

    def _gather(self, values):
        t = torch.tensor(values, dtype=torch.int64, device=self.comm)
        out = [torch.empty_like(t) for _ in range(self.world)]
        self.dist.all_gather(out, t, group=self.group)
        return [[int(x) for x in o.tolist()] for o in out]

    def agree(self, fn, what):
        """Run fn on every rank; if it raised anywhere, raise everywhere (the rank's
        own exception where it failed), so that no rank waits for a collective
        another rank never reaches."""
        err = None
        try:
            fn()
        except Exception as e:  # noqa: BLE001 - re-raised below, after the vote
            err = e
        failed = [r for r, (f,) in enumerate(self._gather([int(err is not None)])) if f]
        if err is not None:
            raise err
        if failed:
            raise RuntimeError(f"rank {self.rank}: rank(s) {failed} could not {what}")

    def agree_create(self, path_fn):
        """Whether this open creates the ranks' devices: path_fn() gives this rank's
        path; all ranks create theirs or none does. Some ranks' devices missing
        while others exist is refused on every rank: a rank's device made anew
        at step 0 would make the others roll back or refuse, or train from
        state of another run or world size."""
        err, exists = None, False
        try:
            exists = os.path.exists(path_fn())
        except Exception as e:  # noqa: BLE001 - re-raised below, after the vote
            err = e
        votes = self._gather([int(err is not None), int(exists)])
        if err is not None:
            raise err
        failed = [r for r, (f, _) in enumerate(votes) if f]
        if failed:
            raise RuntimeError(f"rank {self.rank}: rank(s) {failed} could not find their device's path")
        missing = [r for r, (_, e) in enumerate(votes) if not e]
        if missing and len(missing) < self.world:
            raise RuntimeError(f"rank(s) {missing} of {self.world} have no device at their path while the "
                               f"other ranks have one: a missing device is not made anew at step 0 "
                               f"beside the others' state; restore it, or remove every rank's device "
                               f"to start from the model")
        return bool(missing)

    def agree_step(self, device):
        """On open: the ranks resume from the lowest committed step; a rank one step
        ahead (it committed a step that another rank had not committed when the run
        stopped) rolls back to it. Ranks further apart are refused: the commit never
        leaves them so."""
        steps = [s for (s,) in self._gather([int(device.committed_step)])]
        lo, hi = min(steps), max(steps)
        if hi - lo > 1:
            raise RuntimeError(f"the ranks' devices are at committed steps {steps}: more than one "
                               f"step apart, which the sharded commit never leaves (devices of "
                               f"another run or world size, or one restored by hand); refusing to "
                               f"train from them")
        if steps[self.rank] != lo:
            self.agree(device.rollback, f"roll back to step {lo}")
        else:
            self.agree(lambda: None, f"roll back to step {lo}")
        return lo

    def average(self, flat):
        """Every param's gradient averaged over the ranks (DDP's mean), as one fp32
        all_reduce (gloo has no reduce_scatter in torch 1.13): a list, None for a
        param no rank has a gradient for (a rank without one adds zeros)."""
        have = self._all([int(p.grad is not None) for _, p, _ in flat], self.dist.ReduceOp.SUM)
        buf = torch.zeros(self.n, dtype=torch.float32, device=self.comm)
        for (name, p, _), off in zip(flat, self.offsets):
            if p.grad is not None:
                if p.grad.is_sparse:
                    raise RuntimeError(f"{name!r}: OffloadAdamW does not support sparse gradients")
                buf[off:off + p.numel()].copy_(p.grad.detach().reshape(-1))
        self.dist.all_reduce(buf, group=self.group)
        buf.div_(self.world)
        return [buf[off:off + p.numel()].view(p.shape) if h else None
                for (_, p, _), off, h in zip(flat, self.offsets, have)]

    def step(self, opt, groups, scale, blob_now):
        """The step on every rank or on none. Phase 1: each rank writes its pieces'
        gradients (every chunk applied); the ranks vote (failure, overflow): any
        failure or overflow aborts the step on every rank. Phase 2: every rank
        commits, with rank 0's blob; a second vote tells every rank that all
        committed. A run stopped between the two phases leaves ranks at t - 1 and
        t, which the next open settles (agree_step)."""
        grads = opt._grads()
        opt._avg = None
        opt._step_sumsq = None      # an aborted step has none
        opt.last_step_hooked = False
        opt.last_step_mode = "written"
        dev = opt.device
        err, overflow = None, 0
        try:
            opt._begin(groups, scale)
            opt._write_grads(grads)
            overflow = int(dev.status()["overflow"] != 0)
        except Exception as e:  # noqa: BLE001 - re-raised below, after the vote
            err = e
        failed, overflow = self._all([int(err is not None), overflow], self.dist.ReduceOp.MAX)
        if failed or overflow:
            opt._abort()
            if err is not None:
                raise err
            if failed:
                raise RuntimeError(f"rank {self.rank}: another rank failed its gradient writes; "
                                   f"the step was aborted on every rank")
            return "overflow"
        obj = [None]
        if self.rank == 0:
            try:
                obj = [blob_now()]
            except Exception as e:  # noqa: BLE001 - every rank aborts, rank 0 raises it
                obj, err = [e], e
        self.dist.broadcast_object_list(obj, src=self._global(0), group=self.group)
        result = None
        if isinstance(obj[0], BaseException):
            opt._abort()
            if err is not None:
                raise err
            raise RuntimeError(f"rank {self.rank}: rank 0's trainer blob failed ({obj[0]!r}); the "
                               f"step was aborted on every rank")
        sumsq = None
        try:
            result = dev.commit(obj[0])
            sumsq = dev.grad_sumsq()
        except Exception as e:  # noqa: BLE001 - re-raised below, after the vote
            err = e
        # With the vote, each rank's gradient sum (fp64 bits): the global norm's
        # square is their sum, in rank order (the same float on every rank).
        bits = 0 if sumsq is None else struct.unpack("<q", struct.pack("<d", sumsq))[0]
        votes = self._gather([int(result == "committed"), int(sumsq is not None), bits])
        done = [r for r, (ok, _, _) in enumerate(votes) if not ok]
        if all(have for _, have, _ in votes):
            opt._step_sumsq = 0.0
            for _, _, b in votes:
                opt._step_sumsq += struct.unpack("<d", struct.pack("<q", b))[0]
        if err is not None:
            raise err
        if done:
            raise RuntimeError(f"rank {self.rank}: rank(s) {done} did not commit the step that "
                               f"this rank committed; open every rank's device again (the ranks "
                               f"that committed roll back)")
        return result

    def _global(self, rank):
        if self.group is None:
            return rank
        get = getattr(self.dist, "get_global_rank", None) or self.dist.distributed_c10d._get_global_rank
        return get(self.group, rank)

    def gather_params(self, opt):
        """The low-precision params of every rank, flattened (uint16 words): each
        rank reads its pieces from its device, then one all_gather."""
        mine = [np.ascontiguousarray(opt.device.read_params(dn)).reshape(-1).view(np.uint16)
                for dn, _, _, _, _, _ in self.pieces]
        buf = torch.zeros(self.longest, dtype=torch.int16)
        local = np.concatenate(mine) if mine else np.zeros(0, np.uint16)
        buf[:local.size] = torch.from_numpy(local.view(np.int16))
        buf = buf.to(self.comm)
        out = [torch.empty_like(buf) for _ in range(self.world)]
        # As bytes: gloo's all_gather takes uint8 in every version.
        self.dist.all_gather([o.view(torch.uint8) for o in out], buf.view(torch.uint8),
                             group=self.group)
        parts = [out[r][:self.bounds[r + 1] - self.bounds[r]].cpu() for r in range(self.world)]
        return torch.cat(parts).numpy().view(np.uint16)
