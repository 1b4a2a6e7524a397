"""MoELayer(accumulate_grads=True): micro-batches 2.. add into the parameters' .grad in place, with
the same bits as autograd's own accumulation, and fall back to it when a .grad cannot take that."""

import torch

from moe_engine.torch import MoELayer

E, K, D, F = 8, 2, 32, 48


def make_layer(accumulate, dtype=torch.bfloat16, **keys):
    return MoELayer(num_experts=E, num_experts_per_tok=K, emb_dim=D, moe_mlp_dim=F, dtype=dtype,
                    load_balance_loss_weight=0.01, router_z_loss_weight=0.001,
                    accumulate_grads=accumulate, **keys)


def micro_batches(n=3, T=24):
    g = torch.Generator().manual_seed(4)
    return [(torch.randn(T + 8 * i, D, generator=g), torch.randn(T + 8 * i, D, generator=g)) for i in range(n)]


def accumulate(layer, batches):
    xgrads = []
    for x, dy in batches:
        x = x.clone().requires_grad_(True)
        y, aux = layer(x)
        ((y.float() * dy).sum() + 0.7 * aux["load_balance_loss"] + 1.3 * aux["z_loss"]).backward()
        xgrads.append(x.grad)
    return xgrads


def test_in_place_accumulation_matches_autograd_bit_for_bit():
    for keys in ({}, {"prefuse_moe_weights": True, "moe_split_expert_weight_layout": True}):
        batches = micro_batches()
        plain, fast = make_layer(False, **keys), make_layer(True, **keys)
        xp, xf = accumulate(plain, batches), accumulate(fast, batches)
        for a, b in zip(xp, xf):
            assert torch.equal(a, b)
        for (name, p), (_, q) in zip(plain.named_parameters(), fast.named_parameters()):
            assert q.grad is not None and torch.equal(p.grad, q.grad), name


def test_buffers_are_reused_in_place():
    layer = make_layer(True)
    batches = micro_batches()
    accumulate(layer, batches[:1])
    ptrs = {n: p.grad.data_ptr() for n, p in layer.named_parameters()}
    accumulate(layer, batches[1:])
    assert ptrs == {n: p.grad.data_ptr() for n, p in layer.named_parameters()}


def test_falls_back_when_a_grad_cannot_take_it():
    batches = micro_batches(2)
    plain, fast = make_layer(False), make_layer(True)
    accumulate(plain, batches[:1])
    accumulate(fast, batches[:1])
    fast.wo.grad = None  # one parameter without a gradient: autograd accumulates them all
    plain.wo.grad = None
    accumulate(plain, batches[1:])
    accumulate(fast, batches[1:])
    for (name, p), (_, q) in zip(plain.named_parameters(), fast.named_parameters()):
        assert torch.equal(p.grad, q.grad), name
