#!/usr/bin/env python3
"""PyTorch reference for the dhp executor (tests/t_torch_ref.sh).

Usage: torch_ref.py DIR

DIR holds what the C side (tests/test_executor.c, torch_ref_* tests) dumped:
config.json (model shapes, batch geometry, optimizer), params.bin (+ .names),
pixels.bin (fp32), tokens.bin (int32). This script rebuilds the same model in
PyTorch independently of the C code, in float64, and writes:
  ref_loss.txt          loss of the batch
  ref_grads.bin         every parameter gradient, float64, in params.bin.names order
  ref_adam_losses.txt   losses of 5 steps of torch.optim.AdamW + clip_grad_norm_
  ref_adam_params.bin   parameters after those steps, float64, same order

Model: Qwen2.5-VL style (transformers models/qwen2_5_vl/modeling_qwen2_5_vl.py):
vision patch linear, pre-norm blocks (RMSNorm, attention with 2-D rotary,
SwiGLU), full or window attention, merger RMSNorm -> concat merge^2 ->
Linear -> GELU(erf) -> Linear, merged tokens back to raster order; LLM with 1-D rotary, GQA causal attention,
SwiGLU, final RMSNorm, LM head, cross-entropy on next text tokens. With
batch.loss_mask ([batch * text_tokens], null = none) only positions t with
mask[t] != 0 count (t = text_tokens - 1 never does) and the loss is their
summed cross-entropy / batch.loss_denominator (0 = their count).
"""
import json
import math
import sys

import numpy as np
import torch
import torch.nn.functional as F

EPS = 1e-6
THETA = 10000.0
DT = torch.float64


def load_params(d):
    names = []
    with open(f"{d}/params.bin.names") as f:
        for line in f:
            parts = line.split()
            nd = int(parts[1])
            names.append((parts[0], [int(x) for x in parts[2:2 + nd]]))
    raw = np.fromfile(f"{d}/params.bin", dtype=np.float32)
    params, off = {}, 0
    for name, shape in names:
        n = int(np.prod(shape))
        params[name] = torch.tensor(raw[off:off + n].reshape(shape).astype(np.float64))
        off += n
    assert off == raw.size, "params.bin size does not match names"
    return names, params


def rmsnorm(x, w):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + EPS) * w


def linear(x, P, name):
    y = x @ P[name + ".weight"].T
    b = P.get(name + ".bias")
    return y if b is None else y + b


def rotate(x, cos, sin):
    """Rotate-half RoPE; x [n, heads, hd], cos/sin [n, hd/2]."""
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    c, s = cos[:, None, :], sin[:, None, :]
    return torch.cat([x1 * c - x2 * s, x2 * c + x1 * s], -1)


def attention(q, k, v, bounds, causal):
    """Plain softmax attention per segment [s0, s1); q [n,H,hd], k/v [n,Hkv,hd]."""
    n, H, hd = q.shape
    rep = H // k.shape[1]
    k = k.repeat_interleave(rep, dim=1)
    v = v.repeat_interleave(rep, dim=1)
    outs = []
    for s0, s1 in bounds:
        qs, ks, vs = (t[s0:s1].transpose(0, 1) for t in (q, k, v))
        sc = qs @ ks.transpose(1, 2) / math.sqrt(hd)
        if causal:
            L = s1 - s0
            sc = sc.masked_fill(torch.ones(L, L, dtype=torch.bool).triu(1), float("-inf"))
        outs.append((sc.softmax(-1) @ vs).transpose(0, 1))
    return torch.cat(outs, 0).reshape(n, H * hd)


def block(P, pre, x, cos, sin, bounds, causal, m):
    n = x.shape[0]
    H, Hkv, hd = m["heads"], m["kv_heads"], m["head_dim"]
    h = rmsnorm(x, P[pre + "norm1.weight"])
    q = rotate(linear(h, P, pre + "attn.q").view(n, H, hd), cos, sin)
    k = rotate(linear(h, P, pre + "attn.k").view(n, Hkv, hd), cos, sin)
    v = linear(h, P, pre + "attn.v").view(n, Hkv, hd)
    x = x + linear(attention(q, k, v, bounds, causal), P, pre + "attn.o")
    h = rmsnorm(x, P[pre + "norm2.weight"])
    return x + linear(F.silu(linear(h, P, pre + "mlp.gate")) * linear(h, P, pre + "mlp.up"),
                      P, pre + "mlp.down")


def patch_positions(gh, gw, merge, window):
    """(row, col) of patches in Qwen2.5-VL order: windows, merge groups, patches."""
    side = int(round(math.sqrt(window))) if window > 0 else merge
    u = side // merge
    r = torch.arange(gh)[:, None].expand(gh, gw)
    c = torch.arange(gw)[None, :].expand(gh, gw)

    def order(t):
        return t.reshape(gh // side, u, merge, gw // side, u, merge).permute(0, 3, 1, 4, 2, 5).reshape(-1)
    return order(r), order(c)


def vision_forward(P, vm, b, pixels):
    gh, gw, npatch, nimg = b["grid_h"], b["grid_w"], b["patches"], b["n_images"]
    N = nimg * npatch
    rows, cols = patch_positions(gh, gw, vm["merge"], vm["window"])
    dim = vm["head_dim"] // 2
    inv = 1.0 / (THETA ** (torch.arange(0, dim, 2, dtype=DT) / dim))
    ang = torch.cat([rows[:, None].to(DT) * inv, cols[:, None].to(DT) * inv], -1).repeat(nimg, 1)
    cos, sin = ang.cos(), ang.sin()
    x = linear(pixels.reshape(N, -1), P, "vision.patch_embed")
    full = [(i * npatch, (i + 1) * npatch) for i in range(nimg)]
    W = vm["window"]
    win = [(i * W, (i + 1) * W) for i in range(N // W)] if W > 0 else full
    for l in range(vm["layers"]):
        is_win = W > 0 and l not in vm["full_layers"]
        x = block(P, f"vision.blocks.{l}.", x, cos, sin, win if is_win else full, False, vm)
    x = rmsnorm(x, P["vision.merger.norm.weight"]).reshape(-1, vm["proj_in"])
    y = linear(F.gelu(linear(x, P, "vision.merger.fc1")), P, "vision.merger.fc2")
    # back to raster order, as Qwen2.5-VL's vision tower returns its tokens
    # (hidden_states[reverse_indices]): merged token j sits at (row, col) of
    # its group's first patch, divided by the merge
    m2 = vm["merge"] ** 2
    raster = (rows[::m2] // vm["merge"]) * (gw // vm["merge"]) + cols[::m2] // vm["merge"]
    inverse = torch.argsort(raster)
    return y.reshape(nimg, -1, y.shape[-1])[:, inverse].reshape(y.shape)


def llm_forward(P, lm, b, tokens, vout):
    B, T, mpi = b["batch"], b["text_tokens"], b["merged_per_image"]
    wte = P["llm.embed_tokens.weight"]
    parts, bounds, pos, pred, img, start = [], [], [], [], 0, 0
    for s in range(B):
        nimg = b["images_per_sample"][s]
        seq = torch.cat([vout[img * mpi:(img + nimg) * mpi], wte[tokens[s]]], 0)
        img += nimg
        parts.append(seq)
        L = seq.shape[0]
        bounds.append((start, start + L))
        pos.append(torch.arange(L, dtype=DT))
        t0 = start + nimg * mpi
        pred += list(range(t0, t0 + T - 1))
        start += L
    x = torch.cat(parts, 0)
    hd = lm["head_dim"]
    inv = 1.0 / (THETA ** (torch.arange(0, hd, 2, dtype=DT) / hd))
    ang = torch.cat(pos)[:, None] * inv
    cos, sin = ang.cos(), ang.sin()
    for l in range(lm["layers"]):
        x = block(P, f"llm.layers.{l}.", x, cos, sin, bounds, True, lm)
    x = rmsnorm(x, P["llm.norm.weight"])
    head = P["llm.embed_tokens.weight"] if lm["tied_embeddings"] else P["llm.lm_head.weight"]
    logits = x[pred] @ head.T
    ce = F.cross_entropy(logits, tokens[:, 1:].reshape(-1), reduction="none")
    mask = b.get("loss_mask")
    if mask is not None:
        ce = ce[torch.tensor(mask, dtype=DT).view(B, T)[:, :-1].reshape(-1) != 0]
    den = b.get("loss_denominator") or ce.numel()
    return ce.sum() / den


def model_loss(P, cfg, pixels, tokens):
    b = cfg["batch"]
    vout = vision_forward(P, cfg["vision"], b, pixels) if b["n_images"] > 0 else None
    return llm_forward(P, cfg["llm"], b, tokens, vout)


def lr_at(o, step):
    if step < o["warmup_steps"]:
        return o["lr"] * (step + 1) / o["warmup_steps"]
    p = min(1.0, (step - o["warmup_steps"]) / max(1, o["total_steps"] - o["warmup_steps"]))
    return o["min_lr"] + (o["lr"] - o["min_lr"]) * 0.5 * (1 + math.cos(math.pi * p))


def write_f64(path, tensors):
    np.concatenate([t.detach().reshape(-1).numpy() for t in tensors]).astype(np.float64).tofile(path)


def write_reference(d, names, P0, o, loss_of):
    """The loss and every gradient at P0, then o["steps"] steps of
    torch.optim.AdamW (decay on matrices only) + clip_grad_norm_, into DIR's
    ref_loss.txt, ref_grads.bin, ref_adam_losses.txt, ref_adam_params.bin."""
    P = {k: v.clone().requires_grad_(True) for k, v in P0.items()}
    loss = loss_of(P)
    loss.backward()
    with open(f"{d}/ref_loss.txt", "w") as f:
        f.write(f"{loss.item():.17g}\n")
    # a tensor the model does not train (no grad) has a zero gradient, as dhp reports it
    write_f64(f"{d}/ref_grads.bin", [P[n].grad if P[n].grad is not None else torch.zeros_like(P[n]) for n, _ in names])

    P = {k: v.clone().requires_grad_(True) for k, v in P0.items()}
    decay = [P[n] for n, s in names if len(s) >= 2]
    no_decay = [P[n] for n, s in names if len(s) < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": o["weight_decay"]},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=o["lr"], betas=(o["beta1"], o["beta2"]), eps=o["eps"])
    losses = []
    for step in range(o["steps"]):
        for g in opt.param_groups:
            g["lr"] = lr_at(o, step)
        opt.zero_grad()
        loss = loss_of(P)
        loss.backward()
        torch.nn.utils.clip_grad_norm_([P[n] for n, _ in names], o["grad_clip"])
        opt.step()
        losses.append(loss.item())
    with open(f"{d}/ref_adam_losses.txt", "w") as f:
        f.write("".join(f"{x:.17g}\n" for x in losses))
    write_f64(f"{d}/ref_adam_params.bin", [P[n] for n, _ in names])


def main():
    d = sys.argv[1]
    with open(f"{d}/config.json") as f:
        cfg = json.load(f)
    names, P0 = load_params(d)
    b = cfg["batch"]
    pixels = torch.tensor(np.fromfile(f"{d}/pixels.bin", dtype=np.float32).astype(np.float64))
    tokens = torch.tensor(np.fromfile(f"{d}/tokens.bin", dtype=np.int32).astype(np.int64)).view(b["batch"], b["text_tokens"])
    write_reference(d, names, P0, cfg["optim"], lambda P: model_loss(P, cfg, pixels, tokens))


if __name__ == "__main__":
    main()
