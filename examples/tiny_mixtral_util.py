"""Helpers of examples/tiny_mixtral.py and bench/torch_compare.py.

- safetensors files written and read here (the format: 8-byte little-endian header length, a JSON
  header {name: {"dtype", "shape", "data_offsets": [begin, end]}, "__metadata__": {str: str}},
  then the raw little-endian tensor bytes), written atomically (temporary file + fsync + rename);
- the byte corpus: the `fortunes` package's data files, split by fortune into train / held-out;
- the plain PyTorch MoE blocks with the engine's weight layout (router [D, E], wi_0 / wi_1
  [E, D, F], wo [E, F, D]) and its routing and auxiliary losses (docs/config.md, SPEC.md §2):
  `moe_loop` is Mixtral's per-expert loop, `moe_sorted` sorts the slots by expert and runs one
  matmul per group on stacked weights, `moe_sorted_bmm` pads the groups to one batched matmul.
"""
import json
import math
import os
import struct

import torch
import torch.nn.functional as F


class ExampleError(Exception):
    """A bad input of the example: the message names the file, key or tensor and what was expected."""


# ---------------------------------------------------------------------------------------------
# safetensors

_DTYPES = {
    "F64": torch.float64,
    "F32": torch.float32,
    "F16": torch.float16,
    "BF16": torch.bfloat16,
    "I64": torch.int64,
    "I32": torch.int32,
    "I16": torch.int16,
    "I8": torch.int8,
    "U8": torch.uint8,
    "BOOL": torch.bool,
}
_NAMES = {v: k for k, v in _DTYPES.items()}


def _elem_size(dtype):
    return torch.tensor([], dtype=dtype).element_size()


def _fsync_dir(path):
    try:
        fd = os.open(os.path.dirname(os.path.abspath(path)), os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write_bytes(path, chunks):
    """Writes the byte chunks to `path` via `path.tmp.<pid>`, fsync and rename: a reader sees the
    old file or the whole new one, never a part."""
    tmp = f"{path}.tmp.{os.getpid()}"
    try:
        with open(tmp, "wb") as f:
            for c in chunks:
                f.write(c)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    _fsync_dir(path)


def save_safetensors(path, tensors, metadata=None):
    """Writes {name: tensor} (and string metadata) as a safetensors file, atomically."""
    header = {}
    blobs = []
    offset = 0
    for name in sorted(tensors):
        t = tensors[name]
        if not isinstance(t, torch.Tensor):
            raise ExampleError(f"{path}: tensor '{name}' is a {type(t).__name__}, expected a torch.Tensor")
        if t.dtype not in _NAMES:
            raise ExampleError(f"{path}: tensor '{name}' has dtype {t.dtype}, which safetensors here cannot hold")
        t = t.detach().to("cpu").contiguous()
        raw = t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b""
        header[name] = {"dtype": _NAMES[t.dtype], "shape": list(t.shape),
                        "data_offsets": [offset, offset + len(raw)]}
        offset += len(raw)
        blobs.append(raw)
    if metadata:
        header["__metadata__"] = {str(k): str(v) for k, v in metadata.items()}
    h = json.dumps(header, separators=(",", ":")).encode("utf-8")
    h += b" " * (-len(h) % 8)  # the data starts 8-byte aligned
    atomic_write_bytes(path, [struct.pack("<Q", len(h)), h] + blobs)


def load_safetensors(path):
    """Reads a safetensors file; returns ({name: tensor}, {metadata}). Any inconsistency is an
    ExampleError naming the file and the tensor."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as e:
        raise ExampleError(f"{path}: cannot read ({e.strerror})") from None
    if len(data) < 8:
        raise ExampleError(f"{path}: {len(data)} bytes, too short for a safetensors header length")
    (n,) = struct.unpack("<Q", data[:8])
    if n > len(data) - 8:
        raise ExampleError(f"{path}: header length {n} exceeds the file ({len(data)} bytes)")
    try:
        header = json.loads(data[8:8 + n].decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ExampleError(f"{path}: header is not JSON ({e})") from None
    if not isinstance(header, dict):
        raise ExampleError(f"{path}: header is not a JSON object")
    meta = header.pop("__metadata__", {}) or {}
    if not isinstance(meta, dict) or not all(isinstance(v, str) for v in meta.values()):
        raise ExampleError(f"{path}: __metadata__ is not a map of strings")
    body = memoryview(data)[8 + n:]
    out = {}
    for name, info in header.items():
        where = f"{path}: tensor '{name}'"
        if not isinstance(info, dict) or set(info) != {"dtype", "shape", "data_offsets"}:
            raise ExampleError(f"{where}: expected exactly the fields dtype, shape, data_offsets")
        if info["dtype"] not in _DTYPES:
            raise ExampleError(f"{where}: unknown dtype {info['dtype']!r} (known: {', '.join(_DTYPES)})")
        shape, offs = info["shape"], info["data_offsets"]
        if not (isinstance(shape, list) and all(isinstance(s, int) and s >= 0 for s in shape)):
            raise ExampleError(f"{where}: shape {shape!r} is not a list of sizes")
        if not (isinstance(offs, list) and len(offs) == 2 and all(isinstance(o, int) for o in offs)
                and 0 <= offs[0] <= offs[1] <= len(body)):
            raise ExampleError(f"{where}: data_offsets {offs!r} outside the data ({len(body)} bytes)")
        dtype = _DTYPES[info["dtype"]]
        want = math.prod(shape) * _elem_size(dtype)
        if offs[1] - offs[0] != want:
            raise ExampleError(f"{where}: {offs[1] - offs[0]} bytes for shape {shape} {info['dtype']}, expected {want}")
        raw = bytearray(body[offs[0]:offs[1]])
        t = torch.frombuffer(raw, dtype=torch.uint8) if raw else torch.empty(0, dtype=torch.uint8)
        out[name] = t.view(dtype).reshape(shape).clone()
    return out, meta


# ---------------------------------------------------------------------------------------------
# corpus

FORTUNES_DIR = "/usr/share/games/fortunes"


def load_fortunes(directory=FORTUNES_DIR, heldout_every=10):
    """The fortune data files of `directory` (every file with a `.dat` index beside it, in name
    order), split into fortunes at the `%` lines; every `heldout_every`-th fortune goes to the
    held-out split. Returns (train, heldout) as uint8 tensors of bytes (fortunes joined by
    newlines) and the file names."""
    try:
        names = sorted(n for n in os.listdir(directory)
                       if os.path.isfile(os.path.join(directory, n + ".dat"))
                       and os.path.isfile(os.path.join(directory, n)))
    except OSError as e:
        raise ExampleError(f"corpus directory {directory}: cannot list ({e.strerror}); "
                           "install the Debian package 'fortunes' (scripts/install_deps.sh)") from None
    if not names:
        raise ExampleError(f"corpus directory {directory}: no fortune data files (name + name.dat); "
                           "install the Debian package 'fortunes' (scripts/install_deps.sh)")
    train, held = [], []
    i = 0
    for n in names:
        with open(os.path.join(directory, n), "rb") as f:
            text = f.read()
        for fortune in text.split(b"\n%\n"):
            fortune = fortune.strip(b"%\n")
            if not fortune:
                continue
            (held if i % heldout_every == heldout_every - 1 else train).append(fortune + b"\n")
            i += 1
    tr, he = b"".join(train), b"".join(held)
    return (torch.frombuffer(bytearray(tr), dtype=torch.uint8).clone(),
            torch.frombuffer(bytearray(he), dtype=torch.uint8).clone(), names)


def unigram_entropy(data):
    """Entropy in nats of the byte distribution of `data` (uint8 tensor): the loss of the best
    model that ignores context."""
    counts = torch.bincount(data.long(), minlength=256).double()
    p = counts[counts > 0] / counts.sum()
    return float(-(p * p.log()).sum())


# ---------------------------------------------------------------------------------------------
# plain PyTorch MoE blocks (the engine's layout and routing)

ROUTING_DEFAULTS = {
    "routed_score_func": "softmax",
    "norm_topk_prob": True,
    "routed_scaling_factor": 1.0,
    "load_balance_loss_weight": 0.01,
    "router_z_loss_weight": 0.0,
    "mlp_activation": "silu",
}


def route(x, router, k, cfg):
    """Router and auxiliary losses in f32 (SPEC.md §2 steps 1-2). x [T, D]; router [D, E] f32.
    Returns (w [T, K] f32, idx [T, K], aux dict)."""
    z = x.float() @ router.float()
    if cfg["routed_score_func"] == "softmax":
        s = torch.softmax(z, dim=-1)
    else:
        s = torch.sigmoid(z)
    # descending, ties to the lower expert id: topk of a stable sort
    order = torch.sort(s, dim=-1, descending=True, stable=True).indices[:, :k]
    w = torch.gather(s, 1, order)
    if cfg["norm_topk_prob"]:
        w = w / (w.sum(dim=-1, keepdim=True) + (1e-20 if cfg["routed_score_func"] == "sigmoid" else 0.0))
    w = w * cfg["routed_scaling_factor"]
    T, E = z.shape
    counts = torch.bincount(order.reshape(-1), minlength=E)
    probs = s if cfg["routed_score_func"] == "softmax" else torch.softmax(z, dim=-1)
    lb = E * ((counts.float() / T) * probs.mean(dim=0)).sum() * cfg["load_balance_loss_weight"]
    zl = (torch.logsumexp(z, dim=-1) ** 2).mean() * cfg["router_z_loss_weight"]
    return w, order, {"load_balance_loss": lb, "z_loss": zl, "group_sizes": counts}


def _act(h, cfg):
    return F.silu(h) if cfg["mlp_activation"] == "silu" else F.gelu(h, approximate="tanh")


def moe_loop(x, router, wi_0, wi_1, wo, k, cfg):
    """Mixtral's block: for each expert, gather its tokens, FFN, scale, add back (index_add_).
    x [T, D] in the compute dtype, expert weights in the compute dtype; returns (y, aux)."""
    w, idx, aux = route(x, router, k, cfg)
    out = torch.zeros(x.shape, dtype=torch.float32)
    # unbind: one view per expert whose backward stacks the gradients once (indexing wi_0[e] would
    # allocate and add a full [E, D, F] gradient per expert)
    w0, w1, w2 = wi_0.unbind(0), wi_1.unbind(0), wo.unbind(0)
    for e in range(len(w0)):
        tok, slot = torch.where(idx == e)
        if tok.numel() == 0:
            continue
        xe = x[tok]
        h = _act(xe @ w0[e], cfg) * (xe @ w1[e])
        out = out.index_add(0, tok, (h @ w2[e]).float() * w[tok, slot, None])
    return out.to(x.dtype), aux


def _sorted_slots(idx, k):
    flat = idx.reshape(-1)
    order = torch.sort(flat, stable=True).indices
    return order, order // k


def moe_sorted(x, router, wi_0, wi_1, wo, k, cfg):
    """Sort-by-expert: one gather of the K-fold rows in expert order, one matmul per expert group
    on the stacked weights, one weighted scatter-add back."""
    w, idx, aux = route(x, router, k, cfg)
    E = wi_0.shape[0]
    order, tok = _sorted_slots(idx, k)
    sizes = torch.bincount(idx.reshape(-1), minlength=E).tolist()
    xs = x[tok]
    w0, w1, w2 = wi_0.unbind(0), wi_1.unbind(0), wo.unbind(0)
    ys = []
    for e, part in enumerate(torch.split(xs, sizes)):
        if part.shape[0] == 0:
            continue
        ys.append((_act(part @ w0[e], cfg) * (part @ w1[e])) @ w2[e])
    ys = torch.cat(ys)
    ws = w.reshape(-1)[order]
    out = torch.zeros(x.shape, dtype=torch.float32).index_add(0, tok, ys.float() * ws[:, None])
    return out.to(x.dtype), aux


def moe_sorted_bmm(x, router, wi_0, wi_1, wo, k, cfg):
    """Sort-by-expert with the groups padded to the largest one: three batched matmuls (bmm) on
    the stacked weights [E, C, D] (C = the largest group; padding rows are zero)."""
    w, idx, aux = route(x, router, k, cfg)
    E, D = wi_0.shape[0], x.shape[1]
    order, tok = _sorted_slots(idx, k)
    sizes = torch.bincount(idx.reshape(-1), minlength=E)
    C = int(sizes.max())
    start = torch.cumsum(sizes, 0) - sizes
    flat_sorted = idx.reshape(-1)[order]
    pos = torch.arange(order.numel()) - start[flat_sorted]  # row within its group
    dest = flat_sorted * C + pos
    xp = torch.zeros(E * C, D, dtype=x.dtype).index_copy(0, dest, x[tok]).view(E, C, D)
    h = _act(torch.bmm(xp, wi_0), cfg) * torch.bmm(xp, wi_1)
    yp = torch.bmm(h, wo).view(E * C, D)
    ys = yp[dest]
    ws = w.reshape(-1)[order]
    out = torch.zeros(x.shape, dtype=torch.float32).index_add(0, tok, ys.float() * ws[:, None])
    return out.to(x.dtype), aux


TORCH_BLOCKS = {"loop": moe_loop, "sorted": moe_sorted, "sorted_bmm": moe_sorted_bmm}


class TorchMoE(torch.nn.Module):
    """The plain PyTorch MoE block with MoELayer's parameters (f32 masters router [D, E], wi_0 /
    wi_1 [E, D, F], wo [E, F, D]), computing in `dtype` (the expert weights are cast each step,
    as the engine does). Input [T, D] or [B, S, D]; returns (y, aux) like MoELayer."""

    def __init__(self, num_experts, num_experts_per_tok, emb_dim, moe_mlp_dim, dtype=torch.float32,
                 impl="loop", **cfg):
        super().__init__()
        unknown = set(cfg) - set(ROUTING_DEFAULTS)
        if unknown:
            raise ExampleError(f"TorchMoE: unsupported config keys {sorted(unknown)} "
                               f"(supported: {sorted(ROUTING_DEFAULTS)})")
        if impl not in TORCH_BLOCKS:
            raise ExampleError(f"TorchMoE: impl {impl!r}, expected one of {sorted(TORCH_BLOCKS)}")
        self.cfg = dict(ROUTING_DEFAULTS, **cfg)
        self.k, self.dtype, self.impl = num_experts_per_tok, dtype, TORCH_BLOCKS[impl]
        E, D, Fd = num_experts, emb_dim, moe_mlp_dim
        self.router = torch.nn.Parameter(torch.zeros(D, E))
        self.wi_0 = torch.nn.Parameter(torch.zeros(E, D, Fd))
        self.wi_1 = torch.nn.Parameter(torch.zeros(E, D, Fd))
        self.wo = torch.nn.Parameter(torch.zeros(E, Fd, D))

    def forward(self, x):
        shape = x.shape
        x2 = x.reshape(-1, shape[-1]).to(self.dtype)
        cast = (lambda t: t) if self.dtype == torch.float32 else (lambda t: t.to(self.dtype))
        y, aux = self.impl(x2, self.router, cast(self.wi_0), cast(self.wi_1), cast(self.wo), self.k, self.cfg)
        return y.reshape(shape), aux
