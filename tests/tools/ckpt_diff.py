#!/usr/bin/env python3
"""Compares two dhp checkpoint directories (DIR/latest -> step dir of
<module>.safetensors files, https://github.com/huggingface/safetensors):
prints the worst relative difference over every tensor and exits 1 if it
exceeds --rtol. Relative difference of a tensor: ||a - b||_2 / ||a||_2
(the element-wise worst, max|a-b| / max|a|, is printed too: tensors whose
true gradient is zero, such as attention key biases under softmax's shift
invariance, take AdamW steps driven by rounding noise element by element)."""
import argparse, json, os, struct, sys
import numpy as np

def read_safetensors(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    out = {}
    for name, e in header.items():
        if name == "__metadata__":
            continue
        if e["dtype"] != "F32":
            raise SystemExit(f"{path}: {name}: dtype {e['dtype']} (expected F32)")
        b, end = e["data_offsets"]
        out[name] = np.frombuffer(data[b:end], dtype="<f4").reshape(e["shape"])
    return out, header.get("__metadata__", {})

def latest(d):
    with open(os.path.join(d, "latest")) as f:
        return os.path.join(d, f.read().strip())

def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("a"); ap.add_argument("b")
    ap.add_argument("--rtol", type=float, default=1e-5)
    ap.add_argument("--params-only", action="store_true", help="skip the AdamW moments")
    ap.add_argument("--skip-key-bias", action="store_true",
                    help="skip attention key biases (and their moments): their true gradient is identically zero "
                         "(q.(k_j + b) shifts every score of a query by the same q.b, which softmax ignores), "
                         "so their values are AdamW steps on rounding noise; their size is printed instead")
    args = ap.parse_args()
    da, db = latest(args.a), latest(args.b)
    files = sorted(f for f in os.listdir(da) if f.endswith(".safetensors"))
    if files != sorted(f for f in os.listdir(db) if f.endswith(".safetensors")):
        raise SystemExit(f"module files differ: {da} vs {db}")
    worst, where, worst_elem, where_elem, key_bias = 0.0, "", 0.0, "", 0.0
    for fn in files:
        ta, ma = read_safetensors(os.path.join(da, fn))
        tb, mb = read_safetensors(os.path.join(db, fn))
        if ma.get("step") != mb.get("step"):
            raise SystemExit(f"{fn}: step {ma.get('step')} vs {mb.get('step')}")
        if set(ta) != set(tb):
            raise SystemExit(f"{fn}: tensor names differ")
        for name in ta:
            if args.params_only and name.startswith("adam_"):
                continue
            if args.skip_key_bias and name.endswith("attn.k.bias"):
                if not name.startswith("adam_"):
                    key_bias = max(key_bias, float(np.max(np.abs(ta[name]))), float(np.max(np.abs(tb[name]))))
                continue
            a, b = ta[name].astype(np.float64), tb[name].astype(np.float64)
            if a.shape != b.shape:
                raise SystemExit(f"{fn}: {name}: shape {a.shape} vs {b.shape}")
            rel = np.linalg.norm(a - b) / max(np.linalg.norm(a), 1e-30)
            elem = np.max(np.abs(a - b)) / max(np.max(np.abs(a)), 1e-30)
            if rel > worst:
                worst, where = rel, f"{fn}:{name}"
            if elem > worst_elem:
                worst_elem, where_elem = elem, f"{fn}:{name}"
    print(f"worst relative difference {worst:.3e} at {where or '-'} (element-wise {worst_elem:.3e} at {where_elem or '-'})")
    if args.skip_key_bias:
        print(f"attention key biases skipped, largest |value| {key_bias:.3e}")
    sys.exit(0 if worst <= args.rtol else 1)

main()
