#!/usr/bin/env python3
"""Peak memory of gradient accumulation through the PyTorch MoELayer (docs/benchmarks.md, "Memory").

    PYTHONPATH=build/python /usr/bin/python3 scripts/torch_layer_memory.py [--accumulate-grads]
        [--steps 3] [--tokens 512] [--experts 64 --top-k 8 --emb-dim 2048 --mlp-dim 1024]

Runs `steps` forward + backward passes (bf16 compute, f32 master parameters, gradients kept and
summed as in gradient accumulation) and prints the process's peak RSS above its RSS before the layer
was made, next to the analytic minimum of the step: f32 weights, f32 gradients, the bf16 copies of
the expert weights, the tensors the backward reads and the step's inputs and outputs (the engine's
step_minimum, MoELayer.step_memory_minimum). The default shape is OLMoE-1B-7B's experts. Run
each setting in its own process: peak RSS never goes down.
"""

import argparse
import resource


def rss_mib():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024.0
    return 0.0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--accumulate-grads", action="store_true")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--tokens", type=int, default=512)
    ap.add_argument("--experts", type=int, default=64)
    ap.add_argument("--top-k", type=int, default=8)
    ap.add_argument("--emb-dim", type=int, default=2048)
    ap.add_argument("--mlp-dim", type=int, default=1024)
    a = ap.parse_args()

    import torch
    from moe_engine.torch import MoELayer

    torch.manual_seed(0)
    xs = [torch.randn(a.tokens, a.emb_dim) for _ in range(a.steps)]
    base = rss_mib()
    layer = MoELayer(num_experts=a.experts, num_experts_per_tok=a.top_k, emb_dim=a.emb_dim,
                     moe_mlp_dim=a.mlp_dim, dtype=torch.bfloat16, accumulate_grads=a.accumulate_grads)
    for x in xs:
        y, aux = layer(x)
        (y.float().square().mean() + aux["load_balance_loss"] + aux["z_loss"]).backward()
        del y, aux
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0 - base
    m = {k: v / 2**20 for k, v in layer.step_memory_minimum(a.tokens, torch.float32).items()}
    total = m.pop("total")
    print(f"shape T={a.tokens} D={a.emb_dim} F={a.mlp_dim} E={a.experts} K={a.top_k}, {a.steps} fwd+bwd, "
          f"accumulate_grads={a.accumulate_grads}")
    print("minimum: " + " + ".join(f"{k} {v:.1f} MiB" for k, v in m.items()) + f" = {total:.1f} MiB")
    print(f"peak RSS above the start: {peak:.1f} MiB = {peak / total:.2f}x the minimum")


if __name__ == "__main__":
    main()
