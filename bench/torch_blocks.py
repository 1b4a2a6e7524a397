"""PyTorch MoE blocks for the benchmarks (bench/torch_compare.py, bench/profile_example.py), with
the engine's routing (examples/tiny_mixtral_util.route) and weight layout, at their fastest in
plain PyTorch:

- `sorted_fused`: sort-by-expert. One stable sort of the K*T slots by expert, one gather of the
  rows, per expert one matmul of its contiguous rows with the fused gate/up weight wi[e] [D, 2F]
  and one with wo[e] [F, D], then one weighted index_add_ back, everything in the compute dtype
  (bf16 on a CPU with AVX-512 BF16 goes through oneDNN). No per-expert masks, no padding.
- `dense`: the same routing, gather and combine, but all K*T rows through ONE gated FFN (expert
  0's weights): the same FLOPs as the routed experts in one GEMM chain, i.e. what PyTorch's
  matmuls deliver when the grouping costs nothing. A reference, not an MoE.

params: {"router": [D, E] f32, "wi": [E, D, 2F] (columns [0, F) the activated half), "wo":
[E, F, D]} in the compute dtype (router f32), leaf tensors (no per-step cast: the strongest plain
baseline). Both return (y [T, D] in x's dtype, aux) like MoELayer.
"""
import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "examples"))
import tiny_mixtral_util as util  # noqa: E402


def _act(h, cfg):
    return F.silu(h) if cfg["mlp_activation"] == "silu" else F.gelu(h, approximate="tanh")


def _routed_rows(x, router, k, cfg):
    w, idx, aux = util.route(x, router, k, cfg)
    flat = idx.reshape(-1)
    order = torch.sort(flat, stable=True).indices  # slots in expert order, ties by token
    tok = order // k
    return w.reshape(-1)[order], tok, flat, aux


def _combine(x, tok, ys, ws):
    return torch.zeros_like(x).index_add_(0, tok, ys * ws[:, None].to(ys.dtype))


def sorted_fused(x, p, k, cfg):
    E, _, F2 = p["wi"].shape
    Fd = F2 // 2
    ws, tok, flat, aux = _routed_rows(x, p["router"], k, cfg)
    sizes = torch.bincount(flat, minlength=E).tolist()
    xs = x.index_select(0, tok)
    wi, wo = p["wi"].unbind(0), p["wo"].unbind(0)  # per-expert views, one stacked gradient
    ys = []
    for e, part in enumerate(xs.split(sizes)):
        if part.shape[0]:
            h = part @ wi[e]
            ys.append((_act(h[:, :Fd], cfg) * h[:, Fd:]) @ wo[e])
    return _combine(x, tok, torch.cat(ys), ws), aux


def dense(x, p, k, cfg):
    Fd = p["wi"].shape[2] // 2
    ws, tok, _flat, aux = _routed_rows(x, p["router"], k, cfg)
    h = x.index_select(0, tok) @ p["wi"][0]
    ys = (_act(h[:, :Fd], cfg) * h[:, Fd:]) @ p["wo"][0]
    return _combine(x, tok, ys, ws), aux


BLOCKS = {"sorted_fused": sorted_fused, "dense": dense}


def make_params(w, dtype):
    """Leaf parameters of the blocks above from {router, wi_0, wi_1, wo} f32 tensors."""
    return {"router": w["router"].clone().requires_grad_(True),
            "wi": torch.cat([w["wi_0"], w["wi_1"]], dim=2).to(dtype).requires_grad_(True),
            "wo": w["wo"].to(dtype).requires_grad_(True)}
