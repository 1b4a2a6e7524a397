"""Non-finite in, non-finite out (docs/reliability.md): a NaN or inf in any token of MoELayer's x
makes both aux losses NaN (a plain PyTorch block gives NaN or inf), while the other tokens' rows of
y and their routing keep their bits; aux["nonfinite_tokens"] counts the bad tokens. The user's
report: E=4, K=2, D=32, F=64, T=16 gave load_balance_loss -0.0194 and z_loss -524.28 for one NaN."""

import math

import pytest
import torch

from moe_engine.torch import MoELayer
from reference import MixtralBlock

E, K, D, F, T = 4, 2, 32, 64, 16
NAN, INF = float("nan"), float("inf")


def make_layer(lb=0.01, z=0.001, dtype=torch.float32):
    torch.manual_seed(0)
    block = MixtralBlock(E, K, D, F, lb_weight=lb, z_weight=z)
    layer = MoELayer(num_experts=E, num_experts_per_tok=K, emb_dim=D, moe_mlp_dim=F, dtype=dtype,
                     load_balance_loss_weight=lb, router_z_loss_weight=z)
    layer.load_mixtral_block(block.state_dict())
    return layer, block


def clean_inputs():
    g = torch.Generator().manual_seed(1)
    return torch.randn(T, D, generator=g), torch.randn(T, D, generator=g)


def one_nan(x):
    x[5, 7] = NAN
    return [5]


def one_inf(x):
    x[9, 0] = INF
    return [9]


def minus_inf_row(x):
    x[0, :] = -INF
    return [0]


def all_nan(x):
    x[:] = NAN
    return list(range(T))


CASES = [one_nan, one_inf, minus_inf_row, all_nan]


def step(layer, x, dy):
    x = x.clone().requires_grad_(True)
    y, aux = layer(x)
    ((y.float() * dy).sum() + aux["load_balance_loss"] + aux["z_loss"]).backward()
    grads = {n: p.grad.clone() for n, p in layer.named_parameters()}
    layer.zero_grad(set_to_none=True)
    return y.detach(), aux, x.grad, grads


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("bad", CASES, ids=lambda f: f.__name__)
def test_aux_losses_are_nan_and_finite_tokens_keep_their_bits(bad, dtype):
    layer, block = make_layer(dtype=dtype)
    x, dy = clean_inputs()
    xb = x.clone()
    bad_rows = bad(xb)
    good = [t for t in range(T) if t not in bad_rows]

    y0, aux0, dx0, _ = step(layer, x, dy)
    y, aux, dx, grads = step(layer, xb, dy)
    assert math.isfinite(aux0["load_balance_loss"].item()) and aux0["nonfinite_tokens"] == 0
    assert torch.isnan(aux["load_balance_loss"]) and torch.isnan(aux["z_loss"])
    assert aux["nonfinite_tokens"] == len(bad_rows)
    # The plain PyTorch block's are not finite either (its logsumexp is +inf for a +inf logit).
    with torch.no_grad():
        _, rlb, rz, _ = block(xb)
    assert not torch.isfinite(rlb) and not torch.isfinite(rz)

    # Finite tokens: y rows and routing bit for bit, grad.x rows finite.
    assert torch.equal(y[good], y0[good])
    assert torch.equal(aux["topk_idx"][good], aux0["topk_idx"][good])
    assert torch.equal(aux["topk_weights"][good], aux0["topk_weights"][good])
    assert torch.isfinite(dx[good].float()).all()
    # Bad tokens: NaN scores route to experts 0..K-1 (ties to the lower id); y rows NaN.
    assert aux["topk_idx"][bad_rows].tolist() == [[0, 1]] * len(bad_rows)
    assert torch.isnan(y[bad_rows].float()).all()
    assert int(aux["group_sizes"].sum()) == T * K
    # The router gradient sums over every token: all NaN; experts 0 and 1 got the bad rows.
    assert torch.isnan(grads["router"]).all()
    assert not torch.isfinite(grads["wo"][:K]).all() and torch.isfinite(grads["wo"][K:]).all()


@pytest.mark.parametrize("bad", CASES, ids=lambda f: f.__name__)
def test_without_aux_terms_finite_rows_of_grad_x_keep_their_bits(bad):
    layer, _ = make_layer(lb=0.0, z=0.0)
    x, dy = clean_inputs()
    xb = x.clone()
    bad_rows = bad(xb)
    good = [t for t in range(T) if t not in bad_rows]
    _, _, dx0, _ = step(layer, x, dy)
    _, aux, dx, _ = step(layer, xb, dy)
    assert torch.isnan(aux["load_balance_loss"]) and torch.isnan(aux["z_loss"])  # 0 * NaN
    assert torch.equal(dx[good], dx0[good])


def test_no_grad_path_reports_the_same():
    layer, _ = make_layer()
    x, _ = clean_inputs()
    one_nan(x)
    with torch.no_grad():
        _, aux = layer(x)
    assert torch.isnan(aux["load_balance_loss"]) and torch.isnan(aux["z_loss"]) and aux["nonfinite_tokens"] == 1
