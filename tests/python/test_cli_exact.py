"""MoELayer equals the CLI's `moe step` bit for bit on the same weights, inputs and config; its
initial parameters are the weights `moe init --seed` writes."""

import os
import subprocess

import pytest
import torch

from moe_engine.torch import MoELayer
from reference import read_safetensors

MOE = os.environ.get("MOE_BINARY", os.path.join(os.path.dirname(__file__), "../../build/moe"))
CONFIG = dict(num_experts=8, num_experts_per_tok=2, emb_dim=32, moe_mlp_dim=40, load_balance_loss_weight=0.01,
              router_z_loss_weight=0.001)
NAMES = {"router.kernel": "router", "experts.wi_0": "wi_0", "experts.wi_1": "wi_1", "experts.wi": "wi",
         "experts.wo": "wo"}


@pytest.mark.parametrize("dtype,keys", [("f32", {}), ("bf16", {}), ("f32", {"prefuse_moe_weights": "true"}),
                                        ("bf16", {"capacity_factor": "1.0", "mlp_activation": "gelu"})])
def test_layer_equals_moe_step(tmp_path, dtype, keys):
    cfg = dict(CONFIG, dtype=dtype, seed=7, **keys)
    yml = tmp_path / "c.yml"
    yml.write_text("".join(f"{k}: {v}\n" for k, v in cfg.items()))
    w, i, o = tmp_path / "w.safetensors", tmp_path / "i.safetensors", tmp_path / "o.safetensors"
    subprocess.run([MOE, "init", "--config", str(yml), "--out", str(w), "--seed", "7", "--inputs", str(i),
                    "--tokens", "24"], check=True, capture_output=True)
    subprocess.run([MOE, "step", "--config", str(yml), "--weights", str(w), "--inputs", str(i), "--out", str(o)],
                   check=True, capture_output=True)
    W, I, O = read_safetensors(w), read_safetensors(i), read_safetensors(o)

    layer_keys = {k: (v == "true" if v in ("true", "false") else v) for k, v in cfg.items()}
    layer_keys["dtype"] = torch.float32 if dtype == "f32" else torch.bfloat16
    layer = MoELayer(**layer_keys)
    for spec, t in W.items():  # the layer's initial parameters are `moe init --seed 7`'s weights
        assert torch.equal(getattr(layer, NAMES[spec]).detach(), t), spec
    x = I["x"].clone().requires_grad_(True)
    y, aux = layer(x)
    (y.float() * I["dy"].float()).sum().add(aux["load_balance_loss"] + aux["z_loss"]).backward()

    assert torch.equal(y, O["y"])
    assert torch.equal(aux["topk_idx"], O["topk_idx"]) and torch.equal(aux["topk_weights"], O["topk_weights"])
    assert torch.equal(aux["group_sizes"], O["group_sizes"])
    assert torch.equal(aux["load_balance_loss"], O["aux.load_balance_loss"].reshape(()))
    assert torch.equal(aux["z_loss"], O["aux.z_loss"].reshape(()))
    assert x.grad.dtype == x.dtype and torch.equal(x.grad, O["grad.x"].to(x.dtype))
    for spec in W:
        assert torch.equal(getattr(layer, NAMES[spec]).grad, O["grad." + spec]), spec
