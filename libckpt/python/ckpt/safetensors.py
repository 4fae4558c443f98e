# SPDX-License-Identifier: MIT
"""A minimal reader of the safetensors format, with no dependency but numpy.

The format (https://github.com/huggingface/safetensors, "Format"): an 8-byte
little-endian unsigned header length N, then N bytes of JSON header, then the
raw tensor data. The header maps each tensor name to {"dtype", "shape",
"data_offsets": [begin, end]} (offsets relative to the start of the data,
little-endian, C order, no gaps, no overlaps), plus an optional
"__metadata__" map of str to str. Writers pad the header with spaces so the data
starts 8-byte aligned.

bf16 has no numpy dtype: it is read back as uint16 bit patterns.

The writer is libckpt's (Device.export, ckpt_export in ckpt.h), the one
`ckptctl export` uses; this reader serves `ckpt.torch.load_safetensors_into`.
"""

import json

import numpy as np

__all__ = ["load_file", "DTYPES"]

# safetensors dtype name -> numpy dtype (BF16 travels as uint16 bits).
DTYPES = {
    "F64": np.float64, "F32": np.float32, "F16": np.float16, "BF16": np.uint16,
    "I64": np.int64, "I32": np.int32, "I16": np.int16, "I8": np.int8,
    "U64": np.uint64, "U32": np.uint32, "U16": np.uint16, "U8": np.uint8, "BOOL": np.bool_,
}

def load_file(path, with_metadata=False):
    """Reads a safetensors file: {name: numpy array} (BF16 as uint16 bits), and the
    header's dtype names and metadata if with_metadata (then returns a triple)."""
    with open(path, "rb") as f:
        raw = f.read()
    if len(raw) < 8:
        raise ValueError(f"{path}: too short for a safetensors file")
    n = int.from_bytes(raw[:8], "little")
    if n > len(raw) - 8:
        raise ValueError(f"{path}: header length {n} runs past the end of the file")
    header = json.loads(raw[8:8 + n].decode("utf-8"))
    data = memoryview(raw)[8 + n:]
    meta = header.pop("__metadata__", {}) or {}
    out, dtypes = {}, {}
    for name, e in header.items():
        b, end = e["data_offsets"]
        dt = np.dtype(DTYPES[e["dtype"]]).newbyteorder("<")
        shape = tuple(e["shape"])
        count = int(np.prod(shape, dtype=np.int64))
        if not (0 <= b <= end <= len(data)) or end - b != count * dt.itemsize:
            raise ValueError(f"{path}: tensor {name!r}: bad data_offsets {e['data_offsets']}")
        out[name] = np.frombuffer(data[b:end], dtype=dt).reshape(shape).copy()
        dtypes[name] = e["dtype"]
    return (out, dtypes, meta) if with_metadata else out
