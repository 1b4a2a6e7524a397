#!/usr/bin/env python3
"""Compares two `moe step` output files (safetensors, SPEC.md section 7) tensor by tensor.

  compare_outputs.py A B --exact        every tensor bit-equal (names, dtypes, shapes, bytes)
  compare_outputs.py A B --rel TOL      integer tensors equal; float tensors: max |a - b| <= TOL * max |b|

Prints one line per tensor: the largest difference, and it relative to the tensor's largest
magnitude. Exit status 0 when every tensor passes, 1 otherwise."""
import json
import struct
import sys

import numpy as np

DTYPES = {"F32": np.float32, "I32": np.int32, "I64": np.int64, "BF16": np.uint16, "F64": np.float64}


def read(path):
    with open(path, "rb") as f:
        data = f.read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    body = data[8 + n:]
    out = {}
    for name, meta in header.items():
        if name == "__metadata__":
            continue
        if meta["dtype"] not in DTYPES:
            sys.exit(f"{path}: tensor {name}: dtype {meta['dtype']} is not one of {sorted(DTYPES)}")
        b, e = meta["data_offsets"]
        raw = np.frombuffer(body[b:e], dtype=DTYPES[meta["dtype"]]).reshape(meta["shape"])
        out[name] = (meta["dtype"], raw)
    return out


def as_f64(dtype, raw):
    if dtype == "BF16":
        return (raw.astype(np.uint32) << 16).view(np.float32).astype(np.float64)
    return raw.astype(np.float64)


def main():
    if len(sys.argv) != 4 and not (len(sys.argv) == 5 and sys.argv[3] == "--rel"):
        sys.exit(__doc__)
    a, b = read(sys.argv[1]), read(sys.argv[2])
    exact = sys.argv[3] == "--exact"
    tol = None if exact else float(sys.argv[4])
    ok = sorted(a) == sorted(b)
    if not ok:
        print(f"tensor names differ: {sorted(a)} vs {sorted(b)}")
    for name in sorted(set(a) & set(b)):
        (da, ra), (db, rb) = a[name], b[name]
        if da != db or ra.shape != rb.shape:
            print(f"{name}: {da}{list(ra.shape)} vs {db}{list(rb.shape)}")
            ok = False
            continue
        same = ra.tobytes() == rb.tobytes()
        if exact or da in ("I32", "I64"):
            print(f"{name}: {'bit-equal' if same else 'DIFFERENT'}")
            ok = ok and same
            continue
        fa, fb = as_f64(da, ra), as_f64(db, rb)
        diff = float(np.max(np.abs(fa - fb))) if fa.size else 0.0
        scale = float(np.max(np.abs(fb))) if fb.size else 0.0
        rel = diff / scale if scale > 0 else diff
        good = rel <= tol
        print(f"{name}: max |diff| {diff:.3e}, relative to max |b| {scale:.3e}: {rel:.3e}"
              f"{' (bit-equal)' if same else ''}{'' if good else f' > {tol}'}")
        ok = ok and good
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
