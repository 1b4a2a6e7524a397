"""Run under `mpirun -np 2` by test_threads.py (MOE_NUM_THREADS unset): the ranks on this host
counted from Open MPI's variable and from MPI's shared-memory split; the engine pool's default is
this rank's share of the host's cores, and no more than torch's threads; explicit wins.
Prints "OK threads rank R <share>" on success."""

import os

import torch

import moe_engine
from moe_engine import _moe_engine as C
from moe_engine.torch import MoELayer

R = moe_engine.rank()
assert moe_engine.world_size() == 2
assert os.environ["OMPI_COMM_WORLD_LOCAL_SIZE"] == "2"
assert moe_engine._LOCAL_RANKS_MPI == 0  # the launcher said it: no split at import
assert moe_engine._local_ranks() == 2, moe_engine._local_ranks()  # both ranks on this host
os.environ.pop("OMPI_COMM_WORLD_LOCAL_SIZE")  # as under a launcher that does not say: MPI's split
assert moe_engine._mpi_local_ranks() == 2, moe_engine._mpi_local_ranks()  # what the import computes then
cpus, allowed = os.cpu_count(), len(os.sched_getaffinity(0))
share = max(1, min(cpus // 2, allowed))
layer = MoELayer(num_experts=4, num_experts_per_tok=2, emb_dim=16, moe_mlp_dim=16, dtype=torch.float32,
                 distributed=False)
torch.set_num_threads(cpus * 4)  # more than the share: capped
layer(torch.randn(8, 16))
assert C.get_num_threads() == share, (C.get_num_threads(), share)
torch.set_num_threads(1)  # fewer: followed
layer(torch.randn(8, 16))
assert C.get_num_threads() == 1, C.get_num_threads()
moe_engine.set_num_threads(3)  # explicit wins
torch.set_num_threads(cpus * 4)
layer(torch.randn(8, 16))
assert C.get_num_threads() == 3, C.get_num_threads()
print(f"OK threads rank {R} {share}", flush=True)
