#!/usr/bin/env python3
"""A small Mixtral-like language model trained on real English text with the engine's MoE layer.

A decoder-only transformer over bytes (vocabulary 256): learned position embeddings, pre-norm
blocks of causal multi-head self-attention and a routed MoE FFN (RMSNorm before each), a final
RMSNorm and an output projection. The attention and norms are PyTorch; each block's FFN is
`moe_engine.torch.MoELayer` (`--ffn engine`) or the plain PyTorch Mixtral block of the same
weights (`--ffn torch`, examples/tiny_mixtral_util.py). The corpus is the Debian `fortunes`
package's data files (/usr/share/games/fortunes), one fortune in ten held out.

    PYTHONPATH=build/python /usr/bin/python3 examples/tiny_mixtral.py              # 800 steps, under 2 minutes on 2 cores
    PYTHONPATH=build/python /usr/bin/python3 examples/tiny_mixtral.py --ffn torch  # same weights, plain block
    PYTHONPATH=build/python /usr/bin/python3 examples/tiny_mixtral.py --resume     # continue OUT/latest
    mpirun -np 2 ... examples/tiny_mixtral.py --config expert_parallelism=2        # expert parallelism
    build/moe report out/tiny_mixtral/metrics.jsonl                                # loss / expert load plot

Everything is documented in docs/python_example.md.
"""
import argparse
import json
import math
import os
import sys
import time

# PyTorch's OpenMP threads wait passively between parallel regions unless the caller chose
# otherwise: libgomp's default spinning takes the cores from the engine pool that runs next, and
# from each other on a busy machine (measured: docs/python_benchmarks.md, "Thread settings"). Read
# by libgomp when torch loads, so it is set before the import.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
# OpenBLAS's own threads (torch's matmuls under Debian's python3-torch) poll with sched_yield for
# 2^28 cycles after each call before they sleep: on 2 cores they took the cores from the engine and
# from torch, a third of the job's CPU time in the kernel. 2^4 cycles: they sleep at once (200
# steps: 20,085 against 18,665 tokens/s, median of 6 alternated runs; docs/python_example.md).
# Read when OpenBLAS loads with torch.
os.environ.setdefault("OPENBLAS_THREAD_TIMEOUT", "4")

import torch  # noqa: E402
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import tiny_mixtral_util as util  # noqa: E402
from tiny_mixtral_util import ExampleError  # noqa: E402

FORMAT = "tiny_mixtral/1"
# the checkpoint's metadata that must match on resume (the model and the data)
MODEL_KEYS = ("dim", "layers", "heads", "experts", "top_k", "mlp_dim", "seq_len", "batch", "seed",
              "steps", "lr", "warmup", "min_lr_ratio", "weight_decay", "grad_clip", "lb_weight",
              "z_weight", "heldout_every")


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--ffn", choices=["engine", "torch"], default="engine",
                   help="each block's FFN: moe_engine's MoELayer or the plain PyTorch Mixtral block")
    p.add_argument("--torch-block", choices=sorted(util.TORCH_BLOCKS), default="loop",
                   help="--ffn torch: the per-expert loop (Mixtral) or sort-by-expert")
    p.add_argument("--steps", type=int, default=800, help="optimizer steps (the schedule's length)")
    p.add_argument("--until", type=int, default=0, help="stop after this step (0: --steps); the schedule keeps --steps")
    p.add_argument("--batch", type=int, default=16, help="sequences per step (global, over all ranks)")
    p.add_argument("--seq-len", type=int, default=128, help="bytes per sequence")
    p.add_argument("--dim", type=int, default=128, help="model width D")
    p.add_argument("--layers", type=int, default=2, help="transformer blocks")
    p.add_argument("--heads", type=int, default=4, help="attention heads")
    p.add_argument("--experts", type=int, default=8, help="routed experts E per block")
    p.add_argument("--top-k", type=int, default=2, help="experts per token K")
    p.add_argument("--mlp-dim", type=int, default=512, help="expert hidden width F")
    p.add_argument("--dtype", choices=["f32", "bf16"], default="f32",
                   help="the MoE FFN's compute dtype (master weights, attention and norms stay f32)")
    p.add_argument("--threads", type=int, default=0,
                   help="threads of both PyTorch and the engine's pool (0: this rank's share of the cores)")
    p.add_argument("--torch-threads", type=int, default=0, help="PyTorch threads (0: --threads)")
    p.add_argument("--engine-threads", type=int, default=0, help="engine pool threads (0: --threads)")
    p.add_argument("--lr", type=float, default=3e-3, help="peak learning rate (AdamW)")
    p.add_argument("--warmup", type=int, default=20, help="linear warm-up steps")
    p.add_argument("--min-lr-ratio", type=float, default=0.1, help="final lr / peak (cosine decay)")
    p.add_argument("--weight-decay", type=float, default=0.01, help="AdamW weight decay (matrices only)")
    p.add_argument("--grad-clip", type=float, default=1.0, help="global-norm clip (<= 0: none)")
    p.add_argument("--lb-weight", type=float, default=0.01, help="load_balance_loss_weight")
    p.add_argument("--z-weight", type=float, default=1e-3, help="router_z_loss_weight")
    p.add_argument("--config", nargs="*", default=[], metavar="KEY=VALUE",
                   help="more MoELayer config keys (docs/config.md), e.g. expert_parallelism=2")
    p.add_argument("--seed", type=int, default=0, help="seed of the weights and the batches")
    p.add_argument("--out", default="out/tiny_mixtral", help="directory of metrics.jsonl and the checkpoints")
    p.add_argument("--resume", action="store_true", help="continue from OUT/latest bit-exactly")
    p.add_argument("--checkpoint-every", type=int, default=100, help="steps between checkpoints (and one at the end)")
    p.add_argument("--keep", type=int, default=2, help="checkpoints kept")
    p.add_argument("--log-every", type=int, default=20, help="steps between progress lines")
    p.add_argument("--eval-every", type=int, default=50, help="steps between held-out evaluations (and one at the end)")
    p.add_argument("--eval-batches", type=int, default=8, help="held-out batches (of --batch sequences) per evaluation")
    p.add_argument("--sample", type=int, default=300, help="bytes to sample at the end (0: none)")
    p.add_argument("--prompt", default="The ", help="the sample's prompt")
    p.add_argument("--temperature", type=float, default=0.8, help="sampling temperature")
    p.add_argument("--data-dir", default=util.FORTUNES_DIR, help="the fortunes data files")
    p.add_argument("--heldout-every", type=int, default=10, help="every N-th fortune is held out")
    a = p.parse_args(argv)
    for name in ("steps", "batch", "seq_len", "dim", "layers", "heads", "experts", "top_k", "mlp_dim",
                 "log_every", "eval_every", "eval_batches", "keep", "heldout_every"):
        if getattr(a, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be >= 1, got {getattr(a, name)}")
    for name in ("until", "threads", "torch_threads", "engine_threads", "checkpoint_every", "sample", "warmup"):
        if getattr(a, name) < 0:
            p.error(f"--{name.replace('_', '-')} must be >= 0, got {getattr(a, name)}")
    if a.heldout_every < 2:
        p.error("--heldout-every must be >= 2")
    if a.dim % a.heads:
        p.error(f"--dim {a.dim} must be divisible by --heads {a.heads}")
    if a.top_k > a.experts:
        p.error(f"--top-k {a.top_k} must be <= --experts {a.experts}")
    if not (a.lr > 0 and math.isfinite(a.lr)):
        p.error(f"--lr must be finite and > 0, got {a.lr}")
    if not 0 <= a.min_lr_ratio <= 1:
        p.error(f"--min-lr-ratio must be in [0, 1], got {a.min_lr_ratio}")
    if a.until > a.steps:
        p.error(f"--until {a.until} is past --steps {a.steps}")
    a.layer_config = {}
    for kv in a.config:
        if "=" not in kv:
            p.error(f"--config {kv!r}: expected KEY=VALUE")
        k, v = kv.split("=", 1)
        a.layer_config[k] = _config_value(v)
    return a


def _config_value(v):
    if v in ("true", "false"):
        return v == "true"
    for conv in (int, float):
        try:
            return conv(v)
        except ValueError:
            pass
    return v


# ---------------------------------------------------------------------------------------------
# ranks (moe_engine's world; one process without mpirun)

class World:
    def __init__(self, engine):
        self.engine = engine
        self.size = engine.world_size() if engine else 1
        self.rank = engine.rank() if engine else 0

    def sum_(self, t):
        """In-place sum over the ranks (identity on one process)."""
        if self.size > 1:
            self.engine.all_reduce_(t, axis="data")
        return t


def import_engine(required):
    try:
        import moe_engine
        import moe_engine.torch  # noqa: F401
        return moe_engine
    except ImportError as e:
        if required:
            raise ExampleError(f"cannot import moe_engine ({e}): build it (bash scripts/build.sh) and run with "
                               "PYTHONPATH=build/python /usr/bin/python3") from None
        return None


# ---------------------------------------------------------------------------------------------
# model

class RMSNorm(nn.Module):
    def __init__(self, d, eps=1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(d))

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


class Attention(nn.Module):
    def __init__(self, d, heads, seq_len):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(d, 3 * d, bias=False)
        self.proj = nn.Linear(d, d, bias=False)
        self.register_buffer("mask", torch.full((seq_len, seq_len), float("-inf")).triu(1), persistent=False)

    def forward(self, x):
        B, S, D = x.shape
        q, k, v = self.qkv(x).view(B, S, 3, self.heads, D // self.heads).permute(2, 0, 3, 1, 4)
        att = (q @ k.transpose(-2, -1)) * (D // self.heads) ** -0.5 + self.mask[:S, :S]
        y = torch.softmax(att, dim=-1) @ v
        return self.proj(y.transpose(1, 2).reshape(B, S, D))


class Block(nn.Module):
    def __init__(self, a, ffn):
        super().__init__()
        self.norm1, self.norm2 = RMSNorm(a.dim), RMSNorm(a.dim)
        self.attn = Attention(a.dim, a.heads, a.seq_len)
        self.ffn = ffn
        self.dtype = util_dtype(a.dtype)

    def forward(self, x):
        x = x + self.attn(self.norm1(x))
        y, aux = self.ffn(self.norm2(x).to(self.dtype))
        return x + y.float(), aux


class TinyMixtral(nn.Module):
    def __init__(self, a, make_ffn):
        super().__init__()
        self.emb = nn.Embedding(256, a.dim)
        self.pos = nn.Parameter(torch.zeros(a.seq_len, a.dim))
        self.blocks = nn.ModuleList(Block(a, make_ffn()) for _ in range(a.layers))
        self.norm = RMSNorm(a.dim)
        self.head = nn.Linear(a.dim, 256, bias=False)

    def forward(self, idx):
        x = self.emb(idx) + self.pos[: idx.shape[1]]
        auxes = []
        for b in self.blocks:
            x, aux = b(x)
            auxes.append(aux)
        return self.head(self.norm(x)), auxes


def util_dtype(name):
    return {"f32": torch.float32, "bf16": torch.bfloat16}[name]


FFN_NAMES = ("router", "wi_0", "wi_1", "wo")


def init_weights(a):
    """Every parameter's full initial value, a pure function of --seed (the same for both --ffn
    modes and any number of ranks)."""
    g = torch.Generator().manual_seed(a.seed)
    D, Fd, E, L = a.dim, a.mlp_dim, a.experts, a.layers
    out_scale = (2 * L) ** -0.5
    w = {"emb.weight": torch.randn(256, D, generator=g),
         "pos": torch.randn(a.seq_len, D, generator=g) * 0.1,
         "norm.weight": torch.ones(D),
         "head.weight": torch.randn(256, D, generator=g) * D ** -0.5}
    for i in range(L):
        p = f"blocks.{i}."
        w[p + "norm1.weight"] = torch.ones(D)
        w[p + "norm2.weight"] = torch.ones(D)
        w[p + "attn.qkv.weight"] = torch.randn(3 * D, D, generator=g) * D ** -0.5
        w[p + "attn.proj.weight"] = torch.randn(D, D, generator=g) * D ** -0.5 * out_scale
        w[p + "ffn.router"] = torch.randn(D, E, generator=g) * D ** -0.5
        w[p + "ffn.wi_0"] = torch.randn(E, D, Fd, generator=g) * D ** -0.5
        w[p + "ffn.wi_1"] = torch.randn(E, D, Fd, generator=g) * D ** -0.5
        w[p + "ffn.wo"] = torch.randn(E, Fd, D, generator=g) * Fd ** -0.5 * out_scale
    return w


class Sharding:
    """Which experts of each MoE layer this rank holds (a distributed MoELayer's parameters are the
    engine's shards of the expert dimension); everything else is whole (replicated). The range is
    found by matching the layer's loaded shard against the full initial tensor."""

    def __init__(self, model, init, a):
        self.ranges = {}
        for name, p in model.named_parameters():
            if name.split(".")[-1] not in ("wi_0", "wi_1", "wo"):
                continue
            full = init[name]
            if tuple(p.shape) == tuple(full.shape):
                continue
            n = p.shape[0]
            if tuple(p.shape[1:]) != tuple(full.shape[1:]) or a.experts % n:
                raise ExampleError(f"parameter {name}: local shape {list(p.shape)} is not a shard of the expert "
                                   f"dimension of {list(full.shape)} (only expert and data parallelism are supported)")
            found = [lo for lo in range(0, a.experts, n) if torch.equal(p.detach(), full[lo:lo + n])]
            if len(found) != 1:
                raise ExampleError(f"parameter {name}: cannot tell which experts this rank holds")
            self.ranges[name] = (found[0], found[0] + n)

    def sharded(self, name):
        return name in self.ranges

    def local(self, name, full):
        if name in self.ranges:
            lo, hi = self.ranges[name]
            return full[lo:hi]
        return full

    def gather(self, name, local, full_shape, world):
        """The whole tensor on every rank: each rank writes its rows into zeros, then a sum (each
        element has one non-zero addend: exact)."""
        if name not in self.ranges:
            return local
        full = torch.zeros(full_shape, dtype=local.dtype)
        lo, hi = self.ranges[name]
        full[lo:hi] = local
        return world.sum_(full)


def to_mixtral(init, prefix, experts):
    """The initial weights of one MoE layer as a Mixtral block state dict (load_mixtral_block)."""
    sd = {"gate.weight": init[prefix + "router"].t()}
    for j in range(experts):
        sd[f"experts.{j}.w1.weight"] = init[prefix + "wi_0"][j].t()
        sd[f"experts.{j}.w3.weight"] = init[prefix + "wi_1"][j].t()
        sd[f"experts.{j}.w2.weight"] = init[prefix + "wo"][j].t()
    return sd


# ---------------------------------------------------------------------------------------------
# data

def batch(data, a, step, world, generator_seed):
    """The step's global batch of --batch windows (a pure function of the seed and the step);
    this rank takes its contiguous share of the rows. Returns (inputs, targets) [B_local, S]."""
    g = torch.Generator().manual_seed(generator_seed * 1_000_003 + step)
    starts = torch.randint(0, data.numel() - a.seq_len - 1, (a.batch,), generator=g)
    per = a.batch // world.size
    starts = starts[world.rank * per:(world.rank + 1) * per]
    win = torch.stack([data[s:s + a.seq_len + 1] for s in starts.tolist()]).long()
    return win[:, :-1], win[:, 1:]


def lr_at(a, step):
    """Learning rate of update `step` (0-based): linear warm-up, then cosine to min_lr_ratio."""
    if step < a.warmup:
        return a.lr * (step + 1) / a.warmup
    span = max(1, a.steps - a.warmup)
    c = 0.5 * (1 + math.cos(math.pi * (step - a.warmup) / span))
    return a.lr * (a.min_lr_ratio + (1 - a.min_lr_ratio) * c)


# ---------------------------------------------------------------------------------------------
# checkpoints

def checkpoint_meta(a):
    return {"format": FORMAT, "config": json.dumps({k: getattr(a, k) for k in MODEL_KEYS}, sort_keys=True)}


def save_checkpoint(model, opt, a, step, world, shard, full_shapes):
    """Whole tensors (expert shards gathered), the AdamW moments and step counts, the step; rank 0
    writes them atomically, then `latest` names the file; older ones beyond --keep are removed."""
    tensors = {}
    for name, p in model.named_parameters():
        tensors["param/" + name] = shard.gather(name, p.detach().clone(), full_shapes[name], world)
        st = opt.state.get(p, {})
        for key in ("exp_avg", "exp_avg_sq"):
            if key in st:
                tensors[f"adam/{name}/{key}"] = shard.gather(name, st[key].clone(), full_shapes[name], world)
        if "step" in st:
            tensors[f"adam/{name}/step"] = torch.as_tensor(st["step"]).reshape(1).clone()
    if world.rank != 0:
        return
    meta = checkpoint_meta(a)
    meta["step"] = str(step)
    meta["ffn"] = a.ffn
    fname = f"ckpt-{step:08d}.safetensors"
    util.save_safetensors(os.path.join(a.out, fname), tensors, meta)
    util.atomic_write_bytes(os.path.join(a.out, "latest"), [fname.encode() + b"\n"])
    ckpts = sorted(n for n in os.listdir(a.out) if n.startswith("ckpt-") and n.endswith(".safetensors"))
    for old in ckpts[:-a.keep]:
        os.unlink(os.path.join(a.out, old))


def load_checkpoint(model, opt, a, shard):
    latest = os.path.join(a.out, "latest")
    try:
        with open(latest) as f:
            fname = f.read().strip()
    except OSError as e:
        raise ExampleError(f"--resume: {latest}: cannot read ({e.strerror}); no checkpoint in {a.out}") from None
    path = os.path.join(a.out, fname)
    tensors, meta = util.load_safetensors(path)
    if meta.get("format") != FORMAT:
        raise ExampleError(f"{path}: format {meta.get('format')!r}, expected {FORMAT!r}")
    saved = json.loads(meta.get("config", "{}"))
    now = {k: getattr(a, k) for k in MODEL_KEYS}
    diff = [f"{k}: checkpoint {saved.get(k)!r}, now {now[k]!r}" for k in MODEL_KEYS if saved.get(k) != now[k]]
    if diff:
        raise ExampleError(f"{path}: the run's settings differ from the checkpoint's: " + "; ".join(diff))
    try:
        step = int(meta["step"])
    except (KeyError, ValueError):
        raise ExampleError(f"{path}: metadata 'step' missing or not an integer") from None
    expected = set()
    with torch.no_grad():
        for name, p in model.named_parameters():
            key = "param/" + name
            expected.add(key)
            t = _take(tensors, key, path)
            full_shape = p.shape if not shard.sharded(name) else (a.experts,) + tuple(p.shape[1:])
            _check_shape(t, full_shape, key, path)
            p.copy_(shard.local(name, t))
            st = {}
            for k in ("exp_avg", "exp_avg_sq"):
                kk = f"adam/{name}/{k}"
                if kk in tensors:
                    expected.add(kk)
                    _check_shape(tensors[kk], full_shape, kk, path)
                    st[k] = shard.local(name, tensors[kk]).clone()
            kk = f"adam/{name}/step"
            if kk in tensors:
                expected.add(kk)
                st["step"] = tensors[kk].reshape(())
            if st:
                if set(st) != {"exp_avg", "exp_avg_sq", "step"}:
                    raise ExampleError(f"{path}: AdamW state of {name} incomplete (has {sorted(st)})")
                opt.state[p] = st
    extra = sorted(set(tensors) - expected)
    if extra:
        raise ExampleError(f"{path}: unexpected tensors {extra[:5]} (another model?)")
    return step, path


def _take(tensors, key, path):
    if key not in tensors:
        raise ExampleError(f"{path}: tensor '{key}' missing")
    return tensors[key]


def _check_shape(t, shape, key, path):
    if tuple(t.shape) != tuple(shape) or t.dtype != torch.float32:
        raise ExampleError(f"{path}: tensor '{key}' is {list(t.shape)} {t.dtype}, expected {list(shape)} torch.float32")


def keep_metrics_until(path, step):
    """On resume: keep the metrics lines with step <= the checkpoint's, drop the rest."""
    if not os.path.exists(path):
        return
    kept = []
    with open(path, "rb") as f:
        for line in f:
            try:
                if json.loads(line).get("step", 0) <= step:
                    kept.append(line)
            except json.JSONDecodeError:
                break  # a line cut by a kill: everything after it is dropped
    util.atomic_write_bytes(path, kept)


# ---------------------------------------------------------------------------------------------
# training

def fmt_time(s):
    s = int(round(s))
    return f"{s // 3600}h{s // 60 % 60:02d}m{s % 60:02d}s" if s >= 3600 else f"{s // 60}m{s % 60:02d}s"


def evaluate(model, heldout, a, world):
    """Mean cross-entropy (nats per byte) of fixed held-out windows, over all ranks."""
    model.eval()
    tot = torch.zeros(2, dtype=torch.float32)
    with torch.no_grad():
        for i in range(a.eval_batches):
            x, y = batch(heldout, a, i, world, generator_seed=10_000 + a.seed)
            logits, _ = model(x)
            tot[0] += F.cross_entropy(logits.reshape(-1, 256), y.reshape(-1), reduction="sum")
            tot[1] += y.numel()
    model.train()
    world.sum_(tot)
    return float(tot[0] / tot[1])


def sample(model, a, world):
    """--sample bytes after --prompt, temperature sampling; every rank runs the forward (the MoE
    layer's collectives), rank 0's choice is taken by all (a sum where the others add 0)."""
    g = torch.Generator().manual_seed(a.seed + 7)
    ctx = list(a.prompt.encode("utf-8")) or [10]
    model.eval()
    with torch.no_grad():
        for _ in range(a.sample):
            x = torch.tensor([ctx[-a.seq_len:]])
            logits, _ = model(x)
            probs = torch.softmax(logits[0, -1].double() / a.temperature, dim=-1)
            tok = torch.multinomial(probs, 1, generator=g).float()
            if world.rank != 0:
                tok.zero_()
            ctx.append(int(world.sum_(tok).item()))
    model.train()
    return bytes(ctx).decode("utf-8", errors="replace")


def default_threads():
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    local = int(os.environ.get("OMPI_COMM_WORLD_LOCAL_SIZE", os.environ.get("MPI_LOCALNRANKS", "1")))
    return max(1, cores // max(1, local))


def main(argv=None):
    a = parse_args(argv)
    engine = import_engine(required=a.ffn == "engine")
    world = World(engine)
    if a.batch % world.size:
        raise ExampleError(f"--batch {a.batch} must be divisible by the {world.size} ranks")
    if a.ffn == "torch" and a.layer_config:
        raise ExampleError(f"--config {' '.join(a.config)} applies to --ffn engine only")
    par_keys = ("data_parallelism", "fsdp_parallelism", "expert_parallelism")
    if a.ffn == "engine" and world.size > 1 and not any(k in a.layer_config for k in par_keys):
        a.layer_config["expert_parallelism"] = world.size  # the default under mpirun: experts over the ranks
    if a.layer_config.get("fsdp_parallelism", 1) != 1:
        raise ExampleError("--config fsdp_parallelism: the example supports expert and data parallelism only")
    say = print if world.rank == 0 else (lambda *x, **k: None)
    threads = a.threads or default_threads()
    t_torch, t_engine = a.torch_threads or threads, a.engine_threads or threads
    torch.set_num_threads(t_torch)
    if engine:
        engine.set_num_threads(t_engine)
    torch.manual_seed(a.seed)

    train_data, heldout, files = util.load_fortunes(a.data_dir, a.heldout_every)
    if heldout.numel() <= a.seq_len + 1:
        raise ExampleError(f"{a.data_dir}: held-out split of {heldout.numel()} bytes is shorter than --seq-len {a.seq_len}")
    h_unigram = util.unigram_entropy(train_data)

    dtype = util_dtype(a.dtype)
    routing = {"load_balance_loss_weight": a.lb_weight, "router_z_loss_weight": a.z_weight}
    if a.ffn == "engine":
        def make_ffn():
            return engine.torch.MoELayer(num_experts=a.experts, num_experts_per_tok=a.top_k, emb_dim=a.dim,
                                         moe_mlp_dim=a.mlp_dim, dtype=dtype, **routing, **a.layer_config)
    else:
        def make_ffn():
            return util.TorchMoE(a.experts, a.top_k, a.dim, a.mlp_dim, dtype=dtype, impl=a.torch_block, **routing)
    model = TinyMixtral(a, make_ffn)
    init = init_weights(a)
    names = dict(model.named_parameters())
    if set(names) != set(init):
        raise ExampleError(f"model parameters {sorted(set(names) ^ set(init))} do not match the initializer's")
    full_shapes = {n: tuple(init[n].shape) for n in names}
    with torch.no_grad():
        for n, p in names.items():
            if a.ffn == "torch" or ".ffn." not in n:
                p.copy_(init[n])
        if a.ffn == "engine":
            for i, b in enumerate(model.blocks):
                b.ffn.load_mixtral_block(to_mixtral(init, f"blocks.{i}.ffn.", a.experts))
    shard = Sharding(model, init, a)
    decay = [p for n, p in names.items() if p.dim() >= 2 and not n.endswith("pos")]
    no_decay = [p for n, p in names.items() if not (p.dim() >= 2 and not n.endswith("pos"))]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": a.weight_decay},
                             {"params": no_decay, "weight_decay": 0.0}], lr=a.lr, betas=(0.9, 0.95), eps=1e-8)

    os.makedirs(a.out, exist_ok=True)
    metrics_path = os.path.join(a.out, "metrics.jsonl")
    start = 0
    if a.resume:
        start, path = load_checkpoint(model, opt, a, shard)
        if world.rank == 0:
            keep_metrics_until(metrics_path, start)
        say(f"resumed from {path} at step {start}")
    elif world.rank == 0 and os.path.exists(metrics_path):
        os.unlink(metrics_path)

    n_params = sum(init[n].numel() for n in names)
    n_moe = sum(init[n].numel() for n in names if ".ffn." in n)
    # forward FLOPs per token: attention projections, scores (causal rows, computed full), the MoE
    # FFN (K experts: 3 D x F matmuls) and router, the output projection
    D, Fd, S = a.dim, a.mlp_dim, a.seq_len
    f_attn = a.layers * (8 * D * D + 4 * S * D)
    f_moe = a.layers * (a.top_k * 6 * D * Fd + 2 * D * a.experts)
    f_head = 2 * D * 256
    moe_share = f_moe / (f_attn + f_moe + f_head)
    say(f"tiny_mixtral: --ffn {a.ffn}{' (' + a.torch_block + ')' if a.ffn == 'torch' else ''}, dtype {a.dtype}, "
        f"{world.size} rank(s), threads torch {t_torch} engine {t_engine if engine else '-'}")
    say(f"model: {a.layers} blocks, D={D} heads={a.heads} E={a.experts} K={a.top_k} F={Fd}, seq {S}, "
        f"batch {a.batch} ({a.batch * S} tokens/step); {n_params / 1e6:.2f} M parameters ({n_moe / 1e6:.2f} M in "
        f"experts); MoE FFNs {moe_share:.0%} of the forward FLOPs")
    if world.rank == 0:
        print_config(a, t_torch, t_engine if engine else None, world, model)
    say(f"corpus: {len(files)} fortune files in {a.data_dir}: {train_data.numel()} training bytes, "
        f"{heldout.numel()} held-out; unigram (byte) entropy of the training bytes {h_unigram:.4f} nats "
        f"({h_unigram / math.log(2):.3f} bits)")

    end = a.until or a.steps
    metrics = open(metrics_path, "a") if world.rank == 0 else None
    t_run = time.perf_counter()
    rates = []
    val = None
    for step in range(start, end):
        t0 = time.perf_counter()
        x, y = batch(train_data, a, step, world, generator_seed=a.seed)
        lr = lr_at(a, step)
        for gr in opt.param_groups:
            gr["lr"] = lr
        logits, auxes = model(x)
        ce = F.cross_entropy(logits.reshape(-1, 256), y.reshape(-1))
        lb = sum(aux["load_balance_loss"] for aux in auxes)
        zl = sum(aux["z_loss"] for aux in auxes)
        loss = ce + lb + zl
        opt.zero_grad(set_to_none=True)
        # The global loss is the mean over ranks of the cross-entropy plus the aux losses. Each rank
        # backpropagates its share: ce / W, and the engine's aux losses (global values, the same on
        # every rank; each rank's backward yields its own tokens' part of their gradient) at weight
        # 1; the plain block's aux losses are this rank's own, so they are averaged like ce. The
        # engine sums the expert and router gradients over the ranks; the replicated parameters'
        # gradients are summed below.
        if a.ffn == "engine":
            (ce / world.size + lb + zl).backward()
        else:
            (loss / world.size).backward()
        sq = torch.zeros(2, dtype=torch.float32)
        for n, p in names.items():
            if p.grad is None:
                p.grad = torch.zeros_like(p)
            if not shard.sharded(n) and not engine_summed(n, a):
                world.sum_(p.grad)
            sq[1 if shard.sharded(n) else 0] += p.grad.pow(2).sum()
        sq[1:] = world.sum_(sq[1:].clone())
        gnorm = float(sq.sum().sqrt())
        if a.grad_clip > 0 and gnorm > a.grad_clip:
            for p in names.values():
                p.grad.mul_(a.grad_clip / (gnorm + 1e-6))
        if not math.isfinite(gnorm) or not math.isfinite(float(loss)):
            raise ExampleError(f"step {step + 1}: non-finite loss {float(loss)} or gradient norm {gnorm}; "
                               f"the last checkpoint in {a.out} is intact")
        opt.step()
        stats = torch.tensor([float(loss), float(ce), float(lb), float(zl)], dtype=torch.float32)
        world.sum_(stats)
        stats /= world.size
        dt = time.perf_counter() - t0
        tokens = a.batch * a.seq_len
        if step > start:
            rates.append((tokens, dt))
        done = step + 1
        rec = {"step": done, "loss": float(stats[0]), "ce": float(stats[1]), "lb": float(stats[2]),
               "z": float(stats[3]), "lr": lr, "grad_norm": gnorm, "step_ms": dt * 1e3, "tokens": tokens,
               "tokens_per_s": tokens / dt,
               "load": [{"max": float(aux["group_sizes"].max()), "mean": float(aux["group_sizes"].float().mean())}
                        for aux in auxes]}
        if done % a.eval_every == 0 or done == end:
            val = evaluate(model, heldout, a, world)
            rec["val_loss"] = val
        if metrics:
            metrics.write(json.dumps(rec) + "\n")
            metrics.flush()
        if done % a.log_every == 0 or done == start + 1 or done == end or "val_loss" in rec:
            rate = sum(n for n, _ in rates[-20:]) / sum(t for _, t in rates[-20:]) if rates else tokens / dt
            eta = (end - done) * tokens / rate
            say(f"step {done}/{end}  loss {rec['loss']:.4f} (ce {rec['ce']:.4f})  lr {lr:.2e}  "
                f"{rate:,.0f} tokens/s  ETA {fmt_time(eta)}"
                + (f"  | held-out {val:.4f} nats (unigram {h_unigram:.4f})" if "val_loss" in rec else ""),
                flush=True)
        if (a.checkpoint_every and done % a.checkpoint_every == 0) or done == end:
            save_checkpoint(model, opt, a, done, world, shard, full_shapes)
    if metrics:
        metrics.close()
    wall = time.perf_counter() - t_run
    mean_rate = sum(n for n, _ in rates) / sum(t for _, t in rates) if rates else float("nan")
    if val is not None:
        say(f"held-out loss {val:.4f} nats/byte vs unigram entropy {h_unigram:.4f} "
            f"({val / h_unigram:.2f}x); {mean_rate:,.0f} tokens/s (steps after the first), "
            f"{wall:.1f} s for {end - start} steps")
    if a.sample and end == a.steps:
        text = sample(model, a, world)
        say("sample:\n" + text)
    say(f"metrics: {metrics_path} (draw: build/moe report {metrics_path}); checkpoints: {a.out}")
    return 0


def print_config(a, t_torch, t_engine, world, model):
    """The resolved settings: every flag's value (defaults filled in, threads resolved) and the
    MoE layers' config keys that differ from the engine's defaults (docs/config.md)."""
    skip = {"config", "layer_config", "threads", "torch_threads", "engine_threads"}
    flags = {k: v for k, v in sorted(vars(a).items()) if k not in skip}
    flags["threads"] = f"torch {t_torch}, engine {t_engine if t_engine else '-'} (per rank)"
    flags["ranks"] = world.size
    print("config:")
    for k, v in flags.items():
        print(f"  {k.replace('_', '-'):<17} {v}")
    ffn = model.blocks[0].ffn
    table = getattr(getattr(ffn, "_engine", None), "config_table", None)
    if table:
        keys = [f"{k}={v}" for k, v, src in table() if src != "default"]
        print("  moe layer         " + " ".join(keys))


def engine_summed(name, a):
    """Parameters whose gradient the engine already reduces over the ranks: every MoELayer
    parameter (the router, and the experts whether sharded or replicated by data parallelism)."""
    return a.ffn == "engine" and ".ffn." in name


if __name__ == "__main__":
    try:
        sys.exit(main())
    except ExampleError as e:
        if "OMPI_COMM_WORLD_SIZE" in os.environ or "PMI_SIZE" in os.environ:
            raise  # under mpirun: moe_engine's excepthook ends every rank with the message
        print(f"tiny_mixtral: error: {e}", file=sys.stderr)
        sys.exit(2)
