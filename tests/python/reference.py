"""Plain-PyTorch references for the tests: a Mixtral sparse MoE block (softmax over all experts,
top-k, renormalized weights, SwiGLU experts) with the engine's two aux losses, and a minimal
safetensors reader."""

import json
import struct

import numpy as np
import torch
from torch import nn


class MixtralExpert(nn.Module):
    def __init__(self, D, F):
        super().__init__()
        self.w1 = nn.Linear(D, F, bias=False)
        self.w2 = nn.Linear(F, D, bias=False)
        self.w3 = nn.Linear(D, F, bias=False)

    def forward(self, x):
        return self.w2(torch.nn.functional.silu(self.w1(x)) * self.w3(x))


class MixtralBlock(nn.Module):
    """Mixtral's sparse MoE block (names as in PyTorch Mixtral checkpoints), f32 (f64 after .double())."""

    def __init__(self, E, K, D, F, lb_weight=0.0, z_weight=0.0):
        super().__init__()
        self.E, self.K, self.lb_weight, self.z_weight = E, K, lb_weight, z_weight
        self.gate = nn.Linear(D, E, bias=False)
        self.experts = nn.ModuleList([MixtralExpert(D, F) for _ in range(E)])
        with torch.no_grad():  # unit-variance-ish activations: every expert matters
            self.gate.weight.normal_(0.0, D ** -0.5)
            for e in self.experts:
                e.w1.weight.normal_(0.0, D ** -0.5)
                e.w3.weight.normal_(0.0, D ** -0.5)
                e.w2.weight.normal_(0.0, F ** -0.5)

    def forward(self, x):
        """x [T, D] -> y [T, D], load-balance loss, z-loss (both weighted)."""
        logits = self.gate(x)
        probs = torch.softmax(logits, dim=-1)
        w, idx = torch.topk(probs, self.K, dim=-1)
        w = w / w.sum(dim=-1, keepdim=True)
        y = torch.zeros_like(x)
        for e in range(self.E):
            tok, slot = torch.nonzero(idx == e, as_tuple=True)
            if tok.numel():
                y = y.index_add(0, tok, w[tok, slot, None] * self.experts[e](x[tok]))
        T = x.shape[0]
        counts = torch.bincount(idx.flatten(), minlength=self.E).to(probs.dtype)  # routed slots, no gradient
        lb = self.lb_weight * self.E * torch.sum(counts / T * probs.mean(dim=0))
        z = self.z_weight * torch.mean(torch.logsumexp(logits, dim=-1) ** 2)
        return y, lb, z, idx


_ST_DTYPES = {"F32": (np.float32, None), "I32": (np.int32, None), "BF16": (np.int16, torch.bfloat16),
              "I64": (np.int64, None)}


def read_safetensors(path):
    """{name: torch.Tensor} of a safetensors file (F32, BF16, I32, I64)."""
    with open(path, "rb") as f:
        data = f.read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        b, e = info["data_offsets"]
        npt, view = _ST_DTYPES[info["dtype"]]
        arr = np.frombuffer(data[8 + n + b:8 + n + e], dtype=npt).reshape(info["shape"]).copy()
        t = torch.from_numpy(arr)
        out[name] = t.view(view) if view is not None else t
    return out
