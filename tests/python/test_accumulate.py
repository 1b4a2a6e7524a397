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


def test_step_memory_minimum_terms_by_hand():
    # E=8, K=2, D=32, F=48, T=24 routed rows R=48; bf16 compute, f32 stored weights and x.
    layer = make_layer(True)
    m = layer.step_memory_minimum(24)
    experts = E * 3 * D * F
    want = {
        "weights": experts * 4 + E * D * 4,
        "weight_copies": experts * 2,
        "gradients": (experts + E * D) * 4,
        # x in bf16 (also the router's input: no f32 copy kept), logits + scores, top-k ids/scores/weights,
        # xs (or its i32 index where the GEMMs gather the rows), h [R, 2F], a [R, F], ys
        "saved": 24 * D * 2 + 2 * 24 * E * 4 + 3 * 24 * K * 4 + (48 * 4 if layer.permutes_in_gemm() else 48 * D * 2)
        + 48 * 2 * F * 2 + 48 * F * 2 + 48 * D * 2,
        "io": 24 * D * 4 * 2 + 24 * D * 2 + 24 * D * 4,  # x and dy (f32), y (bf16), dx (f32)
    }
    for k, v in want.items():
        assert m[k] == v, (k, m[k], v)
    assert isinstance(layer.permutes_in_gemm(), bool)
    # 405,056 B with xs [48, 32] bf16 saved; 2,880 B less where the GEMMs gather it (its i32 index)
    assert m["total"] == sum(want.values()) == (402176 if layer.permutes_in_gemm() else 405056)
    # A layer that computes in each input's dtype: f32 x means f32 compute (no weight copies).
    free = make_layer(False, dtype=None)
    assert free.step_memory_minimum(24)["weight_copies"] == 0
    assert free.step_memory_minimum(24, torch.bfloat16)["weight_copies"] == experts * 2


def test_step_memory_minimum_refuses_bad_arguments():
    import pytest
    from moe_engine import MoeError
    layer = make_layer(True)
    with pytest.raises(MoeError, match="x_dtype"):
        layer.step_memory_minimum(24, torch.int32)
    with pytest.raises(MoeError, match="tokens must be >= 0"):
        layer.step_memory_minimum(-1)
