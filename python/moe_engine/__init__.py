"""MoE Engine from Python: the engine's routed Mixture-of-Experts layer (docs/python.md).

    import moe_engine
    from moe_engine.torch import MoELayer

Module functions: world_size(), rank(), all_reduce_(tensor, axis="data"), set_num_threads(n),
get_num_threads(); MoeError is raised for every engine error (bad input, config, files).

Threads: unless set explicitly (set_num_threads or MOE_NUM_THREADS), the engine's compute pool
follows torch.get_num_threads() (checked on every layer call), and under mpirun at most this
rank's share of the host's cores.

Under mpirun, importing this package initializes MPI through mpi4py (when installed; thread level
MPI_THREAD_MULTIPLE, finalized by mpi4py at exit) and installs a sys.excepthook that ends the whole
job on an uncaught exception of any rank: "moe: fatal on rank R: <exception>".
"""

import operator as _operator
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


# --- The compute pool's size ---------------------------------------------------------------------
# Explicit (set_num_threads, or MOE_NUM_THREADS, which the pool itself reads) wins; otherwise the
# pool follows torch's intra-op threads, capped under mpirun by this rank's share of the host.


def _env_threads():
    """MOE_NUM_THREADS as the pool reads it (a positive integer), else None."""
    try:
        n = int(_os.environ.get("MOE_NUM_THREADS", "").strip())
    except ValueError:
        return None
    return n if n > 0 else None


_explicit = _env_threads() is not None  # the pool's size was chosen by the user
_followed = None  # the size last applied by following torch (None: not yet)
_share = None  # this rank's share of the host's cores under mpirun (computed once)


def _local_ranks():
    """Ranks of this job on this host: the launcher's count (Open MPI's OMPI_COMM_WORLD_LOCAL_SIZE,
    MPICH's MPI_LOCALNRANKS), else the size of MPI's shared-memory split of the world (computed at
    import, see _LOCAL_RANKS_MPI), else the world's size (as if every rank shared this host)."""
    for var in ("OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS"):
        try:
            n = int(_os.environ.get(var, ""))
        except ValueError:
            continue
        if n > 0:
            return n
    if _LOCAL_RANKS_MPI:
        return _LOCAL_RANKS_MPI
    return max(1, _C.world_size())


def _rank_share():
    """Under mpirun: the host's hardware threads divided among its ranks (at least 1), and no more
    than this process may run on (its CPU affinity, when the launcher binds ranks)."""
    global _share
    if _share is None:
        cpus = _os.cpu_count() or 1
        try:
            allowed = len(_os.sched_getaffinity(0))
        except (AttributeError, OSError):
            allowed = cpus
        _share = max(1, min(cpus // _local_ranks(), allowed))
    return _share


def _default_threads():
    """The pool's size when none was set: torch's intra-op threads when torch is loaded (else the
    pool's own default, the hardware threads), and under mpirun at most this rank's share."""
    torch = _sys.modules.get("torch")
    n = torch.get_num_threads() if torch is not None and hasattr(torch, "get_num_threads") else None
    if _launched:
        n = _rank_share() if n is None else min(n, _rank_share())
    return n


def _sync_threads():
    """Applies the default pool size (called by every MoELayer call, cheap when nothing changed):
    nothing when the size was set explicitly; else resizes the pool when torch's thread count (or
    the mpirun share) differs from what was last applied."""
    global _followed
    if _explicit:
        return
    n = _default_threads()
    if n is not None and n != _followed:
        _C.set_num_threads(max(1, n))
        _followed = n


def set_num_threads(n):
    """Sets the threads of the engine's compute pool (counting the calling thread) and stops it
    following torch.get_num_threads() (see the module's docstring). `n`: an int >= 1 (TypeError
    for anything else that is not an integer, as torch.set_num_threads; MoeError for n < 1).
    Call it between engine calls, not during one."""
    global _explicit
    if isinstance(n, bool):
        raise TypeError("set_num_threads: expected an int, got bool")
    try:
        count = _operator.index(n)
    except TypeError:
        raise TypeError(f"set_num_threads: expected an int, got {type(n).__name__} {n!r}") from None
    _C.set_num_threads(count)
    _explicit = True


def get_num_threads():
    """Threads of the engine's compute pool, after applying the default (torch's count) when no
    size was set explicitly."""
    _sync_threads()
    return _C.get_num_threads()


def _mpi_local_ranks():
    """Under a launcher that does not say how many ranks share this host: the size of MPI's
    shared-memory split of the world (collective: every rank imports moe_engine), else 0."""
    if not _launched or _MPI is None:
        return 0
    if any(v in _os.environ for v in ("OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS")):
        return 0
    try:
        node = _MPI.COMM_WORLD.Split_type(_MPI.COMM_TYPE_SHARED)
    except Exception:  # an MPI without shared-memory splits: fall back to the world's size
        return 0
    n = node.Get_size()
    node.Free()
    return n


_LOCAL_RANKS_MPI = _mpi_local_ranks()


def _excepthook(exc_type, exc, tb):
    """Under mpirun: print the traceback, then end every rank with the message (as the CLI does),
    so no peer is left waiting in a collective."""
    _traceback.print_exception(exc_type, exc, tb)
    _sys.stderr.flush()
    text = "".join(_traceback.format_exception_only(exc_type, exc)).strip()
    _C.abort(f"uncaught Python exception: {text}")


if _launched:
    _sys.excepthook = _excepthook
