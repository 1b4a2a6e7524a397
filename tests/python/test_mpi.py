"""The distributed MoELayer, all_reduce_ and the exception boundary under `mpirun -np 2`
(tests/python/mpi_ep.py)."""

import os
import pickle
import shutil
import subprocess
import sys
import time

import pytest

from moe_engine import MoeError

MPIRUN = shutil.which("mpirun")
SCRIPT = os.path.join(os.path.dirname(__file__), "mpi_ep.py")
pytestmark = pytest.mark.skipif(MPIRUN is None, reason="mpirun not found")


def mpirun(*args, timeout=120):
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1", MOE_NUM_THREADS="1")
    cmd = [MPIRUN, "--oversubscribe", "-np", "2", sys.executable, SCRIPT, *args]
    t0 = time.monotonic()
    p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
    return p, time.monotonic() - t0


VARIANTS = ["expert_parallelism=2", "expert_parallelism=2,moe_offload_targets=all",
            "expert_parallelism=2,use_ring_of_experts=true", "expert_parallelism=2,num_moe_token_chunks=2",
            "fsdp_parallelism=2", "data_parallelism=2"]


def test_distributed_layer_equals_single_process():
    p, _ = mpirun("ep", *VARIANTS)  # one job for every variant (MPI + torch start-up once)
    assert p.returncode == 0, p.stdout + p.stderr
    for v in VARIANTS:
        for r in (0, 1):
            assert f"variant {v}: ok on rank {r}" in p.stdout, p.stdout + p.stderr
    assert "OK ep rank 0" in p.stdout and "OK ep rank 1" in p.stdout


NONFINITE_VARIANTS = ["expert_parallelism=2", "expert_parallelism=2,moe_offload_targets=all,num_moe_token_chunks=2",
                      "data_parallelism=2"]


def test_one_ranks_nan_makes_every_ranks_aux_losses_nan():
    p, _ = mpirun("nonfinite", *NONFINITE_VARIANTS)
    assert p.returncode == 0, p.stdout + p.stderr
    for v in NONFINITE_VARIANTS:
        for r in (0, 1):
            assert f"variant {v}: ok on rank {r}" in p.stdout, p.stdout + p.stderr
    assert "OK nonfinite rank 0" in p.stdout and "OK nonfinite rank 1" in p.stdout


def test_all_reduce_is_rank_ordered_and_identical():
    p, _ = mpirun("allreduce")
    assert p.returncode == 0, p.stdout + p.stderr
    assert "OK allreduce rank 0" in p.stdout and "OK allreduce rank 1" in p.stdout


def test_python_exception_on_one_rank_ends_the_job():
    p, secs = mpirun("raise", timeout=90)
    out = p.stdout + p.stderr
    assert p.returncode != 0, out
    assert "moe: fatal on rank 1: uncaught Python exception: ValueError: deliberate failure on rank 1" in out, out
    assert "rank 0 was not stopped" not in out
    assert secs < 45, f"the job took {secs:.1f} s to end"


def test_copies_of_a_distributed_layer(tmp_path):
    """Every rank deep-copies / pickles its distributed layer: the copies equal it bit for bit; a
    pickled rank's layer loaded in a single process is refused with the reason. Then rank 1 passes an
    empty batch: rank 0's results equal the single process's on its tokens alone."""
    path = tmp_path / "rank0.pkl"
    p, _ = mpirun("copy", str(path))
    assert p.returncode == 0, p.stdout + p.stderr
    assert "OK copy rank 0" in p.stdout and "OK copy rank 1" in p.stdout
    with open(path, "rb") as f, pytest.raises(MoeError, match=r"holds rank 0's shards of a 2-rank job; it can be "
                                                               r"rebuilt only as rank 0 of 2 .*not as rank 0 of 1"):
        pickle.load(f)
