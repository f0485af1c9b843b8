#!/usr/bin/env bash
# freq_cache against host (training steps of a small-MLP DLRM), and the freq_cache's planning cost
# per batch, on one-hot and on MLPerf multi-hot batches (format.MLPERF_MULTI_HOT_SIZES: 213 ids
# per sample) in one run, on the same Criteo-Kaggle-shaped tables (cardinalities x SCALE).
# Usage: scripts/multi_hot_bench.sh OUT_DIR [SCALE] [BATCH]   (results: OUT_DIR/*.json, *.log)
# Never SCALE=1 on a small machine (17 GB). Numbers of 2026-11-27: docs/multi-hot.md.
set -euo pipefail
out=${1:?usage: scripts/multi_hot_bench.sh OUT_DIR [SCALE] [BATCH]}
scale=${2:-0.01}
batch=${3:-16384}
mkdir -p "$out"
py=${PYTHON:-python}
common=(device=cpu figure=null batch_size="$batch" cardinality_scale="$scale" distinct_batches=6)
for hot in one mlperf; do
  "$py" -m dlrm_cache bench kind=planning hotness="$hot" warmup=3 iters=8 sync_count_batches=0 \
    "${common[@]}" output="$out/planning-$hot.json" 2>&1 | tee "$out/planning-$hot.log"
  "$py" -m dlrm_cache bench kind=train hotness="$hot" backends=[host,freq_cache] \
    bottom_mlp=[128] top_mlp=[128] warmup=2 iters=4 \
    "${common[@]}" output="$out/train-$hot.json" 2>&1 | tee "$out/train-$hot.log"
done
