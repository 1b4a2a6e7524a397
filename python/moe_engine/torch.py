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

import sys as _sys

import torch as _torch

from . import _moe_engine as _C
from . import _sync_threads
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
_X_DTYPES = (_torch.float32, _torch.bfloat16, _torch.float64)  # the dtypes of x the engine takes
_ALLOWED = "torch.float32 or torch.bfloat16 (or torch.float64: one process, reference kernels)"
_KEY_TYPES = _C.config_key_types()
_KEY_DEFAULTS = _C.config_key_defaults()


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


def _check_input(x, emb_dim):
    """Every problem of x named before the engine sees it: type, device, layout, rank, last dim,
    dtype (a non-contiguous x is fine: it is made contiguous)."""
    _check_cpu(x, "x")
    if x.layout != _torch.strided:
        raise MoeError(f"MoELayer: x: expected a dense (strided) tensor, got layout {x.layout}")
    shape = list(x.shape)
    if x.dim() not in (2, 3):
        raise MoeError(f"MoELayer: x: expected shape [T, {emb_dim}] or [B, S, {emb_dim}] (emb_dim = {emb_dim}), "
                       f"got {shape} ({x.dim()} dims)")
    if shape[-1] != emb_dim:
        raise MoeError(f"MoELayer: x: expected the last dim to be emb_dim = {emb_dim}, got shape {shape}")
    if not x.is_floating_point():
        raise MoeError(f"MoELayer: x: expected a floating-point tensor ({_ALLOWED}), got {x.dtype}")
    if x.dtype not in _X_DTYPES:
        raise MoeError(f"MoELayer: x: dtype {x.dtype} is not supported (expected {_ALLOWED})")


# --- Reentrant activation checkpointing ----------------------------------------------------------
# torch.utils.checkpoint.checkpoint(fn, x, use_reentrant=True) runs fn under no_grad and passes on
# only its tensor outputs: the aux losses in the dict would come back detached, and the recompute
# in the backward would see no gradient for them. So a call inside such a checkpoint's forward
# returns aux losses attached to an _AuxCarrier node whose backward (it runs before the
# checkpoint's: autograd runs later-made nodes first) leaves their incoming gradients in a box kept
# on the checkpoint's ctx; the recompute's call takes the box (the k-th call of the recompute is the
# k-th of the forward) and its backward adds them to the engine's aux cotangents, so the gradients
# are those of the unchecked run. A gradient arriving after the recompute ran raises.

try:
    from torch.utils.checkpoint import CheckpointFunction as _CheckpointFunction

    _CKPT_FORWARD = _CheckpointFunction.forward.__code__
    _CKPT_BACKWARD = _CheckpointFunction.backward.__code__
except (ImportError, AttributeError):  # a torch without the reentrant checkpoint
    _CKPT_FORWARD = _CKPT_BACKWARD = None


_carried = False  # set (for good) by the first box: until then calls with a graph skip the stack walk


class _AuxBox:
    """The aux losses' incoming gradients of one checkpointed call, passed to its recompute."""

    def __init__(self):
        self.cot_lb = None
        self.cot_z = None
        self.used = False  # the recompute's backward ran


def _checkpoint_frames():
    """The frames of torch's reentrant checkpoint (CheckpointFunction.forward / .backward) on this
    thread's stack, innermost first."""
    if _CKPT_FORWARD is None:
        return []
    frames = []
    f = _sys._getframe(2)
    while f is not None:
        if f.f_code is _CKPT_FORWARD or f.f_code is _CKPT_BACKWARD:
            frames.append(f)
        f = f.f_back
    return frames


def _nested_error():
    return MoeError("MoELayer: called inside nested reentrant activation checkpoints "
                    "(torch.utils.checkpoint.checkpoint with use_reentrant=True inside another): the "
                    "aux losses' gradient cannot be carried through both; use use_reentrant=False")


def _next_box(frame):
    """In the recompute of a reentrant checkpoint (frame: its backward): the box of the matching
    call of its forward, or None when the forward had nothing to carry. Every call of the
    recompute takes one, with or without a graph, so the k-th call gets the k-th box."""
    ctx = frame.f_locals.get("ctx")
    boxes = getattr(ctx, "_moe_aux_boxes", None)
    if not boxes:
        return None
    i = getattr(ctx, "_moe_aux_next", 0)
    if i >= len(boxes):
        raise MoeError("MoELayer: the checkpointed function called the layer more times in its "
                       "recompute than in its forward (reentrant checkpointing needs the same calls)")
    ctx._moe_aux_next = i + 1
    return boxes[i]


def _box_for_recompute():
    """For a call with a graph: the box of the forward call it recomputes (None elsewhere)."""
    if not _carried:
        return None
    frames = _checkpoint_frames()
    if not frames or frames[0].f_code is not _CKPT_BACKWARD:
        return None
    return _next_box(frames[0])


def _carry_aux(lb, z):
    """(lb, z) as returned by a call without a graph: unchanged, except inside the forward of a
    reentrant checkpoint, where they are attached to an _AuxCarrier (see above)."""
    frames = _checkpoint_frames()
    if not frames:
        return lb, z
    if frames[0].f_code is _CKPT_BACKWARD:  # a call under no_grad inside the recompute: no gradient,
        box = _next_box(frames[0])  # as in the unchecked run, but it keeps the calls matched
        if box is not None:
            box.used = True
        return lb, z
    args = frames[0].f_locals.get("args", ())
    anchor = next((a for a in args if isinstance(a, _torch.Tensor) and a.requires_grad), None)
    if anchor is None:  # torch warns itself: nothing of this checkpoint will get a gradient
        return lb, z
    if len(frames) > 1:
        raise _nested_error()
    global _carried
    ctx = frames[0].f_locals.get("ctx")
    box = _AuxBox()
    if not hasattr(ctx, "_moe_aux_boxes"):
        ctx._moe_aux_boxes = []
    ctx._moe_aux_boxes.append(box)
    _carried = True
    with _torch.enable_grad():
        return _AuxCarrier.apply(box, anchor, lb, z)


class _AuxCarrier(_torch.autograd.Function):
    """lb, z = f(box, anchor, lb, z): the values unchanged; the backward stores their incoming
    gradients in box (and passes none on: the recompute's engine backward applies them)."""

    @staticmethod
    def forward(ctx, box, anchor, lb, z):
        ctx.box = box
        return lb.clone(), z.clone()

    @staticmethod
    def backward(ctx, dlb, dz):
        box = ctx.box
        if box.used:
            raise MoeError("MoELayer: the aux losses' gradient arrived after the layer's checkpointed "
                           "(use_reentrant=True) backward had run: backpropagate the task loss and the aux "
                           "losses in one backward call (sum them first), or use use_reentrant=False")
        box.cot_lb = float(dlb) + (box.cot_lb or 0.0)
        box.cot_z = float(dz) + (box.cot_z or 0.0)
        return None, None, None, None


def _aux_cotangents(ctx, dlb, dz):
    """The engine's aux cotangents: the incoming gradients of the aux outputs, plus, in the
    recompute of a reentrant checkpoint, those its forward's carrier received."""
    cot_lb, cot_z = float(dlb), float(dz)
    box = ctx.aux_box
    if box is not None:
        box.used = True
        if box.cot_lb is not None:
            cot_lb += box.cot_lb
            cot_z += box.cot_z
    return cot_lb, cot_z


def _loss_dtype(compute):
    """The dtype of the two aux losses: float64 for a float64 compute dtype, else float32."""
    return _torch.float64 if compute == _torch.float64 else _torch.float32


class _MoEFunction(_torch.autograd.Function):
    """(y, load_balance_loss, z_loss, group_sizes, topk_idx, topk_weights, dropped, nonfinite_tokens)
    = f(x, *params); the backward is the engine's (the last five outputs carry no gradient).
    `engine` is the layer's engine for the call's compute dtype."""

    @staticmethod
    def forward(ctx, layer, engine, compute, x, *params):
        out = engine.forward(layer._param_views(params), _view(x), True)
        y, lb, z, group_sizes, topk_idx, topk_weights, dropped, nonfinite, state = out
        ctx.layer = layer
        ctx.engine = engine
        ctx.state = state
        ctx.aux_box = layer.__dict__.pop("_aux_box", None)  # reentrant checkpoint's recompute
        # float64 keeps the state for another backward (retain_graph: torch.autograd.gradcheck);
        # the other dtypes free the activations at the first one.
        ctx.keep_state = compute == _torch.float64
        ctx.spec_names = layer._spec_names
        ctx.param_dtypes = [p.dtype for p in params]
        routing = (_from_dlpack(group_sizes), _from_dlpack(topk_idx), _from_dlpack(topk_weights),
                   _torch.tensor(dropped, dtype=_torch.int64), _torch.tensor(nonfinite, dtype=_torch.int64))
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
        acc = ctx.layer._accumulation_buffers() if not ctx.keep_state else None  # f32 buffers only
        dx, grads = ctx.engine.backward(state, _view(dy), *_aux_cotangents(ctx, dlb, dz), acc or {})
        out = [None, None, None, _from_dlpack(dx)]
        for name, dt in zip(ctx.spec_names, ctx.param_dtypes):
            if acc:  # the engine added into every .grad in place: nothing for autograd to add
                out.append(None)
                continue
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
    accumulate_grads: when every parameter already has a float32 .grad (micro-batch 2 onwards of
    gradient accumulation), the engine's backward adds into those buffers in place (the same f32
    sums as autograd's grad += g) instead of returning a second full set of gradients; parameter
    hooks then do not see that step's gradient (docs/python.md). Single-process layer only.
    """

    def __init__(self, num_experts, num_experts_per_tok, emb_dim, moe_mlp_dim, dtype=None,
                 distributed=None, accumulate_grads=False, **config):
        super().__init__()
        self.accumulate_grads = accumulate_grads
        keys = dict(num_experts=num_experts, num_experts_per_tok=num_experts_per_tok, emb_dim=emb_dim,
                    moe_mlp_dim=moe_mlp_dim, **config)
        if dtype is not None:
            keys["dtype"] = dtype
        overrides = [f"{k}={_config_value(k, v)}" for k, v in keys.items()]
        _sync_threads()  # init_params runs on the pool: size it as the calls will
        self._engine = _C.EngineLayer(overrides, distributed)
        # What a copy or an unpickled layer rebuilds its own engine from (__setstate__).
        self._engine_args = {"overrides": overrides, "distributed": self._engine.distributed}
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

    def step_memory_minimum(self, tokens, x_dtype=_torch.float32):
        """{term: bytes} that one forward + backward of `tokens` tokens given in x_dtype cannot do
        without (the engine's step_minimum, docs/architecture.md "Memory of one step"): 'weights'
        (the stored weights), 'weight_copies' (their compute-dtype copies), 'gradients' (f32),
        'saved' (what the backward reads; the permuted rows xs, or only their index where
        permutes_in_gemm), 'io' (x, dy, y, dx) and 'total'. The compute dtype is the
        layer's (or x_dtype's when the layer computes in each input's dtype). Single-process layer
        only: a distributed rank's estimate is `moe validate`'s (docs/config.md)."""
        if self.distributed:
            raise MoeError("MoELayer.step_memory_minimum: single-process layer only (this layer is distributed; "
                           "`moe validate` estimates a rank's memory)")
        if x_dtype not in _DTYPES:
            raise MoeError(f"MoELayer.step_memory_minimum: x_dtype: expected {_ALLOWED}, got {x_dtype}")
        compute = self._dtype if self._dtype is not None else x_dtype
        return self._engine_for(compute).step_minimum(int(tokens), _DTYPES[x_dtype])

    def permutes_in_gemm(self, x_dtype=_torch.float32):
        """True where this machine's kernel level runs the permute inside the expert GEMMs for inputs of
        x_dtype (the fused permute kernel, `amx_bf16`, bf16 compute): the permuted rows [T*K, D] are
        never written, and the step keeps their int32 index instead (docs/architecture.md, "The
        permute inside the GEMMs"). The results are the same bits either way."""
        if x_dtype not in _DTYPES:
            raise MoeError(f"MoELayer.permutes_in_gemm: x_dtype: expected {_ALLOWED}, got {x_dtype}")
        compute = self._dtype if self._dtype is not None else x_dtype
        return self._engine_for(compute).permutes_in_gemm()

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
        """The four layer keys, dtype, every other key whose value is not its default, and
        distributed=True for a distributed layer (repr(layer) shows them)."""
        c = self.config
        shown = ["num_experts", "num_experts_per_tok", "emb_dim", "moe_mlp_dim", "dtype"]
        items = [f"{k}={c[k]}" for k in shown]
        for key, value, _src in self._engine.config_table():
            if key not in shown and value != _KEY_DEFAULTS.get(key):
                items.append(f"{key}={c[key]!r}")
        if self.distributed:
            items.append("distributed=True")
        return ", ".join(items)

    # --- Copies and pickles -------------------------------------------------------------------
    # The engine object holds no weights (they are the nn.Parameters) and no state between calls,
    # only the resolved config (and, when distributed, the world's communicators): a copy or an
    # unpickled layer builds its own from the same config tokens. Parameters and everything else
    # in __dict__ go the usual way (deepcopy clones them, pickle stores them).

    def __getstate__(self):
        state = dict(self.__dict__)
        state.pop("_engine", None)
        state.pop("_engines", None)  # one per compute dtype: rebuilt on first use
        state.pop("_aux_box", None)
        if self._engine.distributed:  # its parameters are this rank's shards of this world
            args = dict(state["_engine_args"])
            args["world_size"], args["rank"] = _C.world_size(), _C.rank()
            state["_engine_args"] = args
        return state

    def __setstate__(self, state):
        args = state["_engine_args"]
        if args["distributed"]:
            world, rank = _C.world_size(), _C.rank()
            if (world, rank) != (args["world_size"], args["rank"]):
                raise MoeError(
                    f"MoELayer: this distributed layer holds rank {args['rank']}'s shards of a {args['world_size']}-rank "
                    f"job; it can be rebuilt only as rank {args['rank']} of {args['world_size']} (under mpirun, every "
                    f"rank copying or loading its own layer), not as rank {rank} of {world}. To move the weights "
                    f"elsewhere, use export_mixtral_block() and load_mixtral_block()")
        super().__setstate__(state)
        _sync_threads()
        self._engine = _C.EngineLayer(args["overrides"], args["distributed"])  # collective when distributed
        config = {k: _typed(k, v) for k, v, _src in self._engine.config_table()}
        self._engines = {{name: dt for dt, name in _DTYPES.items()}[config["dtype"]]: self._engine}
        # self.config["dtype"] is the explicit compute dtype (or None), not the built engine's.
        changed = sorted(k for k in set(config) | set(self.config)
                         if k != "dtype" and config.get(k) != self.config.get(k))
        if changed:
            k = changed[0]
            raise MoeError(f"MoELayer: the rebuilt engine resolves '{k}' to {config.get(k)!r}, the pickled layer "
                           f"had {self.config.get(k)!r} (an engine with other defaults: build the layer anew)")

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
        """y, aux = layer(x): x [T, D] or [B, S, D] (float32, bfloat16 or float64, CPU); y has x's
        shape and the compute dtype (the module docstring's rule). aux: load_balance_loss and z_loss
        (0-d float32, float64 for float64 compute; differentiable, already weighted), group_sizes [E]
        int32 (rows kept per expert, all ranks summed), topk_idx [T, K] int32, topk_weights [T, K]
        float32 (float64 for float64 compute), dropped (slots dropped by capacity on this rank) and
        nonfinite_tokens (tokens whose router logits are not all finite, all ranks: > 0 makes both
        aux losses NaN; docs/reliability.md). T = 0 (an empty batch) gives an empty y and zero aux
        losses."""
        if _torch.jit.is_tracing():
            raise MoeError("MoELayer: torch.jit.trace cannot record it: the layer runs in the engine (through "
                           "DLPack), which a trace cannot capture; run the model eagerly, or trace the modules "
                           "around it (torch.fx: make MoELayer a leaf module)")
        _check_input(x, self.config["emb_dim"])
        _sync_threads()
        compute = self._compute_dtype(x)
        engine = self._engine_for(compute)
        shape = x.shape
        x2 = x.reshape(-1, shape[-1]) if x.dim() == 3 else x
        params = self._params()
        if _torch.is_grad_enabled() and (x.requires_grad or any(p.requires_grad for p in params)):
            self._aux_box = _box_for_recompute()  # taken by _MoEFunction.forward
            try:
                y, lb, z, gs, topk_idx, topk_weights, dropped, nonfinite = _MoEFunction.apply(
                    self, engine, compute, x2, *params)
            finally:
                self.__dict__.pop("_aux_box", None)
            dropped, nonfinite = int(dropped), int(nonfinite)
        else:  # no graph: the engine keeps no activations
            out = engine.forward(self._param_views(params), _view(x2), False)
            y, lb, z, gs, topk_idx, topk_weights, dropped, nonfinite, _ = out
            y, gs = _from_dlpack(y), _from_dlpack(gs)
            topk_idx, topk_weights = _from_dlpack(topk_idx), _from_dlpack(topk_weights)
            ld = _loss_dtype(compute)
            lb, z = _torch.tensor(lb, dtype=ld), _torch.tensor(z, dtype=ld)
            lb, z = _carry_aux(lb, z)
        if x.dim() == 3:
            y = y.reshape(shape[0], shape[1], shape[2])
        aux = {"load_balance_loss": lb, "z_loss": z, "group_sizes": gs, "topk_idx": topk_idx,
               "topk_weights": topk_weights, "dropped": dropped, "nonfinite_tokens": nonfinite}
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
