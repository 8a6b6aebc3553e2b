#!/usr/bin/env python3
"""Rounds the weights of a dhp checkpoint step (its *.safetensors, format
dhp.ckpt/1) to bfloat16 in place, leaving the AdamW moments, and rewrites
each tensor's CRC and the metadata's (executor/checkpoint.c checks them): one bf16 rounding of
every weight, the perturbation bench/bf16_curve.sh measures a trajectory's
sensitivity with. MODE: nearest (round to nearest, ties to even, as
executor/bf16.h), down (toward zero), up (away from zero).
usage: bf16_perturb.py STEP_DIR MODE"""
import array, json, os, struct, sys, zlib


def round_bits(b, mode):
    if (b & 0x7F800000) == 0x7F800000:  # inf, nan: as they are
        return b
    low = b & 0xFFFF
    hi = b & 0xFFFF0000
    if mode == "down" or low == 0:
        return hi
    if mode == "up":
        return (hi + 0x10000) & 0xFFFFFFFF
    return (b + 0x7FFF + ((b >> 16) & 1)) & 0xFFFF0000  # nearest, ties to even


def perturb(path, mode):
    with open(path, "rb") as f:
        raw = bytearray(f.read())
    n = struct.unpack("<Q", raw[:8])[0]
    head = json.loads(raw[8:8 + n])
    meta = head.get("__metadata__", {})
    base = 8 + n
    for name, t in head.items():
        if name == "__metadata__" or name.startswith("adam_") or t["dtype"] != "F32":
            continue
        lo, hi = (base + o for o in t["data_offsets"])
        a = array.array("I", bytes(raw[lo:hi]))
        for i, b in enumerate(a):
            a[i] = round_bits(b, mode)
        raw[lo:hi] = a.tobytes()
        key = "crc32:" + name
        if key in meta:
            meta[key] = "%08x" % zlib.crc32(raw[lo:hi])
    if "meta_crc32" in meta:  # over every other key and value, NUL-terminated, in order
        crc = 0
        for k, v in meta.items():
            if k != "meta_crc32":
                crc = zlib.crc32(k.encode() + b"\0" + v.encode() + b"\0", crc)
        meta["meta_crc32"] = "%08x" % crc
    text = json.dumps(head, separators=(",", ":")).encode()
    text += b" " * (n - len(text))  # the same header length: offsets unchanged
    if len(text) != n:
        sys.exit(f"{path}: the header grew")
    raw[8:8 + n] = text
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(raw)
    os.replace(tmp, path)


if __name__ == "__main__":
    if len(sys.argv) != 3 or sys.argv[2] not in ("nearest", "down", "up"):
        sys.exit(__doc__)
    for f in sorted(os.listdir(sys.argv[1])):
        if f.endswith(".safetensors"):
            perturb(os.path.join(sys.argv[1], f), sys.argv[2])
