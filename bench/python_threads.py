"""Do the engine's compute pool and torch's intra-op threads get in each other's way?

PYTHONPATH=build/python /usr/bin/python3 bench/python_threads.py [--iters N]

Prints (1) the CPU time the process burns while the main thread sleeps right after an engine
step (spinning pool threads would burn up to threads x the sleep), and (2) the median time of a
torch op alone vs the same op right after each engine step, in one run (a ratio: robust to a busy
machine). docs/python.md ("Threads") quotes its output.
"""

import argparse
import statistics
import time

import torch

import moe_engine
from moe_engine.torch import MoELayer

ap = argparse.ArgumentParser()
ap.add_argument("--iters", type=int, default=30)
args = ap.parse_args()

layer = MoELayer(num_experts=8, num_experts_per_tok=2, emb_dim=256, moe_mlp_dim=512, dtype=torch.float32)
x = torch.randn(512, 256, requires_grad=True)
a, b = torch.randn(512, 512), torch.randn(512, 512)


def engine_step():
    y, aux = layer(x)
    (y.square().mean() + aux["load_balance_loss"]).backward()


def torch_op():
    t0 = time.perf_counter()
    for _ in range(4):
        torch.mm(a, b)
    return time.perf_counter() - t0


engine_step()
torch_op()
t0 = time.process_time()
time.sleep(0.5)
idle_cpu = time.process_time() - t0

alone = [torch_op() for _ in range(args.iters)]
after = []
for _ in range(args.iters):
    engine_step()
    after.append(torch_op())
ma, mb = statistics.median(alone), statistics.median(after)
print(f"engine threads {moe_engine.get_num_threads()}, torch threads {torch.get_num_threads()}")
print(f"CPU burnt during a 0.5 s sleep after an engine step: {idle_cpu * 1e3:.1f} ms")
print(f"torch 4x mm(512x512): alone {ma * 1e3:.2f} ms, right after an engine step {mb * 1e3:.2f} ms "
      f"(ratio {mb / ma:.2f})")
