#!/usr/bin/env bash
# Safetensors interop: Python writes checkpoints with its own writer, dhp
# reads and re-writes them (F32 and BF16), Python reads dhp's files back with
# `safetensors` if importable, else an independent json+struct reader.
. "$(dirname "$0")/lib.sh"

PY=/usr/bin/python3
if [ ! -x "$PY" ]; then skip ckpt_python_interop "no /usr/bin/python3"; exit 0; fi

cat >"$T/st.py" <<'PYEOF'
import json, struct, sys
import numpy as np
DT = {"F32": np.float32, "I32": np.int32}

def write(path, tensors, meta):
    hdr, off, blobs = {"__metadata__": meta}, 0, []
    for name, (dt, a) in tensors.items():
        raw = a.astype("<u2").tobytes() if dt == "BF16" else a.astype("<f4").tobytes()
        hdr[name] = {"dtype": dt, "shape": list(a.shape), "data_offsets": [off, off + len(raw)]}
        off += len(raw); blobs.append(raw)
    h = json.dumps(hdr).encode()          # deliberately not 8-byte padded
    open(path, "wb").write(struct.pack("<Q", len(h)) + h + b"".join(blobs))

def read(path):
    try:
        from safetensors.numpy import load_file, safe_open
        with safe_open(path, "np") as f: meta = f.metadata()
        return load_file(path), meta, "safetensors"
    except ImportError:
        pass
    b = open(path, "rb").read()
    n = struct.unpack_from("<Q", b, 0)[0]
    hdr = json.loads(b[8:8 + n]); meta = hdr.pop("__metadata__", {})
    data, out = b[8 + n:], {}
    for name, e in hdr.items():
        s, t = e["data_offsets"]
        if e["dtype"] == "BF16":
            out[name] = widen(np.frombuffer(data[s:t], "<u2")).reshape(e["shape"])
        else:
            out[name] = np.frombuffer(data[s:t], np.dtype(DT[e["dtype"]]).newbyteorder("<")).reshape(e["shape"])
    return out, meta, "json+struct"

def verify_checksums(path):
    """dhp's checksums, recomputed with zlib: crc32:<name> per tensor's stored
    bytes, meta_crc32 over the other metadata pairs (NUL-terminated, in order)."""
    import zlib
    b = open(path, "rb").read()
    n = struct.unpack_from("<Q", b, 0)[0]
    hdr = json.loads(b[8:8 + n]); meta = hdr.pop("__metadata__", {})
    data = b[8 + n:]
    for name, e in hdr.items():
        s, t = e["data_offsets"]
        assert int(meta["crc32:" + name], 16) == zlib.crc32(data[s:t]), "crc32 of " + name
    crc = 0
    for k, v in meta.items():
        if k != "meta_crc32": crc = zlib.crc32(v.encode() + b"\0", zlib.crc32(k.encode() + b"\0", crc))
    assert int(meta["meta_crc32"], 16) == crc, "meta_crc32"
    return {k: v for k, v in meta.items() if not k.startswith("crc32:") and k != "meta_crc32"}

def widen(bits):    # uint16 bf16 bits -> float32, flattened
    return (bits.astype(np.uint32).reshape(-1) << np.uint32(16)).view(np.float32)

def bf16_bits(a):   # round to nearest even, as a uint16 array
    u = a.astype(np.float32).view(np.uint32).astype(np.uint64)
    s16, one = np.uint64(16), np.uint64(1)
    return ((u + np.uint64(0x7FFF) + ((u >> s16) & one)) >> s16).astype(np.uint16)

rng = np.random.default_rng(3)
src = {"embed.weight": rng.standard_normal((7, 5)).astype(np.float32) * 10,
       "blk.0.attn.qkv": rng.standard_normal((2, 3, 4)).astype(np.float32),
       "adam.m.embed": np.array([1e-38, -0.0, 3.4e38, 1.0], np.float32),
       "scalar": np.array(2.5, np.float32),
       "empty": np.zeros((0, 3), np.float32)}
bf = rng.standard_normal((9,)).astype(np.float32)
meta = {"step": "77", "rng_state": "12345678901234567890", "note": "caf\u00e9 \"quoted\""}
mode, path = sys.argv[1], sys.argv[2]
if mode == "write":
    t = {k: ("F32", v) for k, v in src.items()}
    t["bf"] = ("BF16", bf16_bits(bf))
    write(path, t, meta)
else:
    got, gmeta, how = read(path)
    assert verify_checksums(path) == meta, gmeta
    assert set(got) == set(src) | {"bf"}, sorted(got)
    for k, v in src.items():
        want = v if mode == "check-f32" else widen(bf16_bits(v))
        assert got[k].shape == v.shape and got[k].dtype == np.float32, k
        assert np.array_equal(got[k].view(np.uint32), want.reshape(v.shape).view(np.uint32)), k
    bfw = widen(bf16_bits(bf))
    assert np.array_equal(got["bf"].view(np.uint32), bfw.view(np.uint32)), "bf"
    print("read with", how)
PYEOF

if ! "$PY" -c 'import numpy' 2>/dev/null; then skip ckpt_python_interop "numpy missing in /usr/bin/python3"; exit 0; fi
"$PY" "$T/st.py" write "$T/py.safetensors" >"$T/pyout" 2>&1 || fail ckpt_python_writer "$(tail -c 300 "$T/pyout")"

if "$DHP" data ckpt-inspect "$T/py.safetensors" >"$T/out" 2>"$T/err" \
   && grep -q "^6 tensors, 3 metadata entries" "$T/out" \
   && grep -q "^tensor blk.0.attn.qkv F32 \[2,3,4\]" "$T/out" \
   && grep -q "^tensor bf BF16 \[9\]" "$T/out" \
   && grep -q "^tensor scalar F32 \[\]" "$T/out" \
   && grep -q "^meta step = 77" "$T/out"; then ok ckpt_reads_python_file
else fail ckpt_reads_python_file "$(cat "$T/out" "$T/err" | head -c 400)"; fi

for mode in f32 bf16; do
    flag=; [ $mode = bf16 ] && flag=--bf16
    if "$DHP" data ckpt-copy "$T/py.safetensors" "$T/c_$mode.safetensors" $flag 2>"$T/err" \
       && "$PY" "$T/st.py" check-$mode "$T/c_$mode.safetensors" >"$T/pyout" 2>&1; then
        ok "ckpt_python_reads_dhp_$mode ($(cat "$T/pyout"))"
    else fail "ckpt_python_reads_dhp_$mode" "$(cat "$T/err"; tail -c 300 "$T/pyout")"; fi
done

head -c 100 "$T/py.safetensors" >"$T/trunc.safetensors"
expect_err ckpt_cli_truncated 'trunc.safetensors: header length [0-9]+ runs past end of file' \
    "$DHP" data ckpt-inspect "$T/trunc.safetensors"
expect_err ckpt_cli_missing 'cannot open' "$DHP" data ckpt-inspect "$T/none.safetensors"
expect_err ckpt_cli_copy_args 'ckpt-copy: needs IN and OUT' "$DHP" data ckpt-copy "$T/py.safetensors"
