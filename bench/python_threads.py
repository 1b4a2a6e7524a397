"""Do the engine's compute pool and torch's intra-op threads get in each other's way?

PYTHONPATH=build/python /usr/bin/python3 bench/python_threads.py [--iters N] [--torch-threads N]

Prints (1) the CPU time the process burns while the main thread sleeps 1 s right after an engine
step (spinning pool threads would burn up to threads x the sleep), and (2) the median time of a
torch op alone vs the same op right after each engine step, and of an engine step after a pause vs
right after a torch op, in one run (ratios: more robust to a busy machine). docs/python.md ("Threads") quotes its output.
"""

import argparse
import statistics
import time

import torch

import moe_engine
from moe_engine.torch import MoELayer

ap = argparse.ArgumentParser()
ap.add_argument("--iters", type=int, default=30)
ap.add_argument("--torch-threads", type=int, default=0, help="torch.set_num_threads (0: torch's default)")
args = ap.parse_args()
if args.torch_threads:
    torch.set_num_threads(args.torch_threads)

layer = MoELayer(num_experts=8, num_experts_per_tok=2, emb_dim=256, moe_mlp_dim=512, dtype=torch.float32)
x = torch.randn(512, 256, requires_grad=True)
a, b = torch.randn(512, 512), torch.randn(512, 512)


def engine_step():
    t0 = time.perf_counter()
    y, aux = layer(x)
    (y.square().mean() + aux["load_balance_loss"]).backward()
    return time.perf_counter() - t0


def torch_op():
    t0 = time.perf_counter()
    for _ in range(4):
        torch.mm(a, b)
    return time.perf_counter() - t0


engine_step()
torch_op()
t0 = time.process_time()
time.sleep(1.0)
idle_cpu = time.process_time() - t0

alone, after, e_alone, e_after = [], [], [], []
for _ in range(args.iters):  # interleaved, so both see the same machine load
    alone.append(torch_op())
    time.sleep(0.01)  # both pools asleep
    e_alone.append(engine_step())
    after.append(torch_op())
    e_after.append(engine_step())
ma, mb = statistics.median(alone), statistics.median(after)
print(f"engine threads {moe_engine.get_num_threads()}, torch threads {torch.get_num_threads()}")
print(f"CPU burnt during a 1 s sleep after an engine step: {idle_cpu * 1e3:.1f} ms")
print(f"torch 4x mm(512x512): alone {ma * 1e3:.2f} ms, right after an engine step {mb * 1e3:.2f} ms "
      f"(ratio {mb / ma:.2f})")


def small_ops():
    t0 = time.perf_counter()
    for _ in range(20):
        x.detach().square().mean()
    return time.perf_counter() - t0


def busy():
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < 0.05:
        pass


small = {"an engine step": [], "a 50 ms busy loop": [], "a 50 ms sleep": []}
for _ in range(10):
    for what, f in (("an engine step", engine_step), ("a 50 ms busy loop", busy),
                    ("a 50 ms sleep", lambda: time.sleep(0.05))):
        f()
        small[what].append(small_ops())
print("20 small torch ops ([512, 256] square + mean), median ms right after: " +
      ", ".join(f"{k} {statistics.median(v) * 1e3:.1f}" for k, v in small.items()))
ea, eb = statistics.median(e_alone), statistics.median(e_after)
print(f"engine step (fwd+bwd, T=512, D=256, F=512, E=8, K=2): after a 10 ms pause {ea * 1e3:.2f} ms, right after "
      f"a torch op {eb * 1e3:.2f} ms (ratio {eb / ea:.2f})")
