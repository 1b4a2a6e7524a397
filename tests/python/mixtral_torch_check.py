# Independent check of the Mixtral mapping of `moe convert --from mixtral`
# (CTest entry mixtral_torch): a Mixtral sparse MoE block in PyTorch (the math
# of transformers' MixtralSparseMoeBlock, written out), its weights saved under
# Mixtral names (safetensors written here with json/struct: Debian has no
# safetensors package for torch 1.13), converted by `moe convert --from mixtral
# --layer 0`, run by `moe step` (f32), and y compared with torch's.
# Usage: python3 tests/python/mixtral_torch_check.py MOE_BINARY SCRATCH_DIR
# Exit 77 (CTest: skipped) when torch is not importable.
import json, os, struct, subprocess, sys
try:
    import torch
except ImportError:
    print("mixtral_torch_check: torch is not installed; skipped")
    sys.exit(77)
moe, d = sys.argv[1], sys.argv[2]
os.makedirs(d, exist_ok=True)
torch.manual_seed(0)
E, K, D, F, T = 8, 2, 32, 48, 40
gate = torch.randn(E, D) * 0.3
w1 = [torch.randn(F, D) / D**0.5 for _ in range(E)]
w2 = [torch.randn(D, F) / F**0.5 for _ in range(E)]
w3 = [torch.randn(F, D) / D**0.5 for _ in range(E)]
x = torch.randn(T, D)
# MixtralSparseMoeBlock.forward
logits = x @ gate.T
p = torch.softmax(logits, dim=1)
wts, idx = torch.topk(p, K, dim=-1)
wts = wts / wts.sum(dim=-1, keepdim=True)
y = torch.zeros(T, D)
for t in range(T):
    for k in range(K):
        j = idx[t, k].item()
        h = torch.nn.functional.silu(x[t] @ w1[j].T) * (x[t] @ w3[j].T)
        y[t] += wts[t, k] * (h @ w2[j].T)
def save(path, tensors):
    hdr, off, blobs = {}, 0, []
    for n, t in tensors:
        b = t.contiguous().numpy().astype('<f4').tobytes()
        hdr[n] = {"dtype": "F32", "shape": list(t.shape), "data_offsets": [off, off + len(b)]}
        off += len(b); blobs.append(b)
    h = json.dumps(hdr).encode()
    open(path, "wb").write(struct.pack("<Q", len(h)) + h + b"".join(blobs))
P = "model.layers.0.block_sparse_moe."
ts = [(P + "gate.weight", gate), ("model.embed_tokens.weight", torch.randn(5, D))]
for j in range(E):
    ts += [(P + f"experts.{j}.w1.weight", w1[j]), (P + f"experts.{j}.w2.weight", w2[j]), (P + f"experts.{j}.w3.weight", w3[j])]
save(f"{d}/mixtral.safetensors", ts)
save(f"{d}/in.safetensors", [("x", x)])
open(f"{d}/c.yaml", "w").write(f"num_experts: {E}\nnum_experts_per_tok: {K}\nemb_dim: {D}\nmoe_mlp_dim: {F}\ndtype: f32\nweight_dtype: f32\n")
for extra in ([], ["--prefuse"]):
    subprocess.run([moe, "convert", "--from", "mixtral", "--layer", "0", *extra, f"{d}/mixtral.safetensors", f"{d}/w.st"], check=True)
    cfg = ["prefuse_moe_weights=true"] if extra else []
    subprocess.run([moe, "step", "--config", f"{d}/c.yaml", "--weights", f"{d}/w.st", "--inputs", f"{d}/in.safetensors", "--out", f"{d}/o.st", *cfg], check=True, stdout=subprocess.DEVNULL)
    raw = open(f"{d}/o.st", "rb").read()
    n = struct.unpack("<Q", raw[:8])[0]; h = json.loads(raw[8:8 + n]); e = h["y"]
    b0, b1 = e["data_offsets"]
    ye = torch.frombuffer(bytearray(raw[8 + n + b0:8 + n + b1]), dtype=torch.float32).reshape(T, D)
    err = (ye - y).abs().max().item() / y.abs().max().item()
    print(f"layout {'prefused' if extra else 'wi_0/wi_1'}: max |y_engine - y_torch| / max |y_torch| = {err:.3g}")
    assert err < 1e-5, err
print("OK")
