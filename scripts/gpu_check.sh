#!/usr/bin/env bash
# Everything this project checks on a GPU, in one call, from the repository root of a CUDA install
# (README: set-up on a CUDA machine):   bash scripts/gpu_check.sh [PART...]
# PART: tests, embedding, train, planning, precision, streams (default: all six); feed (the loader and
# `train` against `bench kind=train` on a generated 8M-line set -- about 8 minutes, run it on its own).
# Results (test log, benchmark JSON, tables and figures) go to $OUT (default gpu-results/).
# A machine without pytest (an offline bundle) can carry it as .gpu-extra/pytest.tar.gz (make gpu-extra).
set -uo pipefail
OUT=${OUT:-gpu-results}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1  # a part cut off by the time limit still leaves its lines in $OUT
# The GPU machine has no pytest: `make gpu-extra` packs it into .gpu-extra/ (carry it too).
if ! python3 -c "import pytest" 2>/dev/null && [ -f .gpu-extra/pytest.tar.gz ]; then
    mkdir -p /tmp/gpu-extra && tar -xzf .gpu-extra/pytest.tar.gz -C /tmp/gpu-extra
    export PYTHONPATH="/tmp/gpu-extra${PYTHONPATH:+:$PYTHONPATH}"
fi
PARTS=" ${*:-tests embedding train planning precision streams} "
want() { [[ "$PARTS" == *" $1 "* ]]; }
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > "$OUT/gpu.txt" 2>&1
python3 -c "import torch, fbgemm_gpu, torchrec; print(torch.__version__, fbgemm_gpu.__version__, torchrec.__version__)" >> "$OUT/gpu.txt" 2>&1

# 1. the CUDA equality tests (freq_cache and uvm_cache == hbm; trainer on cuda)
want tests && python3 -m pytest -m gpu -q -p no:cacheprovider 2>&1 | tail -40 > "$OUT/gpu-tests.txt"

# 2. embedding layer alone: 26 tables x 2M rows x dim 128, batch 16384, power-law ids
want embedding && python3 -m dlrm_cache bench kind=embedding num_tables=26 rows_per_table=2000000 embedding_dim=128 \
    batch_size=16384 backends=[hbm,uvm_cache,freq_cache] cache_ratios=[0.015,0.1] warmup=10 iters=50 \
    output="$OUT/bench-embedding.json" figure="$OUT/bench-embedding.png" 2>&1 | grep --line-buffered -v "^W1" > "$OUT/bench-embedding.txt"

# 3. whole DLRM step, Criteo-Kaggle cardinalities, MLPerf MLPs, batch 16384
want train && python3 -m dlrm_cache bench kind=train cardinality_scale=1 embedding_dim=128 batch_size=16384 \
    backends=[hbm,uvm_cache,freq_cache] cache_ratios=[0.005,0.015,0.05] warmup=10 iters=30 \
    output="$OUT/bench-train.json" figure="$OUT/bench-train.png" 2>&1 | grep --line-buffered -v "^W1" > "$OUT/bench-train.txt"

# 4. the freq_cache's own work per batch (plan + copies, to a device sync)
want planning && python3 -m dlrm_cache bench kind=planning cardinality_scale=1 embedding_dim=128 batch_size=16384 \
    cache_ratios=[0.005,0.015,0.05] device=cuda output="$OUT/bench-planning.json" figure="$OUT/bench-planning.png" 2>&1 \
    | grep --line-buffered -v "^W1" > "$OUT/bench-planning.txt"
# 5. feeding the step: the loader alone, then the real command vs the bench step, hbm and
# freq_cache, on a Kaggle-shaped synthetic set (8M lines)
if want feed; then
    K=/tmp/feed
    [ -f $K/processed/manifest.json ] || { python3 -m dlrm_cache synth output=$K/raw lines=8000000 \
        cardinality_scale=1 progress=false && python3 -m dlrm_cache preprocess input=$K/raw \
        output=$K/processed progress=false; } > "$OUT/feed-data.txt" 2>&1
    python3 -m dlrm_cache bench kind=loader data_path=$K/processed batch_size=16384 epochs=3 \
        output="$OUT/bench-loader.json" 2>&1 | grep --line-buffered -v "^W1" > "$OUT/bench-loader.txt"
    python3 -m dlrm_cache bench kind=train cardinality_scale=1 embedding_dim=128 batch_size=16384 \
        backends=[hbm,freq_cache] cache_ratios=[0.015] warmup=10 iters=30 bottom_mlp=[512,256] \
        top_mlp=[1024,1024,512,256] output="$OUT/bench-train-feed.json" 2>&1 | grep --line-buffered -v "^W1" \
        > "$OUT/bench-train-feed.txt"
    for emb in hbm freq_cache; do
        python3 -m dlrm_cache train data.path=$K/processed data.batch_size=16384 data.eval_batch_size=65536 \
            model=mlperf embedding=$emb eval_batches=4 progress=false run_dir=$K/run-$emb 2>&1 \
            | grep --line-buffered -v "^W1" > "$OUT/train-feed-$emb.txt"
        cp $K/run-$emb/summary.json "$OUT/train-feed-$emb-summary.json"
    done
fi
# 6. issue 11: the step in every precision x compile setting, hbm and freq_cache at 1.5% side by side,
#    each with its breakdown (embedding fwd, dense fwd/bwd, embedding bwd+update, optimizer, between steps)
want precision && python3 -m dlrm_cache bench kind=train cardinality_scale=1 embedding_dim=128 batch_size=16384 \
    backends=[hbm,freq_cache] cache_ratios=[0.015] precisions=[fp32,tf32,bf16] compile=[false,true] warmup=10 iters=30 \
    output="$OUT/bench-train-precision.json" 2>&1 | grep --line-buffered -v "^W1" > "$OUT/bench-train-precision.txt"
# 7. the stream protocol on the GPU: a profiler trace of `train` with freq_cache (1M Kaggle-shaped
#    lines, batch 16384): per stream, kernel time and the share of the cache's kernels that ran beside
#    a compute-stream kernel; the compute stream's gaps (a drained step shows as one gap per step)
if want streams; then
    S=/tmp/streams
    [ -f $S/processed/manifest.json ] || { python3 -m dlrm_cache synth output=$S/raw lines=1000000 \
        cardinality_scale=1 progress=false && python3 -m dlrm_cache preprocess input=$S/raw \
        output=$S/processed progress=false; } > "$OUT/streams-data.txt" 2>&1
    for ratio in 0.015 0.05; do
        python3 scripts/stream_trace.py $S/processed $S/trace-$ratio data.batch_size=16384 \
            embedding.cache_ratio=$ratio model.embedding_dim=128 > "$OUT/streams-$ratio.txt" 2>&1
        cp $S/trace-$ratio/trace.json "$OUT/trace-freq_cache-$ratio.json" 2>/dev/null
    done
fi
tail -n 12 "$OUT"/*.txt
