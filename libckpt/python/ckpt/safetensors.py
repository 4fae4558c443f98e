# SPDX-License-Identifier: MIT
"""safetensors checkpoints read through libckpt, without reading them into memory.

The header is parsed and validated by the library (ckpt_safetensors_header in
ckpt.h, the reader `ckptctl import` and `format --from-safetensors` use): a
single file, a sharded checkpoint's model.safetensors.index.json, or a Hugging
Face model folder holding either. The tensors are numpy.memmap views of the
files (read-only): nothing is read until a tensor is used.

bf16 has no numpy dtype: it is read back as uint16 bit patterns.
"""

import ctypes
import json

import numpy as np

from ._abi import _check, _lib, _path_bytes

__all__ = ["load_file", "header", "DTYPES"]

# safetensors dtype name -> numpy dtype (BF16 travels as uint16 bits).
DTYPES = {
    "F64": np.float64, "F32": np.float32, "F16": np.float16, "BF16": np.uint16,
    "I64": np.int64, "I32": np.int32, "I16": np.int16, "I8": np.int8,
    "U64": np.uint64, "U32": np.uint32, "U16": np.uint16, "U8": np.uint8, "BOOL": np.bool_,
}


def header(path):
    """The library's validated header of a file, index or model folder:
    {"path", "files", "tensors": [{"name", "dtype", "shape", "file", "offset",
    "bytes"}], "metadata"}. Raises ckpt.CkptError (E_INVAL) for a bad one."""
    out = ctypes.c_void_p()
    _check(_lib.ckpt_safetensors_header(_path_bytes(path), ctypes.byref(out)))
    try:
        return json.loads(ctypes.string_at(out.value).decode())
    finally:
        _lib.ckpt_free(out)


def load_file(path, with_metadata=False):
    """A checkpoint's tensors: {name: read-only numpy.memmap view} (BF16 as
    uint16 bits), in file order, and the dtype names and metadata if
    with_metadata (then returns a triple)."""
    h = header(path)
    maps = [np.memmap(f, dtype=np.uint8, mode="r") for f in h["files"]]
    out, dtypes = {}, {}
    for t in h["tensors"]:
        dt = np.dtype(DTYPES[t["dtype"]]).newbyteorder("<")
        raw = maps[t["file"]][t["offset"]:t["offset"] + t["bytes"]]
        out[t["name"]] = raw.view(dt).reshape(t["shape"])
        dtypes[t["name"]] = t["dtype"]
    return (out, dtypes, h["metadata"]) if with_metadata else out
