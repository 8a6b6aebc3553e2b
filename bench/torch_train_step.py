#!/usr/bin/env python3
"""PyTorch float32 baseline for bench/train_speed.sh: one training step of the
same model dhp run trains (a models/zoo JSON, e.g. dhp-100m), timed on the CPU.

Usage: torch_train_step.py --model models/zoo/dhp-100m.json --threads N
                           --batch B --image-size S --text-tokens T
                           [--warmup W] [--steps K]
                           [--foreach 0|1] [--set-to-none 0|1]
Prints one JSON object: threads, params, median step_s over K steps after W
warm-up steps, all step times, the first loss.

The model is written for speed, not as a reference (tests/ref/torch_ref.py is
the float64 reference): nn.Linear layers, batched [B, L, d] tensors (every
sample has the same geometry), scaled-dot-product attention, GQA by expanding
the kv heads. Architecture (Qwen2.5-VL style, as executor/model.c): vision
patch linear, pre-norm blocks (RMSNorm, attention with 2-D rotary, SwiGLU),
full attention per image, merger RMSNorm -> concat merge^2 -> Linear ->
GELU(erf) -> Linear; LLM with [vision tokens, text tokens] per sample, 1-D
rotary, causal GQA, SwiGLU, final RMSNorm on the predicting rows, LM head,
cross-entropy on the next text tokens. A step is what dhp's step_s covers:
forward, backward, clip_grad_norm_(1.0), AdamW (decay on matrices only),
zeroing the gradients. One image per sample (dhp data synth's layout).
"""
import argparse
import json
import math
import statistics
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

EPS = 1e-6
THETA = 10000.0


def sdpa(q, k, v, causal):
    """q/k/v [B, H, L, hd]; torch >= 2 has the public fused kernel, 1.13 the private one."""
    if hasattr(F, "scaled_dot_product_attention"):
        return F.scaled_dot_product_attention(q, k, v, is_causal=causal)
    return F._scaled_dot_product_attention(q, k, v, None, 0.0, False, causal)[0]


class RMSNorm(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(d))

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + EPS) * self.weight


def rope(x, cos, sin):
    """Rotate-half RoPE on x [B, L, heads, hd]; cos/sin [L, 1, hd] (halves repeated)."""
    half = x.shape[-1] // 2
    rot = torch.cat([-x[..., half:], x[..., :half]], -1)
    return x * cos + rot * sin


class Block(nn.Module):
    def __init__(self, m):
        super().__init__()
        d, hd = m["hidden"], m["head_dim"]
        self.H, self.Hkv, self.hd = m["heads"], m["kv_heads"], hd
        qkv_b, out_b, mlp_b = m.get("qkv_bias", False), m.get("out_bias", False), m.get("mlp_bias", False)
        self.norm1, self.norm2 = RMSNorm(d), RMSNorm(d)
        self.q = nn.Linear(d, self.H * hd, bias=qkv_b)
        self.k = nn.Linear(d, self.Hkv * hd, bias=qkv_b)
        self.v = nn.Linear(d, self.Hkv * hd, bias=qkv_b)
        self.o = nn.Linear(self.H * hd, d, bias=out_b)
        self.gate = nn.Linear(d, m["ffn"], bias=mlp_b)
        self.up = nn.Linear(d, m["ffn"], bias=mlp_b)
        self.down = nn.Linear(m["ffn"], d, bias=mlp_b)

    def forward(self, x, cos, sin, causal):
        B, L, _ = x.shape
        H, Hkv, hd = self.H, self.Hkv, self.hd
        h = self.norm1(x)
        q = rope(self.q(h).view(B, L, H, hd), cos, sin).transpose(1, 2)
        k = rope(self.k(h).view(B, L, Hkv, hd), cos, sin).transpose(1, 2)
        v = self.v(h).view(B, L, Hkv, hd).transpose(1, 2)
        if Hkv != H:
            k = k[:, :, None].expand(B, Hkv, H // Hkv, L, hd).reshape(B, H, L, hd)
            v = v[:, :, None].expand(B, Hkv, H // Hkv, L, hd).reshape(B, H, L, hd)
        a = sdpa(q, k, v, causal).transpose(1, 2).reshape(B, L, H * hd)
        x = x + self.o(a)
        h = self.norm2(x)
        return x + self.down(F.silu(self.gate(h)) * self.up(h))


def rope_tables(pos_angles):
    """angles [L, hd/2] -> cos/sin [L, 1, hd] with the halves repeated (rotate-half)."""
    ang = torch.cat([pos_angles, pos_angles], -1)[:, None, :]
    return ang.cos().float(), ang.sin().float()


def vision_angles(grid, merge, hd):
    """Qwen2-VL 2-D rotary over patches in merge-group order: the first hd/4 pairs
    rotate by the patch row, the rest by its column (as executor/model.c)."""
    r = torch.arange(grid)[:, None].expand(grid, grid)
    c = torch.arange(grid)[None, :].expand(grid, grid)

    def order(t):
        u = grid // merge
        return t.reshape(u, merge, u, merge).permute(0, 2, 1, 3).reshape(-1)
    dim = hd // 2
    inv = 1.0 / (THETA ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim))
    return torch.cat([order(r)[:, None].double() * inv, order(c)[:, None].double() * inv], -1)


class VisionLM(nn.Module):
    def __init__(self, vm, lm):
        super().__init__()
        self.vm, self.lm = vm, lm
        cpp = vm["in_channels"] * vm.get("temporal_patch", 1) * vm["patch"] ** 2
        self.patch_embed = nn.Linear(cpp, vm["hidden"])
        self.vblocks = nn.ModuleList(Block(vm) for _ in range(vm["layers"]))
        self.merger_norm = RMSNorm(vm["hidden"])
        self.fc1 = nn.Linear(vm["proj_in"], vm["proj_hidden"])
        self.fc2 = nn.Linear(vm["proj_hidden"], vm["out_hidden"])
        self.embed = nn.Embedding(lm["vocab"], lm["hidden"])
        self.layers = nn.ModuleList(Block(lm) for _ in range(lm["layers"]))
        self.norm = RMSNorm(lm["hidden"])
        self.head = nn.Linear(lm["hidden"], lm["vocab"], bias=False)
        for p in self.parameters():
            if p.dim() >= 2:
                nn.init.normal_(p, std=0.02)

    def forward(self, pixels, tokens, vcos, vsin, lcos, lsin):
        """pixels [B, P, cpp] (one image per sample), tokens [B, T] -> mean CE."""
        B, P, _ = pixels.shape
        x = self.patch_embed(pixels)
        for blk in self.vblocks:
            x = blk(x, vcos, vsin, False)
        m2 = self.vm["merge"] ** 2
        vis = self.fc2(F.gelu(self.fc1(self.merger_norm(x).reshape(B, P // m2, -1))))
        x = torch.cat([vis, self.embed(tokens)], 1)
        for blk in self.layers:
            x = blk(x, lcos, lsin, True)
        T = tokens.shape[1]
        h = self.norm(x[:, P // m2:P // m2 + T - 1])
        logits = self.head(h)
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), tokens[:, 1:].reshape(-1))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--image-size", type=int, default=64)
    ap.add_argument("--text-tokens", type=int, default=64)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--steps", type=int, default=5)
    # Defaults: the fastest combination measured with Debian's torch 1.13 on this 2-core
    # machine (foreach=1 and set_to_none=1 were each 15-40% slower per step).
    ap.add_argument("--foreach", type=int, default=0, help="AdamW foreach (multi-tensor) implementation")
    ap.add_argument("--set-to-none", type=int, default=0, help="zero_grad(set_to_none=...)")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    with open(a.model) as f:
        mods = json.load(f)["modules"]
    for m in mods:   # models/SCHEMA.md defaults
        m.setdefault("kv_heads", m["heads"])
        m.setdefault("head_dim", m["hidden"] // m["heads"])
    vm = next(m for m in mods if m["kind"] == "vision")
    lm = next(m for m in mods if m["kind"] == "llm")
    if vm.get("window", 0) != 0:
        raise SystemExit("torch_train_step.py: window attention is not implemented here (full attention only)")
    grid = a.image_size // vm["patch"]
    P, mpi = grid * grid, grid * grid // vm["merge"] ** 2
    model = VisionLM(vm, lm)
    n_params = sum(p.numel() for p in model.parameters())
    vcos, vsin = rope_tables(vision_angles(grid, vm["merge"], vm["head_dim"]))
    L, hd = mpi + a.text_tokens, lm["head_dim"]
    inv = 1.0 / (THETA ** (torch.arange(0, hd, 2, dtype=torch.float64) / hd))
    lcos, lsin = rope_tables(torch.arange(L, dtype=torch.float64)[:, None] * inv)
    cpp = vm["in_channels"] * vm.get("temporal_patch", 1) * vm["patch"] ** 2
    pixels = torch.randn(a.batch, P, cpp)
    tokens = torch.randint(0, lm["vocab"], (a.batch, a.text_tokens))
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=1e-3, betas=(0.9, 0.999), eps=1e-8, foreach=bool(a.foreach))
    times, first_loss = [], None
    for i in range(a.warmup + a.steps):
        t0 = time.perf_counter()
        loss = model(pixels, tokens, vcos, vsin, lcos, lsin)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=bool(a.set_to_none))
        dt = time.perf_counter() - t0
        if first_loss is None:
            first_loss = loss.item()
        if i >= a.warmup:
            times.append(dt)
    print(json.dumps({"threads": a.threads, "torch": torch.__version__, "params": n_params,
                      "step_s": statistics.median(times), "steps_s": times, "first_loss": first_loss,
                      "loss_at_init_expected": math.log(lm["vocab"])}))


if __name__ == "__main__":
    main()
