#!/usr/bin/env python3
"""Correctness oracle that dhp did not write (tests/t_hf_oracle.sh).

Usage: hf_oracle.py DIR

Builds a tiny Qwen2.5-VL with Hugging Face transformers' own modeling code
(Qwen2_5_VLForConditionalGeneration, transformers 4.49.0, eager attention,
fp32), random weights from a fixed seed (every tensor perturbed, so norms
and biases are not their initial 1 and 0), and writes:
  DIR/model/           save_pretrained: config.json + model.safetensors
  DIR/sharded/         the same weights, save_pretrained in several shards
                       with model.safetensors.index.json
  DIR/cli/             a model of the same shapes with temporal_patch_size 1 and
                       an 8 x 8-patch window (what `dhp data synth --window 64`
                       stores), saved in shards, for `dhp run --init-from`
  DIR/grads/model.safetensors   d loss / d every parameter (Hugging Face names)
  DIR/audio/, DIR/audio_*       a tiny Qwen2-Audio (Qwen2AudioForConditionalGeneration):
                       its audio tower + projector's output on 3 clips of 16
                       log-mel frames (audio_out.bin), and the gradients of
                       sum(output * audio_dout.bin)
  DIR/audio_llm_*      the same model's whole loss (audio tower, projector, the
                       Qwen2 LLM) on 2 samples of one clip and 10 text tokens
                       each, and every parameter's gradient
  DIR/window/, DIR/window_*     a model with window attention (4 windows of 2 x 2
                       merged tokens an image, layer 1 full) and its batch: see
                       main() for what its reference is
  DIR/llava/, DIR/llava_*       a tiny LLaVA (LlavaForConditionalGeneration: a
                       3-block CLIP tower read at vision_feature_layer -2, the
                       class row dropped, a Llama LLM), its batch, loss and
                       gradients as the Qwen2.5-VL case's (llava_cli/: the same
                       shapes in shards for `dhp run --init-from`)
  DIR/batch.json       the batch's geometry, and transformers' loss
  DIR/pixels.bin       pixel_values (fp32, [patches, C * Tp * P * P], merge-block order)
  DIR/tokens.bin       the text tokens (int32, [batch, text_tokens])

The batch is dhp's layout (executor.h, ex_batch): each sample is its image's
merged tokens, then its text. transformers' input is the same sequence with
image_token_id at the image's places; its M-RoPE positions come from the
model's own get_rope_index, given the sample with a vision_start token in
front (that is how transformers finds an image) and that token dropped
(positions shifted by one, which RoPE's relative angles do not see: the
image starts at position 0 as in dhp). Labels are the text tokens, -100 on
the image tokens and on the first text token (nothing predicts it), as
transformers masks them; the loss is transformers' own (shift by one, mean
cross-entropy over the labels that are not -100, fp32 logits).
"""
import json
import os
import sys

import numpy as np
import torch
from safetensors.torch import save_file
from transformers import (LlavaConfig, LlavaForConditionalGeneration, Qwen2AudioConfig,
                          Qwen2AudioForConditionalGeneration, Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration)

VOCAB = 272
IMAGE, VSTART, VEND, VIDEO = 270, 269, 268, 267
GRID = 8                  # patches per side: 64 patches, 16 merged tokens per image
TEXT = 10
BATCH = 2


def config(temporal_patch, window_px=GRID * 4):
    cfg = Qwen2_5_VLConfig(
        vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, rms_norm_eps=1e-6, rope_theta=1000000.0,
        tie_word_embeddings=False, max_position_embeddings=512,
        rope_scaling={"type": "mrope", "mrope_section": [2, 3, 3]},
        image_token_id=IMAGE, video_token_id=VIDEO, vision_start_token_id=VSTART,
        vision_end_token_id=VEND,
        vision_config={"depth": 2, "hidden_size": 32, "intermediate_size": 64, "num_heads": 4,
                       "in_channels": 3, "patch_size": 4, "spatial_merge_size": 2,
                       "temporal_patch_size": temporal_patch, "window_size": window_px,
                       "fullatt_block_indexes": [1], "out_hidden_size": 64},
    )
    cfg._attn_implementation = "eager"
    cfg.vision_config._attn_implementation = "eager"
    return cfg


def random_model(temporal_patch, window_px=GRID * 4):
    model = Qwen2_5_VLForConditionalGeneration(config(temporal_patch, window_px)).float()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    return model


def main():
    out = sys.argv[1]
    torch.manual_seed(1234)
    random_model(1).save_pretrained(f"{out}/cli", safe_serialization=True, max_shard_size="100KB")
    model = random_model(2)
    model.save_pretrained(f"{out}/model", safe_serialization=True)
    model.save_pretrained(f"{out}/sharded", safe_serialization=True, max_shard_size="40KB")

    batch = make_batch(model)
    loss = forward_backward(model, batch)
    write_case(out, "", model, batch, loss, {"loss": loss})
    print(f"transformers loss {loss:.9g}")

    # Window attention over 4 windows of 2 x 2 merged tokens per image: the
    # true model (its vision tower reorders the patches into windows and the
    # merged tokens back to raster order before the LLM; dhp stores the
    # patches in window order and puts the tokens back in the hand-off).
    model = random_model(2, window_px=16)
    model.save_pretrained(f"{out}/window", safe_serialization=True)
    batch = make_batch(model)
    loss = forward_backward(model, batch)
    write_case(out, "window_", model, batch, loss, {"loss": loss})
    print(f"transformers window loss {loss:.9g}")
    audio_case(out)
    llava_case(out)


LLAVA_SIDE, LLAVA_PATCH = 16, 4     # 16 px images of 4 px patches: 16 patches + the class row


def llava_model():
    cfg = LlavaConfig(
        vision_config={"model_type": "clip_vision_model", "hidden_size": 32, "intermediate_size": 64,
                       "num_hidden_layers": 3, "num_attention_heads": 4, "num_channels": 3,
                       "image_size": LLAVA_SIDE, "patch_size": LLAVA_PATCH, "hidden_act": "quick_gelu",
                       "layer_norm_eps": 1e-3},
        text_config={"model_type": "llama", "vocab_size": VOCAB, "hidden_size": 64, "intermediate_size": 128,
                     "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
                     "rms_norm_eps": 1e-3, "rope_theta": 10000.0, "max_position_embeddings": 512,
                     "tie_word_embeddings": False},
        image_token_index=IMAGE, vision_feature_layer=-2, vision_feature_select_strategy="default",
        projector_hidden_act="gelu")
    cfg._attn_implementation = "eager"
    cfg.vision_config._attn_implementation = "eager"
    cfg.text_config._attn_implementation = "eager"
    model = LlavaForConditionalGeneration(cfg).float()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    return model


def llava_case(out):
    """LLaVA-1.5's layout: each sample is its image's 16 patch tokens (image_token_index,
    replaced by the projected features in transformers) then its text; labels as the
    Qwen2.5-VL case's. dhp's pixels are the image's patches in raster order, each
    patch flattened as the Conv2d weight's [C, P, P]."""
    model = llava_model()
    model.save_pretrained(f"{out}/llava", safe_serialization=True)
    llava_model().save_pretrained(f"{out}/llava_cli", safe_serialization=True, max_shard_size="60KB")
    g = LLAVA_SIDE // LLAVA_PATCH
    P = g * g
    pixel_values = torch.randn(BATCH, 3, LLAVA_SIDE, LLAVA_SIDE)
    text = torch.randint(0, 256, (BATCH, TEXT))
    ids = torch.cat([torch.full((BATCH, P), IMAGE), text], 1)
    labels = ids.clone()
    labels[:, :P + 1] = -100
    model.train()
    res = model(input_ids=ids, pixel_values=pixel_values, labels=labels)
    res.loss.backward()
    loss = res.loss.item()
    os.makedirs(f"{out}/llava_grads", exist_ok=True)
    # the block after the feature layer and post_layernorm get no gradient (nothing reads them)
    save_file({n: (p.grad if p.grad is not None else torch.zeros_like(p)).detach().contiguous()
               for n, p in model.named_parameters()}, f"{out}/llava_grads/model.safetensors", metadata={"format": "pt"})
    patches = pixel_values.view(BATCH, 3, g, LLAVA_PATCH, g, LLAVA_PATCH).permute(0, 2, 4, 1, 3, 5)
    patches.reshape(BATCH * P, 3 * LLAVA_PATCH * LLAVA_PATCH).contiguous().numpy().astype(np.float32).tofile(
        f"{out}/llava_pixels.bin")
    text.numpy().astype(np.int32).tofile(f"{out}/llava_tokens.bin")
    unused = [n for n, p in model.named_parameters() if p.grad is None]
    with open(f"{out}/llava_batch.json", "w") as f:
        json.dump({"batch": BATCH, "text_tokens": TEXT, "n_images": BATCH, "patches": P, "grid_h": g, "grid_w": g,
                   "loss": loss, "no_grad": unused}, f)
    print(f"transformers llava loss {loss:.9g}; {len(unused)} tensors without a gradient (block 2, post_layernorm)")


def audio_case(out, clips=3, frames=16, mel=16):
    cfg = Qwen2AudioConfig(
        audio_config={"d_model": 32, "encoder_layers": 2, "encoder_attention_heads": 4, "encoder_ffn_dim": 64,
                      "num_mel_bins": mel, "max_source_positions": frames // 2},
        text_config={"model_type": "qwen2", "vocab_size": VOCAB, "hidden_size": 64, "intermediate_size": 128,
                     "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
                     "rms_norm_eps": 1e-3, "tie_word_embeddings": False},
        audio_token_index=VIDEO)
    cfg._attn_implementation = "eager"
    cfg.audio_config._attn_implementation = "eager"
    model = Qwen2AudioForConditionalGeneration(cfg).float()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    model.save_pretrained(f"{out}/audio", safe_serialization=True)
    model.train()
    features = torch.randn(clips, mel, frames)          # transformers' input_features [clips, mel bins, frames]
    y = model.multi_modal_projector(model.audio_tower(features).last_hidden_state)
    dout = torch.randn_like(y)
    (y * dout).sum().backward()
    os.makedirs(f"{out}/audio_grads", exist_ok=True)
    save_file({n: (p.grad if p.grad is not None else torch.zeros_like(p)).detach().contiguous()
               for n, p in model.named_parameters()}, f"{out}/audio_grads/model.safetensors", metadata={"format": "pt"})
    features.transpose(1, 2).contiguous().numpy().astype(np.float32).tofile(f"{out}/audio_mel.bin")   # dhp: frame-major
    dout.detach().numpy().astype(np.float32).tofile(f"{out}/audio_dout.bin")
    y.detach().numpy().astype(np.float32).tofile(f"{out}/audio_out.bin")
    # transformers freezes the learned positions (Qwen2AudioEncoder: embed_positions.requires_grad_(False))
    frozen = [n for n, p in model.audio_tower.named_parameters(prefix="audio_tower") if not p.requires_grad]
    with open(f"{out}/audio_batch.json", "w") as f:
        json.dump({"n_audio": clips, "mel_frames": frames, "rows": y.shape[0] * y.shape[1], "width": y.shape[2],
                   "frozen": frozen}, f)
    audio_llm_case(out, model, frames, mel)


def audio_llm_case(out, model, frames, mel):
    """The whole model: each sample is its clip's pooled rows (the audio
    tokens, already expanded as Qwen2AudioProcessor expands them), then its
    text; labels -100 on the audio tokens and the first text token."""
    model.zero_grad()
    features = torch.randn(BATCH, mel, frames)
    rows = model.audio_tower._get_feat_extract_output_lengths(torch.tensor([frames]))[1].item()
    text = torch.randint(0, 256, (BATCH, TEXT))
    ids = torch.cat([torch.full((BATCH, rows), VIDEO), text], 1)
    labels = ids.clone()
    labels[:, :rows + 1] = -100
    res = model(input_ids=ids, input_features=features, feature_attention_mask=torch.ones(BATCH, frames, dtype=torch.long),
                labels=labels)
    res.loss.backward()
    os.makedirs(f"{out}/audio_llm_grads", exist_ok=True)
    save_file({n: (p.grad if p.grad is not None else torch.zeros_like(p)).detach().contiguous()
               for n, p in model.named_parameters()}, f"{out}/audio_llm_grads/model.safetensors", metadata={"format": "pt"})
    features.transpose(1, 2).contiguous().numpy().astype(np.float32).tofile(f"{out}/audio_llm_mel.bin")
    text.numpy().astype(np.int32).tofile(f"{out}/audio_llm_tokens.bin")
    with open(f"{out}/audio_llm_batch.json", "w") as f:
        json.dump({"batch": BATCH, "text_tokens": TEXT, "mel_frames": frames, "audio_rows": rows,
                   "loss": res.loss.item()}, f)
    print(f"transformers audio loss {res.loss.item():.9g}")


MERGED = GRID * GRID // 4
CPP = 3 * 2 * 4 * 4


def make_batch(model):
    pixels = torch.randn(BATCH * GRID * GRID, CPP)
    grid_thw = torch.tensor([[1, GRID, GRID]] * BATCH)
    text = torch.randint(0, 256, (BATCH, TEXT))
    ids = torch.cat([torch.full((BATCH, MERGED), IMAGE), text], 1)
    with_start = torch.cat([torch.full((BATCH, 1), VSTART), ids], 1)
    pos, _ = model.get_rope_index(with_start, grid_thw, None, None, None)
    labels = ids.clone()
    labels[:, :MERGED + 1] = -100
    widx, _ = model.visual.get_window_index(grid_thw)
    return {"pixels": pixels, "grid_thw": grid_thw, "text": text, "ids": ids, "pos": pos[:, :, 1:] - 1,
            "labels": labels, "window_index": torch.as_tensor(widx)}


def forward_backward(model, b):
    model.train()
    res = model(input_ids=b["ids"], pixel_values=b["pixels"], image_grid_thw=b["grid_thw"],
                position_ids=b["pos"], labels=b["labels"])
    res.loss.backward()
    return res.loss.item()


def write_case(out, prefix, model, b, loss, extra):
    os.makedirs(f"{out}/{prefix}grads", exist_ok=True)
    save_file({n: p.grad.detach().contiguous() for n, p in model.named_parameters()},
              f"{out}/{prefix}grads/model.safetensors", metadata={"format": "pt"})
    pixels = b["pixels"]
    if prefix:   # dhp stores an image's patches in window order (executor.h, ex_patch_positions)
        pixels = pixels.view(-1, 4, CPP)[b["window_index"]].reshape(-1, CPP)
    pixels.numpy().astype(np.float32).tofile(f"{out}/{prefix}pixels.bin")
    b["text"].numpy().astype(np.int32).tofile(f"{out}/{prefix}tokens.bin")
    with open(f"{out}/{prefix}batch.json", "w") as f:
        json.dump(dict({"batch": BATCH, "text_tokens": TEXT, "n_images": BATCH, "patches": GRID * GRID,
                        "grid_h": GRID, "grid_w": GRID, "positions": b["pos"][:, 0].tolist()}, **extra), f)


if __name__ == "__main__":
    main()
