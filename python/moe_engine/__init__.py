"""MoE Engine from Python: the engine's routed Mixture-of-Experts layer (docs/python.md).

    import moe_engine
    from moe_engine.torch import MoELayer

Module functions: world_size(), rank(), all_reduce_(tensor, axis="data"), set_num_threads(n),
get_num_threads(); MoeError is raised for every engine error (bad input, config, files).

Under mpirun, importing this package initializes MPI through mpi4py (when installed; thread level
MPI_THREAD_MULTIPLE, finalized by mpi4py at exit) and installs a sys.excepthook that ends the whole
job on an uncaught exception of any rank: "moe: fatal on rank R: <exception>".
"""

import os as _os
import sys as _sys
import traceback as _traceback

_LAUNCHER_VARS = ("OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK")
_launched = any(v in _os.environ for v in _LAUNCHER_VARS)

if _launched:
    try:  # one MPI for the engine and mpi4py: mpi4py initializes it, the engine reuses it
        from mpi4py import MPI as _MPI  # noqa: F401
    except ImportError:
        _MPI = None

from . import _moe_engine as _C  # noqa: E402
from ._moe_engine import MoeError, __version__  # noqa: E402,F401

__all__ = ["MoeError", "__version__", "world_size", "rank", "all_reduce_", "set_num_threads", "get_num_threads"]


def world_size():
    """Ranks of the job: the MPI world size under mpirun, else 1."""
    return _C.world_size()


def rank():
    """This process's rank (0 without mpirun)."""
    return _C.rank()


def all_reduce_(tensor, axis="data"):
    """In place: tensor := the sum of `tensor` over the ranks of `axis`, added in rank order in f32
    (the same bits on every rank, run after run). Returns `tensor`.

    axis "data" (or "world"): every rank of the job. The MoE layer shards the tokens over all
    three mesh axes (data, fsdp, expert), so every rank holds its own tokens and the rest of a
    model trains data-parallel over the whole world: sum its gradients with this. `tensor`: a
    contiguous float32 CPU tensor (torch or anything with __dlpack__). Without mpirun: a no-op.
    """
    if axis not in ("data", "world"):
        raise MoeError(f"all_reduce_: unknown axis '{axis}' (expected 'data' or 'world')")
    target = tensor.detach() if hasattr(tensor, "detach") else tensor
    _C.all_reduce_(target)
    return tensor


def set_num_threads(n):
    """Threads of the engine's compute pool (counting the calling thread); default MOE_NUM_THREADS
    or the hardware threads. Call it between engine calls, not during one."""
    _C.set_num_threads(int(n))


def get_num_threads():
    """Threads of the engine's compute pool."""
    return _C.get_num_threads()


def _excepthook(exc_type, exc, tb):
    """Under mpirun: print the traceback, then end every rank with the message (as the CLI does),
    so no peer is left waiting in a collective."""
    _traceback.print_exception(exc_type, exc, tb)
    _sys.stderr.flush()
    text = "".join(_traceback.format_exception_only(exc_type, exc)).strip()
    _C.abort(f"uncaught Python exception: {text}")


if _launched:
    _sys.excepthook = _excepthook
