"""The engine's compute pool: by default it follows torch.get_num_threads() (at the first layer
call and after every torch.set_num_threads), OMP_NUM_THREADS through torch; MOE_NUM_THREADS or
moe_engine.set_num_threads set it explicitly and win; a non-integer count is a TypeError; under
mpirun the default is this rank's share of the host's cores. Each case runs in its own process
(the pool and its policy are per process)."""

import os
import shutil
import subprocess
import sys
import textwrap

import pytest

import moe_engine
from moe_engine import MoeError

HERE = os.path.dirname(__file__)
PRELUDE = """
import torch, moe_engine
from moe_engine import _moe_engine as C
from moe_engine.torch import MoELayer
layer = MoELayer(num_experts=4, num_experts_per_tok=2, emb_dim=16, moe_mlp_dim=16, dtype=torch.float32)
x = torch.randn(8, 16)
"""


def run(code, **env):
    e = {k: v for k, v in os.environ.items() if k not in ("MOE_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS")}
    e.update(env)
    p = subprocess.run([sys.executable, "-c", PRELUDE + textwrap.dedent(code)], env=e, capture_output=True,
                       text=True, timeout=120)
    assert p.returncode == 0, p.stdout + p.stderr
    return p.stdout


def test_default_follows_torch_and_explicit_wins():
    run("""
    layer(x)
    assert C.get_num_threads() == torch.get_num_threads(), (C.get_num_threads(), torch.get_num_threads())
    x.requires_grad_(True)
    outs = []
    for n in (3, 1, 2):
        torch.set_num_threads(n)
        layer.zero_grad(); x.grad = None
        y, aux = layer(x)
        assert C.get_num_threads() == n, (C.get_num_threads(), n)
        (y.square().sum() + aux["load_balance_loss"]).backward()
        outs.append([y.detach(), x.grad.clone()] + [p.grad.clone() for p in layer.parameters()])
    for o in outs[1:]:  # results do not depend on the count
        assert all(torch.equal(a, b) for a, b in zip(outs[0], o))
    torch.set_num_threads(4)
    assert moe_engine.get_num_threads() == 4  # get_num_threads applies the default too
    moe_engine.set_num_threads(3)  # explicit: torch no longer followed
    torch.set_num_threads(1)
    layer(x)
    assert C.get_num_threads() == 3 and moe_engine.get_num_threads() == 3
    """)


def test_environment():
    run("""
    assert torch.get_num_threads() == 3
    layer(x)
    assert C.get_num_threads() == 3, C.get_num_threads()  # OMP_NUM_THREADS, through torch
    """, OMP_NUM_THREADS="3")
    run("""
    assert C.get_num_threads() == 2
    torch.set_num_threads(3)
    layer(x)
    assert C.get_num_threads() == 2 and moe_engine.get_num_threads() == 2  # MOE_NUM_THREADS wins
    moe_engine.set_num_threads(4)
    layer(x)
    assert C.get_num_threads() == 4
    """, MOE_NUM_THREADS="2", OMP_NUM_THREADS="3")


def test_count_type_errors():
    before = moe_engine._moe_engine.get_num_threads()
    for bad in (2.7, 2.0, "2", None, True):
        with pytest.raises(TypeError, match=r"set_num_threads: expected an int, got"):
            moe_engine.set_num_threads(bad)
    with pytest.raises(MoeError, match=r"set_num_threads: expected n >= 1, got 0"):
        moe_engine.set_num_threads(0)
    assert moe_engine._moe_engine.get_num_threads() == before
    numpy = pytest.importorskip("numpy")
    moe_engine.set_num_threads(numpy.int64(before))  # anything with __index__, as torch takes it
    assert moe_engine.get_num_threads() == before


MPIRUN = shutil.which("mpirun")


@pytest.mark.skipif(MPIRUN is None, reason="mpirun not found")
def test_mpirun_default_is_the_ranks_share():
    env = {k: v for k, v in os.environ.items() if k not in ("MOE_NUM_THREADS", "OMP_NUM_THREADS")}
    env.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    cmd = [MPIRUN, "--oversubscribe", "-np", "2", sys.executable, os.path.join(HERE, "mpi_threads.py")]
    p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "OK threads rank 0" in p.stdout and "OK threads rank 1" in p.stdout, p.stdout + p.stderr
