"""Run under `mpirun -np 2` by test_mpi.py. Modes:
  ep V...: each variant V ("key=value,...", e.g. expert_parallelism=2) of the distributed layer
         vs the single-process layer on every rank (same Mixtral block, the global batch split by
         rank): y, dx, losses, routing bit-exact; expert weight gradients bit-exact when
         data = fsdp = 1, else (and the router's) within f32 rounding; the shards; export.
  nonfinite V...: one NaN token on rank 1: NaN aux losses on both ranks, the finite tokens'
         rows bit-exact against the single process.
  allreduce: all_reduce_ sums in rank order, the same bits on every rank.
  raise: rank 1 raises while rank 0 waits in the layer's collectives: the job must end.
  copy PATH: a distributed layer's deepcopy and pickle round trip (every rank copying) equal it bit
         for bit and are independent; rank 0 writes its pickled layer to PATH (test_mpi.py checks a
         single process refuses it, saying why); then rank 1 passes an empty batch.
Prints "OK <mode> rank R" on success."""

import copy
import pickle
import sys
import time

import torch

import moe_engine
from moe_engine.torch import MoELayer

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from reference import MixtralBlock  # noqa: E402

E, K, D, F, T = 8, 2, 32, 48, 64
mode = sys.argv[1]
W, R = moe_engine.world_size(), moe_engine.rank()
assert W == 2, W


def layer(**keys):
    return MoELayer(num_experts=E, num_experts_per_tok=K, emb_dim=D, moe_mlp_dim=F, dtype=torch.float32,
                    load_balance_loss_weight=0.01, router_z_loss_weight=0.001, **keys)


def step(l, x, dy):
    x = x.clone().requires_grad_(True)
    y, aux = l(x)
    ((y * dy).sum() + 0.7 * aux["load_balance_loss"] + 1.3 * aux["z_loss"]).backward()
    return y.detach(), aux, x.grad


def spec_grads(l):
    return {spec: p.grad for spec, p in zip(l._spec_names, l._params())}


def check_variant(keys, single, ys, auxs, dxs, block, x, dy):
    """keys: the distributed layer's config; every rank's results against the single process."""
    rows = slice(R * T // W, (R + 1) * T // W)
    dist = layer(**keys)
    assert dist.distributed
    dist.load_mixtral_block(block.state_dict())  # every rank passes the full block, keeps its shard
    if keys.get("expert_parallelism") == 2:
        assert dist.wo.shape == (E // W, F, D) and dist.router.shape == (D, E)
        assert torch.equal(dist.wo, single.wo[R * E // W:(R + 1) * E // W])
    yd, auxd, dxd = step(dist, x[rows], dy[rows])
    assert torch.equal(yd, ys[rows]), "y"
    assert torch.equal(dxd, dxs[rows]), "grad x"
    assert torch.equal(auxd["load_balance_loss"], auxs["load_balance_loss"]) and torch.equal(auxd["z_loss"], auxs["z_loss"])
    assert torch.equal(auxd["topk_idx"], auxs["topk_idx"][rows])
    assert torch.equal(auxd["group_sizes"], auxs["group_sizes"]), "group_sizes are global"
    full = {k: torch.utils.dlpack.from_dlpack(v) for k, v in dist._engine.unshard(
        {k: g.contiguous() for k, g in spec_grads(dist).items()}).items()}
    want = spec_grads(single)
    # Expert weight gradients: exact when each expert's rows live on one rank (data = fsdp = 1,
    # dist_layer.h); otherwise, and for the router (a rank-order sum of partials), a few f32 ulps.
    exact_experts = keys.get("data_parallelism", 1) == 1 and keys.get("fsdp_parallelism", 1) == 1
    for spec, g in want.items():
        if spec != "router.kernel" and exact_experts:
            assert torch.equal(full[spec], g), spec
        else:
            assert torch.allclose(full[spec], g, rtol=1e-5, atol=1e-6 * g.abs().max().item()), (spec, (full[spec] - g).abs().max())
    out = dist.export_mixtral_block()
    for k, v in block.state_dict().items():
        assert torch.equal(out[k], v), k


if mode == "ep":
    torch.manual_seed(0)
    block = MixtralBlock(E, K, D, F)
    g = torch.Generator().manual_seed(1)
    x, dy = torch.randn(T, D, generator=g), torch.randn(T, D, generator=g)
    single = layer(distributed=False)
    single.load_mixtral_block(block.state_dict())
    ys, auxs, dxs = step(single, x, dy)
    for variant in sys.argv[2:]:  # "key=value,key=value"
        keys = {k: (int(v) if v.isdigit() else v == "true" if v in ("true", "false") else v)
                for k, v in (kv.split("=", 1) for kv in variant.split(","))}
        check_variant(keys, single, ys, auxs, dxs, block, x, dy)
        print(f"variant {variant}: ok on rank {R}", flush=True)
elif mode == "nonfinite":
    # One NaN in one token of rank 1's rows: the aux losses are NaN on both ranks (offload on and
    # off), every finite token's y, grad x and routing equal the single process's bit for bit.
    torch.manual_seed(0)
    block = MixtralBlock(E, K, D, F)
    g = torch.Generator().manual_seed(1)
    x, dy = torch.randn(T, D, generator=g), torch.randn(T, D, generator=g)
    bad = T // W + 3
    x[bad, 5] = float("nan")
    single = layer(distributed=False)
    single.load_mixtral_block(block.state_dict())
    ys, auxs, dxs = step(single, x, dy)
    assert torch.isnan(auxs["load_balance_loss"]) and torch.isnan(auxs["z_loss"]) and auxs["nonfinite_tokens"] == 1
    rows = range(R * T // W, (R + 1) * T // W)
    good = [t for t in rows if t != bad]
    local = [t - rows.start for t in good]
    for variant in sys.argv[2:]:
        keys = {k: (int(v) if v.isdigit() else v) for k, v in (kv.split("=", 1) for kv in variant.split(","))}
        dist = layer(**keys)
        dist.load_mixtral_block(block.state_dict())
        yd, auxd, dxd = step(dist, x[rows.start:rows.stop], dy[rows.start:rows.stop])
        assert torch.isnan(auxd["load_balance_loss"]) and torch.isnan(auxd["z_loss"]), variant
        assert auxd["nonfinite_tokens"] == 1, (variant, auxd["nonfinite_tokens"])
        assert torch.equal(yd[local], ys[good]), variant
        assert torch.equal(dxd[local], dxs[good]), variant
        assert torch.equal(auxd["topk_idx"], auxs["topk_idx"][rows.start:rows.stop]), variant
        print(f"variant {variant}: ok on rank {R}", flush=True)
elif mode == "allreduce":
    g = torch.Generator().manual_seed(10 + R)
    t = torch.randn(1000, generator=g) * (10.0 ** R)
    mine = t.clone()
    parts = [torch.randn(1000, generator=torch.Generator().manual_seed(10 + r)) * (10.0 ** r) for r in range(W)]
    want = parts[0].clone()
    for p in parts[1:]:
        want += p  # rank order, f32
    assert moe_engine.all_reduce_(t) is t
    assert torch.equal(t, want), (t - want).abs().max()
    again = mine.clone()
    moe_engine.all_reduce_(again, axis="world")
    assert torch.equal(again, t)
elif mode == "copy":
    g = torch.Generator().manual_seed(2 + R)
    x, dy = torch.randn(T // W, D, generator=g), torch.randn(T // W, D, generator=g)
    for keys in ({"expert_parallelism": 2}, {"fsdp_parallelism": 2}):
        orig = layer(**keys)
        with torch.no_grad():
            for p in orig.parameters():
                p.add_(0.01 * torch.randn(p.shape, generator=g))
        want = step(orig, x, dy)
        want_g = [p.grad.clone() for p in orig.parameters()]
        for dup in (copy.deepcopy(orig), pickle.loads(pickle.dumps(orig))):  # collective, like building one
            assert dup.distributed and dup._engine is not orig._engine
            got = step(dup, x, dy)
            assert torch.equal(got[0], want[0]) and torch.equal(got[2], want[2]), keys
            assert all(torch.equal(got[1][k], want[1][k]) for k in ("load_balance_loss", "z_loss", "topk_idx"))
            assert all(torch.equal(p.grad, q) for p, q in zip(dup.parameters(), want_g)), keys
            with torch.no_grad():
                dup.wo.zero_()
            assert torch.equal(step(orig, x, dy)[0], want[0]), "the copy shares the original's weights"
    if R == 0:
        with open(sys.argv[2], "wb") as f:
            pickle.dump(orig, f)
    # An empty batch on rank 1: rank 0's tokens are the whole batch (same init on both layers).
    g = torch.Generator().manual_seed(7)
    x0, dy0 = torch.randn(T // W, D, generator=g), torch.randn(T // W, D, generator=g)
    mine = slice(0, T // W if R == 0 else 0)
    yd, auxd, dxd = step(layer(expert_parallelism=2), x0[mine], dy0[mine])
    ys, auxs, dxs = step(layer(distributed=False), x0, dy0)
    assert yd.shape == (len(range(T // W)[mine]), D) and torch.equal(yd, ys[mine]) and torch.equal(dxd, dxs[mine])
    assert torch.equal(auxd["load_balance_loss"], auxs["load_balance_loss"]) and torch.equal(auxd["z_loss"], auxs["z_loss"])
elif mode == "raise":
    l = layer(expert_parallelism=2)
    if R == 1:
        time.sleep(0.5)
        raise ValueError("deliberate failure on rank 1")
    x = torch.randn(T // W, D)
    l(x)  # rank 0 waits in the layer's collectives for rank 1
    print("rank 0 was not stopped", flush=True)
    time.sleep(60)
    sys.exit(0)
print(f"OK {mode} rank {R}", flush=True)
