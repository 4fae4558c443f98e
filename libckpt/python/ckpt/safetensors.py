# SPDX-License-Identifier: MIT
"""A minimal reader and writer of the safetensors format, with no dependency but numpy.

The format (https://github.com/huggingface/safetensors, "Format"): an 8-byte
little-endian unsigned header length N, then N bytes of JSON header, then the
raw tensor data. The header maps each tensor name to {"dtype", "shape",
"data_offsets": [begin, end]} (offsets relative to the start of the data,
little-endian, C order, no gaps, no overlaps), plus an optional
"__metadata__" map of str to str. Writers pad the header with spaces so the data
starts 8-byte aligned.

bf16 has no numpy dtype: it is written from, and read back as, uint16 bit
patterns (pass ("BF16", array_of_uint16) to save_file).

Used by `ckpt.torch.export_safetensors` (a device's params as a safetensors
checkpoint) until `ckptctl export` exists.
"""

import json
import os

import numpy as np

__all__ = ["save_file", "load_file", "DTYPES"]

# safetensors dtype name -> numpy dtype (BF16 travels as uint16 bits).
DTYPES = {
    "F64": np.float64, "F32": np.float32, "F16": np.float16, "BF16": np.uint16,
    "I64": np.int64, "I32": np.int32, "I16": np.int16, "I8": np.int8,
    "U64": np.uint64, "U32": np.uint32, "U16": np.uint16, "U8": np.uint8, "BOOL": np.bool_,
}
_NAMES = {np.dtype(v): k for k, v in DTYPES.items() if k not in ("BF16",)}


def save_file(tensors, path, metadata=None):
    """Writes {name: array | (dtype_name, array)} to path, atomically (temp + rename).

    Tensors are written in name order. metadata: an optional {str: str}.
    """
    entries, blobs, offset = {}, [], 0
    for name in sorted(tensors):
        v = tensors[name]
        if isinstance(v, tuple):
            dt, a = v
            if dt not in DTYPES:
                raise ValueError(f"{name!r}: unknown safetensors dtype {dt!r}")
            a = np.asarray(a)
            if a.dtype != np.dtype(DTYPES[dt]):
                raise ValueError(f"{name!r}: {dt} wants a {np.dtype(DTYPES[dt])} array, got {a.dtype}")
        else:
            a = np.asarray(v)
            dt = _NAMES.get(a.dtype)
            if dt is None:
                raise ValueError(f"{name!r}: numpy dtype {a.dtype} has no safetensors name")
        data = np.ascontiguousarray(a, dtype=a.dtype.newbyteorder("<")).tobytes()
        entries[name] = {"dtype": dt, "shape": [int(d) for d in a.shape],
                         "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    if metadata:
        entries = {"__metadata__": {str(k): str(v) for k, v in metadata.items()}, **entries}
    header = json.dumps(entries, separators=(",", ":")).encode("utf-8")
    header += b" " * (-len(header) % 8)
    tmp = f"{path}.tmp-{os.getpid()}"
    with open(tmp, "wb") as f:
        f.write(len(header).to_bytes(8, "little"))
        f.write(header)
        for b in blobs:
            f.write(b)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


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
