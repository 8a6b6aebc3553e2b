#!/usr/bin/env python3
"""Round trip check of `dhp export-weights` (tests/t_hf_oracle.sh).

Usage: hf_compare.py ORIG_DIR EXPORT_DIR

ORIG_DIR is a transformers save_pretrained directory (single file or
sharded) of a Qwen2.5-VL or a LLaVA, EXPORT_DIR what dhp exported after
starting from it. Checks the
same tensor names with bit-identical values, and that transformers itself
loads EXPORT_DIR (from_pretrained, no missing or unexpected keys) into a
model whose state equals the original's and whose config has the
original's shapes. Exits non-zero with one line on any difference."""
import glob
import json
import sys

import numpy as np
import torch
import transformers
from safetensors.numpy import load_file


def tensors(d):
    out = {}
    for f in sorted(glob.glob(f"{d}/*.safetensors")):
        out.update(load_file(f))
    return out


def main():
    orig, exp = sys.argv[1], sys.argv[2]
    a, b = tensors(orig), tensors(exp)
    if set(a) != set(b):
        sys.exit(f"names differ: only original {sorted(set(a) - set(b))[:3]}, only export {sorted(set(b) - set(a))[:3]}")
    for k in a:
        if a[k].shape != b[k].shape or a[k].dtype != b[k].dtype or a[k].tobytes() != b[k].tobytes():
            sys.exit(f"{k}: {a[k].shape} {a[k].dtype} vs {b[k].shape} {b[k].dtype}, values differ")
    arch = json.load(open(f"{orig}/config.json"))["architectures"][0]
    cls = getattr(transformers, arch)
    model, info = cls.from_pretrained(exp, output_loading_info=True, attn_implementation="eager")
    if info["missing_keys"] or info["unexpected_keys"]:
        sys.exit(f"transformers: missing {info['missing_keys'][:3]}, unexpected {info['unexpected_keys'][:3]}")
    for k, v in model.state_dict().items():
        if not torch.equal(v, torch.from_numpy(a[k])):
            sys.exit(f"transformers loaded {k} with other values")
    c0 = cls.config_class.from_pretrained(orig).to_dict()
    c1 = model.config.to_dict()
    text = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
            "num_key_value_heads", "rope_theta", "tie_word_embeddings", "rms_norm_eps")
    if arch == "LlavaForConditionalGeneration":
        pairs = [("text_config", k) for k in text] + [("vision_config", k) for k in (
            "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "num_channels",
            "image_size", "patch_size", "hidden_act")] + [(None, k) for k in (
            "vision_feature_layer", "vision_feature_select_strategy", "projector_hidden_act", "image_token_index")]
    else:
        pairs = [(None, k) for k in text] + [(None, "rope_scaling")] + [("vision_config", k) for k in (
            "depth", "hidden_size", "intermediate_size", "num_heads", "in_channels", "patch_size",
            "spatial_merge_size", "temporal_patch_size", "window_size", "fullatt_block_indexes", "out_hidden_size")]
    for sec, k in pairs:
        x, y = (c0, c1) if sec is None else (c0[sec], c1[sec])
        if k == "rope_scaling":
            x, y = x[k]["mrope_section"], y[k]["mrope_section"]
        elif x[k] != y[k]:
            sys.exit(f"config {sec + '.' if sec else ''}{k}: {x[k]} vs {y[k]}")
        if k == "rope_scaling" and x != y:
            sys.exit("config rope_scaling.mrope_section differs")
    print(f"{len(a)} tensors bit-identical; transformers loads the export with the original's config")


if __name__ == "__main__":
    main()
