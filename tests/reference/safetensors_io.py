"""Pure-python safetensors reading and writing (struct + json only).

Kept free of numpy, torch and the `safetensors` package so that it is an independent
implementation of the format: the C++ tests use it to check interoperability, and
reference_model.py uses it for its inputs and outputs.

Values are exchanged as array('f') (float32) plus a shape list.
"""

import json
import math
import os
import struct
import sys
from array import array

DTYPE_SIZES = {"F32": 4, "BF16": 2, "F16": 2}


class SafetensorsError(ValueError):
    pass


def _little_endian(values):
    """array values in little-endian byte order (the file's order)."""
    if sys.byteorder != "little":
        values = array(values.typecode, values)
        values.byteswap()
    return values


def _from_little_endian(typecode, raw):
    values = array(typecode)
    values.frombytes(raw)
    if sys.byteorder != "little":
        values.byteswap()
    return values


def bf16_bits_to_f32(bits):
    """array('H') of bf16 bit patterns -> array('f') (exact)."""
    wide = array("I", (b << 16 for b in bits))
    return array("f", wide.tobytes())


def f32_to_bf16_bits(values):
    """Round float32 values to bf16 bit patterns, nearest even; NaN stays NaN."""
    bits = array("I", array("f", values).tobytes())
    out = array("H")
    for b in bits:
        if (b & 0x7F800000) == 0x7F800000 and (b & 0x007FFFFF) != 0:
            out.append((b >> 16) | 0x40)
        else:
            out.append(((b + 0x7FFF + ((b >> 16) & 1)) >> 16) & 0xFFFF)
    return out


def read_file(path):
    """Returns (tensors, metadata): tensors maps name -> (dtype, shape, array('f'))."""
    with open(path, "rb") as f:
        blob = f.read()

    def fail(problem):
        raise SafetensorsError(f"safetensors file '{path}': {problem}")

    if len(blob) < 8:
        fail(f"file is {len(blob)} bytes, shorter than the 8-byte header length")
    (header_length,) = struct.unpack("<Q", blob[:8])
    if header_length > len(blob) - 8:
        fail(f"header length {header_length} is larger than the {len(blob)}-byte file")
    try:
        header = json.loads(blob[8 : 8 + header_length].decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        fail(f"invalid JSON header: {e}")
    if not isinstance(header, dict):
        fail("JSON header is not an object")
    data = memoryview(blob)[8 + header_length :]

    metadata = header.pop("__metadata__", {})
    if not isinstance(metadata, dict) or not all(isinstance(v, str) for v in metadata.values()):
        fail("__metadata__ is not an object of strings")

    tensors = {}
    spans = []
    for name, info in header.items():
        if not isinstance(info, dict):
            fail(f"tensor '{name}' is not a JSON object")
        dtype, shape, offsets = info.get("dtype"), info.get("shape"), info.get("data_offsets")
        if dtype not in DTYPE_SIZES:
            fail(f"tensor '{name}' has unsupported dtype {dtype!r}")
        if not isinstance(shape, list) or not all(isinstance(d, int) and d >= 0 for d in shape):
            fail(f"tensor '{name}' has invalid shape {shape!r}")
        if not (isinstance(offsets, list) and len(offsets) == 2
                and all(isinstance(o, int) and o >= 0 for o in offsets)):
            fail(f"tensor '{name}' has invalid data_offsets {offsets!r}")
        begin, end = offsets
        numel = math.prod(shape)
        if end - begin != numel * DTYPE_SIZES[dtype]:
            fail(f"tensor '{name}' spans {end - begin} bytes but shape {shape} of {dtype} "
                 f"needs {numel * DTYPE_SIZES[dtype]}")
        if end > len(data):
            fail(f"tensor '{name}' ends at data byte {end} but the file holds only "
                 f"{len(data)} bytes of data")
        raw = bytes(data[begin:end])
        if dtype == "F32":
            values = _from_little_endian("f", raw)
        elif dtype == "BF16":
            values = bf16_bits_to_f32(_from_little_endian("H", raw))
        else:
            values = array("f", struct.unpack(f"<{numel}e", raw))
        tensors[name] = (dtype, shape, values)
        if begin < end:
            spans.append((begin, end, name))
    spans.sort()
    for (_, end_a, name_a), (begin_b, _, name_b) in zip(spans, spans[1:]):
        if begin_b < end_a:
            fail(f"tensors '{name_a}' and '{name_b}' overlap in the data section")
    return tensors, metadata


def write_file(path, tensors, metadata=None):
    """tensors: list of (name, dtype, shape, values) with dtype "F32" or "BF16" and
    values any iterable of floats (row-major). Data is laid out in list order."""
    header = {}
    if metadata:
        header["__metadata__"] = {str(k): str(v) for k, v in metadata.items()}
    chunks = []
    offset = 0
    for name, dtype, shape, values in tensors:
        if dtype == "F32":
            raw = _little_endian(array("f", values)).tobytes()
        elif dtype == "BF16":
            raw = _little_endian(f32_to_bf16_bits(values)).tobytes()
        else:
            raise SafetensorsError(f"cannot write dtype {dtype!r} (F32 or BF16 only)")
        numel = math.prod(shape)
        if len(raw) != numel * DTYPE_SIZES[dtype]:
            raise SafetensorsError(
                f"tensor '{name}': {len(raw) // DTYPE_SIZES[dtype]} values for shape {shape}")
        header[name] = {"dtype": dtype, "shape": list(shape),
                        "data_offsets": [offset, offset + len(raw)]}
        chunks.append(raw)
        offset += len(raw)
    text = json.dumps(header, separators=(",", ":")).encode("utf-8")
    text += b" " * (-len(text) % 8)  # keeps the data 8-byte aligned
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for raw in chunks:
            f.write(raw)
        f.flush()
        os.fsync(f.fileno())
