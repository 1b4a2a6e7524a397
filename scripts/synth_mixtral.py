#!/usr/bin/env python3
# A synthetic Mixtral-shaped checkpoint for measuring `moe convert --from mixtral`: random BF16 bits
# (values do not matter for a conversion), sharded in two files with model.safetensors.index.json,
# plus attention/embedding/norm tensors that the conversion leaves out. No third-party modules.
# Usage: python3 scripts/synth_mixtral.py DIR LAYERS E D F
import json, struct, sys, os
d, L, E, D, F = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
def write(path, tensors):
    hdr = {"__metadata__": {"format": "pt"}}; off = 0
    for n, shape in tensors:
        nb = 2
        for x in shape: nb *= x
        hdr[n] = {"dtype": "BF16", "shape": shape, "data_offsets": [off, off + nb]}; off += nb
    h = json.dumps(hdr).encode(); h += b" " * ((8 - (8 + len(h)) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h)
        for n, shape in tensors:
            nb = 2
            for x in shape: nb *= x
            f.write(os.urandom(nb))
wm = {}
shards = [[("model.embed_tokens.weight", [1000, D])], [("model.norm.weight", [D])]]
for i in range(L):
    P = f"model.layers.{i}.block_sparse_moe."
    t = [(f"model.layers.{i}.self_attn.q_proj.weight", [D, D]), (P + "gate.weight", [E, D])]
    for j in range(E):
        t += [(P + f"experts.{j}.w1.weight", [F, D]), (P + f"experts.{j}.w2.weight", [D, F]), (P + f"experts.{j}.w3.weight", [F, D])]
    shards[0 if i < L // 2 else 1] += t
for s in range(2):
    name = f"model-0000{s+1}-of-00002.safetensors"
    write(f"{d}/{name}", shards[s])
    for n, _ in shards[s]: wm[n] = name
json.dump({"metadata": {}, "weight_map": wm}, open(f"{d}/model.safetensors.index.json", "w"))
