#!/usr/bin/env bash
# Hugging Face weights in and out, against transformers itself (build/venv,
# from make deps: transformers 4.49.0 on Debian's torch 1.13):
#  - the oracle: tests/ref/hf_oracle.py builds tiny Qwen2.5-VLs with
#    transformers' own modeling code and writes its checkpoint, a batch, its
#    loss and every parameter gradient; tests/test_hf.c loads the checkpoint
#    (single file, sharded, window attention) and compares dhp's loss and gradients;
#    a tiny Qwen2-Audio: its audio tower + projector output and gradients; a tiny
#    LLaVA (CLIP tower read at layer -2, Llama LLM): loss and every gradient;
#  - `dhp run --init-from` on 2 ranks (LLM tp 2, vision ZeRO-3 over 2) with
#    --lr 0, then `dhp export-weights`: bit-identical tensors, and
#    transformers loads the export (tests/ref/hf_compare.py);
#  - bad checkpoints: one line naming the file / tensor, exit 2, before training.
. "$(dirname "$0")/lib.sh"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OPENBLAS_NUM_THREADS=1
export ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0"
HERE=$(cd "$(dirname "$0")" && pwd)
PY="${DHP_VENV:-$PWD/build/venv}/bin/python"
if ! "$PY" -c 'import transformers, safetensors, torch' >/dev/null 2>&1; then
    fail hf_venv "$PY cannot import transformers, safetensors and torch: run make deps (scripts/venv.sh)"; exit 0
fi
O="$T/o"
if ! "$PY" "$HERE/ref/hf_oracle.py" "$O" >"$T/oracle.out" 2>&1; then fail hf_oracle_model "$(tail -c 300 "$T/oracle.out")"; exit 0; fi
DHP_HF_ORACLE_DIR="$O" "$TEST_BIN" hf_oracle 2>&1 | grep -vE '^unit: ' | sed 's/^hf_oracle /# hf_oracle /'

# --init-from on 2 ranks, --lr 0, export: the same bits back
"$DHP" import "$O/cli/config.json" -o "$T/m.json" >/dev/null 2>"$T/import.err" || { fail hf_import "$(cat "$T/import.err")"; exit 0; }
"$DHP" data synth --out "$T/data" --samples 16 --window 64 >/dev/null || { fail hf_data "dhp data synth failed"; exit 0; }
SETUP="--model $T/m.json --cluster 8xh100 --batch 4 --vision-tokens 64 --text-tokens 48 --precision fp32 --placement colocated"
"$DHP" plan $SETUP --strategy "vision:dp=2,zero=3;llm:tp=2,dp=1,seqpar=0" --gpus 2 -o "$T/p2.json" >"$T/p2.out" 2>&1 \
    || { fail hf_plan "$(tail -c 300 "$T/p2.out")"; exit 0; }
"$DHP" plan $SETUP --strategy "vision:dp=1;llm:dp=1" --gpus 1 -o "$T/p1.json" >"$T/p1.out" 2>&1 \
    || { fail hf_plan "$(tail -c 300 "$T/p1.out")"; exit 0; }
if timeout 300 mpirun --oversubscribe -np 2 "$DHP" run "$T/p2.json" --data "$T/data" --init-from "$O/cli" --steps 2 \
        --lr 0 --min-lr 0 --ckpt "$T/ck" --no-progress >"$T/run.out" 2>&1; then ok hf_init_from_tp2_zero3
else fail hf_init_from_tp2_zero3 "$(tail -c 300 "$T/run.out")"; fi
if "$DHP" export-weights "$T/ck" -o "$T/exp" --plan "$T/p2.json" >"$T/exp.out" 2>&1 &&
   r=$("$PY" "$HERE/ref/hf_compare.py" "$O/cli" "$T/exp" 2>&1); then echo "# $r"; ok hf_export_round_trip
else fail hf_export_round_trip "$(cat "$T/exp.out") ${r:-}"; fi
# the special token ids the source config names come back (dhp import keeps them in the model's "tokens")
if r=$(/usr/bin/python3 - "$O/cli/config.json" "$T/exp/config.json" 2>&1 <<'PY'
import json, sys
a, b = (json.load(open(f)) for f in sys.argv[1:])
keys = ["image_token_id", "video_token_id", "vision_start_token_id", "vision_end_token_id"]
bad = [k for k in keys if a.get(k) is None or a.get(k) != b.get(k)]
if bad: sys.exit(f"differ: {[(k, a.get(k), b.get(k)) for k in bad]}")
print(" ".join(f"{k} {b[k]}" for k in keys))
PY
); then echo "# exported $r"; ok hf_export_keeps_special_tokens; else fail hf_export_keeps_special_tokens "$r"; fi
# a trained checkpoint exports too, and transformers loads it
if timeout 300 "$DHP" run "$T/p1.json" --data "$T/data" --init-from "$O/cli" --steps 2 --ckpt "$T/ck1" --no-progress \
        >"$T/run1.out" 2>&1 && "$DHP" export-weights "$T/ck1/step-00000002" -o "$T/exp1" --model "$T/m.json" >/dev/null 2>&1 &&
   "$PY" -c "import sys; from transformers import Qwen2_5_VLForConditionalGeneration as M; M.from_pretrained(sys.argv[1])" \
        "$T/exp1" >/dev/null 2>&1; then ok hf_export_trained
else fail hf_export_trained "$(tail -c 300 "$T/run1.out")"; fi

# LLaVA: transformers' tiny LLaVA (tests/ref/hf_oracle.py llava_cli: 3 CLIP blocks read at layer -2)
# loaded on 2 ranks (CLIP tower tp 2, Llama LLM ZeRO-3 over 2), --lr 0, exported: every tensor back bit for bit,
# the unused third block and post_layernorm included
"$DHP" import "$O/llava_cli/config.json" -o "$T/ml.json" >/dev/null 2>"$T/import.err" || fail hf_llava_import "$(cat "$T/import.err")"
"$DHP" data synth --out "$T/cdata" --samples 16 --image-size 16 --merge 1 --window 0 >/dev/null || fail hf_llava_data "dhp data synth failed"
LSETUP="--model $T/ml.json --cluster 8xh100 --batch 4 --vision-tokens 16 --text-tokens 48 --precision fp32 --placement colocated"
if "$DHP" plan $LSETUP --strategy "vision:tp=2,dp=1;llm:dp=2,zero=3" --gpus 2 -o "$T/pl.json" >"$T/pl.out" 2>&1 &&
   timeout 300 mpirun --oversubscribe -np 2 "$DHP" run "$T/pl.json" --data "$T/cdata" --init-from "$O/llava_cli" --steps 2 \
        --lr 0 --min-lr 0 --ckpt "$T/ckl" --no-progress >"$T/runl.out" 2>&1; then ok hf_llava_init_from_tp2_zero3
else fail hf_llava_init_from_tp2_zero3 "$(tail -c 300 "$T/pl.out" "$T/runl.out")"; fi
if "$DHP" export-weights "$T/ckl" -o "$T/expl" --plan "$T/pl.json" >"$T/expl.out" 2>&1 &&
   r=$("$PY" "$HERE/ref/hf_compare.py" "$O/llava_cli" "$T/expl" 2>&1); then echo "# llava: $r"; ok hf_llava_export_round_trip
else fail hf_llava_export_round_trip "$(cat "$T/expl.out") ${r:-}"; fi

# bad input: a copy of the single-file checkpoint with one thing wrong
bad() {   # bad NAME PYTHON-EDIT: $T/NAME is $O/cli re-saved as one file after the edit of dict t
    rm -rf "${T:?}/$1"; mkdir -p "$T/$1"; cp "$O/cli/config.json" "$T/$1/"
    "$PY" - "$O/cli" "$T/$1" <<PYEOF
import glob, sys
from safetensors.numpy import load_file, save_file
import numpy as np
t = {}
for f in sorted(glob.glob(sys.argv[1] + "/*.safetensors")): t.update(load_file(f))
$2
save_file(t, sys.argv[2] + "/model.safetensors", metadata={"format": "pt"})
PYEOF
}
run1() { "$DHP" run "$T/p1.json" --data "$T/data" --steps 1 --no-progress --init-from "$@"; }
bad wrong_shape 't["model.norm.weight"] = np.ones(65, np.float32)'
expect_err hf_bad_shape 'model.safetensors: tensor model.norm.weight has shape \[65\], model .* needs \[64\]' run1 "$T/wrong_shape"
bad missing 'del t["lm_head.weight"]'
expect_err hf_bad_missing_tensor 'tensor lm_head.weight \(the model.s llm.lm_head.weight\) is missing' run1 "$T/missing"
bad extra 't["visual.blocks.2.norm1.weight"] = np.ones(32, np.float32)'
expect_err hf_bad_extra_tensor 'tensor visual.blocks.2.norm1.weight is not part of model' run1 "$T/extra"
bad heads 'pass'
sed -i "s/\"num_key_value_heads\": 2/\"num_key_value_heads\": 4/" "$T/heads/config.json"
expect_err hf_bad_architecture 'config.json: llm kv_heads is 4, the run.s model .* has 2' run1 "$T/heads"
bad fp16 't = {k: v.astype(np.float16) for k, v in t.items()}'
if run1 "$T/fp16" >"$T/fp16.out" 2>&1; then ok hf_fp16_checkpoint; else fail hf_fp16_checkpoint "$(tail -c 300 "$T/fp16.out")"; fi
rm -rf "$T/noshard"; cp -r "$O/cli" "$T/noshard"; rm "$T/noshard/model-00002-of-"*.safetensors
expect_err hf_bad_missing_shard 'model.safetensors.index.json: names shard model-00002-of-[0-9]+.safetensors, which is missing' run1 "$T/noshard"
rm -rf "$T/trunc"; cp -r "$T/missing" "$T/trunc"; truncate -s 1000 "$T/trunc/model.safetensors"
expect_err hf_bad_truncated 'trunc/model.safetensors: ' run1 "$T/trunc"
rm -rf "$T/hdr"; mkdir "$T/hdr"; printf '\377\377\377\377\377\377\377\177{}' >"$T/hdr/model.safetensors"
expect_err hf_bad_header 'hdr/model.safetensors: ' run1 "$T/hdr"
expect_err hf_bad_empty_dir 'no model.safetensors.index.json and no model.safetensors' run1 "$T"
expect_err hf_bad_with_resume '--init-from and --resume' "$DHP" run "$T/p1.json" --data "$T/data" --ckpt "$T/ck1" --resume --init-from "$O/cli"
expect_err hf_export_bad_ckpt 'nope/vision.safetensors' "$DHP" export-weights "$T/nope" -o "$T/x" --plan "$T/p1.json"
if [ -e "$T/x" ]; then fail hf_export_bad_ckpt_no_output "$T/x written"; else ok hf_export_bad_ckpt_no_output; fi
expect_err hf_export_unsupported_model 'model tiny-vl: module vision has a patch embedding bias; qwen2_5_vl.s has none' \
    "$DHP" export-weights "$T/ck" -o "$T/y" --model tiny-vl
