"""The package is typed and documented: every public name has a docstring (MoeError included); the
type stubs (moe_engine/*.pyi, with py.typed) name exactly the module's public names, with the same
parameters; mypy (when installed: Debian's python3-mypy) accepts a typical use, rejects a float
thread count, and its stubtest finds the stubs consistent with the modules."""

import ast
import inspect
import os
import re
import subprocess
import sys

import pytest
import torch

import moe_engine
import moe_engine._moe_engine as C
import moe_engine.torch as mt

PKG = os.path.dirname(moe_engine.__file__)


def stub(name):
    with open(os.path.join(PKG, name + ".pyi")) as f:
        return ast.parse(f.read())


def stub_names(tree):
    """{name: node} of a stub's top-level definitions (functions, classes, annotated names,
    `import X as X` re-exports), leaving out private ones."""
    out = {}
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            out[node.name] = node
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            out[node.target.id] = node
        elif isinstance(node, ast.ImportFrom):
            for a in node.names:
                if a.asname == a.name:
                    out[a.name] = node
    return {k: v for k, v in out.items() if not k.startswith("_") or k in ("__version__", "__all__")}


def stub_params(fn):
    a = fn.args
    names = [x.arg for x in a.posonlyargs + a.args + a.kwonlyargs]
    if a.vararg:
        names.append("*" + a.vararg.arg)
    if a.kwarg:
        names.append("**" + a.kwarg.arg)
    return [n for n in names if n != "self"]


def py_params(fn):
    out = []
    for p in inspect.signature(fn).parameters.values():
        prefix = {p.VAR_POSITIONAL: "*", p.VAR_KEYWORD: "**"}.get(p.kind, "")
        if p.name != "self":
            out.append(prefix + p.name)
    return out


def pybind_params(fn):
    """Parameter names from a pybind11 docstring's signature line: 'name(a: int, b: str) -> None'."""
    first = fn.__doc__.splitlines()[0]
    inside = first[first.index("(") + 1:first.rindex(") ->")]
    names = [p.split(":")[0].strip() for p in re.split(r",\s*(?![^\[]*\])", inside) if p.strip()]
    return [n for n in names if n != "self"]


def pybind_doc(fn):
    """A pybind11 docstring without its signature line(s)."""
    lines = (fn.__doc__ or "").splitlines()
    return "\n".join(l for l in lines if not re.match(r"^\w+\(.*\) -> ", l) and not l.startswith("Overloaded")).strip()


def public(module):
    return sorted(n for n in dir(module) if not n.startswith("_"))


def test_every_public_name_has_a_docstring():
    missing = []
    for name in moe_engine.__all__:
        obj = getattr(moe_engine, name)
        if name != "__version__" and not (obj.__doc__ or "").strip():
            missing.append(f"moe_engine.{name}")
    assert "Every error the engine reports" in moe_engine.MoeError.__doc__
    for name in public(C):
        obj = getattr(C, name)
        if isinstance(obj, str):
            continue
        if not pybind_doc(obj) and not (inspect.isclass(obj) and (obj.__doc__ or "").strip()):
            missing.append(f"_moe_engine.{name}")
        if inspect.isclass(obj) and obj is not C.MoeError:
            for m, v in vars(obj).items():
                if not m.startswith("_") and not pybind_doc(v):
                    missing.append(f"_moe_engine.{name}.{m}")
    for mod in (moe_engine, mt, C):
        if not (mod.__doc__ or "").strip():
            missing.append(mod.__name__)
    for name in mt.__all__:
        cls = getattr(mt, name)
        if not (cls.__doc__ or "").strip():
            missing.append(f"moe_engine.torch.{name}")
        for m, v in vars(cls).items():
            if not m.startswith("_") and not (getattr(v, "__doc__", None) or "").strip():
                missing.append(f"moe_engine.torch.{name}.{m}")
    assert not missing, f"no docstring: {missing}"


def test_stubs_name_the_extension_module():
    names = stub_names(stub("_moe_engine"))
    assert sorted(n for n in names if not n.startswith("_")) == public(C)
    for name, node in names.items():
        obj = getattr(C, name)
        if isinstance(node, ast.FunctionDef):
            assert stub_params(node) == pybind_params(obj), name
        if isinstance(node, ast.ClassDef) and obj is not C.MoeError:
            members = {n.name: n for n in node.body if isinstance(n, ast.FunctionDef)}
            want = sorted(m for m in vars(obj) if not m.startswith("_"))
            assert sorted(m for m in members if not m.startswith("_")) == want, name
            for m, fn in members.items():
                if m == "__init__" or not m.startswith("_"):
                    if isinstance(getattr(obj, m), property):
                        continue
                    assert stub_params(fn) == pybind_params(getattr(obj, m)), f"{name}.{m}"


def test_stubs_name_the_package():
    names = stub_names(stub("__init__"))
    assert sorted(n for n in names if n != "__all__") == sorted(moe_engine.__all__)
    for name, node in names.items():
        if isinstance(node, ast.FunctionDef):
            assert stub_params(node) == py_params(getattr(moe_engine, name)), name


def test_stubs_name_the_torch_module():
    names = stub_names(stub("torch"))
    assert sorted(n for n in names if n != "__all__") == sorted(mt.__all__)
    cls = names["MoELayer"]
    members = {n.name: n for n in cls.body if isinstance(n, ast.FunctionDef)}
    defined = {m for m, v in vars(mt.MoELayer).items() if not m.startswith("_") or m in ("__init__",)}
    assert defined <= set(members), defined - set(members)
    for m in defined:
        v = getattr(mt.MoELayer, m)
        if isinstance(v, property):
            continue
        assert stub_params(members[m]) == py_params(v), m
    # The parameters the stub declares are the layer's (both layouts).
    declared = {n.target.id for n in cls.body if isinstance(n, ast.AnnAssign)
                and n.target.id not in ("config", "accumulate_grads")}
    keys = dict(num_experts=4, num_experts_per_tok=2, emb_dim=8, moe_mlp_dim=8, dtype=torch.float32)
    got = {n for n, _ in mt.MoELayer(**keys).named_parameters()}
    got |= {n for n, _ in mt.MoELayer(prefuse_moe_weights=True, **keys).named_parameters()}
    assert got == declared


def test_stubs_and_marker_are_in_the_package():
    for f in ("py.typed", "__init__.pyi", "_moe_engine.pyi", "torch.pyi"):
        assert os.path.isfile(os.path.join(PKG, f)), f


def test_mypy_accepts_the_stubs_and_a_use(tmp_path):
    pytest.importorskip("mypy", reason="mypy not installed (Debian: python3-mypy)")
    use = tmp_path / "use.py"
    use.write_text("""
import torch
import moe_engine
from moe_engine.torch import MoELayer

layer = MoELayer(num_experts=4, num_experts_per_tok=2, emb_dim=8, moe_mlp_dim=8, dtype=torch.float32)
y, aux = layer(torch.randn(3, 8))
loss: torch.Tensor = y.sum()
n: int = moe_engine.get_num_threads()
moe_engine.set_num_threads(n)
try:
    pass
except moe_engine.MoeError as e:
    print(e)
""")
    bad = tmp_path / "bad.py"
    bad.write_text("import moe_engine\nmoe_engine.set_num_threads(2.7)\n")
    ini = tmp_path / "mypy.ini"
    ini.write_text("[mypy]\n[mypy-torch.*]\nfollow_imports = skip\n")  # torch's own sources: not ours to check
    env = dict(os.environ, MYPYPATH=os.path.dirname(PKG), PYTHONPATH=os.path.dirname(PKG))
    args = [sys.executable, "-m", "mypy", "--config-file", str(ini), "--no-error-summary", "--cache-dir",
            str(tmp_path / "cache")]
    ok = subprocess.run(args + [str(use)], env=env, capture_output=True, text=True, cwd=tmp_path)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    err = subprocess.run(args + [str(bad)], env=env, capture_output=True, text=True, cwd=tmp_path)
    assert err.returncode != 0 and "set_num_threads" in err.stdout, err.stdout + err.stderr
    # stubtest: the stubs against the imported modules (names, kinds, Python signatures; pybind11's
    # own differences allowed in stubtest_allowlist.txt; pybind11 signatures are checked above).
    allow = os.path.join(os.path.dirname(__file__), "stubtest_allowlist.txt")
    st = subprocess.run([sys.executable, "-m", "mypy.stubtest", "--mypy-config-file", str(ini), "--allowlist", allow,
                         "moe_engine"], env=env, capture_output=True, text=True, cwd=tmp_path)
    assert st.returncode == 0, st.stdout + st.stderr
