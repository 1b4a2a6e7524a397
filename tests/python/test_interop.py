"""Zero-copy tensors in and out, errors as moe_engine.MoeError naming the thing, the thread pool."""

import os
import threading
import time

import numpy as np
import pytest
import torch

import moe_engine
from moe_engine import MoeError
from moe_engine.torch import MoELayer

E, K, D, F, T = 4, 2, 16, 24, 12


def make_layer(**keys):
    return MoELayer(num_experts=E, num_experts_per_tok=K, emb_dim=D, moe_mlp_dim=F, dtype=torch.float32, **keys)


def test_output_is_the_engines_buffer():
    layer = make_layer()
    x = torch.randn(T, D)
    with torch.no_grad():
        y, aux = layer(x)
        before = moe_engine._C.tensor_memory_bytes()
        del y  # y's storage is engine memory: releasing the torch tensor releases it
        assert before - moe_engine._C.tensor_memory_bytes() >= T * D * 4
        y2, _ = layer(x)
        # the same y again, and torch reads engine memory in place: writes through it are seen
        y2c = y2.clone()
        y2.add_(1.0)
        assert torch.equal(y2, y2c + 1.0)


def test_parameters_live_in_engine_memory_and_are_read_in_place():
    layer = make_layer()
    x = torch.randn(T, D)
    with torch.no_grad():
        y0, _ = layer(x)
        layer.wo.mul_(2.0)  # an in-place update (what an optimizer does) is what the next forward reads
        y1, _ = layer(x)
    assert torch.allclose(y1, 2 * y0, rtol=1e-6, atol=1e-6)


def test_input_is_not_copied():
    base = moe_engine._C.tensor_memory_bytes()
    x = torch.randn(1000, 64)
    # A zero-copy view: the engine sees torch's pointer, allocates nothing for it.
    assert moe_engine._C.view_address(x) == x.data_ptr()
    assert moe_engine._C.tensor_memory_bytes() == base
    xb = torch.randn(8, 4).to(torch.bfloat16)
    assert moe_engine._C.view_address(xb) == xb.data_ptr()
    xn = np.ones((3, 5), dtype=np.float32)
    assert moe_engine._C.view_address(xn) == xn.ctypes.data
    sliced = torch.randn(10, 64)[3:7]  # contiguous rows at an offset (not 64-byte aligned): still a view
    assert moe_engine._C.view_address(sliced) == sliced.data_ptr()


def test_unaligned_views_give_the_same_results():
    layer = make_layer()
    x = torch.randn(T, D)
    big = torch.empty(T * D + 1)
    big[1:] = x.flatten()
    xu = big[1:].view(T, D)  # 4 bytes past a 64-byte boundary
    assert xu.data_ptr() % 64 == 4
    with torch.no_grad():
        assert torch.equal(layer(x)[0], layer(xu)[0])


def test_bad_inputs_raise_moe_error_naming_the_tensor():
    layer = make_layer()
    with pytest.raises(MoeError, match=r"x: expected the last dim to be emb_dim = 16, got shape \[12, 17\]"):
        layer(torch.randn(T, D + 1))
    with pytest.raises(MoeError, match=r"x: dtype torch.float16 is not supported \(expected torch.float32 or torch.bfloat16"):
        layer(torch.randn(T, D, dtype=torch.float16))  # float64 is supported (test_dtypes.py)
    with pytest.raises(MoeError, match=r"x: expected a CPU tensor, got device 'meta'"):
        layer(torch.empty(T, D, device="meta"))
    with pytest.raises(MoeError, match=r"x: expected a torch.Tensor"):
        layer([[0.0] * D] * T)
    with pytest.raises(MoeError, match=r"x: expected shape \[T, 16\] or \[B, S, 16\] .*got \[2, 3, 4, 16\]"):
        layer(torch.randn(2, 3, 4, D))
    layer.wo.data = torch.randn(E, F, D + 1)
    with pytest.raises(MoeError, match=r"parameter 'experts.wo': expected shape \[4, 24, 16\], got \[4, 24, 17\]"):
        layer(torch.randn(T, D))


def test_bad_config_raises_moe_error_naming_the_key():
    with pytest.raises(MoeError, match=r"unknown config key 'num_expert' \(did you mean 'num_experts'\?\)"):
        make_layer(num_expert=3)
    with pytest.raises(MoeError, match=r"capacity_factor"):
        make_layer(capacity_factor=0)
    with pytest.raises(MoeError, match=r"dtype: expected torch.float32 or torch.bfloat16"):
        MoELayer(num_experts=E, num_experts_per_tok=K, emb_dim=D, moe_mlp_dim=F, dtype=torch.float16)
    with pytest.raises(MoeError, match=r"expert_parallelism"):  # a multi-rank mesh on one process
        make_layer(expert_parallelism=2)
    assert issubclass(MoeError, RuntimeError)


def test_bad_mixtral_state_dict():
    layer = make_layer()
    torch.manual_seed(0)
    sd = {"gate.weight": torch.randn(E, D)}
    for j in range(E):
        sd[f"experts.{j}.w1.weight"] = torch.randn(F, D)
        sd[f"experts.{j}.w3.weight"] = torch.randn(F, D)
        sd[f"experts.{j}.w2.weight"] = torch.randn(D, F)
    layer.load_mixtral_block(sd)
    bad = dict(sd)
    del bad["experts.3.w3.weight"]
    with pytest.raises(MoeError, match=r"missing 'experts.3.w3.weight' \(expected shape \[24, 16\]\)"):
        layer.load_mixtral_block(bad)
    bad = dict(sd, **{"experts.1.w2.weight": torch.randn(F, D)})
    with pytest.raises(MoeError, match=r"'experts.1.w2.weight': expected shape \[16, 24\], got \[24, 16\]"):
        layer.load_mixtral_block(bad)
    with pytest.raises(MoeError, match=r"unexpected key 'experts.4.w1.weight'"):
        layer.load_mixtral_block(dict(sd, **{"experts.4.w1.weight": torch.randn(F, D)}))


def test_all_reduce_single_process_is_identity():
    t = torch.randn(5)
    c = t.clone()
    assert moe_engine.all_reduce_(t) is t and torch.equal(t, c)
    with pytest.raises(MoeError, match=r"unknown axis 'expert'"):
        moe_engine.all_reduce_(t, axis="expert")
    with pytest.raises(MoeError, match=r"expected float32, got bf16"):
        moe_engine.all_reduce_(t.to(torch.bfloat16))


def test_thread_pool_size_and_results_do_not_depend_on_it():
    n0 = moe_engine.get_num_threads()
    layer = make_layer()
    x = torch.randn(64, D, requires_grad=True)
    outs = []
    for n in (1, 3, n0):
        moe_engine.set_num_threads(n)
        assert moe_engine.get_num_threads() == n
        layer.zero_grad()
        x.grad = None
        y, aux = layer(x)
        (y.square().sum() + aux["load_balance_loss"]).backward()
        outs.append([y.detach().clone(), x.grad.clone()] + [p.grad.clone() for p in layer.parameters()])
    for o in outs[1:]:
        assert all(torch.equal(a, b) for a, b in zip(outs[0], o))
    with pytest.raises(MoeError, match=r"set_num_threads: expected n >= 1, got 0"):
        moe_engine.set_num_threads(0)
    assert moe_engine.get_num_threads() == n0


def thread_states():
    """{tid: state letter} of this process's threads other than the caller (R: running or runnable)."""
    me = str(threading.get_native_id())
    out = {}
    for t in os.listdir("/proc/self/task"):
        if t == me:
            continue
        try:
            with open(f"/proc/self/task/{t}/stat") as f:
                stat = f.read()
        except FileNotFoundError:
            continue
        out[t] = stat[stat.rindex(")") + 2]
    return out


def test_pool_threads_sleep_between_engine_calls():
    """The engine's pool must not spin while torch (or anything else) runs between engine calls:
    shortly after a step every other thread is asleep (a spinning thread reads R, running or
    runnable, whatever the machine's load)."""
    moe_engine.set_num_threads(max(3, moe_engine.get_num_threads()))
    layer = make_layer()
    x = torch.randn(256, D, requires_grad=True)
    y, aux = layer(x)
    (y.square().sum()).backward()
    time.sleep(0.2)
    runnable = {}
    for _ in range(20):
        for t, st in thread_states().items():
            runnable[t] = runnable.get(t, 0) + (st == "R")
        time.sleep(0.01)
    busy = {t: n for t, n in runnable.items() if n > 10}
    assert not busy, f"threads runnable in most samples while idle (spinning): {busy}"
