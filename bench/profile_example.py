#!/usr/bin/env python3
"""Where a training step of examples/tiny_mixtral.py goes, and the binding's fixed cost per call.

Builds the example's model (its own code: tiny_mixtral.TinyMixtral, init_weights, batch) with the
example's arguments (anything after `--` is passed to tiny_mixtral.parse_args), runs its training
step (batch, forward, cross-entropy + aux losses, backward, gradient norm and clip, AdamW) for
--steps steps after --warmup, and splits the median step into:
  data, attention forward, MoE FFN forward, the rest of the forward and the loss, MoE FFN
  backward, the rest of the backward, gradient norm + clip, the optimizer;
for --ffn engine, the MoE calls are split again into the engine's own time (the C++ forward /
backward, timed around the binding's EngineLayer calls) and the binding's fixed cost (the
Python and PyTorch work of MoELayer around them: argument checks, views, DLPack, autograd).
Also the process's CPU time per wall second (threads x busy share: below the thread count the
threads wait, on each other or for the cores) and its context switches.

--layer: instead of the example, the single layer D=128 F=512 E=8 K=2 T=2048 (the example's
MoE FFN) fwd+bwd in a loop: MoELayer call time against the engine's time inside it.

    PYTHONPATH=build/python /usr/bin/python3 bench/profile_example.py --steps 20
    PYTHONPATH=build/python /usr/bin/python3 bench/profile_example.py --steps 20 -- --ffn torch --torch-block sorted
    PYTHONPATH=build/python /usr/bin/python3 bench/profile_example.py --layer --steps 50
"""
import argparse
import math
import os
import resource
import statistics
import sys
import time
from collections import defaultdict

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "examples"))
import tiny_mixtral as ex  # noqa: E402  (sets OMP_WAIT_POLICY=PASSIVE before torch loads, as the example)
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import tiny_mixtral_util as util  # noqa: E402


class Timers:
    def __init__(self):
        self.t = defaultdict(float)

    def add(self, key, dt):
        self.t[key] += dt


class EngineProxy:
    """Stands in for MoELayer._engine: times the C++ forward / backward calls."""

    def __init__(self, engine, timers):
        self._e, self._timers = engine, timers

    def forward(self, *args):
        t = time.perf_counter()
        out = self._e.forward(*args)
        self._timers.add("moe engine fwd", time.perf_counter() - t)
        return out

    def backward(self, *args):
        t = time.perf_counter()
        out = self._e.backward(*args)
        self._timers.add("moe engine bwd", time.perf_counter() - t)
        return out

    def __getattr__(self, name):
        return getattr(self._e, name)


def proxy_engines(layer, timers):
    """Times every engine a MoELayer calls: it holds one per compute dtype (layer._engines, the
    first made with the layer, the others on first use through layer._engine_for)."""
    for dtype, e in list(layer._engines.items()):
        layer._engines[dtype] = EngineProxy(e, timers)
    orig = layer._engine_for

    def engine_for(dtype):
        e = orig(dtype)
        if not isinstance(e, EngineProxy):
            e = layer._engines[dtype] = EngineProxy(e, timers)
        return e

    layer._engine_for = engine_for


def time_module(module, key, timers):
    """Forward time of `module` (pre/post hooks)."""
    start = {}
    module.register_forward_pre_hook(lambda m, i: start.__setitem__("t", time.perf_counter()))
    module.register_forward_hook(lambda m, i, o: timers.add(key, time.perf_counter() - start["t"]))


def patch_moe_backward(timers):
    """Times moe_engine.torch._MoEFunction.backward (the MoE FFN's whole backward call)."""
    import moe_engine.torch as mt
    orig = mt._MoEFunction.backward

    def timed(ctx, *grads):
        t = time.perf_counter()
        out = orig(ctx, *grads)
        timers.add("moe call bwd", time.perf_counter() - t)
        return out
    mt._MoEFunction.backward = staticmethod(timed)


def cpu_snapshot():
    r = resource.getrusage(resource.RUSAGE_SELF)
    return time.perf_counter(), r.ru_utime + r.ru_stime, r.ru_stime, r.ru_nvcsw, r.ru_nivcsw


def build(a):
    engine = ex.import_engine(required=a.ffn == "engine")
    threads = a.threads or ex.default_threads()
    torch.set_num_threads(a.torch_threads or threads)
    if engine:
        engine.set_num_threads(a.engine_threads or threads)
    dtype = ex.util_dtype(a.dtype)
    routing = {"load_balance_loss_weight": a.lb_weight, "router_z_loss_weight": a.z_weight}
    if a.ffn == "engine":
        def make_ffn():
            return engine.torch.MoELayer(num_experts=a.experts, num_experts_per_tok=a.top_k, emb_dim=a.dim,
                                         moe_mlp_dim=a.mlp_dim, dtype=dtype, distributed=False, **routing,
                                         **a.layer_config)
    else:
        def make_ffn():
            return util.TorchMoE(a.experts, a.top_k, a.dim, a.mlp_dim, dtype=dtype, impl=a.torch_block, **routing)
    model = ex.TinyMixtral(a, make_ffn)
    init = ex.init_weights(a)
    with torch.no_grad():
        for n, p in model.named_parameters():
            if a.ffn == "torch" or ".ffn." not in n:
                p.copy_(init[n])
        if a.ffn == "engine":
            for i, b in enumerate(model.blocks):
                b.ffn.load_mixtral_block(ex.to_mixtral(init, f"blocks.{i}.ffn.", a.experts))
    names = dict(model.named_parameters())
    decay = [p for n, p in names.items() if p.dim() >= 2 and not n.endswith("pos")]
    no_decay = [p for n, p in names.items() if not (p.dim() >= 2 and not n.endswith("pos"))]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": a.weight_decay},
                             {"params": no_decay, "weight_decay": 0.0}], lr=a.lr, betas=(0.9, 0.95), eps=1e-8)
    return model, opt, names, threads


def profile_example(p, a):
    timers = Timers()
    model, opt, names, threads = build(a)
    for b in model.blocks:
        time_module(b.attn, "attention fwd", timers)
        time_module(b.ffn, "moe call fwd", timers)
        if a.ffn == "engine":
            proxy_engines(b.ffn, timers)
    if a.ffn == "engine":
        patch_moe_backward(timers)
    train, _held, _files = util.load_fortunes(a.data_dir, a.heldout_every)
    world = ex.World(None)
    steps = []
    snap0 = None
    for step in range(p.warmup + p.steps):
        if step == p.warmup:
            snap0 = cpu_snapshot()
        timers.t.clear()
        t0 = time.perf_counter()
        x, y = ex.batch(train, a, step, world, generator_seed=a.seed)
        for gr in opt.param_groups:
            gr["lr"] = ex.lr_at(a, step)
        t1 = time.perf_counter()
        logits, auxes = model(x)
        ce = F.cross_entropy(logits.reshape(-1, 256), y.reshape(-1))
        loss = ce + sum(aux["load_balance_loss"] for aux in auxes) + sum(aux["z_loss"] for aux in auxes)
        t2 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        t3 = time.perf_counter()
        sq = torch.zeros((), dtype=torch.float32)
        for q in names.values():
            if q.grad is None:
                q.grad = torch.zeros_like(q)
            sq += q.grad.pow(2).sum()
        gnorm = float(sq.sqrt())
        if a.grad_clip > 0 and gnorm > a.grad_clip:
            for q in names.values():
                q.grad.mul_(a.grad_clip / (gnorm + 1e-6))
        if not math.isfinite(gnorm):
            raise SystemExit(f"profile_example: step {step}: non-finite gradient norm")
        t4 = time.perf_counter()
        opt.step()
        t5 = time.perf_counter()
        rec = dict(timers.t)
        rec.update({"step": t5 - t0, "data": t1 - t0, "forward+loss": t2 - t1, "backward": t3 - t2,
                    "grad norm + clip": t4 - t3, "optimizer": t5 - t4})
        if step >= p.warmup:
            steps.append(rec)
    snap1 = cpu_snapshot()
    med = {k: statistics.median(r.get(k, 0.0) for r in steps) for k in steps[0]}
    rows = [("data (batch, lr)", med["data"]),
            ("attention forward", med.get("attention fwd", 0.0))]
    if a.ffn == "engine":
        rows += [("MoE FFN forward: engine", med["moe engine fwd"]),
                 ("MoE FFN forward: binding (fixed cost)", med["moe call fwd"] - med["moe engine fwd"])]
    else:
        rows += [("MoE FFN forward (plain PyTorch)", med["moe call fwd"])]
    rows += [("rest of the forward + loss (norms, embedding, head, CE)",
              med["forward+loss"] - med.get("attention fwd", 0.0) - med["moe call fwd"])]
    if a.ffn == "engine":
        rows += [("MoE FFN backward: engine", med["moe engine bwd"]),
                 ("MoE FFN backward: binding (fixed cost)", med["moe call bwd"] - med["moe engine bwd"]),
                 ("rest of the backward (attention, norms, head; autograd)", med["backward"] - med["moe call bwd"])]
    else:
        rows += [("backward (all, plain PyTorch MoE included)", med["backward"])]
    rows += [("gradient norm + clip", med["grad norm + clip"]), ("optimizer (AdamW)", med["optimizer"])]
    total = med["step"]
    tokens = a.batch * a.seq_len
    wall, cpu, sys_, nv, niv = (s1 - s0 for s0, s1 in zip(snap0, snap1))
    print(f"tiny_mixtral step profile: --ffn {a.ffn}{' (' + a.torch_block + ')' if a.ffn == 'torch' else ''}, "
          f"dtype {a.dtype}, D={a.dim} layers={a.layers} E={a.experts} K={a.top_k} F={a.mlp_dim}, "
          f"{tokens} tokens/step, threads {threads}; median of {p.steps} steps after {p.warmup}; "
          f"load average {' '.join(f'{v:.1f}' for v in os.getloadavg())}")
    print(f"{'part':<58} {'ms':>8} {'share':>7}")
    for name, v in rows:
        print(f"{name:<58} {v * 1e3:8.2f} {100 * v / total:6.1f}%")
    print(f"{'step (median)':<58} {total * 1e3:8.2f}  {tokens / total:,.0f} tokens/s")
    if a.ffn == "engine":
        fixed = (med["moe call fwd"] - med["moe engine fwd"]) + (med["moe call bwd"] - med["moe engine bwd"])
        calls = a.layers
        moe = med["moe call fwd"] + med["moe call bwd"]
        print(f"binding fixed cost: {fixed * 1e3 / calls:.3f} ms per layer (fwd+bwd), "
              f"{100 * fixed / moe:.1f}% of the MoE FFN time, {100 * fixed / total:.1f}% of the step")
    print(f"CPU time / wall {cpu / wall:.2f} (of {threads} threads: {100 * cpu / wall / threads:.0f}% busy), "
          f"system {100 * sys_ / cpu:.1f}% of it; context switches per step: {nv / p.steps:.0f} voluntary, "
          f"{niv / p.steps:.0f} involuntary")
    return 0


def profile_layer(p, a):
    """The example's MoE FFN alone: MoELayer fwd+bwd vs the engine's time inside the calls."""
    engine = ex.import_engine(required=True)
    threads = a.threads or ex.default_threads()
    torch.set_num_threads(threads)
    engine.set_num_threads(threads)
    timers = Timers()
    T = a.batch * a.seq_len
    layer = engine.torch.MoELayer(num_experts=a.experts, num_experts_per_tok=a.top_k, emb_dim=a.dim,
                                  moe_mlp_dim=a.mlp_dim, dtype=ex.util_dtype(a.dtype), distributed=False)
    proxy_engines(layer, timers)
    patch_moe_backward(timers)
    g = torch.Generator().manual_seed(0)
    x0 = torch.randn(T, a.dim, generator=g).to(ex.util_dtype(a.dtype))
    dy = torch.randn(T, a.dim, generator=g).to(x0.dtype)
    recs = []
    for i in range(p.warmup + p.steps):
        timers.t.clear()
        layer.zero_grad(set_to_none=True)
        x = x0.clone().requires_grad_(True)
        t0 = time.perf_counter()
        y, aux = layer(x)
        t1 = time.perf_counter()
        torch.autograd.backward([y, aux["load_balance_loss"] + aux["z_loss"]], [dy, torch.ones(())])
        t2 = time.perf_counter()
        if i >= p.warmup:
            recs.append({"call": t2 - t0, "fwd": t1 - t0, "engine": timers.t["moe engine fwd"] + timers.t["moe engine bwd"],
                         "engine fwd": timers.t["moe engine fwd"], "engine bwd": timers.t["moe engine bwd"]})
    med = {k: statistics.median(r[k] for r in recs) for k in recs[0]}
    fixed = statistics.median(r["call"] - r["engine"] for r in recs)
    print(f"MoELayer D={a.dim} F={a.mlp_dim} E={a.experts} K={a.top_k} T={T} {a.dtype} fwd+bwd, {threads} threads, "
          f"median of {p.steps} after {p.warmup}; load average {' '.join(f'{v:.1f}' for v in os.getloadavg())}")
    print(f"  MoELayer fwd+bwd call {med['call'] * 1e3:.3f} ms; engine inside it {med['engine'] * 1e3:.3f} ms "
          f"(fwd {med['engine fwd'] * 1e3:.3f}, bwd {med['engine bwd'] * 1e3:.3f}); binding fixed cost "
          f"{fixed * 1e3:.3f} ms = {100 * fixed / med['call']:.1f}% of the call (target <= 5%)")
    return 0


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    own, rest = (argv[:argv.index("--")], argv[argv.index("--") + 1:]) if "--" in argv else (argv, [])
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=20, help="profiled steps")
    ap.add_argument("--warmup", type=int, default=3, help="steps first, not counted")
    ap.add_argument("--layer", action="store_true", help="the example's MoE layer alone (binding fixed cost)")
    p = ap.parse_args(own)
    if p.steps < 1 or p.warmup < 0:
        ap.error("--steps >= 1, --warmup >= 0")
    a = ex.parse_args(rest)
    return profile_layer(p, a) if p.layer else profile_example(p, a)


if __name__ == "__main__":
    sys.exit(main())
