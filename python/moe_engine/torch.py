"""moe_engine.torch: the engine's MoE layer as a torch.nn.Module (docs/python.md).

    layer = MoELayer(num_experts=8, num_experts_per_tok=2, emb_dim=64, moe_mlp_dim=128,
                     load_balance_loss_weight=0.01)
    y, aux = layer(x)                 # x [T, D] or [B, S, D]; y in x's dtype (see "Dtypes" below)
    loss = (y.float() ** 2).mean() + aux["load_balance_loss"] + aux["z_loss"]
    loss.backward()                   # the engine's backward fills x.grad and every .grad

Parameters (f32 master weights, named as the file contract): router [D, E], wi_0 and wi_1
[E, D, F] (or wi [E, D, 2F] with prefuse_moe_weights, [2, E, D/2, 2F] in the split layout), wo
[E, F, D]. In a distributed layer (mpirun with parallelism keys) they are this rank's shards.

Dtypes (docs/python.md): the compute dtype of a call is, in order, torch.autocast('cpu')'s dtype
when autocast is on (not for a float64 layer or input), else the layer's explicit dtype (the
constructor's `dtype`, or the last .to(dtype) / .float() / .bfloat16() / .double()), else x's
dtype. y comes out in the compute dtype, x.grad in x's dtype, each parameter's grad in its dtype.
float64 runs the engine's reference kernels in double on one process (torch.autograd.gradcheck).
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
_DTYPES = {_torch.float32: "f32", _torch.bfloat16: "bf16", _torch.float64: "f64"}
_ALLOWED = "torch.float32 or torch.bfloat16 (or torch.float64: one process, reference kernels)"
_KEY_TYPES = _C.config_key_types()


def _config_value(key, v):
    if isinstance(v, _torch.dtype):
        if v not in _DTYPES or (key == "weight_dtype" and v == _torch.float64):
            raise MoeError(f"MoELayer: {key}: expected {_ALLOWED if key == 'dtype' else 'torch.float32 or torch.bfloat16'}"
                           f", got {v}")
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


def _conversion_target(fn):
    """The dtype a Module._apply function converts float tensors to, or None when it keeps
    dtypes (a device move, share_memory): fn applied to an empty float32 and bfloat16 tensor."""
    a, b = fn(_torch.empty(0, dtype=_torch.float32)), fn(_torch.empty(0, dtype=_torch.bfloat16))
    if not isinstance(a, _torch.Tensor) or (a.dtype == _torch.float32 and b.dtype == _torch.bfloat16):
        return None
    return a.dtype


def _check_cpu(t, what):
    if not isinstance(t, _torch.Tensor):
        raise MoeError(f"MoELayer: {what}: expected a torch.Tensor, got {type(t).__name__}")
    if t.device.type != "cpu":
        raise MoeError(f"MoELayer: {what}: expected a CPU tensor, got device '{t.device}'")


def _loss_dtype(compute):
    """The dtype of the two aux losses: float64 for a float64 compute dtype, else float32."""
    return _torch.float64 if compute == _torch.float64 else _torch.float32


class _MoEFunction(_torch.autograd.Function):
    """(y, load_balance_loss, z_loss, group_sizes, topk_idx, topk_weights, dropped) = f(x, *params);
    the backward is the engine's (the last four outputs carry no gradient). `engine` is the
    layer's engine for the call's compute dtype."""

    @staticmethod
    def forward(ctx, layer, engine, compute, x, *params):
        out = engine.forward(layer._param_views(params), _view(x), True)
        y, lb, z, group_sizes, topk_idx, topk_weights, dropped, state = out
        ctx.engine = engine
        ctx.state = state
        # float64 keeps the state for another backward (retain_graph: torch.autograd.gradcheck);
        # the other dtypes free the activations at the first one.
        ctx.keep_state = compute == _torch.float64
        ctx.spec_names = layer._spec_names
        ctx.param_dtypes = [p.dtype for p in params]
        routing = (_from_dlpack(group_sizes), _from_dlpack(topk_idx), _from_dlpack(topk_weights),
                   _torch.tensor(dropped, dtype=_torch.int64))
        ctx.mark_non_differentiable(*routing)
        ld = _loss_dtype(compute)
        return (_from_dlpack(y), _torch.tensor(lb, dtype=ld), _torch.tensor(z, dtype=ld), *routing)

    @staticmethod
    def backward(ctx, dy, dlb, dz, *_routing):
        if ctx.state is None:
            raise MoeError("MoELayer: backward ran twice through one forward (retain_graph is supported "
                           "for float64 only)")
        state = ctx.state
        if not ctx.keep_state:
            ctx.state = None
        dx, grads = ctx.engine.backward(state, _view(dy), float(dlb), float(dz))
        out = [None, None, None, _from_dlpack(dx)]
        for name, dt in zip(ctx.spec_names, ctx.param_dtypes):
            g = _from_dlpack(grads[name])
            out.append(g if g.dtype == dt else g.to(dt))
        return tuple(out)


class MoELayer(_torch.nn.Module):
    """The engine's routed MoE layer (SPEC.md section 2) with the engine's forward and backward.

    MoELayer(num_experts=E, num_experts_per_tok=K, emb_dim=D, moe_mlp_dim=F,
             dtype=None | torch.float32 | torch.bfloat16 | torch.float64, **config_keys, distributed=None)

    dtype: the compute dtype; None (the default) computes in each input's dtype (see the module
    docstring for autocast and conversions).

    config_keys: any other key of docs/config.md (e.g. prefuse_moe_weights=True,
    load_balance_loss_weight=0.01, expert_parallelism=2, moe_offload_targets="all", seed=3).
    Parameters start as the engine's init_weights(seed) (the same values `moe init --seed` writes).
    distributed: None runs the distributed layer when the job has several ranks (mpirun) or a
    parallelism key is not 1; False forces the single-process layer on this rank.
    """

    def __init__(self, num_experts, num_experts_per_tok, emb_dim, moe_mlp_dim, dtype=None,
                 distributed=None, **config):
        super().__init__()
        keys = dict(num_experts=num_experts, num_experts_per_tok=num_experts_per_tok, emb_dim=emb_dim,
                    moe_mlp_dim=moe_mlp_dim, **config)
        if dtype is not None:
            keys["dtype"] = dtype
        overrides = [f"{k}={_config_value(k, v)}" for k, v in keys.items()]
        self._engine = _C.EngineLayer(overrides, distributed)
        # One engine per compute dtype, made on first use (the same keys with that dtype).
        self._overrides = [o for o in overrides if not o.startswith("dtype=")]
        self._distributed_arg = distributed
        self._dtype = dtype  # the explicit compute dtype, or None: each input's dtype
        self.config = {k: _typed(k, v) for k, v, _src in self._engine.config_table()}
        built = {name: dt for dt, name in _DTYPES.items()}[self.config["dtype"]]
        self._engines = {built: self._engine}  # the engine of the config's dtype (default bf16)
        self.config["dtype"] = _DTYPES[dtype] if dtype is not None else None
        self._spec_names = [n for n, _shape in self._engine.param_shapes()]
        init = self._engine.init_params()
        for name in self._spec_names:  # file order: router, wi_0, wi_1 (or wi), wo
            self.register_parameter(_PARAM_NAMES[name], _torch.nn.Parameter(_from_dlpack(init[name])))

    @property
    def distributed(self):
        """True when this layer runs over the MPI ranks (its parameters are this rank's shards)."""
        return self._engine.distributed

    @property
    def compute_dtype(self):
        """The explicit compute dtype (constructor or last conversion), or None: each input's dtype."""
        return self._dtype

    def _apply(self, fn, *args, **kwargs):
        # .to(dtype), .float(), .bfloat16(), .double(), .half(): convert the parameters and make the
        # target the compute dtype, or raise here (before any parameter changes) for a dtype the
        # engine cannot compute in.
        target = _conversion_target(fn)
        if target is not None and target not in _DTYPES:
            raise TypeError(f"MoELayer: cannot convert to {target}: the engine computes in torch.float32, "
                            f"torch.bfloat16 or torch.float64")
        if target == _torch.float64 and self.distributed:
            raise TypeError("MoELayer: cannot convert a distributed layer to torch.float64 (float64 runs on "
                            "one process only)")
        out = super()._apply(fn, *args, **kwargs)
        if target is not None:
            self._engine_for(target)  # a config error (e.g. float64 with parallelism keys) raises here
            self._dtype = target
            self.config["dtype"] = _DTYPES[target]
        return out

    def _engine_for(self, dtype):
        if dtype not in self._engines:
            self._engines[dtype] = _C.EngineLayer(self._overrides + [f"dtype={_DTYPES[dtype]}"],
                                                  self._distributed_arg)
        return self._engines[dtype]

    def _compute_dtype(self, x):
        """The compute dtype of a call on x (the rule of the module docstring)."""
        dtype = self._dtype if self._dtype is not None else x.dtype
        if dtype not in _DTYPES:
            raise MoeError(f"MoELayer: x: expected float32, bfloat16 or float64, got {x.dtype}")
        if dtype != _torch.float64 and x.dtype != _torch.float64 and _torch.is_autocast_cpu_enabled():
            dtype = _torch.get_autocast_cpu_dtype()
            if dtype not in (_torch.float32, _torch.bfloat16):
                raise MoeError(f"MoELayer: torch.autocast('cpu', dtype={dtype}): expected torch.bfloat16 or "
                               f"torch.float32")
        return dtype

    def extra_repr(self):
        c = self.config
        return (f"num_experts={c['num_experts']}, num_experts_per_tok={c['num_experts_per_tok']}, "
                f"emb_dim={c['emb_dim']}, moe_mlp_dim={c['moe_mlp_dim']}, dtype={c['dtype']}")

    def _params(self):
        return [getattr(self, _PARAM_NAMES[n]) for n in self._spec_names]

    def _param_views(self, params):
        views = {}
        for name, p in zip(self._spec_names, params):
            _check_cpu(p, f"parameter '{_PARAM_NAMES[name]}'")
            views[name] = _view(p)
        return views

    def forward(self, x):
        """y, aux = layer(x): x [T, D] or [B, S, D] (float32, bfloat16 or float64, CPU); y has x's
        shape and the compute dtype (the module docstring's rule). aux: load_balance_loss and z_loss
        (0-d float32, float64 for float64 compute; differentiable, already weighted), group_sizes [E]
        int32 (rows kept per expert, all ranks summed), topk_idx [T, K] int32, topk_weights [T, K]
        float32 (float64 for float64 compute) and dropped (slots dropped by capacity on this rank)."""
        _check_cpu(x, "x")
        compute = self._compute_dtype(x)
        engine = self._engine_for(compute)
        shape = x.shape
        x2 = x.reshape(-1, shape[-1]) if x.dim() == 3 else x
        params = self._params()
        if _torch.is_grad_enabled() and (x.requires_grad or any(p.requires_grad for p in params)):
            y, lb, z, gs, topk_idx, topk_weights, dropped = _MoEFunction.apply(self, engine, compute, x2, *params)
            dropped = int(dropped)
        else:  # no graph: the engine keeps no activations
            out = engine.forward(self._param_views(params), _view(x2), False)
            y, lb, z, gs, topk_idx, topk_weights, dropped, _ = out
            y, gs = _from_dlpack(y), _from_dlpack(gs)
            topk_idx, topk_weights = _from_dlpack(topk_idx), _from_dlpack(topk_weights)
            ld = _loss_dtype(compute)
            lb, z = _torch.tensor(lb, dtype=ld), _torch.tensor(z, dtype=ld)
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
