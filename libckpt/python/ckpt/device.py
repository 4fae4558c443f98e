# SPDX-License-Identifier: MIT
"""A dm-ckpt device from Python: Layout, format(), open() and Device (steps,
reads, state loads, export), restore(), image_uuid(), all over libckpt's C ABI
(_abi)."""

import contextlib
import ctypes
import json
import os
import sys
import warnings as _warnings

from ._abi import (ERRORS, CkptError, _check, _DTYPE_NAMES, _DTYPES, _EXPORT_FORCE, _EXPORT_LOWP,
                   _EXPORT_OPTIMIZER, _f32p, _HParams, _Info, _lib, _name_bytes, _path_bytes,
                   _PROGRESS_FN, _RESTORE_ROLLBACK, _SHARD_RULE_EVEN, _SHARD_RULE_Q8, _Status, _TensorInfo,
                   _Traffic, _u16p)


class _LazyNumpy:
    """numpy, imported on first use: `import ckpt` works on an interpreter
    without it (tools that only inspect a device), arrays need it."""

    def __getattr__(self, name):
        import numpy
        globals()["np"] = numpy
        return getattr(numpy, name)


np = _LazyNumpy()


class Layout:
    """Tensors in the order they are added; groups never share a chunk."""

    def __init__(self):
        self._h = _lib.ckpt_layout_new()
        if not self._h:
            raise MemoryError("ckpt_layout_new")
        self.tensors = []

    def add(self, name, shape, group=0):
        shape = tuple(int(d) for d in (shape if np.iterable(shape) else (shape,)))
        arr = (ctypes.c_uint64 * max(1, len(shape)))(*shape)
        _check(_lib.ckpt_layout_add(self._h, _name_bytes(name), arr, len(shape), int(group)))
        self.tensors.append((name, shape, int(group)))
        return self

    def shard(self, rank, world, rule=None):
        """Rank's share of this layout of whole params over world ranks
        (ckpt_layout_shard): a new Layout whose tensors are the params the
        rank holds, a param cut by a bound as a flat piece "name[a:b]". rule:
        "q8" (the default: cut at 8-bit block boundaries) or "even" (n r /
        world, the images of dm-ckpt before 0.4)."""
        rules = {None: 0, "q8": _SHARD_RULE_Q8, "even": _SHARD_RULE_EVEN}
        if rule not in rules:
            raise CkptError(ERRORS.index("E_INVAL"), f"unknown shard rule {rule!r}: use 'q8' or 'even'")
        out = Layout()
        h = ctypes.c_void_p()
        _check(_lib.ckpt_layout_shard(self._h, int(rank), int(world), rules[rule], ctypes.byref(h)))
        _lib.ckpt_layout_free(out._h)
        out._h = h.value
        desc = out.describe()
        out.tensors = [(t["name"], tuple(t["shape"]), t["group"]) for t in desc["tensors"]]
        return out

    def describe(self):
        """The layout as ckpt_layout_json gives it: {"tensors": [{"name",
        "shape", "group", "piece": {"param", "shape", "begin"} for a piece}],
        "shard": {"rank", "world", "rule", "params", "digest", "bounds"} for
        a share}."""
        return _json_out(lambda out: _lib.ckpt_layout_json(self._h, out))

    def __del__(self):
        if getattr(self, "_h", None):
            _lib.ckpt_layout_free(self._h)
            self._h = None


@contextlib.contextmanager
def _progress(desc, progress):
    """A tqdm bar on stderr fed by libckpt's progress hook while the block
    runs: progress=None shows it when stderr is a terminal, True always,
    False never."""
    if progress is None:
        progress = sys.stderr.isatty()
    if not progress:
        yield
        return
    from tqdm import tqdm  # Debian's python3-tqdm
    bars = {}

    def hook(_ctx, what, done, total):
        name = what.decode()
        bar = bars.get(name)
        if bar is None or done < bar.n:  # a phase that starts (again)
            if bar is not None:
                bar.close()
            bar = bars[name] = tqdm(total=total, desc=f"{desc}: {name}" if name != desc else desc,
                                    unit="", file=sys.stderr)
        bar.update(done - bar.n)

    fn = _PROGRESS_FN(hook)
    _lib.ckpt_set_progress(fn, None)
    try:
        yield
    finally:
        _lib.ckpt_set_progress(_PROGRESS_FN(), None)
        for bar in bars.values():
            bar.close()


_STATES = {"fp32": 0, "8bit": 1}  # CKPT_FORMAT_STATE_8BIT
_MASTERS = {"fp32": 0, "bf16": 2}  # CKPT_FORMAT_MASTER_BF16


def format(path, layout, dtype="bf16", chunk_params=65536, size=None, progress=None, state="fp32",
           master="fp32"):
    """Create or format a backing file or block device for layout.
    state: "fp32", or "8bit" for exp_avg and exp_avg_sq as block-wise 8-bit
    codes (6 B of state per param instead of 12).
    master: "fp32", or "bf16" for bf16 master params rounded stochastically
    at every step (with state="8bit" and dtype="bf16" only: 4 B of state per
    param).
    progress: a tqdm bar on stderr (None: when stderr is a terminal)."""
    if dtype not in _DTYPES:
        raise CkptError(ERRORS.index("E_DTYPE"),
                        f"unknown dtype {dtype!r}: use {' or '.join(repr(d) for d in _DTYPES)}")
    if state not in _STATES:
        raise CkptError(ERRORS.index("E_INVAL"), f"unknown state {state!r}: use 'fp32' or '8bit'")
    if master not in _MASTERS:
        raise CkptError(ERRORS.index("E_INVAL"), f"unknown master {master!r}: use 'fp32' or 'bf16'")
    with _progress("format", progress):
        _check(_lib.ckpt_format_opts(_path_bytes(path), layout._h, _DTYPES[dtype], int(chunk_params),
                                     int(size or 0), _STATES[state] | _MASTERS[master]))


def _json_out(call):
    """call(out) fills out with a malloc'ed JSON text (a tool operation of
    ckpt_admin.h): its value."""
    out = ctypes.c_void_p()
    _check(call(ctypes.byref(out)))
    try:
        return json.loads(ctypes.string_at(out.value).decode())
    finally:
        _lib.ckpt_free(out)


def image_info(path):
    """What `ckptctl info --json` prints about the image at path (a backing
    file or device, or a dm-ckpt device node, read-only), as a dict: geometry,
    tensors, "shard" (the rank's share a sharded run's image holds, else
    None)."""
    return _json_out(lambda out: _lib.ckpt_image_info(_path_bytes(path), out))


def reshard(sources, path, rank, world, params=None):
    """Makes path (a new image file) rank's share over world ranks of the
    committed state of sources, the images of every rank of a sharded run
    (any order) or one unsharded image (ckpt_reshard): masters, moments and
    step counts kept bit for bit (read back and compared), with their step
    and trainer blob. params: [(name, shape, group)] of the whole model, for
    images of dm-ckpt before 0.4. Returns the report (a dict)."""
    srcs = [_path_bytes(p) for p in sources]
    arr = (ctypes.c_char_p * max(1, len(srcs)))(*srcs)
    opts = None
    if params is not None:
        opts = json.dumps({"params": [{"name": n, "shape": [int(d) for d in shape], "group": int(g)}
                                      for n, shape, g in params]}).encode()
    return _json_out(lambda out: _lib.ckpt_reshard(arr, len(srcs), _path_bytes(path), int(rank), int(world),
                                                   opts, out))


def rename_new(src, path):
    """Renames the file src to path, which must not exist (ckpt_rename_new):
    a file at path, even one another process created meanwhile, is never
    replaced. Returns False (src stays) when path exists, else True."""
    ret = _lib.ckpt_rename_new(_path_bytes(src), _path_bytes(path))
    if ret == -ERRORS.index("E_STATE") and os.path.lexists(path):
        return False
    _check(ret)
    return True


def _uuid_text(u):
    buf = ctypes.create_string_buffer(37)
    _lib.ckpt_uuid_string(u, buf)
    return buf.value.decode()


def image_uuid(path):
    """The uuid of the dm-ckpt image at path (a backing file or device, or a
    dm-ckpt device node, read-only)."""
    u = (ctypes.c_uint8 * 16)()
    _check(_lib.ckpt_image_uuid(_path_bytes(path), u))
    return _uuid_text(u)


def restore(path, rollback=False):
    """What `ckptctl restore [--rollback] --json` reports about the image at
    path, as a dict (ckpt_restore in ckpt.h): "report" (committed step, blob,
    damage, whether the previous step can be rolled back to and why not),
    "refused" (rollback asked for, but no previous step to go back to).
    rollback=True makes the previous committed step the committed one; the
    device must not be open (by an optimizer, the kernel target or ckptctl)."""
    out = ctypes.c_void_p()
    _check(_lib.ckpt_restore(_path_bytes(path), _RESTORE_ROLLBACK if rollback else 0, ctypes.byref(out)))
    try:
        return json.loads(ctypes.string_at(out.value).decode())
    finally:
        _lib.ckpt_free(out)


def open(path, param_cache=False):  # noqa: A001 - the module's verb, like the builtin for files
    """Open a formatted backing file or device with the userspace engine.

    param_cache: the engine keeps the params as it last wrote them (2 bytes
    per param of memory) and read_params answers from them while the device
    holds the same bytes: no device reads for a read-back after each step."""
    h = ctypes.c_void_p()
    _check(_lib.ckpt_open_engine_flags(_path_bytes(path), 0, 0, 1 if param_cache else 0, ctypes.byref(h)))
    try:
        return Device(h, os.fspath(path))
    except BaseException:
        _lib.ckpt_close(h)
        raise


class CkptWarning(UserWarning):
    """The device opened, but around a damaged superblock or metadata copy."""


class Device:
    def __init__(self, handle, path):
        self._h = handle
        self.path = path  # where it was opened from
        # Damaged copies skipped on open (a damaged superblock copy may mean
        # the last commit was lost); each also raised as a CkptWarning.
        self.warnings = []
        msg = ctypes.c_char_p()
        for i in range(_check(_lib.ckpt_warning(self._h, 0, None))):
            _check(_lib.ckpt_warning(self._h, i, ctypes.byref(msg)))
            self.warnings.append(msg.value.decode("utf-8", "replace"))
        for w in self.warnings:
            _warnings.warn(f"{path}: {w}", CkptWarning, stacklevel=3)
        info = self.info()
        self.dtype = _DTYPE_NAMES[info["dtype"]]
        self._tensors = []
        for i in range(info["n_tensors"]):
            t = _TensorInfo()
            _check(_lib.ckpt_tensor(self._h, i, ctypes.byref(t)))
            self._tensors.append({"name": t.name.decode("utf-8"),
                                  "shape": tuple(t.shape[k] for k in range(t.ndim)),
                                  "group": t.group, "numel": t.numel, "offset": t.offset})
        self._by_name = {t["name"]: t for t in self._tensors}

    # -- lifecycle
    # Threads: libckpt serializes the calls on one device (ctypes releases
    # the GIL during them). close() waits for the call in flight; a thread
    # that took the handle before close() gets E_STATE from the library (its
    # handles are never reused), one after it from _handle().
    def close(self):
        h, self._h = getattr(self, "_h", None), None
        if h:
            _lib.ckpt_close(h)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        self.close()

    def _handle(self):
        if not self._h:
            raise CkptError(ERRORS.index("E_STATE"), "device is closed")
        return self._h

    # -- what is on the device
    def info(self):
        i = _Info()
        _check(_lib.ckpt_info(self._handle(), ctypes.byref(i)))
        return {f: getattr(i, f) for f, _ in _Info._fields_}

    def status(self):
        """The device's counters (the dm status line's fields, state and
        last_result by name), geometry, and the last COMMIT's gradient sum of
        squares (grad_sumsq, a float, of step grad_sumsq_step; see
        grad_sumsq()), as a dict."""
        st = _Status()
        _check(_lib.ckpt_status(self._handle(), ctypes.byref(st)))
        d = {f: getattr(st, f) for f, _ in _Status._fields_}
        d["state"] = _lib.ckpt_state_name(d["state"]).decode()
        d["last_result"] = _lib.ckpt_result_name(d["last_result"]).decode()
        d["dtype"] = _DTYPE_NAMES.get(d["dtype"], d["dtype"])
        d["grad_sumsq"] = ctypes.c_double.from_buffer_copy(ctypes.c_uint64(d["grad_sumsq"])).value
        return d

    def prometheus(self, **labels):
        """The device's status (status()'s counters) in Prometheus' text
        format, each sample with these labels (name="trainer-3", ...), for
        node_exporter's textfile collector: the families ckptctl list
        --prometheus prints for kernel targets (ckpt_status_prometheus)."""
        st = _Status()
        _check(_lib.ckpt_status(self._handle(), ctypes.byref(st)))
        out = ctypes.c_void_p()
        _check(_lib.ckpt_status_prometheus(ctypes.byref(st), 1, json.dumps([labels]).encode(),
                                           ctypes.byref(out)))
        try:
            return ctypes.string_at(out.value).decode()
        finally:
            _lib.ckpt_free(out)

    def traffic(self):
        """What this handle moved through the virtual device since it was opened
        (the same count on the engine and the kernel target): grad_bytes written,
        param_bytes read, control_bytes (commands, status pages), and the number
        of commands and status_reads."""
        t = _Traffic()
        _check(_lib.ckpt_traffic(self._handle(), ctypes.byref(t)))
        return {f: getattr(t, f) for f, _ in _Traffic._fields_}

    def uuid(self):
        """The image's uuid, "xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx"."""
        u = (ctypes.c_uint8 * 16)()
        _check(_lib.ckpt_uuid(self._handle(), u))
        return _uuid_text(u)

    def export(self, out, what="master", with_optimizer=False, metadata=None, progress=None, force=False):
        """Writes the committed step to the safetensors file out (see
        ckpt_export in ckpt.h): what="master", the fp32 master params (F32),
        or "lowp", the params in the device dtype (F16/BF16); with_optimizer
        adds NAME.exp_avg and NAME.exp_avg_sq. metadata: {str: str} added to
        (and replacing entries of) the file's __metadata__. progress: a tqdm
        bar on stderr (None: when stderr is a terminal). out is a new path or
        a regular file, which is replaced; a dm-ckpt image only with
        force=True, and never one a trainer has open (CkptError E_STATE).
        Returns out."""
        if what not in ("master", "lowp"):
            raise ValueError("what must be 'master' or 'lowp'")
        flags = (_EXPORT_LOWP if what == "lowp" else 0) | (_EXPORT_OPTIMIZER if with_optimizer else 0) \
            | (_EXPORT_FORCE if force else 0)
        meta = None
        if metadata:
            meta = json.dumps({str(k): str(v) for k, v in metadata.items()}).encode()
        with _progress("export", progress):
            _check(_lib.ckpt_export(self._handle(), _path_bytes(out), flags, meta))
        return out

    @property
    def committed_step(self):
        return self.info()["committed_step"]

    def tensors(self):
        return [dict(t) for t in self._tensors]

    def _tensor(self, name):
        t = self._by_name.get(name)
        if t is None:
            raise CkptError(ERRORS.index("E_NAME"), f"no tensor named {name!r} on this device")
        return t

    def _lowp_in(self, name, array):
        a = np.asarray(array)
        if a.dtype == np.float16 and self.dtype == "fp16":
            a = a.view(np.uint16)
        elif a.dtype == np.int16:
            a = a.view(np.uint16)
        if a.dtype != np.uint16:
            want = "float16 (or its uint16 bits)" if self.dtype == "fp16" else "uint16 bf16 bit patterns"
            raise CkptError(ERRORS.index("E_DTYPE"),
                            f"gradient of {name!r} is {array.dtype if hasattr(array, 'dtype') else type(array).__name__}: "
                            f"this {self.dtype} device takes {want}")
        return np.ascontiguousarray(a).reshape(-1)

    # -- steps
    def load_params(self, name_or_dict, values=None):
        """Initial fp32 master params (moments zero), before the first step."""
        items = name_or_dict.items() if isinstance(name_or_dict, dict) else [(name_or_dict, values)]
        names, arrays = [], []
        for name, v in items:
            names.append(_name_bytes(name))
            arrays.append(np.ascontiguousarray(np.asarray(v, dtype=np.float32)).reshape(-1))
        n = len(names)
        c_names = (ctypes.c_char_p * n)(*names)
        c_vals = (_f32p * n)(*[a.ctypes.data_as(_f32p) for a in arrays])
        c_ns = (ctypes.c_uint64 * n)(*[a.size for a in arrays])
        _check(_lib.ckpt_load_params_multi(self._handle(), n, c_names, c_vals, c_ns))

    def load_state(self, state, blob=b""):
        """A whole optimizer state from outside: {name: (param, exp_avg,
        exp_avg_sq, step)} for every tensor of the device (fp32 arrays, step
        an int), committed at once as the largest step with the trainer blob, a
        tensor at a smaller step keeping its own count. Only before the first
        step (see ckpt_load_state)."""
        names, arrays, steps = [], [], []
        for name, (p, m, v, step) in state.items():
            names.append(_name_bytes(name))
            arrays.append([np.ascontiguousarray(np.asarray(x, dtype=np.float32)).reshape(-1) for x in (p, m, v)])
            steps.append(int(step))
        n = len(names)
        ptrs = [(_f32p * n)(*[a[k].ctypes.data_as(_f32p) for a in arrays]) for k in range(3)]
        sizes = [a[0].size for a in arrays]
        for name, a in zip(state, arrays):
            if a[1].size != a[0].size or a[2].size != a[0].size:
                raise CkptError(ERRORS.index("E_SIZE"), f"{name!r}: param, exp_avg and exp_avg_sq "
                                f"have {a[0].size}, {a[1].size} and {a[2].size} elements")
        blob = bytes(blob)
        _check(_lib.ckpt_load_state(self._handle(), n, (ctypes.c_char_p * n)(*names), *ptrs,
                                    (ctypes.c_uint64 * n)(*sizes), (ctypes.c_uint64 * n)(*steps),
                                    blob, len(blob)))

    def begin(self, groups, grad_scale=1.0):
        """Open step committed_step + 1 with one dict of hyperparameters per group."""
        arr = (_HParams * max(1, len(groups)))()
        for i, g in enumerate(groups):
            unknown = set(g) - {"lr", "betas", "eps", "weight_decay", "adam_l2"}
            if unknown:
                raise CkptError(ERRORS.index("E_HPARAM"), f"group {i}: unknown keys {sorted(unknown)}")
            if "lr" not in g:
                raise CkptError(ERRORS.index("E_HPARAM"), f"group {i}: 'lr' is required")
            b1, b2 = g.get("betas", (0.9, 0.999))
            arr[i] = _HParams(float(g["lr"]), float(b1), float(b2), float(g.get("eps", 1e-8)),
                              float(g.get("weight_decay", 1e-2)), int(bool(g.get("adam_l2", False))))
        _check(_lib.ckpt_begin(self._handle(), arr, len(groups), float(grad_scale)))

    def write_grad(self, name, array):
        c_name = _name_bytes(name)
        a = self._lowp_in(name, array)
        _check(_lib.ckpt_write_grad(self._handle(), c_name, a.ctypes.data_as(_u16p), a.size))

    def skip(self, name):
        """Leave tensor name as it is in the open step (params, moments, step count).

        Instead of write_grad; E_FEATURE on an image without per-block step counts."""
        _check(_lib.ckpt_skip(self._handle(), _name_bytes(name)))

    def tensor_step(self, name):
        """The number of committed steps that updated tensor name (torch's state["step"])."""
        out = ctypes.c_uint64()
        _check(_lib.ckpt_tensor_step(self._handle(), _name_bytes(name), ctypes.byref(out)))
        return out.value

    def commit(self, blob=b""):
        """Returns "committed", or "overflow" when a non-finite gradient skipped the step."""
        blob = bytes(blob)
        r = _check(_lib.ckpt_commit(self._handle(), blob, len(blob)))
        return _lib.ckpt_result_name(r).decode()

    def grad_sumsq(self):
        """The sum of the squares of the gradients of the step the last commit()
        ended (committed or skipped), as written (before grad_scale), which the
        device added up as they arrived; None if it did not report one."""
        s = ctypes.c_double()
        return s.value if _check(_lib.ckpt_last_grad_sumsq(self._handle(), ctypes.byref(s))) else None

    def abort(self):
        _check(_lib.ckpt_abort(self._handle()))

    def rollback(self):
        """Make the previous step the committed one again; returns it.

        The ROLLBACK command, on the userspace engine and on a kernel target
        (/dev/mapper/NAME) alike. Refused (CkptError, nothing changed) while a
        step is open, or when there is nothing to go back to: step 0, a step
        began since the last commit, or the device already went back once
        (never two steps)."""
        out = ctypes.c_uint64()
        _check(_lib.ckpt_rollback(self._handle(), ctypes.byref(out)))
        return out.value

    def read_params(self, name, out=None):
        """The tensor's low-precision params; into out (a contiguous uint16 array of
        its numel, reused across steps) when given."""
        c_name = _name_bytes(name)
        t = self._tensor(name)
        if out is None:
            out = np.empty(t["numel"], dtype=np.uint16)
        elif out.dtype != np.uint16 or out.size != t["numel"] or not out.flags.c_contiguous:
            raise CkptError(ERRORS.index("E_SIZE"), f"read_params {name!r}: out must be a contiguous "
                            f"uint16 array of {t['numel']} elements")
        _check(_lib.ckpt_read_params(self._handle(), c_name, out.ctypes.data_as(_u16p), out.size))
        if self.dtype == "fp16":
            out = out.view(np.float16)
        return out.reshape(t["shape"])

    def read_params_multi(self, names, outs):
        """The params of several tensors in one batch into outs (contiguous uint16
        arrays of each tensor's numel, reused across steps; 4 KiB aligned ones
        are read into directly)."""
        c_names = [_name_bytes(n) for n in names]
        for name, out in zip(names, outs):
            numel = self._tensor(name)["numel"]
            if out.dtype != np.uint16 or out.size != numel or not out.flags.c_contiguous:
                raise CkptError(ERRORS.index("E_SIZE"), f"read_params_multi {name!r}: out must be a "
                                f"contiguous uint16 array of {numel} elements")
        n = len(c_names)
        _check(_lib.ckpt_read_params_multi(self._handle(), n, (ctypes.c_char_p * n)(*c_names),
                                           (_u16p * n)(*[o.ctypes.data_as(_u16p) for o in outs]),
                                           (ctypes.c_uint64 * n)(*[o.size for o in outs])))

    def read_state(self, name):
        """fp32 (param, exp_avg, exp_avg_sq) of the committed step, also while a step
        is open (what it has applied is not state until it commits; read_params
        returns the latest applied params)."""
        c_name = _name_bytes(name)
        t = self._tensor(name)
        p, m, v = (np.empty(t["numel"], dtype=np.float32) for _ in range(3))
        _check(_lib.ckpt_read_state(self._handle(), c_name, p.ctypes.data_as(_f32p),
                                    m.ctypes.data_as(_f32p), v.ctypes.data_as(_f32p), p.size))
        return tuple(x.reshape(t["shape"]) for x in (p, m, v))

    def blob(self):
        n = _check(_lib.ckpt_blob(self._handle(), None, 0))
        buf = ctypes.create_string_buffer(max(1, n))
        _check(_lib.ckpt_blob(self._handle(), buf, n))
        return buf.raw[:n]
