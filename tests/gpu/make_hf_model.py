#!/usr/bin/env python3
"""Writes a Hugging Face model folder (config.json, model.safetensors) of a
Llama-architecture model with seeded random f16 weights.

    make_hf_model.py OUT_DIR [--size smollm2-135m|tiny] [--seed N]

smollm2-135m has SmolLM2-135M's shapes (30 layers, hidden 576, 9 query and
3 key/value heads, vocabulary 49152, tied embeddings: 135 M parameters,
270 MB of f16), so that a GPU check can run a model of a real size without
carrying one; tiny (2 layers, hidden 128) is for the CUDA emulator.  There
is no tokenizer: the model takes token ids.

Weights are normal, with a standard deviation of 0.02 for the embedding
(as Hugging Face initializes it) and 1/sqrt(fan-in) for every other matrix
(norms are 1).  Hugging Face's 0.02 everywhere would leave the layers'
outputs far smaller than the embedding, and with tied embeddings the
greedy choice would then echo the last token whatever the layers compute;
scaled this way, every layer moves the residual stream by about as much as
its input, so that the ids depend on the whole computation.  They are
drawn with numpy when it can be imported and with Python's random module
otherwise (slow for smollm2-135m); the same seed and the same generator
give the same bytes.  Only the standard library is needed.
"""
import argparse
import json
import os
import random
import struct
import sys

SIZES = {
    "smollm2-135m": dict(hidden_size=576, intermediate_size=1536, num_attention_heads=9,
                         num_key_value_heads=3, num_hidden_layers=30, vocab_size=49152,
                         rope_theta=100000.0, max_position_embeddings=8192),
    "tiny": dict(hidden_size=128, intermediate_size=256, num_attention_heads=2,
                 num_key_value_heads=1, num_hidden_layers=2, vocab_size=512,
                 rope_theta=10000.0, max_position_embeddings=512),
}


def tensors(c):
    """(name, shape, kind) of every weight, kind "embedding", "matrix" or
    "norm" (ones)."""
    h, i = c["hidden_size"], c["intermediate_size"]
    hd = h // c["num_attention_heads"]
    kv = c["num_key_value_heads"] * hd
    out = [("model.embed_tokens.weight", [c["vocab_size"], h], "embedding")]
    for layer in range(c["num_hidden_layers"]):
        p = "model.layers.%d." % layer
        out += [(p + "input_layernorm.weight", [h], "norm"),
                (p + "self_attn.q_proj.weight", [h, h], "matrix"),
                (p + "self_attn.k_proj.weight", [kv, h], "matrix"),
                (p + "self_attn.v_proj.weight", [kv, h], "matrix"),
                (p + "self_attn.o_proj.weight", [h, h], "matrix"),
                (p + "post_attention_layernorm.weight", [h], "norm"),
                (p + "mlp.gate_proj.weight", [i, h], "matrix"),
                (p + "mlp.up_proj.weight", [i, h], "matrix"),
                (p + "mlp.down_proj.weight", [h, i], "matrix")]
    out.append(("model.norm.weight", [h], "norm"))
    return out


def f16_bytes(shape, kind, draw):
    n = 1
    for d in shape:
        n *= d
    if kind == "norm":
        return struct.pack("<H", 0x3C00) * n  # 1.0
    return draw(n, 0.02 if kind == "embedding" else shape[1] ** -0.5)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out")
    ap.add_argument("--size", choices=sorted(SIZES), default="smollm2-135m")
    ap.add_argument("--seed", type=int, default=1234)
    a = ap.parse_args()
    c = dict(SIZES[a.size])
    config = {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_act": "silu",
        "rms_norm_eps": 1e-5, "tie_word_embeddings": True, "bos_token_id": 1,
        "eos_token_id": 2, "rope_scaling": None, "attention_bias": False, "mlp_bias": False,
        "torch_dtype": "float16",
        "head_dim": c["hidden_size"] // c["num_attention_heads"],
    }
    config.update(c)
    try:
        import numpy as np
        rng = np.random.default_rng(a.seed)

        def draw(n, std):
            return (rng.standard_normal(n, dtype=np.float32) * std).astype("<f2").tobytes()
        generator = "numpy"
    except ImportError:
        rnd = random.Random(a.seed)

        def draw(n, std):
            return struct.pack("<%de" % n, *(rnd.gauss(0.0, std) for _ in range(n)))
        generator = "random"
    header, blobs, off = {"__metadata__": {"format": "pt", "generator": generator,
                                           "seed": str(a.seed)}}, [], 0
    for name, shape, kind in tensors(c):
        b = f16_bytes(shape, kind, draw)
        header[name] = {"dtype": "F16", "shape": shape, "data_offsets": [off, off + len(b)]}
        blobs.append(b)
        off += len(b)
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    os.makedirs(a.out, exist_ok=True)
    with open(os.path.join(a.out, "config.json"), "w") as f:
        json.dump(config, f, indent=1)
    with open(os.path.join(a.out, "model.safetensors"), "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for b in blobs:
            f.write(b)
    print("%s: %s, %d tensors, %.1f MB of f16 weights (%s, seed %d)"
          % (a.out, a.size, len(header) - 1, off / 1e6, generator, a.seed))
    return 0


if __name__ == "__main__":
    sys.exit(main())
