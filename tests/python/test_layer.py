"""moe_engine.torch.MoELayer against a plain-PyTorch Mixtral block: forward, every gradient, the
aux losses' gradients, layouts, no_grad, requires_grad=False, [B, S, D] inputs, round trips."""

import pytest
import torch

import moe_engine
from moe_engine import MoeError
from moe_engine.torch import MoELayer
from reference import MixtralBlock

E, K, D, F, T = 8, 2, 32, 48, 40
LB, Z = 0.01, 0.001  # aux loss weights (z-loss on, so its gradient is checked)
COT_LB, COT_Z = 0.7, 1.3  # the aux losses' cotangents: not 1, so they must reach the engine


def make_block(seed=0):
    torch.manual_seed(seed)
    return MixtralBlock(E, K, D, F, lb_weight=LB, z_weight=Z)


def make_layer(dtype=torch.float32, **keys):
    return MoELayer(num_experts=E, num_experts_per_tok=K, emb_dim=D, moe_mlp_dim=F, dtype=dtype,
                    load_balance_loss_weight=LB, router_z_loss_weight=Z, **keys)


def inputs(seed=1, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(T, D, generator=g).to(dtype)
    dy = torch.randn(T, D, generator=g)
    return x, dy


def run_layer(layer, x, dy):
    x = x.clone().requires_grad_(True)
    y, aux = layer(x)
    loss = (y.float() * dy).sum() + COT_LB * aux["load_balance_loss"] + COT_Z * aux["z_loss"]
    loss.backward()
    return y, aux, x.grad


def run_block(block, x, dy):
    x = x.float().clone().requires_grad_(True)
    y, lb, z, idx = block(x)
    ((y * dy).sum() + COT_LB * lb + COT_Z * z).backward()
    return y, lb, z, idx, x.grad


def spec_grads(block):
    """The block's gradients in the layer's names and layouts."""
    ex = block.experts
    return {
        "router": block.gate.weight.grad.t(),
        "wi_0": torch.stack([e.w1.weight.grad.t() for e in ex]),
        "wi_1": torch.stack([e.w3.weight.grad.t() for e in ex]),
        "wo": torch.stack([e.w2.weight.grad.t() for e in ex]),
    }


def assert_close(got, want, rel, what):
    got, want = got.detach().float(), want.detach().float()
    assert got.shape == want.shape, what
    err = (got - want).abs().max().item()
    scale = want.abs().max().item()
    assert err <= rel * scale + 1e-12, f"{what}: max error {err:.3g} vs scale {scale:.3g} (rel {rel})"


def check_against_block(dtype, rel, **keys):
    block = make_block()
    layer = make_layer(dtype, **keys)
    layer.load_mixtral_block(block.state_dict())
    x, dy = inputs(dtype=dtype)
    y, aux, dx = run_layer(layer, x, dy)
    ry, rlb, rz, ridx, rdx = run_block(block, x, dy)  # the block sees the same (rounded) x
    assert torch.equal(aux["topk_idx"].long(), ridx), "routing differs from the reference"
    assert y.dtype == dtype and dx.dtype == dtype
    assert_close(y, ry, rel, "y")
    assert_close(aux["load_balance_loss"], rlb, rel, "load_balance_loss")
    assert_close(aux["z_loss"], rz, rel, "z_loss")
    assert aux["load_balance_loss"].dim() == 0 and aux["z_loss"].dim() == 0
    assert torch.equal(aux["group_sizes"].long(), torch.bincount(ridx.flatten(), minlength=E))
    assert_close(dx, rdx, rel, "grad x")
    want = spec_grads(block)
    if layer.config["prefuse_moe_weights"]:
        g = layer.wi.grad.reshape(E, D, 2 * F)
        assert_close(g[:, :, :F], want["wi_0"], rel, "grad wi (wi_0 half)")
        assert_close(g[:, :, F:], want["wi_1"], rel, "grad wi (wi_1 half)")
        del want["wi_0"], want["wi_1"]
    for name, w in want.items():
        p = getattr(layer, name)
        assert p.dtype == torch.float32 and p.grad.dtype == torch.float32
        assert_close(p.grad, w, rel, f"grad {name}")
    return layer, y, dx


def test_f32_forward_and_every_gradient_match_mixtral_block():
    check_against_block(torch.float32, 1e-5)


def test_bf16_forward_and_every_gradient_within_bf16_bound():
    # bf16 activations and GEMM inputs (f32 accumulation): a few bf16 ulps (2^-8) of the scale.
    check_against_block(torch.bfloat16, 3e-2)


@pytest.mark.parametrize("keys", [dict(prefuse_moe_weights=True),
                                  dict(prefuse_moe_weights=True, moe_split_expert_weight_layout=True)])
def test_prefused_and_split_layouts(keys):
    _, y_plain, dx_plain = check_against_block(torch.float32, 1e-5)
    layer, y, dx = check_against_block(torch.float32, 1e-5, **keys)
    shape = [2, E, D // 2, 2 * F] if keys.get("moe_split_expert_weight_layout") else [E, D, 2 * F]
    assert list(layer.wi.shape) == shape and not hasattr(layer, "wi_0")
    assert torch.equal(y, y_plain)  # the same forward, bit for bit
    assert_close(dx, dx_plain, 1e-6, "grad x vs the unfused layout")  # the fused dx GEMM sums F and F in one pass


def test_aux_loss_gradients_flow_into_the_router():
    block, layer = make_block(), make_layer()
    layer.load_mixtral_block(block.state_dict())
    x, _ = inputs()
    y, aux = layer(x)
    (3.0 * aux["load_balance_loss"] + 5.0 * aux["z_loss"]).backward()  # y unused: dy = 0
    _, lb, z, _ = block(x)
    (3.0 * lb + 5.0 * z).backward()
    assert layer.router.grad.abs().max() > 0
    assert_close(layer.router.grad, block.gate.weight.grad.t(), 1e-5, "router grad of the aux losses")
    assert layer.wo.grad.abs().max() == 0 and layer.wi_0.grad.abs().max() == 0


def test_only_one_aux_loss_used():
    block, layer = make_block(), make_layer()
    layer.load_mixtral_block(block.state_dict())
    x, _ = inputs()
    _, aux = layer(x)
    aux["z_loss"].backward()
    _, _, z, _ = block(x)
    z.backward()
    assert_close(layer.router.grad, block.gate.weight.grad.t(), 1e-5, "router grad of z_loss alone")


def test_no_grad_keeps_no_activations_and_gives_the_same_y():
    layer = make_layer()
    x, _ = inputs()
    base = moe_engine._C.tensor_memory_bytes()
    y_grad = layer(x.clone().requires_grad_(True))[0]  # (the aux dict would keep the graph alive)
    with_graph = moe_engine._C.tensor_memory_bytes() - base
    with torch.no_grad():
        y, aux = layer(x)
    assert not y.requires_grad and not aux["load_balance_loss"].requires_grad
    assert torch.equal(y, y_grad)
    del y_grad  # drops the graph and the engine's saved activations
    without_graph = moe_engine._C.tensor_memory_bytes() - base
    # With a graph the engine keeps at least the permuted rows [T*K, D] and the FFN activations.
    assert with_graph - without_graph >= T * K * (D + 2 * F) * 4, (with_graph, without_graph)


def test_requires_grad_false_inputs():
    layer = make_layer()
    x, dy = inputs()
    y, aux = layer(x)  # x needs no gradient, the parameters do
    (y * dy).sum().backward()
    assert all(p.grad is not None and p.grad.abs().max() > 0 for p in layer.parameters())
    layer2 = make_layer()
    for p in layer2.parameters():
        p.requires_grad_(False)
    y2, _ = layer2(x)
    assert not y2.requires_grad  # nothing needs a gradient: no graph
    xg = x.clone().requires_grad_(True)
    y3, _ = layer2(xg)
    (y3 * dy).sum().backward()
    assert xg.grad is not None and all(p.grad is None for p in layer2.parameters())


def test_batched_input_equals_flat():
    layer = make_layer()
    x, dy = inputs()
    y, _, dx = run_layer(layer, x, dy)
    grads = [p.grad.clone() for p in layer.parameters()]
    layer.zero_grad()
    x3 = x.reshape(4, T // 4, D).clone().requires_grad_(True)
    y3, aux3 = layer(x3)
    assert y3.shape == (4, T // 4, D)
    ((y3 * dy.reshape(4, T // 4, D)).sum() + COT_LB * aux3["load_balance_loss"] + COT_Z * aux3["z_loss"]).backward()
    assert torch.equal(y3.reshape(T, D), y) and torch.equal(x3.grad.reshape(T, D), dx)
    for g, p in zip(grads, layer.parameters()):
        assert torch.equal(g, p.grad)


@pytest.mark.parametrize("keys", [dict(), dict(prefuse_moe_weights=True),
                                  dict(prefuse_moe_weights=True, moe_split_expert_weight_layout=True)])
def test_mixtral_round_trip(keys):
    block = make_block(3)
    layer = make_layer(**keys)
    layer.load_mixtral_block(block.state_dict())
    out = layer.export_mixtral_block()
    sd = block.state_dict()
    assert set(out) == set(sd)
    for k, v in sd.items():
        assert torch.equal(out[k], v), k


def test_parameters_and_config():
    layer = make_layer(prefuse_moe_weights=False, seed=5)
    names = dict(layer.named_parameters())
    assert list(names) == ["router", "wi_0", "wi_1", "wo"]
    assert names["router"].shape == (D, E) and names["wi_0"].shape == (E, D, F) and names["wo"].shape == (E, F, D)
    assert all(p.dtype == torch.float32 for p in names.values())
    c = layer.config
    assert c["num_experts"] == E and c["seed"] == 5 and c["dtype"] == "f32" and c["load_balance_loss_weight"] == LB
    assert c["prefuse_moe_weights"] is False and c["moe_offload_targets"] == ""
    assert isinstance(moe_engine.__version__, str) and moe_engine.world_size() == 1 and moe_engine.rank() == 0
    # init is a pure function of the seed
    assert torch.equal(make_layer(seed=5).wo, layer.wo) and not torch.equal(make_layer(seed=6).wo, layer.wo)


def test_second_backward_through_one_forward_is_an_error():
    layer = make_layer()
    x, dy = inputs()
    y, _ = layer(x)
    (y * dy).sum().backward(retain_graph=True)
    with pytest.raises(MoeError, match=r"backward ran twice through one forward"):
        (y * dy).sum().backward()
