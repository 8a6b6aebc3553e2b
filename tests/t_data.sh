#!/usr/bin/env bash
# dhp data: synth/inspect through the CLI, bad input, and an independent
# Python check of the shard CRC32 (zlib) and record layout.
. "$(dirname "$0")/lib.sh"

D="$T/set"
if "$DHP" data synth --out "$D" --samples 12 --shards 2 --image-size 16 --patch 2 --merge 2 --window 16 \
        --text-tokens 32 --seed 5 >"$T/out" 2>"$T/err" \
   && grep -q "wrote 12 samples in 2 shards" "$T/out"; then ok data_cli_synth
else fail data_cli_synth "$(cat "$T/err")"; fi

if "$DHP" data inspect "$D" --captions 2 >"$T/out" 2>"$T/err" \
   && grep -q "samples   12 in 2 shards" "$T/out" \
   && grep -q "64 patches of 12" "$T/out" \
   && [ "$(grep -c '^caption' "$T/out")" = 2 ] \
   && grep -qE '^caption   0: a (small|large) [a-z]+ [a-z]+ (at|on|in) ' "$T/out"; then ok data_cli_inspect
else fail data_cli_inspect "$(cat "$T/out" "$T/err" | head -c 400)"; fi

expect_err data_cli_no_subcommand '^dhp data: needs a subcommand' "$DHP" data
expect_err data_cli_unknown_subcommand "unknown subcommand 'frobnicate'" "$DHP" data frobnicate
expect_err data_cli_synth_needs_out '^dhp data: synth: --out DIR is required' "$DHP" data synth --samples 4
expect_err data_cli_synth_unknown_option "unknown option '--bogus'" "$DHP" data synth --out "$T/x" --bogus 1
expect_err data_cli_synth_non_integer "--samples: 'many' is not an integer" "$DHP" data synth --out "$T/x" --samples many
expect_err data_cli_synth_missing_value '--seed needs a value' "$DHP" data synth --out "$T/x" --seed
expect_err data_cli_synth_negative_seed "--seed: '-3' is not an unsigned" "$DHP" data synth --out "$T/x" --seed -3
expect_err data_cli_synth_patch '^dhp data: synth: patch 5 must be >= 1 and divide image-size 32' "$DHP" data synth --out "$T/x" --patch 5
expect_err data_cli_synth_window 'window 12 is not a square' "$DHP" data synth --out "$T/x" --window 12
expect_err data_cli_synth_shards 'shards 9 outside \[1, samples=4\]' "$DHP" data synth --out "$T/x" --samples 4 --shards 9
expect_err data_cli_synth_unwritable 'cannot create directory' "$DHP" data synth --out "$T/no/such/dir"
expect_err data_cli_inspect_missing 'manifest.json' "$DHP" data inspect "$T/nothing-here"

cp -r "$D" "$T/bad"
printf 'X' | dd of="$T/bad/shard-00001.bin" bs=1 seek=500 conv=notrunc status=none
expect_err data_cli_inspect_corrupt 'shard-00001.bin: CRC32 mismatch' "$DHP" data inspect "$T/bad"

PY=/usr/bin/python3
if [ ! -x "$PY" ]; then skip data_python_reads_shards "no /usr/bin/python3"
elif "$PY" - "$D" >"$T/py" 2>&1 <<'PYEOF'
import json, struct, sys, zlib
d = sys.argv[1]
m = json.load(open(d + "/manifest.json"))
S, first = m["image_size"], 0
for k, sh in enumerate(m["shards"]):
    b = open(d + "/" + sh["file"], "rb").read()
    assert b[:8] == b"DHPDATA\0", "magic"
    f = struct.unpack_from("<14IQ", b, 8)
    version, hdr, idx, nsh, fs, n, tot, size, ch, P, M, W, T, rb, seed = f
    assert (version, hdr, idx, nsh, fs, n, tot, size) == (1, 72, k, len(m["shards"]), first, sh["samples"], m["samples"], S)
    assert rb == 8 + 64 + S * S * 3 and len(b) == 72 + n * rb + 4, "size"
    assert zlib.crc32(b[:-4]) == struct.unpack("<I", b[-4:])[0], "crc"
    for j in range(n):
        r = b[72 + j * rb: 72 + (j + 1) * rb]
        cap = r[8:8 + r[4]].decode()
        words = cap.split()
        assert words[0] == "a" and words[1] in ("small", "large"), cap
    first += n
assert first == m["samples"]
print("shards ok", first)
PYEOF
then ok data_python_reads_shards; else fail data_python_reads_shards "$(tail -c 300 "$T/py")"; fi

# --audio: version 2 (an audio section), through the CLI and read back by Python alone
A="$T/aset"
if "$DHP" data synth --out "$A" --audio --samples 10 --shards 2 --image-size 16 --patch 2 --merge 2 --window 16 \
        --mel-bins 12 --mel-frames 40 --text-tokens 64 --seed 9 >"$T/out" 2>"$T/err" \
   && grep -q "wrote 10 samples in 2 shards to $A (with audio)" "$T/out" \
   && "$DHP" data inspect "$A" --captions 3 >"$T/out" 2>>"$T/err" \
   && grep -q "^format    version 2" "$T/out" && grep -q "^audio     40 frames x 12 mel bins" "$T/out" \
   && grep -qE '^caption   0: a (small|large) .*, a [a-z ]+(tone|chirp|burst)$' "$T/out"; then ok data_cli_synth_audio
else fail data_cli_synth_audio "$(cat "$T/out" "$T/err" | head -c 400)"; fi
if "$DHP" data synth --out "$T/aonly" --audio --image-size 0 --samples 4 --shards 1 >"$T/out" 2>"$T/err" \
   && "$DHP" data inspect "$T/aonly" --captions 1 >"$T/out" 2>>"$T/err" \
   && grep -q "^images    none" "$T/out" && grep -qE '^caption   0: a [a-z ]+(tone|chirp|burst)$' "$T/out"; then
    ok data_cli_synth_audio_only
else fail data_cli_synth_audio_only "$(cat "$T/out" "$T/err" | head -c 400)"; fi
expect_err data_cli_synth_mel_without_audio '^dhp data: synth: --mel-bins and --mel-frames need --audio' \
    "$DHP" data synth --out "$T/x" --mel-frames 32
expect_err data_cli_synth_odd_mel_frames 'mel-frames 33 must be even' "$DHP" data synth --out "$T/x" --audio --mel-frames 33
expect_err data_cli_synth_no_images_without_audio 'image-size 0 outside' "$DHP" data synth --out "$T/x" --image-size 0

if [ ! -x "$PY" ]; then skip data_python_reads_audio_shards "no /usr/bin/python3"
elif "$PY" - "$A" >"$T/py" 2>&1 <<'PYEOF'
import json, struct, sys, zlib
d = sys.argv[1]
m = json.load(open(d + "/manifest.json"))
assert m["version"] == 2 and m["audio"] == {"version": 1, "mel_bins": 12, "mel_frames": 40}, m
S, B, F, first = m["image_size"], 12, 40, 0
for k, sh in enumerate(m["shards"]):
    b = open(d + "/" + sh["file"], "rb").read()
    f = struct.unpack_from("<14IQ2I", b, 8)
    version, hdr, idx, nsh, fs, n, tot, size, ch, P, M, W, T, rb, seed, bins, frames = f
    assert (version, hdr, idx, fs, n, bins, frames) == (2, 80, k, first, sh["samples"], B, F), f
    assert rb == 8 + 64 + S * S * 3 + F * B and len(b) == 80 + n * rb + 4, "size"
    assert zlib.crc32(b[:-4]) == struct.unpack("<I", b[-4:])[0], "crc"
    for j in range(n):
        r = b[80 + j * rb: 80 + (j + 1) * rb]
        cap = r[8:8 + r[4]].decode()
        sound = cap.split(", ")[1]
        kind = ["tone", "chirp", "burst"][r[5] - 1]
        assert sound.endswith(kind), (cap, r[5])
        v = [x / 127.5 - 1 for x in r[8 + 64 + S * S * 3:]]
        on = [t for t in range(F) if max(v[t * B:(t + 1) * B]) > 0]
        peak = [max(range(B), key=lambda i: v[t * B + i]) for t in on]
        if kind == "tone":
            want = {"low": 0.2, "mid": 0.5, "high": 0.8}[sound.split()[1]] * B
            assert abs(sum(peak) / len(peak) - want) < 1, (cap, peak)
        elif kind == "chirp":
            assert (peak[-1] - peak[0] >= B / 2) == (sound.split()[1] == "rising"), (cap, peak)
        else:
            assert len(on) == {"short": F // 8, "long": F // 2}[sound.split()[1]], (cap, on)
    first += n
assert first == m["samples"]
print("audio shards ok", first)
PYEOF
then ok data_python_reads_audio_shards; else fail data_python_reads_audio_shards "$(tail -c 300 "$T/py")"; fi
