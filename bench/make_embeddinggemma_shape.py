#!/usr/bin/env python3
"""A random checkpoint with EmbeddingGemma-300M's shapes, for speed measurements.

    python3 bench/make_embeddinggemma_shape.py OUT_DIR [--dtype bf16|f32] [--seed S]

Writes OUT_DIR as a sentence-transformers directory like the published one: config.json (a
Gemma3TextModel with use_bidirectional_attention, 24 layers of width 768, 3 query heads on one
kv head of 256, MLP 1152, sliding window 512 with every 6th layer global, 262144-token
vocabulary, 2048-token context), model.safetensors, modules.json, 1_Pooling (mean), 2_Dense
(768 -> 3072) and 3_Dense (3072 -> 768) without bias, and the test tokenizer of
tests/fixtures/tokenizer/small (the server needs one; benchmarks send token ids). Speed does not
depend on the weights' values; the values are scaled so that activations stay finite."""
import argparse
import json
import os
import shutil

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
D, LAYERS, HEADS, KV, HD, FF, VOCAB = 768, 24, 3, 1, 256, 1152, 262144


def to_bytes(a, dtype):
    a = np.ascontiguousarray(a, dtype=np.float32)
    if dtype == "f32":
        return a.tobytes()
    bits = a.view(np.uint32)
    return ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype("<u2").tobytes()  # round to bf16


def header_of(tensors, dtype):
    """The safetensors header (padded to 8 bytes) of (name, shape) pairs in file order; the
    tensors are generated and written one at a time after it."""
    header, offset = {}, 0
    size = 2 if dtype == "bf16" else 4
    for name, shape in tensors:
        n = int(np.prod(shape)) * size
        header[name] = {"dtype": "BF16" if dtype == "bf16" else "F32", "shape": list(shape),
                        "data_offsets": [offset, offset + n]}
        offset += n
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    return h


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--dtype", default="bf16", choices=["bf16", "f32"])
    ap.add_argument("--seed", type=int, default=7)
    a = ap.parse_args()
    rng = np.random.default_rng(a.seed)
    os.makedirs(a.out, exist_ok=True)
    shapes = [("embed_tokens.weight", (VOCAB, D)), ("norm.weight", (D,))]
    for i in range(LAYERS):
        p = f"layers.{i}."
        shapes += [(p + "input_layernorm.weight", (D,)), (p + "post_attention_layernorm.weight", (D,)),
                   (p + "pre_feedforward_layernorm.weight", (D,)),
                   (p + "post_feedforward_layernorm.weight", (D,)),
                   (p + "self_attn.q_norm.weight", (HD,)), (p + "self_attn.k_norm.weight", (HD,)),
                   (p + "self_attn.q_proj.weight", (HEADS * HD, D)),
                   (p + "self_attn.k_proj.weight", (KV * HD, D)),
                   (p + "self_attn.v_proj.weight", (KV * HD, D)),
                   (p + "self_attn.o_proj.weight", (D, HEADS * HD)),
                   (p + "mlp.gate_proj.weight", (FF, D)), (p + "mlp.up_proj.weight", (FF, D)),
                   (p + "mlp.down_proj.weight", (D, FF))]
    shapes.sort()
    header = header_of(shapes, a.dtype)
    with open(os.path.join(a.out, "model.safetensors"), "wb") as f:
        f.write(len(header).to_bytes(8, "little"))
        f.write(header)
        for name, shape in shapes:
            if len(shape) == 1:
                v = rng.uniform(-0.5, 0.5, shape)
            else:
                v = rng.standard_normal(shape, dtype=np.float32) * (shape[1] ** -0.5)
            f.write(to_bytes(v, a.dtype))
    layer_types = ["full_attention" if (i + 1) % 6 == 0 else "sliding_attention"
                   for i in range(LAYERS)]
    cfg = {"architectures": ["Gemma3TextModel"], "model_type": "gemma3_text",
           "hidden_size": D, "num_hidden_layers": LAYERS, "num_attention_heads": HEADS,
           "num_key_value_heads": KV, "head_dim": HD, "intermediate_size": FF,
           "vocab_size": VOCAB, "max_position_embeddings": 2048, "sliding_window": 512,
           "layer_types": layer_types, "query_pre_attn_scalar": HD, "rms_norm_eps": 1e-6,
           "hidden_activation": "gelu_pytorch_tanh", "use_bidirectional_attention": True,
           "rope_parameters": {"full_attention": {"rope_type": "default", "rope_theta": 1e6},
                               "sliding_attention": {"rope_type": "default", "rope_theta": 1e4}},
           "tie_word_embeddings": True, "bos_token_id": 2, "eos_token_id": 1, "pad_token_id": 0}
    with open(os.path.join(a.out, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
    mods = [{"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
            {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
            {"idx": 2, "name": "2", "path": "2_Dense", "type": "sentence_transformers.models.Dense"},
            {"idx": 3, "name": "3", "path": "3_Dense", "type": "sentence_transformers.models.Dense"},
            {"idx": 4, "name": "4", "path": "4_Normalize",
             "type": "sentence_transformers.models.Normalize"}]
    with open(os.path.join(a.out, "modules.json"), "w") as f:
        json.dump(mods, f, indent=2)
    os.makedirs(os.path.join(a.out, "1_Pooling"), exist_ok=True)
    with open(os.path.join(a.out, "1_Pooling", "config.json"), "w") as f:
        json.dump({"word_embedding_dimension": D, "pooling_mode_mean_tokens": True}, f)
    for k, (fin, fout) in ((2, (D, 4 * D)), (3, (4 * D, D))):
        d = os.path.join(a.out, f"{k}_Dense")
        os.makedirs(d, exist_ok=True)
        with open(os.path.join(d, "config.json"), "w") as f:
            json.dump({"in_features": fin, "out_features": fout, "bias": False,
                       "activation_function": "torch.nn.modules.linear.Identity"}, f)
        h = header_of([("linear.weight", (fout, fin))], "f32")
        with open(os.path.join(d, "model.safetensors"), "wb") as f:
            f.write(len(h).to_bytes(8, "little"))
            f.write(h)
            f.write(to_bytes(rng.standard_normal((fout, fin), dtype=np.float32) * fin ** -0.5,
                             "f32"))
    shutil.copy(os.path.join(HERE, "..", "tests", "fixtures", "tokenizer", "small",
                             "tokenizer.json"), a.out)


if __name__ == "__main__":
    main()
