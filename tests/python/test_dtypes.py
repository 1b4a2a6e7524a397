"""MoELayer's dtype rule (docs/python.md "Dtypes"): the compute dtype follows the input unless the
layer has an explicit one (constructor or conversion); torch.autocast('cpu') wins over both
except for float64; conversions to a dtype the engine cannot compute in raise at the conversion;
float64 runs the engine's own f64 forward and backward (reference kernels), checked by
torch.autograd.gradcheck and against the plain-PyTorch Mixtral block in float64."""

import pytest
import torch
from torch.nn.utils import stateless

from moe_engine import MoeError
from moe_engine.torch import MoELayer
from reference import MixtralBlock

E, K, D, F, T = 4, 2, 8, 16, 6
NAMES = ["router", "wi_0", "wi_1", "wo"]


def make_layer(dtype=None, **keys):
    return MoELayer(num_experts=E, num_experts_per_tok=K, emb_dim=D, moe_mlp_dim=F, dtype=dtype, seed=3,
                    load_balance_loss_weight=0.1, router_z_loss_weight=0.05, **keys)


def x_of(dtype, seed=1, requires_grad=True):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(T, D, generator=g, dtype=torch.float64).to(dtype).requires_grad_(requires_grad)


def step(layer, x):
    """y, aux and the gradients of sum(y) + both losses (x.grad, then each parameter's grad)."""
    for p in layer.parameters():
        p.grad = None
    y, aux = layer(x)
    (y.float().sum() + aux["load_balance_loss"] + aux["z_loss"]).backward()
    return y, aux, x.grad, [getattr(layer, n).grad for n in NAMES]


# --- the default: the compute dtype follows the input --------------------------------------------

@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
def test_default_layer_computes_in_the_input_dtype(dtype):
    layer = make_layer()
    assert layer.compute_dtype is None and layer.config["dtype"] is None
    x = x_of(dtype)
    y, aux, dx, grads = step(layer, x)
    assert y.dtype == dtype and dx.dtype == dtype
    loss = torch.float64 if dtype == torch.float64 else torch.float32
    assert aux["load_balance_loss"].dtype == loss and aux["z_loss"].dtype == loss
    assert aux["topk_weights"].dtype == loss
    assert all(g.dtype == torch.float32 for g in grads)  # each parameter's grad in its own dtype
    # The same bits as a layer built with that dtype explicitly.
    y2, aux2, dx2, grads2 = step(make_layer(dtype), x_of(dtype))
    assert torch.equal(y, y2) and torch.equal(dx, dx2)
    assert all(torch.equal(a, b) for a, b in zip(grads, grads2))


def test_f32_output_feeds_the_next_f32_module():
    layer, lin = make_layer(), torch.nn.Linear(D, 3)
    y, _ = layer(x_of(torch.float32))
    lin(y).sum().backward()  # a bfloat16 y would raise here (mat1 and mat2 must have the same dtype)


def test_three_dim_input_keeps_its_dtype():
    y, _ = make_layer()(x_of(torch.float64).detach().reshape(2, 3, D))
    assert y.dtype == torch.float64 and y.shape == (2, 3, D)


# --- an explicit compute dtype: y in that dtype, x.grad in x's -------------------------------------

@pytest.mark.parametrize("compute", [torch.float32, torch.bfloat16, torch.float64])
@pytest.mark.parametrize("xdtype", [torch.float32, torch.bfloat16, torch.float64])
def test_explicit_dtype_sets_the_output_dtype(compute, xdtype):
    layer = make_layer(compute)
    assert layer.compute_dtype == compute
    y, aux, dx, _ = step(layer, x_of(xdtype))
    assert y.dtype == compute and dx.dtype == xdtype
    # The engine rounds x to the compute dtype first: the same y as an input already in it.
    y2, _ = make_layer(compute)(x_of(xdtype).detach().to(compute))
    assert torch.equal(y, y2)


def test_unsupported_input_dtype_is_a_clear_error():
    with pytest.raises(MoeError, match=r"x: dtype torch.float16 is not supported \(expected torch.float32 or torch.bfloat16"):
        make_layer()(x_of(torch.float16, requires_grad=False))


# --- torch.autocast('cpu') -------------------------------------------------------------------------

@pytest.mark.parametrize("explicit", [None, torch.float32])
def test_autocast_cpu_bf16_runs_the_layer_in_bf16(explicit):
    layer = make_layer(explicit)
    x = x_of(torch.float32)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert torch.is_autocast_cpu_enabled() and torch.get_autocast_cpu_dtype() == torch.bfloat16
        y, aux = layer(x)
    assert y.dtype == torch.bfloat16
    (y.float().sum() + aux["load_balance_loss"]).backward()
    assert x.grad.dtype == torch.float32
    # Bit for bit the bf16 layer (autocast wins over the input's and the layer's dtype, as for nn.Linear).
    y_bf16, _ = make_layer(torch.bfloat16)(x.detach())
    assert torch.equal(y, y_bf16)
    y_after, _ = layer(x.detach())  # autocast off again: the rule without it
    assert y_after.dtype == torch.float32


def test_autocast_leaves_float64_alone():
    # As torch's autocast, which casts no float64 op: a float64 layer or input stays float64.
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert make_layer(torch.float64)(x_of(torch.float32, requires_grad=False))[0].dtype == torch.float64
        assert make_layer()(x_of(torch.float64, requires_grad=False))[0].dtype == torch.float64


# --- conversions -----------------------------------------------------------------------------------

@pytest.mark.parametrize("convert,dtype", [
    (lambda l: l.to(torch.bfloat16), torch.bfloat16), (lambda l: l.bfloat16(), torch.bfloat16),
    (lambda l: l.double(), torch.float64), (lambda l: l.to(torch.float64), torch.float64),
    (lambda l: l.float(), torch.float32), (lambda l: l.to(dtype=torch.float32), torch.float32),
])
def test_conversion_sets_parameters_and_compute_dtype(convert, dtype):
    layer = make_layer()
    assert convert(layer) is layer
    assert all(p.dtype == dtype for p in layer.parameters())
    assert layer.compute_dtype == dtype and layer.config["dtype"] in ("f32", "bf16", "f64")
    x = x_of(torch.float32)
    y, aux, dx, grads = step(layer, x)
    assert y.dtype == dtype and dx.dtype == torch.float32
    assert all(g.dtype == dtype for g in grads)
    # The same y as a layer built with that dtype whose parameters were converted the same way.
    ref = make_layer(dtype)
    with torch.no_grad():
        for n in NAMES:
            getattr(ref, n).copy_(getattr(layer, n))
    assert torch.equal(ref(x.detach())[0], y)


def test_bf16_then_back_to_f32():
    layer = make_layer().bfloat16().float()
    assert layer.compute_dtype == torch.float32 and layer(x_of(torch.bfloat16))[0].dtype == torch.float32


@pytest.mark.parametrize("convert", [lambda l: l.half(), lambda l: l.to(torch.float16)])
def test_half_raises_at_the_conversion(convert):
    layer = make_layer(torch.float32)
    before = [p.detach().clone() for p in layer.parameters()]
    with pytest.raises(TypeError, match=r"MoELayer: cannot convert to torch.float16: the engine computes in "
                                        r"torch.float32, torch.bfloat16 or torch.float64"):
        convert(layer)
    assert all(p.dtype == torch.float32 and torch.equal(p, b) for p, b in zip(layer.parameters(), before))
    assert layer.compute_dtype == torch.float32


def test_device_moves_keep_the_dtype_rule():
    layer = make_layer().to("cpu")
    assert layer.compute_dtype is None
    layer.share_memory()
    assert layer.compute_dtype is None and layer(x_of(torch.float64))[0].dtype == torch.float64


# --- float64: the engine's own backward under gradcheck -------------------------------------------

def test_float64_is_one_process_only():
    with pytest.raises(MoeError, match=r"dtype=f64 runs on one process only.*expert_parallelism must be 1"):
        make_layer(torch.float64, expert_parallelism=2)
    with pytest.raises(MoeError, match=r"weight_dtype: expected torch.float32 or torch.bfloat16"):
        make_layer(weight_dtype=torch.float64)


def routing_margins(layer, x):
    """The smallest gap between the K-th and the (K+1)-th router score of any token (a top-k tie or
    near-tie would let gradcheck's perturbations change the routing)."""
    s = torch.softmax(x.detach() @ layer.router.detach().double(), dim=-1).sort(dim=-1, descending=True).values
    return (s[:, K - 1] - s[:, K]).min().item()


def gradcheck_layer():
    layer = make_layer().double()
    x = x_of(torch.float64)
    assert routing_margins(layer, x) > 1e-3  # no tie within gradcheck's eps (1e-6)
    y, aux = layer(x)
    assert aux["dropped"] == 0  # dropless (capacity_factor -1)
    assert type(y.grad_fn).__name__ == "_MoEFunctionBackward"  # the engine's backward, not torch's
    return layer, x


def test_gradcheck_x_through_the_engine_backward():
    layer, x = gradcheck_layer()

    def f(x):
        y, aux = layer(x)
        return y, aux["load_balance_loss"], aux["z_loss"]

    assert torch.autograd.gradcheck(f, (x,), eps=1e-6, atol=1e-5, rtol=1e-4)


def test_gradcheck_every_parameter_through_the_engine_backward():
    layer, x = gradcheck_layer()
    params = tuple(getattr(layer, n).detach().clone().requires_grad_(True) for n in NAMES)

    def f(x, *ps):
        y, aux = stateless.functional_call(layer, dict(zip(NAMES, ps)), (x,))
        return y, aux["load_balance_loss"], aux["z_loss"]

    assert torch.autograd.gradcheck(f, (x, *params), eps=1e-6, atol=1e-5, rtol=1e-4)


def test_gradcheck_catches_a_wrong_backward(monkeypatch):
    # The check can fail: scale the engine's dx by (1 + 1e-3) and gradcheck must object.
    layer, x = gradcheck_layer()
    from moe_engine import torch as mt
    real = mt._MoEFunction.backward

    def wrong(ctx, *grads):
        out = list(real(ctx, *grads))
        out[3] = out[3] * 1.001
        return tuple(out)

    monkeypatch.setattr(mt._MoEFunction, "backward", staticmethod(wrong))
    assert not torch.autograd.gradcheck(lambda x: layer(x)[0], (x,), eps=1e-6, atol=1e-5, rtol=1e-4,
                                        raise_exception=False)


def test_float64_matches_the_float64_mixtral_block():
    torch.manual_seed(0)
    block = MixtralBlock(E, K, D, F, lb_weight=0.1, z_weight=0.05)
    layer = make_layer()
    layer.load_mixtral_block(block.state_dict())
    block, layer = block.double(), layer.double()
    x = x_of(torch.float64)
    y, aux = layer(x)
    ry, rlb, rz, ridx = block(x)
    assert torch.equal(aux["topk_idx"].long(), ridx)
    assert (y - ry).abs().max().item() <= 1e-12 * max(1.0, ry.abs().max().item())
    assert abs(aux["load_balance_loss"].item() - rlb.item()) <= 1e-13
    assert abs(aux["z_loss"].item() - rz.item()) <= 1e-12
    (y.sum() + aux["load_balance_loss"] + aux["z_loss"]).backward()
    xr = x.detach().clone().requires_grad_(True)
    ry, rlb, rz, _ = block(xr)
    (ry.sum() + rlb + rz).backward()
    assert (x.grad - xr.grad).abs().max().item() <= 1e-12 * max(1.0, xr.grad.abs().max().item())
    assert (layer.wo.grad - torch.stack([e.w2.weight.grad.t() for e in block.experts])).abs().max().item() <= 1e-12
