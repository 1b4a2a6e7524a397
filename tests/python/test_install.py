"""`cmake --install` puts moe_engine where Debian's python3 finds it (checked with DESTDIR)."""

import os
import subprocess
import sys

import pytest

BUILD = os.environ.get("MOE_BUILD_DIR", os.path.join(os.path.dirname(__file__), "../../build"))


@pytest.mark.parametrize("prefix", ["/usr/local", "/usr"])
def test_install_lands_on_debian_sys_path(tmp_path, prefix):
    env = dict(os.environ, DESTDIR=str(tmp_path))
    subprocess.run(["cmake", "--install", BUILD, "--prefix", prefix], check=True,
                   env=env, capture_output=True)
    found = [d for d in sys.path if d.startswith(prefix + "/") and os.path.isfile(
        os.path.join(str(tmp_path) + d, "moe_engine", "__init__.py"))]
    assert found, f"no moe_engine under {tmp_path} in a sys.path directory of {sys.executable}: {sys.path}"
    pkg = os.path.join(str(tmp_path) + found[0], "moe_engine")
    assert any(f.startswith("_moe_engine") and f.endswith(".so") for f in os.listdir(pkg))
    for f in ("py.typed", "__init__.pyi", "_moe_engine.pyi", "torch.pyi"):  # the package is typed (PEP 561)
        assert os.path.isfile(os.path.join(pkg, f)), f
    # The installed copy imports and runs (from the DESTDIR tree, as if it were at the prefix).
    code = ("import moe_engine, torch; from moe_engine.torch import MoELayer; "
            "l = MoELayer(num_experts=4, num_experts_per_tok=2, emb_dim=8, moe_mlp_dim=8, dtype=torch.float32); "
            "y, a = l(torch.randn(3, 8)); print(moe_engine.__file__)")
    out = subprocess.run([sys.executable, "-c", code], env=dict(os.environ, PYTHONPATH=str(tmp_path) + found[0]),
                         cwd=str(tmp_path),  # not a directory holding a moe_engine of its own (build/python)
                         check=True, capture_output=True, text=True).stdout
    assert out.startswith(pkg)
