"""A PyTorch user's habits with MoELayer: copies and pickles (deepcopy, pickle, torch.save of a
whole model, AveragedModel) that are independent and bit-identical; the aux losses' gradient
through activation checkpointing in both modes; empty batches; input errors; repr."""

import copy
import io
import pickle

import pytest
import torch
import torch.fx
import torch.utils.checkpoint as ckpt
from torch.optim.swa_utils import AveragedModel

from moe_engine import MoeError
from moe_engine.torch import MoELayer

E, K, D, F, T = 4, 2, 32, 64, 16
COT_LB, COT_Z = 0.7, 1.3  # not 1: the aux cotangents must reach the engine


def make_layer(dtype=torch.float32, **keys):
    keys.setdefault("load_balance_loss_weight", 0.01)
    keys.setdefault("router_z_loss_weight", 0.001)
    return MoELayer(num_experts=E, num_experts_per_tok=K, emb_dim=D, moe_mlp_dim=F, dtype=dtype, **keys)


class Model(torch.nn.Module):
    """A small model around the layer: a projection, the MoE layer, a head."""

    def __init__(self, **keys):
        super().__init__()
        torch.manual_seed(0)
        self.proj = torch.nn.Linear(D, D)
        self.moe = make_layer(**keys)
        self.head = torch.nn.Linear(D, 3)

    def forward(self, x):
        y, aux = self.moe(self.proj(x))
        return self.head(y), aux


def inputs(seed=1, shape=(T, D)):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g), torch.randn(*shape, generator=g)


def layer_step(layer, x, dy):
    """y, aux losses, x.grad and every parameter's gradient of one training step."""
    layer.zero_grad(set_to_none=True)
    x = x.clone().requires_grad_(True)
    y, aux = layer(x)
    ((y.float() * dy).sum() + COT_LB * aux["load_balance_loss"] + COT_Z * aux["z_loss"]).backward()
    return [y.detach(), aux["load_balance_loss"].detach(), aux["z_loss"].detach(), aux["topk_idx"], x.grad] + \
        [p.grad for p in layer.parameters()]


def model_step(model, x):
    model.zero_grad(set_to_none=True)
    x = x.clone().requires_grad_(True)
    out, aux = model(x)
    (out.square().sum() + COT_LB * aux["load_balance_loss"] + COT_Z * aux["z_loss"]).backward()
    return [out.detach(), aux["load_balance_loss"].detach(), x.grad] + [p.grad for p in model.parameters()]


def assert_bits_equal(a, b):
    assert len(a) == len(b)
    for i, (u, v) in enumerate(zip(a, b)):
        assert u is not None and v is not None, i
        assert u.dtype == v.dtype and u.shape == v.shape, i
        assert torch.equal(u, v), f"item {i} differs"


# --- Copies and pickles ----------------------------------------------------------------------------


@pytest.mark.parametrize("keys", [{}, {"dtype": torch.bfloat16}, {"prefuse_moe_weights": True}])
def test_deepcopy_is_independent_and_bit_identical(keys):
    layer = make_layer(**keys)
    x, dy = inputs()
    with torch.no_grad():  # weights that are not the init's, so the copy must carry them
        for p in layer.parameters():
            p.add_(0.01 * torch.randn_like(p))
    dup = copy.deepcopy(layer)
    assert dup._engine is not layer._engine and dup.config == layer.config
    for (n, p), (m, q) in zip(layer.named_parameters(), dup.named_parameters()):
        assert n == m and torch.equal(p, q) and p.data_ptr() != q.data_ptr(), n
    want = layer_step(layer, x, dy)
    assert_bits_equal(layer_step(dup, x, dy), want)  # forward and backward, bit for bit
    # Independent: changing the copy leaves the original alone (and the other way round).
    with torch.no_grad():
        dup.router.mul_(2.0)
    assert_bits_equal(layer_step(layer, x, dy), want)
    assert not torch.equal(layer_step(dup, x, dy)[0], want[0])
    shallow = copy.copy(layer)
    assert shallow._engine is not layer._engine and shallow.router is layer.router
    assert_bits_equal(layer_step(shallow, x, dy), want)


def test_pickle_and_torch_save_of_a_whole_model(tmp_path):
    model = Model()
    x, _ = inputs()
    want = model_step(model, x)
    loaded = pickle.loads(pickle.dumps(model))
    assert isinstance(loaded.moe, MoELayer) and loaded.moe._engine is not model.moe._engine
    assert_bits_equal(model_step(loaded, x), want)
    path = tmp_path / "model.pt"
    torch.save(model, path)
    again = torch.load(path)
    assert_bits_equal(model_step(again, x), want)
    buf = io.BytesIO()
    torch.save(model.state_dict(), buf)
    fresh = Model(seed=5)  # other weights, then the state dict's
    buf.seek(0)
    fresh.load_state_dict(torch.load(buf))
    assert_bits_equal(model_step(fresh, x), want)


def test_averaged_model():
    layer = make_layer()
    swa = AveragedModel(layer)
    opt = torch.optim.SGD(layer.parameters(), lr=0.1)
    x, dy = inputs()
    snapshots = []
    for _ in range(3):
        layer_step(layer, x, dy)
        opt.step()
        swa.update_parameters(layer)
        snapshots.append([p.detach().clone() for p in layer.parameters()])
    for i, p in enumerate(swa.module.parameters()):
        mean = snapshots[0][i].clone()
        for k in (1, 2):  # AveragedModel's running mean, as it computes it
            mean = mean + (snapshots[k][i] - mean) / (k + 1)
        assert torch.equal(p, mean)
    # The averaged copy runs as a layer with those weights.
    ref = make_layer()
    ref.load_state_dict(swa.module.state_dict())
    y_swa, _ = swa(x)
    y_ref, _ = ref(x)
    assert torch.equal(y_swa, y_ref)


def test_unpickling_a_distributed_layer_elsewhere_says_why():
    layer = make_layer()
    state = layer.__getstate__()
    state["_engine_args"] = dict(state["_engine_args"], distributed=True, world_size=2, rank=1)
    blank = MoELayer.__new__(MoELayer)
    with pytest.raises(MoeError, match=r"holds rank 1's shards of a 2-rank job; it can be rebuilt only as rank 1 "
                                       r"of 2 .* not as rank 0 of 1.*export_mixtral_block"):
        blank.__setstate__(state)


def test_unpickling_with_other_engine_defaults_says_so():
    layer = make_layer()
    state = layer.__getstate__()
    state["config"] = dict(state["config"], capacity_factor=3.5)
    with pytest.raises(MoeError, match=r"rebuilt engine resolves 'capacity_factor' to"):
        MoELayer.__new__(MoELayer).__setstate__(state)


# --- Activation checkpointing ----------------------------------------------------------------------


def block_step(fn, layers, x, reentrant):
    """One step of fn(x) -> (out, [aux...]) under checkpoint (reentrant: True/False) or without
    (None): the outputs, x.grad and every layer parameter's gradient."""
    for l in layers:
        l.zero_grad(set_to_none=True)
    x = x.clone().requires_grad_(True)
    if reentrant is None:
        out, auxes = fn(x)
    else:
        out, auxes = ckpt.checkpoint(fn, x, use_reentrant=reentrant)
    for a in auxes:
        assert a["load_balance_loss"].requires_grad and a["z_loss"].requires_grad
    loss = out.square().sum()
    for i, a in enumerate(auxes):
        loss = loss + (COT_LB + i) * a["load_balance_loss"] + (COT_Z + i) * a["z_loss"]
    loss.backward()
    grads = [x.grad] + [p.grad for l in layers for p in l.parameters()]
    return [out.detach()] + [a["load_balance_loss"].detach() for a in auxes] + grads


@pytest.mark.parametrize("reentrant", [True, False])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_checkpoint_keeps_the_aux_gradient(reentrant, dtype):
    layer = make_layer(dtype)
    x, _ = inputs()

    def fn(v):
        y, aux = layer(v)
        return y.float(), [aux]

    want = block_step(fn, [layer], x, None)
    got = block_step(fn, [layer], x, reentrant)
    assert_bits_equal(got, want)
    # Without the aux losses in the loss the router's gradient differs: they do reach it.
    layer.zero_grad(set_to_none=True)
    v = x.clone().requires_grad_(True)
    y, _aux = ckpt.checkpoint(layer, v, use_reentrant=reentrant)
    y.float().square().sum().backward()
    assert not torch.equal(layer.router.grad, want[3])


@pytest.mark.parametrize("reentrant", [True, False])
def test_checkpoint_two_layers_and_derived_inputs(reentrant):
    """Two layers (and one of them twice, and once more under no_grad) in one checkpointed
    function, whose input to the layers is computed inside it: every call's aux gradient reaches
    its own recompute."""
    a, b = make_layer(), make_layer(seed=3)

    def fn(v):
        with torch.no_grad():
            b(v * 3.0)  # no gradient either way, but it must not shift the calls' matching
        y1, aux1 = a(v * 0.5)
        y2, aux2 = b(torch.tanh(y1))
        y3, aux3 = a(y2 + v)
        return y3, [aux1, aux2, aux3]

    x, _ = inputs()
    want = block_step(fn, [a, b], x, None)
    assert_bits_equal(block_step(fn, [a, b], x, reentrant), want)


def test_checkpoint_sequential_blocks():
    layers = [make_layer(seed=s) for s in range(3)]

    def run(x, reentrant):
        for l in layers:
            l.zero_grad(set_to_none=True)
        x = x.clone().requires_grad_(True)
        h, loss = x, 0.0
        for i, l in enumerate(layers):
            if reentrant is None:
                h, aux = l(h)
            else:
                h, aux = ckpt.checkpoint(l, h, use_reentrant=reentrant)
            loss = loss + (i + 1) * aux["load_balance_loss"] + aux["z_loss"]
        (loss + h.square().sum()).backward()
        return [h.detach(), x.grad] + [p.grad for l in layers for p in l.parameters()]

    x, _ = inputs()
    want = run(x, None)
    assert_bits_equal(run(x, True), want)
    assert_bits_equal(run(x, False), want)


def test_reentrant_aux_gradient_after_the_layers_backward_raises():
    layer = make_layer()
    x = inputs()[0].requires_grad_(True)
    y, aux = ckpt.checkpoint(layer, x, use_reentrant=True)
    y.sum().backward()  # the recompute's backward runs here, without the aux losses
    with pytest.raises(MoeError, match=r"aux losses' gradient arrived after the layer's checkpointed "
                                       r"\(use_reentrant=True\) backward.*use_reentrant=False"):
        aux["load_balance_loss"].backward()


def test_nested_reentrant_checkpoints_raise():
    layer = make_layer()
    x = inputs()[0].requires_grad_(True)

    def inner(v):
        return ckpt.checkpoint(layer, v, use_reentrant=True)

    with pytest.raises(MoeError, match=r"nested reentrant activation checkpoints.*use_reentrant=False"):
        ckpt.checkpoint(inner, x, use_reentrant=True)


def test_no_grad_and_inference_mode_give_plain_aux_losses():
    layer = make_layer()
    x = inputs()[0]
    with torch.no_grad():
        y, aux = layer(x)
    assert not aux["load_balance_loss"].requires_grad and aux["load_balance_loss"].grad_fn is None
    with torch.inference_mode():
        y2, aux2 = layer(x)
    assert torch.equal(y, y2) and not aux2["load_balance_loss"].requires_grad


# --- Edges -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("shape", [(0, D), (2, 0, D), (0, 5, D)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_empty_batch(shape, dtype):
    layer = make_layer(dtype)
    x = torch.randn(*shape).to(dtype).requires_grad_(True)
    y, aux = layer(x)
    assert y.shape == x.shape and y.dtype == dtype and y.numel() == 0
    assert aux["load_balance_loss"].item() == 0.0 and aux["z_loss"].item() == 0.0
    assert aux["topk_idx"].shape == (0, K) and aux["topk_weights"].shape == (0, K)
    assert torch.equal(aux["group_sizes"], torch.zeros(E, dtype=torch.int32)) and aux["dropped"] == 0
    (y.float().sum() + aux["load_balance_loss"] + aux["z_loss"]).backward()
    assert x.grad.shape == x.shape and x.grad.dtype == dtype
    for name, p in layer.named_parameters():
        assert p.grad is not None and p.grad.shape == p.shape, name
        assert torch.equal(p.grad, torch.zeros_like(p)), name
    with torch.no_grad():
        y0, aux0 = layer(x)
    assert y0.shape == x.shape and aux0["load_balance_loss"].item() == 0.0


def test_input_errors_name_the_problem():
    layer = make_layer()
    cases = [
        (torch.randn(T, D + 1), r"x: expected the last dim to be emb_dim = 32, got shape \[16, 33\]"),
        (torch.randn(2, T, D - 1), r"x: expected the last dim to be emb_dim = 32, got shape \[2, 16, 31\]"),
        (torch.randn(D), r"x: expected shape \[T, 32\] or \[B, S, 32\] \(emb_dim = 32\), got \[32\] \(1 dims\)"),
        (torch.randn(2, 2, T, D), r"x: expected shape \[T, 32\] or \[B, S, 32\] .*got \[2, 2, 16, 32\] \(4 dims\)"),
        (torch.tensor(1.0), r"x: expected shape .*got \[\] \(0 dims\)"),
        (torch.randn(T, D, device="meta"), r"x: expected a CPU tensor, got device 'meta'"),
        (torch.randn(T, D, dtype=torch.float16), r"x: dtype torch.float16 is not supported \(expected torch.float32 "
                                                 r"or torch.bfloat16 \(or torch.float64"),
        (torch.ones(T, D, dtype=torch.int64), r"x: expected a floating-point tensor .*got torch.int64"),
        (torch.randn(T, D).to_sparse(), r"x: expected a dense \(strided\) tensor, got layout torch.sparse_coo"),
        ([[0.0] * D] * T, r"x: expected a torch.Tensor, got list"),
    ]
    for x, msg in cases:
        with pytest.raises(MoeError, match=msg):
            layer(x)


def test_jit_trace_is_a_clear_error_and_fx_leaf_tracing_works():
    model = Model()
    x = torch.randn(T, D)
    with pytest.raises(MoeError, match="torch.jit.trace cannot record it"):
        torch.jit.trace(model, (x,), check_trace=False)

    class Indexing(Model):  # torch 1.13's fx cannot unpack a leaf's tuple result: index it
        def forward(self, x):
            return self.head(self.moe(self.proj(x))[0])

    class Leaf(torch.fx.Tracer):
        def is_leaf_module(self, m, name):
            return isinstance(m, MoELayer) or super().is_leaf_module(m, name)

    wrapped = Indexing()
    graph = torch.fx.GraphModule(wrapped, Leaf().trace(wrapped))
    assert torch.equal(graph(x), wrapped(x))


def test_non_contiguous_input_works():
    layer = make_layer()
    base = torch.randn(D, T)
    x = base.t()  # [T, D], not contiguous
    assert not x.is_contiguous()
    y, aux = layer(x)
    y2, aux2 = layer(x.contiguous())
    assert torch.equal(y, y2) and torch.equal(aux["topk_idx"], aux2["topk_idx"])


def test_second_backward_with_retain_graph_is_a_clear_error():
    layer = make_layer()
    x = inputs()[0].requires_grad_(True)
    y, aux = layer(x)
    loss = y.sum() + aux["load_balance_loss"]
    loss.backward(retain_graph=True)
    with pytest.raises(MoeError, match=r"backward ran twice through one forward \(retain_graph is supported for float64 only\)"):
        loss.backward()


def test_repr_shows_the_non_default_keys():
    r = repr(make_layer(prefuse_moe_weights=True, capacity_factor=1.5, load_balance_loss_weight=0.05,
                        router_z_loss_weight=0.0))
    assert r.startswith("MoELayer(num_experts=4, num_experts_per_tok=2, emb_dim=32, moe_mlp_dim=64, dtype=f32"), r
    assert "prefuse_moe_weights=True" in r and "capacity_factor=1.5" in r and "load_balance_loss_weight=0.05" in r, r
    assert "router_z_loss_weight" not in r, r  # passed, but its default value (0)
    assert "seed" not in r and "distributed" not in r, r
    assert "moe_offload_targets='all'" in repr(make_layer(moe_offload_targets="all"))
