#!/usr/bin/env bash
# Seed corpora for the fuzz targets, from the repository's own files: the
# model zoo, cluster and GPU files, Hugging Face configs of tests/data/hf,
# the --strategy strings the tests and benches use, and plan files,
# checkpoints and data sets that the dhp binary writes from them.
# usage: tests/fuzz/seeds.sh OUT_DIR   (needs $DHP, the dhp binary)
set -euo pipefail
cd "$(dirname "$0")/../.."
OUT=$1
: "${DHP:=$PWD/dhp}"
# a sanitizer build of dhp: Open MPI's allocations outlive MPI_Finalize (leak reports are not ours)
export ASAN_OPTIONS=detect_leaks=0
work=$(mktemp -d "${TMPDIR:-/tmp}/dhp-seeds.XXXXXX")
trap 'rm -rf "$work"' EXIT
for t in model cluster plan strategy hf_config hf_index safetensors data; do mkdir -p "$OUT/fuzz_$t"; done

cp models/zoo/*.json "$OUT/fuzz_model/"
cp costdb/clusters/*.json "$OUT/fuzz_cluster/"
for g in costdb/gpus/*.json; do cp "$g" "$OUT/fuzz_cluster/gpu-$(basename "$g")"; done
cp tests/data/hf/*.json "$OUT/fuzz_hf_config/"
# a weights index as transformers' save_pretrained writes it, naming fuzz_hf_index's one shard
printf '{"metadata": {"total_size": 48}, "weight_map": {"model.norm.weight": "model-00001-of-00001.safetensors", "visual.blocks.0.norm1.weight": "model-00001-of-00001.safetensors", "lm_head.weight": "model-00002-of-00002.safetensors"}}\n' \
    >"$OUT/fuzz_hf_index/index.json"

# strategy strings: a selector byte (model, placement, GPUs, chunks, batch, cluster) then the string
i=0
grep -rhoE '"(vision|llm|audio):[^"]*"' tests/*.sh tests/*.c bench/*.py | tr -d '"' | sort -u >"$work/specs"
grep -rhoE "\-\-strategy '[^']+'" tests/*.sh README.md | sed -E "s/--strategy '(.*)'/\1/" | sort -u >>"$work/specs"
while IFS= read -r spec; do
    for sel in 0 2 6 10; do printf "\\$(printf '%03o' $sel)%s" "$spec" >"$OUT/fuzz_strategy/s$i-$sel"; done
    i=$((i + 1))
done <"$work/specs"

# plan files: the planner's and explicit strategies, both placements
export OPENBLAS_NUM_THREADS=1
"$DHP" plan --top 0 --no-baselines -o "$OUT/fuzz_plan/default.json" >/dev/null
"$DHP" plan --model qwen2.5-vl-7b --cluster 2x8xh100 --batch 32 --vision-tokens 9216 --top 0 --no-baselines \
    -o "$OUT/fuzz_plan/q7-16.json" >/dev/null
"$DHP" plan --model qwen2.5-omni-7b --cluster mixed-h100-a100 --batch 16 --vision-tokens 4096 --top 0 --no-baselines \
    -o "$OUT/fuzz_plan/omni-mixed.json" >/dev/null
TINY="--model tiny-vl --cluster cpu-4 --batch 16 --vision-tokens 64 --text-tokens 48 --precision fp32"
"$DHP" plan $TINY --placement disaggregated --n-micro 4 --strategy 'vision:gpus=1;llm:gpus=2,tp=2,seqpar=0' \
    -o "$OUT/fuzz_plan/tiny-dis.json" >/dev/null
"$DHP" plan $TINY --placement colocated --gpus 4 --strategy 'vision:dp=4,zero=1;llm:dp=4,zero=1' \
    -o "$OUT/fuzz_plan/tiny-col.json" >/dev/null

# a data set of one shard, packed as fuzz_data reads it: u32 LE manifest length, manifest, shard
"$DHP" data synth --out "$work/data" --samples 6 --shards 1 --image-size 8 --patch 4 --merge 2 --window 0 \
    --text-tokens 16 >/dev/null
pack() {
    /usr/bin/python3 - "$1" "$2" "$3" <<'PY'
import struct, sys
m = open(sys.argv[1], 'rb').read(); s = open(sys.argv[2], 'rb').read()
open(sys.argv[3], 'wb').write(struct.pack('<I', len(m)) + m + s)
PY
}
pack "$work/data/manifest.json" "$work/data/shard-00000.bin" "$OUT/fuzz_data/synth-6"

# checkpoints: one step of a micro version of tiny-vl (small files fuzz fast) writes both module files
/usr/bin/python3 - models/zoo/tiny-vl.json "$work/micro.json" <<'PY'
import json, sys
m = json.load(open(sys.argv[1]))
m["name"] = "micro-vl"
v, l = m["modules"]
v.update(layers=1, hidden=8, heads=2, kv_heads=2, head_dim=4, ffn=16, proj_in=32, proj_hidden=16, out_hidden=8)
l.update(layers=1, hidden=8, heads=2, kv_heads=1, head_dim=4, ffn=16, tied_embeddings=True)
json.dump(m, open(sys.argv[2], "w"), indent=1)
PY
"$DHP" data synth --out "$work/d16" --samples 16 --window 0 >/dev/null
"$DHP" plan --model "$work/micro.json" --cluster cpu-4 --batch 4 --vision-tokens 64 --text-tokens 48 --precision fp32 \
    --gpus 1 --strategy 'vision:dp=1;llm:dp=1' -o "$work/one.json" >/dev/null
"$DHP" run "$work/one.json" --data "$work/d16" --steps 1 --ckpt "$work/ck" --no-progress >/dev/null
cp "$work"/ck/step-*/vision.safetensors "$OUT/fuzz_safetensors/vision.safetensors"
cp "$work"/ck/step-*/llm.safetensors "$OUT/fuzz_safetensors/llm.safetensors"
