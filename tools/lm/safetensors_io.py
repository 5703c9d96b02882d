"""Reads and writes the safetensors format (an 8-byte little-endian header length, a JSON header
of dtype, shape and byte offsets per tensor, then the bytes) without the `safetensors` package,
which Debian 12 lacks."""
import json
import struct

import torch

_DTYPES = {torch.bfloat16: "BF16", torch.float16: "F16", torch.float32: "F32"}
_BY_NAME = {v: k for k, v in _DTYPES.items()}


def save(tensors, path, metadata=None):
    header, offset, blobs = {}, 0, []
    for name in sorted(tensors):
        t = tensors[name].detach().contiguous().cpu()
        if t.dtype not in _DTYPES:
            raise ValueError(f"{name}: dtype {t.dtype} is not written")
        raw = (t.view(torch.int16) if t.dtype == torch.bfloat16 else t).numpy().tobytes()
        header[name] = {"dtype": _DTYPES[t.dtype], "shape": list(t.shape), "data_offsets": [offset, offset + len(raw)]}
        offset += len(raw)
        blobs.append(raw)
    if metadata:
        header["__metadata__"] = metadata
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for raw in blobs:
            f.write(raw)


def load(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    out = {}
    for name, h in header.items():
        if name == "__metadata__":
            continue
        a, b = h["data_offsets"]
        dtype = _BY_NAME[h["dtype"]]
        buf = torch.frombuffer(bytearray(data[a:b]), dtype=torch.uint8)
        out[name] = buf.view(dtype).reshape(h["shape"]).clone()
    return out
