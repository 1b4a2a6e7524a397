#!/usr/bin/env python3
"""Writes the seed corpora (fuzz/<target>/corpus/seed-*) and dictionaries
(fuzz/<target>.dict) of the fuzz targets. The files are committed; rerun this
after a format change (docs/formats.md). Inputs that once crashed a target are
kept beside the seeds as crash-* files and are not written here."""
import json
import os
import struct

HERE = os.path.dirname(os.path.abspath(__file__))

DTYPES = {"F32": ("<f", 4), "BF16": (None, 2), "F16": ("<e", 2), "I32": ("<i", 4), "I64": ("<q", 8)}


def tensor_bytes(dtype, shape, start):
    n = 1
    for d in shape:
        n *= d
    fmt, size = DTYPES[dtype]
    out = b""
    for i in range(n):
        v = (start + i) * 0.125 - 1.0
        if dtype == "BF16":
            out += struct.pack("<f", v)[2:]
        elif dtype in ("I32", "I64"):
            out += struct.pack(fmt, start + i)
        else:
            out += struct.pack(fmt, v)
    return out


def safetensors(tensors, metadata=None):
    """tensors: [(name, dtype, shape)] written in order, as src/io/safetensors.cpp does."""
    header, data = {}, b""
    if metadata is not None:
        header["__metadata__"] = metadata
    for i, (name, dtype, shape) in enumerate(tensors):
        b = tensor_bytes(dtype, shape, i)
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [len(data), len(data) + len(b)]}
        data += b
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * ((-(8 + len(text))) % 8)
    return struct.pack("<Q", len(text)) + text + data


# The small layer of fuzz/fuzz_common.h: E=2, K=1, D=4, F=2.
E, D, F = 2, 4, 2


def layer(prefix, layout, dtype="F32"):
    t = [(prefix + "router.kernel", "F32", [D, E])]
    if layout == "split":
        t.append((prefix + "experts.wi", dtype, [2, E, D // 2, 2 * F]))
    elif layout == "fused":
        t.append((prefix + "experts.wi", dtype, [E, D, 2 * F]))
    else:
        t += [(prefix + "experts.wi_0", dtype, [E, D, F]), (prefix + "experts.wi_1", dtype, [E, D, F])]
    t.append((prefix + "experts.wo", dtype, [E, F, D]))
    return t


def checkpoint(step=1, seed="0", teacher_seed="1"):
    params = layer("layers.0.", "wi01") + [("layers.0.norm.scale", "F32", [D])]
    names = [(n, "F32", s) for n, _, s in params]
    tensors = names + [("opt.m." + n, d, s) for n, d, s in names] + [("opt.v." + n, d, s) for n, d, s in names]
    md = {"format": "moe-engine train checkpoint", "format_version": "1", "step": str(step), "seed": seed,
          "teacher_seed": teacher_seed, "config": json.dumps({"num_experts": "2", "num_layers": "1"})}
    return safetensors(tensors, md)


def seeds():
    yield "safetensors", "weights_f32", safetensors(layer("", "wi01"))
    yield "safetensors", "weights_bf16_prefixed", safetensors(layer("layers.0.", "wi01", "BF16"), {"note": "x"})
    yield "safetensors", "weights_fused_f16", safetensors(layer("", "fused", "F16"))
    yield "safetensors", "weights_split", safetensors(layer("", "split"))
    yield "safetensors", "ints_and_empty", safetensors(
        [("a", "I32", [2, 3]), ("b", "I64", [3]), ("z", "F32", [0, 5]), ("s", "F32", [])])
    yield "safetensors", "empty_header", safetensors([])
    yield "checkpoint", "step1", checkpoint()
    yield "checkpoint", "step7", checkpoint(step=7)
    yield "checkpoint", "other_seed", checkpoint(seed="5")
    yield "config", "small", open(os.path.join(HERE, "..", "examples", "small.yaml"), "rb").read()
    yield "config", "overrides", (b"num_experts: 4\nnum_experts_per_tok: 2\nemb_dim: 8\nmoe_mlp_dim: 4\n\0"
                                  b"dtype=f32\nexpert_parallelism=-1\nmoe_offload_targets=all\ncapacity_factor=1.25")
    yield "config", "train", (b"num_experts: 2\nnum_experts_per_tok: 1\nemb_dim: 4\nmoe_mlp_dim: 2\n"
                              b"num_layers: 3\nsteps: 10\ncheckpoint_dir: ck\ncheckpoint_period: 2\n"
                              b"metrics_file: m.jsonl\nrouted_score_func: sigmoid\nprefuse_moe_weights: true\n"
                              b"moe_split_expert_weight_layout: true\nlearning_rate: 3e-4\n")
    yield "config", "flow", b"{num_experts: 8, num_experts_per_tok: 2, emb_dim: 16, moe_mlp_dim: 8, seed: -3}\0seed=7"
    line = {"step": 1, "loss": 0.5, "mse": 0.4, "lb": 1.0, "z": 0.0, "lr": 1e-3, "grad_norm": 0.2, "step_ms": 3.5,
            "tokens": 256, "tokens_per_s": 1000.0, "dropped": 0, "collective_bytes": 0, "side_ops": 0,
            "load": [{"max": 140, "mean": 128}, {"max": 130, "mean": 128}]}
    lines = []
    for s in range(1, 4):
        line["step"], line["loss"] = s, 0.5 / s
        lines.append(json.dumps(line))
    yield "metrics", "three_lines", ("\n".join(lines) + "\n").encode()
    yield "metrics", "null_loss", b'{"step": 1, "loss": null}\n\n{"step": 2, "loss": 1e-30}\n'
    yield "topology", "eight_ranks", b"ranks=8,cores=4,mpi_thread=multiple"
    yield "topology", "one", b"ranks=1"
    yield "topology", "backend", b" ranks = 2 , backend=mpi-funneled,cores=1"
    yield "offload", "all", b"all"
    yield "offload", "list", b"fsdp_all_gather, ep_collectives,,ragged_sort"
    yield "offload", "one", b"ep_collectives"


DICTS = {
    "safetensors": ['"dtype"', '"shape"', '"data_offsets"', '"__metadata__"', '"F32"', '"BF16"', '"F16"',
                    '"I32"', '"I64"', '"F64"', '"router.kernel"', '"experts.wi"', '"experts.wi_0"',
                    '"experts.wi_1"', '"experts.wo"', '"layers.0."', "9223372036854775807",
                    "18446744073709551615", "4294967296", "-1", "1e400", "[", "]", "{", "}", ",", ":"],
    "checkpoint": ['"format"', '"format_version"', '"step"', '"seed"', '"teacher_seed"', '"config"',
                   '"moe-engine train checkpoint"', '"opt.m."', '"opt.v."', '"layers.0."', '"layers.1."',
                   '"norm.scale"', '"experts.wi_0"', '"experts.wo"', '"router.kernel"', '"dtype"', '"shape"',
                   '"data_offsets"', '"__metadata__"', '"F32"', '"BF16"', "9223372036854775807", "-1"],
    "metrics": ['"step"', '"loss"', '"load"', '"max"', '"mean"', "null", "true", "1e308", "-1e308", "1e400",
                "[]", "{}", "\\x0a", "NaN", "Infinity"],
    "topology": ['"ranks="', '"cores="', '"mpi_thread="', '"backend="', '"single"', '"funneled"',
                 '"serialized"', '"multiple"', '"mpi-multiple"', '"single-process"', '","',
                 '"9223372036854775807"', '"2147483648"', '"4294967296"', '"0"', '"-1"'],
    "offload": ['"all"', '"fsdp_all_gather"', '"ep_collectives"', '"ragged_sort"', '","', '" "', '"\\x09"'],
}


def config_dict():
    keys = ["num_experts", "num_experts_per_tok", "emb_dim", "moe_mlp_dim", "dtype", "weight_dtype",
            "routed_score_func", "norm_topk_prob", "routed_scaling_factor", "load_balance_loss_weight",
            "router_z_loss_weight", "mlp_activation", "capacity_factor", "prefuse_moe_weights",
            "moe_split_expert_weight_layout", "moe_permute_kernel", "moe_combine_kernel", "float32_weight_sum",
            "data_parallelism", "fsdp_parallelism", "expert_parallelism", "shard_exp_on_fsdp",
            "use_ring_of_experts", "num_moe_token_chunks", "ragged_buffer_factor", "collective_timeout_s",
            "moe_offload_targets", "side_engine_threads", "num_layers", "steps", "batch_tokens", "learning_rate",
            "warmup_steps", "min_lr_ratio", "beta1", "beta2", "adam_eps", "weight_decay", "grad_clip", "seed",
            "teacher_seed", "checkpoint_dir", "checkpoint_period", "keep_checkpoints", "metrics_file",
            "log_period"]
    words = ["bf16", "f32", "softmax", "sigmoid", "silu", "gelu", "reference", "fused", "true", "false", "all",
             "-1", "9223372036854775807", "1e400", ".nan", ".inf", "~", "null", ": ", "=", "\\x00", "\\x0a",
             "[", "]", "{", "}", "&a", "*a", "!!str", "---"]
    return ['"%s"' % k for k in keys] + ['"%s"' % w for w in words]


def main():
    for target, name, data in seeds():
        d = os.path.join(HERE, target, "corpus")
        os.makedirs(d, exist_ok=True)
        with open(os.path.join(d, "seed-" + name), "wb") as f:
            f.write(data)
    DICTS["config"] = config_dict()
    for target, words in DICTS.items():
        with open(os.path.join(HERE, target + ".dict"), "w") as f:
            f.write("# libFuzzer dictionary of fuzz/%s_fuzz.cpp (written by fuzz/make_seeds.py)\n" % target)
            for w in words:
                if not w.startswith('"'):
                    w = '"%s"' % w.replace('"', '\\"')
                f.write(w + "\n")


if __name__ == "__main__":
    main()
