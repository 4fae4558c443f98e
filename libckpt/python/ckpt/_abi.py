# SPDX-License-Identifier: MIT
"""libckpt's C ABI (ckpt.h) as ctypes: the library, its prototypes, the
mirrors of its structs (checked against the library's sizes at import), its
error names, dtype codes and constants. The rest of the package calls the
library through this module alone."""

import ctypes
import os

def _load_library():
    """libckpt: the copy beside this file (the package assembled in a build
    tree, or a wheel's), else the installed library by its SONAME through the dynamic
    loader (`make install`; a `pip install` of the package)."""
    here = os.path.join(os.path.dirname(os.path.abspath(__file__)), "libckpt.so")
    name = here if os.path.exists(here) else "libckpt.so.0"
    try:
        return ctypes.CDLL(name)
    except OSError as e:
        raise ImportError(f"ckpt: cannot load libckpt ({e}); install it (make install, "
                          "then ldconfig) or put its directory in LD_LIBRARY_PATH") from None


_lib = _load_library()
_lib.ckpt_version.restype = ctypes.c_char_p
_lib.ckpt_version.argtypes = []
# The library's version: the VERSION file of the tree it was built from (the
# kernel module's and the C ABI's, ckpt_version()).
__version__ = _lib.ckpt_version().decode()

_lib.ckpt_err_name.restype = ctypes.c_char_p
_lib.ckpt_err_name.argtypes = [ctypes.c_int]
_lib.ckpt_abi_count.restype = ctypes.c_uint32
_lib.ckpt_abi_count.argtypes = [ctypes.c_char_p]

# The library's error names (enum ckpt_err): ERRORS[code] == "E_TWICE".
ERRORS = [_lib.ckpt_err_name(_i).decode() for _i in range(_lib.ckpt_abi_count(b"errors"))]


class CkptError(Exception):
    """An engine error: .code (enum ckpt_err), .name ("E_TWICE", ...), .message."""

    def __init__(self, code, message):
        self.code = code
        self.name = ERRORS[code] if 0 <= code < len(ERRORS) else f"E_{code}"
        self.message = message
        super().__init__(f"[{self.name}] {message}")


def _check(ret):
    if ret < 0:
        raise CkptError(-ret, _lib.ckpt_last_error().decode("utf-8", "replace"))
    return ret


class _HParams(ctypes.Structure):
    _fields_ = [("lr", ctypes.c_double), ("beta1", ctypes.c_double),
                ("beta2", ctypes.c_double), ("eps", ctypes.c_double),
                ("weight_decay", ctypes.c_double), ("adam_l2", ctypes.c_int)]


class _Info(ctypes.Structure):
    _fields_ = [("committed_step", ctypes.c_uint64), ("open_step", ctypes.c_uint64),
                ("state", ctypes.c_uint32), ("dtype", ctypes.c_uint32),
                ("n_params", ctypes.c_uint64), ("chunk_params", ctypes.c_uint32),
                ("n_chunks", ctypes.c_uint32), ("n_groups", ctypes.c_uint32),
                ("n_tensors", ctypes.c_uint32), ("steps_committed", ctypes.c_uint64),
                ("steps_skipped", ctypes.c_uint64)]


class _TensorInfo(ctypes.Structure):
    _fields_ = [("name", ctypes.c_char_p), ("ndim", ctypes.c_uint32),
                ("group", ctypes.c_uint32), ("shape", ctypes.c_uint64 * 8),
                ("numel", ctypes.c_uint64), ("offset", ctypes.c_uint64)]


class _Traffic(ctypes.Structure):
    _fields_ = [("grad_bytes", ctypes.c_uint64), ("param_bytes", ctypes.c_uint64),
                ("control_bytes", ctypes.c_uint64), ("commands", ctypes.c_uint64),
                ("status_reads", ctypes.c_uint64)]


_lib.ckpt_status_field.restype = ctypes.c_char_p
_lib.ckpt_status_field.argtypes = [ctypes.c_uint32]


class _Status(ctypes.Structure):
    # struct ckpt_device_status: uint64_t members the library names
    _fields_ = [(_lib.ckpt_status_field(_i).decode(), ctypes.c_uint64)
                for _i in range(_lib.ckpt_abi_count(b"status"))]


_u64p = ctypes.POINTER(ctypes.c_uint64)
_u16p = ctypes.POINTER(ctypes.c_uint16)
_f32p = ctypes.POINTER(ctypes.c_float)
_vp, _cp, _int, _u32, _u64 = ctypes.c_void_p, ctypes.c_char_p, ctypes.c_int, ctypes.c_uint32, ctypes.c_uint64
for _name, _res, _args in [
    ("ckpt_last_error", _cp, []),
    ("ckpt_layout_new", _vp, []),
    ("ckpt_layout_free", None, [_vp]),
    ("ckpt_layout_add", _int, [_vp, _cp, _u64p, _u32, _u32]),
    ("ckpt_layout_shard", _int, [_vp, _u32, _u32, _u32, ctypes.POINTER(_vp)]),
    ("ckpt_layout_json", _int, [_vp, ctypes.POINTER(_vp)]),
    ("ckpt_image_info", _int, [_cp, ctypes.POINTER(_vp)]),
    ("ckpt_reshard", _int, [ctypes.POINTER(_cp), _u32, _cp, _u32, _u32, _cp, ctypes.POINTER(_vp)]),
    ("ckpt_format", _int, [_cp, _vp, _int, _u32, _u64]),
    ("ckpt_format_opts", _int, [_cp, _vp, _int, _u32, _u64, _u32]),
    ("ckpt_rename_new", _int, [_cp, _cp]),
    ("ckpt_open", _int, [_cp, ctypes.POINTER(_vp)]),
    ("ckpt_open_engine_flags", _int, [_cp, _u32, _u32, _u32, ctypes.POINTER(_vp)]),
    ("ckpt_close", None, [_vp]),
    ("ckpt_info", _int, [_vp, ctypes.POINTER(_Info)]),
    ("ckpt_warning", _int, [_vp, _u32, ctypes.POINTER(_cp)]),
    ("ckpt_tensor", _int, [_vp, _u32, ctypes.POINTER(_TensorInfo)]),
    ("ckpt_load_params_multi", _int, [_vp, _u32, ctypes.POINTER(_cp), ctypes.POINTER(_f32p), _u64p]),
    ("ckpt_load_state", _int, [_vp, _u32, ctypes.POINTER(_cp), ctypes.POINTER(_f32p), ctypes.POINTER(_f32p),
                               ctypes.POINTER(_f32p), _u64p, _u64p, ctypes.c_char_p, ctypes.c_size_t]),
    ("ckpt_restore", _int, [_cp, _u32, ctypes.POINTER(_vp)]),
    ("ckpt_free", None, [_vp]),
    ("ckpt_begin", _int, [_vp, ctypes.POINTER(_HParams), _u32, ctypes.c_double]),
    ("ckpt_write_grad", _int, [_vp, _cp, _u16p, _u64]),
    ("ckpt_skip", _int, [_vp, _cp]),
    ("ckpt_tensor_step", _int, [_vp, _cp, _u64p]),
    ("ckpt_commit", _int, [_vp, ctypes.c_char_p, ctypes.c_size_t]),
    ("ckpt_abort", _int, [_vp]),
    ("ckpt_last_grad_sumsq", _int, [_vp, ctypes.POINTER(ctypes.c_double)]),
    ("ckpt_rollback", _int, [_vp, ctypes.POINTER(ctypes.c_uint64)]),
    ("ckpt_read_params", _int, [_vp, _cp, _u16p, _u64]),
    ("ckpt_read_params_multi", _int, [_vp, _u32, ctypes.POINTER(_cp), ctypes.POINTER(_u16p), _u64p]),
    ("ckpt_traffic", _int, [_vp, ctypes.POINTER(_Traffic)]),
    ("ckpt_read_state", _int, [_vp, _cp, _f32p, _f32p, _f32p, _u64]),
    ("ckpt_blob", _int, [_vp, _vp, ctypes.c_size_t]),
    ("ckpt_status", _int, [_vp, ctypes.POINTER(_Status)]),
    ("ckpt_status_prometheus", _int, [ctypes.POINTER(_Status), _u32, _cp, ctypes.POINTER(_vp)]),
    ("ckpt_uuid", _int, [_vp, ctypes.POINTER(ctypes.c_uint8)]),
    ("ckpt_image_uuid", _int, [_cp, ctypes.POINTER(ctypes.c_uint8)]),
    ("ckpt_uuid_string", None, [ctypes.POINTER(ctypes.c_uint8), _cp]),
    ("ckpt_export", _int, [_vp, _cp, _u32, _cp]),
    ("ckpt_safetensors_header", _int, [_cp, ctypes.POINTER(_vp)]),
    ("ckpt_state_name", _cp, [_u32]),
    ("ckpt_result_name", _cp, [_u32]),
    ("ckpt_dtype_name", _cp, [_u32]),
    ("ckpt_dtype_parse", _int, [_cp]),
    ("ckpt_dtype_code", _int, [_u32]),
    ("ckpt_abi_sizeof", ctypes.c_size_t, [_cp]),
    ("ckpt_abi_constant", ctypes.c_int64, [_cp]),
]:
    _fn = getattr(_lib, _name)
    _fn.restype = _res
    _fn.argtypes = _args

# The mirrors above must be the library's structs, byte for byte.
for _cname, _mirror in [("ckpt_info", _Info), ("ckpt_tensor_info", _TensorInfo),
                        ("ckpt_group_hparams", _HParams), ("ckpt_device_status", _Status),
                        ("ckpt_traffic", _Traffic)]:
    if _lib.ckpt_abi_sizeof(_cname.encode()) != ctypes.sizeof(_mirror):
        raise ImportError(f"ckpt: struct {_cname} is {_lib.ckpt_abi_sizeof(_cname.encode())} bytes in "
                          f"{_lib._name}, {ctypes.sizeof(_mirror)} in this package: they are out of step")

# dtype name <-> code (enum ckpt_dtype), from the library.
_DTYPES = {_lib.ckpt_dtype_name(_c).decode(): _c
           for _c in (_lib.ckpt_dtype_code(_i) for _i in range(_lib.ckpt_abi_count(b"dtypes")))}
_DTYPE_NAMES = {v: k for k, v in _DTYPES.items()}



def _constant(name):
    v = _lib.ckpt_abi_constant(name.encode())
    if v < 0:
        raise ImportError(f"ckpt: {_lib._name} does not define {name}")
    return v


# ckpt_export flags
_EXPORT_LOWP, _EXPORT_OPTIMIZER = _constant("CKPT_EXPORT_LOWP"), _constant("CKPT_EXPORT_OPTIMIZER")
_EXPORT_FORCE = _constant("CKPT_EXPORT_FORCE")
_RESTORE_ROLLBACK = _constant("CKPT_RESTORE_ROLLBACK")
_SHARD_RULE_EVEN, _SHARD_RULE_Q8 = _constant("CKPT_SHARD_RULE_EVEN"), _constant("CKPT_SHARD_RULE_Q8")


def _c_string(b, what, value):
    """b, the bytes of value, as a C string: C would stop at a NUL ("w\\0x"
    would name tensor "w"), so one is refused."""
    if b"\0" in b:
        raise CkptError(ERRORS.index("E_INVAL"), f"{what} {value!r} contains a NUL character")
    return b


def _name_bytes(name):
    """A tensor name as it crosses into C: a str, UTF-8, no NUL."""
    if not isinstance(name, str):
        raise TypeError(f"tensor name must be a str, not {type(name).__name__}")
    try:
        b = name.encode("utf-8")
    except UnicodeEncodeError:
        raise CkptError(ERRORS.index("E_INVAL"), f"tensor name {name!r} is not valid UTF-8 text") from None
    return _c_string(b, "tensor name", name)


def _path_bytes(path):
    """A path (str, bytes or os.PathLike) as it crosses into C."""
    return _c_string(os.fsencode(path), "path", path)


# libckpt's progress hook (ckpt_set_progress): fn(ctx, what, done, total).
_PROGRESS_FN = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_char_p, ctypes.c_uint64, ctypes.c_uint64)
_lib.ckpt_set_progress.restype = None
_lib.ckpt_set_progress.argtypes = [_PROGRESS_FN, ctypes.c_void_p]
