"""moe_engine.torch: the engine's MoE layer as a torch.nn.Module (docs/python.md).

    layer = MoELayer(num_experts=8, num_experts_per_tok=2, emb_dim=64, moe_mlp_dim=128,
                     dtype=torch.bfloat16, load_balance_loss_weight=0.01)
    y, aux = layer(x)                 # x [T, D] or [B, S, D]
    loss = (y.float() ** 2).mean() + aux["load_balance_loss"] + aux["z_loss"]
    loss.backward()                   # the engine's backward fills x.grad and every .grad

Parameters (f32 master weights, named as the file contract): router [D, E], wi_0 and wi_1
[E, D, F] (or wi [E, D, 2F] with prefuse_moe_weights, [2, E, D/2, 2F] in the split layout), wo
[E, F, D]. In a distributed layer (mpirun with parallelism keys) they are this rank's shards.
"""

import torch as _torch

from . import _moe_engine as _C
from ._moe_engine import MoeError

__all__ = ["MoELayer"]

# SPEC name -> parameter name.
_PARAM_NAMES = {
    "router.kernel": "router",
    "experts.wi_0": "wi_0",
    "experts.wi_1": "wi_1",
    "experts.wi": "wi",
    "experts.wo": "wo",
}
_DTYPES = {_torch.float32: "f32", _torch.bfloat16: "bf16"}
_KEY_TYPES = _C.config_key_types()


def _config_value(key, v):
    if isinstance(v, _torch.dtype):
        if v not in _DTYPES:
            raise MoeError(f"MoELayer: {key}: expected torch.float32 or torch.bfloat16, got {v}")
        return _DTYPES[v]
    if isinstance(v, bool):
        return "true" if v else "false"
    return str(v)


def _typed(key, text):
    t = _KEY_TYPES.get(key, "string")
    if t == "int":
        return int(text)
    if t == "float":
        return float(text)
    if t == "bool":
        return text == "true"
    return text


def _from_dlpack(capsule):
    return _torch.utils.dlpack.from_dlpack(capsule)


def _view(t):
    """A tensor the engine can read in place: detached; contiguous (a copy only if it is not)."""
    return t.detach().contiguous()


def _check_cpu(t, what):
    if not isinstance(t, _torch.Tensor):
        raise MoeError(f"MoELayer: {what}: expected a torch.Tensor, got {type(t).__name__}")
    if t.device.type != "cpu":
        raise MoeError(f"MoELayer: {what}: expected a CPU tensor, got device '{t.device}'")


class _MoEFunction(_torch.autograd.Function):
    """(y, load_balance_loss, z_loss, group_sizes, topk_idx, topk_weights, dropped) = f(x, *params);
    the backward is the engine's (the last four outputs carry no gradient)."""

    @staticmethod
    def forward(ctx, layer, x, *params):
        out = layer._engine.forward(layer._param_views(params), _view(x), True)
        y, lb, z, group_sizes, topk_idx, topk_weights, dropped, state = out
        ctx.layer = layer
        ctx.state = state
        ctx.param_dtypes = [p.dtype for p in params]
        routing = (_from_dlpack(group_sizes), _from_dlpack(topk_idx), _from_dlpack(topk_weights),
                   _torch.tensor(dropped, dtype=_torch.int64))
        ctx.mark_non_differentiable(*routing)
        return (_from_dlpack(y), _torch.tensor(lb, dtype=_torch.float32), _torch.tensor(z, dtype=_torch.float32),
                *routing)

    @staticmethod
    def backward(ctx, dy, dlb, dz, *_routing):
        if ctx.state is None:
            raise MoeError("MoELayer: backward ran twice through one forward (retain_graph is not supported)")
        state, ctx.state = ctx.state, None
        acc = ctx.layer._accumulation_buffers()
        dx, grads = ctx.layer._engine.backward(state, _view(dy), float(dlb), float(dz), acc or {})
        out = [None, _from_dlpack(dx)]
        for name, dt in zip(ctx.layer._spec_names, ctx.param_dtypes):
            if acc:  # the engine added into every .grad in place: nothing for autograd to add
                out.append(None)
                continue
            g = _from_dlpack(grads[name])
            out.append(g if g.dtype == dt else g.to(dt))
        return tuple(out)


class MoELayer(_torch.nn.Module):
    """The engine's routed MoE layer (SPEC.md section 2) with the engine's forward and backward.

    MoELayer(num_experts=E, num_experts_per_tok=K, emb_dim=D, moe_mlp_dim=F,
             dtype=torch.bfloat16 | torch.float32, **config_keys, distributed=None)

    config_keys: any other key of docs/config.md (e.g. prefuse_moe_weights=True,
    load_balance_loss_weight=0.01, expert_parallelism=2, moe_offload_targets="all", seed=3).
    Parameters start as the engine's init_weights(seed) (the same values `moe init --seed` writes).
    distributed: None runs the distributed layer when the job has several ranks (mpirun) or a
    parallelism key is not 1; False forces the single-process layer on this rank.
    accumulate_grads: when every parameter already has a float32 .grad (micro-batch 2 onwards of
    gradient accumulation), the engine's backward adds into those buffers in place (the same f32
    sums as autograd's grad += g) instead of returning a second full set of gradients; parameter
    hooks then do not see that step's gradient (docs/python.md). Single-process layer only.
    """

    def __init__(self, num_experts, num_experts_per_tok, emb_dim, moe_mlp_dim, dtype=_torch.bfloat16,
                 distributed=None, accumulate_grads=False, **config):
        super().__init__()
        self.accumulate_grads = accumulate_grads
        keys = dict(num_experts=num_experts, num_experts_per_tok=num_experts_per_tok, emb_dim=emb_dim,
                    moe_mlp_dim=moe_mlp_dim, dtype=dtype, **config)
        overrides = [f"{k}={_config_value(k, v)}" for k, v in keys.items()]
        self._engine = _C.EngineLayer(overrides, distributed)
        self.config = {k: _typed(k, v) for k, v, _src in self._engine.config_table()}
        self._spec_names = [n for n, _shape in self._engine.param_shapes()]
        init = self._engine.init_params()
        for name in self._spec_names:  # file order: router, wi_0, wi_1 (or wi), wo
            self.register_parameter(_PARAM_NAMES[name], _torch.nn.Parameter(_from_dlpack(init[name])))

    @property
    def distributed(self):
        """True when this layer runs over the MPI ranks (its parameters are this rank's shards)."""
        return self._engine.distributed

    def extra_repr(self):
        c = self.config
        return (f"num_experts={c['num_experts']}, num_experts_per_tok={c['num_experts_per_tok']}, "
                f"emb_dim={c['emb_dim']}, moe_mlp_dim={c['moe_mlp_dim']}, dtype={c['dtype']}")

    def _params(self):
        return [getattr(self, _PARAM_NAMES[n]) for n in self._spec_names]

    def _accumulation_buffers(self):
        """SPEC name -> .grad of every parameter when the engine can add into them in place, else None."""
        if not self.accumulate_grads or self.distributed:
            return None
        bufs = {}
        for name, p in zip(self._spec_names, self._params()):
            g = p.grad
            if (g is None or g.dtype != _torch.float32 or g.shape != p.shape or not g.is_contiguous()
                    or g.requires_grad or g.device.type != "cpu"):
                return None
            bufs[name] = g
        return bufs

    def _param_views(self, params):
        views = {}
        for name, p in zip(self._spec_names, params):
            _check_cpu(p, f"parameter '{_PARAM_NAMES[name]}'")
            views[name] = _view(p)
        return views

    def forward(self, x):
        """y, aux = layer(x): x [T, D] or [B, S, D] (float32 or bfloat16, CPU); y has x's shape and
        the layer's dtype. aux: load_balance_loss and z_loss (0-d float32, differentiable, already
        weighted), group_sizes [E] int32 (rows kept per expert, all ranks summed), topk_idx [T, K]
        int32, topk_weights [T, K] float32 and dropped (slots dropped by capacity on this rank)."""
        _check_cpu(x, "x")
        shape = x.shape
        x2 = x.reshape(-1, shape[-1]) if x.dim() == 3 else x
        params = self._params()
        if _torch.is_grad_enabled() and (x.requires_grad or any(p.requires_grad for p in params)):
            y, lb, z, gs, topk_idx, topk_weights, dropped = _MoEFunction.apply(self, x2, *params)
            dropped = int(dropped)
        else:  # no graph: the engine keeps no activations
            out = self._engine.forward(self._param_views(params), _view(x2), False)
            y, lb, z, gs, topk_idx, topk_weights, dropped, _ = out
            y, gs = _from_dlpack(y), _from_dlpack(gs)
            topk_idx, topk_weights = _from_dlpack(topk_idx), _from_dlpack(topk_weights)
            lb, z = _torch.tensor(lb, dtype=_torch.float32), _torch.tensor(z, dtype=_torch.float32)
        if x.dim() == 3:
            y = y.reshape(shape[0], shape[1], -1)
        aux = {"load_balance_loss": lb, "z_loss": z, "group_sizes": gs, "topk_idx": topk_idx,
               "topk_weights": topk_weights, "dropped": dropped}
        return y, aux

    # --- Mixtral weights ---------------------------------------------------------------------

    def _mixtral_to_spec(self, sd):
        c = self.config
        E, D, F = c["num_experts"], c["emb_dim"], c["moe_mlp_dim"]
        expected = {"gate.weight": (E, D)}
        for j in range(E):
            expected[f"experts.{j}.w1.weight"] = (F, D)
            expected[f"experts.{j}.w3.weight"] = (F, D)
            expected[f"experts.{j}.w2.weight"] = (D, F)
        for name, shape in expected.items():
            if name not in sd:
                raise MoeError(f"load_mixtral_block: missing '{name}' (expected shape {list(shape)})")
            t = sd[name]
            if not isinstance(t, _torch.Tensor) or tuple(t.shape) != shape:
                got = list(t.shape) if isinstance(t, _torch.Tensor) else type(t).__name__
                raise MoeError(f"load_mixtral_block: '{name}': expected shape {list(shape)}, got {got}")
            if not t.is_floating_point():
                raise MoeError(f"load_mixtral_block: '{name}': expected a float tensor, got {t.dtype}")
        unknown = sorted(set(sd) - set(expected))
        if unknown:
            raise MoeError(f"load_mixtral_block: unexpected key '{unknown[0]}' (a Mixtral block with "
                           f"num_experts={E} has gate.weight and experts.{{0..{E - 1}}}.w1/w2/w3.weight)")
        f32 = _torch.float32
        with _torch.no_grad():
            w1 = _torch.stack([sd[f"experts.{j}.w1.weight"].to(f32).t() for j in range(E)])  # [E, D, F]
            w3 = _torch.stack([sd[f"experts.{j}.w3.weight"].to(f32).t() for j in range(E)])
            w2 = _torch.stack([sd[f"experts.{j}.w2.weight"].to(f32).t() for j in range(E)])  # [E, F, D]
            full = {"router.kernel": sd["gate.weight"].to(f32).t().contiguous(), "experts.wo": w2.contiguous()}
            if c["prefuse_moe_weights"]:
                wi = _torch.cat([w1, w3], dim=2)  # [E, D, 2F]: columns [0, F) wi_0, [F, 2F) wi_1
                if c["moe_split_expert_weight_layout"]:
                    wi = wi.reshape(2, E, D // 2, 2 * F)  # a pure row-major reshape (SPEC.md section 5)
                full["experts.wi"] = wi.contiguous()
            else:
                full["experts.wi_0"], full["experts.wi_1"] = w1.contiguous(), w3.contiguous()
        return full

    def load_mixtral_block(self, state_dict):
        """Loads a Mixtral sparse MoE block's state dict (gate.weight [E, D],
        experts.{j}.w1.weight / w3.weight [F, D], experts.{j}.w2.weight [D, F]): router =
        gate.weight^T, wi_0[j] = w1^T (the activated half), wi_1[j] = w3^T, wo[j] = w2^T. Every
        rank passes the full block; a distributed layer keeps this rank's shard."""
        full = self._mixtral_to_spec(state_dict)
        dtype = self.config["weight_dtype"]
        full = {n: (t if n == "router.kernel" or dtype == "f32" else t.to(_torch.bfloat16)) for n, t in full.items()}
        shards = self._engine.shard(full)
        with _torch.no_grad():
            for name, t in shards.items():
                getattr(self, _PARAM_NAMES[name]).copy_(_from_dlpack(t))

    def export_mixtral_block(self):
        """The layer's weights as a Mixtral block state dict (float32 for f32 weights), the inverse
        of load_mixtral_block; a distributed layer gathers the full block on every rank
        (collective)."""
        c = self.config
        E, D, F = c["num_experts"], c["emb_dim"], c["moe_mlp_dim"]
        full = {n: _from_dlpack(t) for n, t in self._engine.unshard(self._param_views(self._params())).items()}
        if c["prefuse_moe_weights"]:
            wi = full["experts.wi"].reshape(E, D, 2 * F)
            w1, w3 = wi[:, :, :F], wi[:, :, F:]
        else:
            w1, w3 = full["experts.wi_0"], full["experts.wi_1"]
        sd = {"gate.weight": full["router.kernel"].t().contiguous()}
        for j in range(E):
            sd[f"experts.{j}.w1.weight"] = w1[j].t().contiguous()
            sd[f"experts.{j}.w2.weight"] = full["experts.wo"][j].t().contiguous()
            sd[f"experts.{j}.w3.weight"] = w3[j].t().contiguous()
        return sd
