#!/usr/bin/env python3
"""PyTorch reference for the dhp audio encoder (tests/t_torch_ref.sh).

Usage: torch_audio_ref.py DIR

DIR holds what tests/test_audio.c dumped: config.json (the audio module's
shapes, the batch geometry, the optimizer), params.bin (+ .names) of an
audio-only model instance, mel.bin (fp32 [n_audio, mel_frames, mel_bins])
and dout.bin (fp32 [rows, out_hidden]). The encoder is rebuilt here in
float64 from torch's own modules, independently of the C code, as
Qwen2-Audio / Qwen2.5-Omni run it (transformers
models/qwen2_audio/modeling_qwen2_audio.py Qwen2AudioEncoder,
models/qwen2_5_omni/modeling_qwen2_5_omni.py Qwen2_5OmniAudioEncoder):
per clip, gelu(conv1), gelu(conv2 stride 2), + positions (the learned table's
first rows, frozen as Qwen2AudioEncoder freezes embed_positions, or Whisper's sinusoids), pre-norm blocks (LayerNorm, attention
over the clip with q, v biases and none on k, GELU MLP), AvgPool1d(pool),
the final LayerNorm and the projector. The loss is sum(out * dout), so its
gradient with respect to the output is dout. Writes the files torch_ref.py
writes: ref_loss.txt, ref_grads.bin, ref_adam_losses.txt, ref_adam_params.bin.
"""
import json
import math
import os
import sys

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from torch_ref import DT, load_params, write_reference  # noqa: E402

LN_EPS = 1e-5   # torch.nn.LayerNorm's default, Whisper's


def linear(x, P, name):
    b = P.get(name + ".bias")
    return F.linear(x, P[name + ".weight"], b)


def layernorm(x, P, name):
    return F.layer_norm(x, (x.shape[-1],), P[name + ".weight"], P.get(name + ".bias"), LN_EPS)


def conv(x, P, name, channels, k, stride):
    """torch Conv1d over frames: x [T, C] -> [T', d]; weight stored [d, C * k]."""
    w = P[name + ".weight"]
    w = w.view(w.shape[0], channels, k)
    return F.conv1d(x.T[None], w, P.get(name + ".bias"), stride=stride, padding=k // 2)[0].T


def sinusoids(length, channels):
    """Whisper's sinusoids (Qwen2_5Omni SinusoidsPositionEmbedding)."""
    inc = math.log(10000) / (channels // 2 - 1)
    inv = torch.exp(-inc * torch.arange(channels // 2, dtype=DT))
    t = torch.arange(length, dtype=DT)[:, None] * inv[None, :]
    return torch.cat([torch.sin(t), torch.cos(t)], dim=1)


def block(P, pre, x, m):
    n, H, hd = x.shape[0], m["heads"], m["head_dim"]
    h = layernorm(x, P, pre + "norm1")
    q = linear(h, P, pre + "attn.q").view(n, H, hd).transpose(0, 1)
    k = linear(h, P, pre + "attn.k").view(n, H, hd).transpose(0, 1)
    v = linear(h, P, pre + "attn.v").view(n, H, hd).transpose(0, 1)
    att = ((q @ k.transpose(1, 2)) / math.sqrt(hd)).softmax(-1) @ v
    x = x + linear(att.transpose(0, 1).reshape(n, H * hd), P, pre + "attn.o")
    h = layernorm(x, P, pre + "norm2")
    return x + linear(F.gelu(linear(h, P, pre + "mlp.fc1")), P, pre + "mlp.fc2")


def encoder(P, m, b, mel):
    C, k = m["in_channels"], m["patch"]
    outs = []
    for c in range(b["n_audio"]):
        x = F.gelu(conv(mel[c], P, "audio.conv1", C, k, 1))
        x = F.gelu(conv(x, P, "audio.conv2", x.shape[1], k, 2))
        pos = P.get("audio.embed_positions.weight")   # frozen, as transformers holds it: no gradient
        x = x + (pos.detach()[:x.shape[0]] if pos is not None else sinusoids(x.shape[0], x.shape[1]))
        for l in range(m["layers"]):
            x = block(P, f"audio.blocks.{l}.", x, m)
        x = F.avg_pool1d(x.T[None], m["pool"], m["pool"])[0].T
        outs.append(linear(layernorm(x, P, "audio.layer_norm"), P, "audio.proj"))
    return torch.cat(outs, 0)


def main():
    d = sys.argv[1]
    with open(f"{d}/config.json") as f:
        cfg = json.load(f)
    m, b = cfg["audio"], cfg["batch"]
    names, P0 = load_params(d)
    mel = torch.tensor(np.fromfile(f"{d}/mel.bin", dtype=np.float32).astype(np.float64))
    mel = mel.view(b["n_audio"], b["mel_frames"], m["in_channels"])
    dout = torch.tensor(np.fromfile(f"{d}/dout.bin", dtype=np.float32).astype(np.float64))

    def loss_of(P):
        out = encoder(P, m, b, mel)
        return (out.reshape(-1) * dout).sum()

    write_reference(d, names, P0, cfg["optim"], loss_of)


if __name__ == "__main__":
    main()
