#!/usr/bin/env bash
# Everything this project checks on a GPU, in one call, from the repository root of a CUDA install
# (README: set-up on a CUDA machine):   bash scripts/gpu_check.sh [PART...]
# PART: quick (below: the one call to make when a GPU is lent, about 5 minutes); tests, embedding,
# train, planning, precision, streams (default: all six); feed (the loader and `train` against
# `bench kind=train` on a generated 8M-line set -- about 8 minutes, run it on its own).
# quick: the GPU tests; the embedding layer at 1.5% and the whole step at 1.5% and 5% (hbm,
# uvm_cache, freq_cache, with the step's breakdown), the DLRM-DCN step and the step on MLPerf
# multi-hot batches at 1.5% (hbm, freq_cache);
# the freq_cache's host half per batch for 1, 2 and 4 planner threads; `train` hbm against
# freq_cache on a generated Kaggle-shaped set; the compute stream's gaps per step from a profiler
# trace of `train`; `bench kind=preprocess` with 1, 4, 8 and 16 workers.  Each step has a time limit (QUICK_BUDGET seconds in all, default 390);
# without CUDA the GPU steps are skipped, each with a line saying so.  Last, a table of the ratios
# (scripts/gpu_summary.py).
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
GPU=$(python3 -c "import torch; print(int(torch.cuda.is_available()))" 2>/dev/null || echo 0)
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
if want quick; then
    Q=/tmp/quick
    BUDGET=${QUICK_BUDGET:-390}
    # the rates `train` runs at (hydra overrides); empty: the preset's own
    TRAIN_RATES=${TRAIN_RATES:-}
    T0=$SECONDS
    # run "$@" with at most $1 seconds, and never past the budget; its output to $OUT/$2
    step() {
        local limit=$1 log=$2 gpu=$3; shift 3
        local left=$(( BUDGET - (SECONDS - T0) ))
        if [ "$gpu" = gpu ] && [ "$GPU" != 1 ]; then
            echo "quick: SKIPPED $log (no CUDA device)" | tee -a "$OUT/quick.txt"; return
        fi
        [ "$left" -lt "$limit" ] && limit=$left
        if [ "$limit" -le 5 ]; then
            echo "quick: SKIPPED $log (the ${BUDGET}s budget is spent)" | tee -a "$OUT/quick.txt"; return
        fi
        local t=$SECONDS
        timeout "$limit" "$@" 2>&1 | grep --line-buffered -v -e '^W1' -e 'compatibility with PyTorch' \
            -e '_fbgemm_torch_compat' -e '\[0m' -e '\[33m' -e 'WARNING\] - *$' -e '^[[:space:]]*$' \
            > "$OUT/$log"
        echo "quick: $log rc=${PIPESTATUS[0]} in $((SECONDS - t))s (limit ${limit}s)" | tee -a "$OUT/quick.txt"
    }
    : > "$OUT/quick.txt"
    # a Kaggle-shaped set for `train`, generated while the GPU tests run
    ( [ -f $Q/processed/manifest.json ] || { python3 -m dlrm_cache synth output=$Q/raw \
        lines=${QUICK_LINES:-1000000} files=2 cardinality_scale=1 progress=false && \
        python3 -m dlrm_cache preprocess input=$Q/raw output=$Q/processed progress=false; } ) \
        > "$OUT/quick-data.txt" 2>&1 &
    DATA=$!
    # the GPU tests but the compiled precision cases (each compiles for a minute; `tests` runs them)
    P=tests/train/test_precision.py::test_gpu_training_step_never_synchronises_the_host
    step 90 gpu-tests.txt gpu python3 -m pytest -m gpu -v -p no:cacheprovider -x \
        tests/embedding/test_gpu.py tests/test_end_to_end.py tests/test_stats_interface.py \
        tests/data/test_loader_multihot.py "$P[False-fp32-hbm]" "$P[False-fp32-freq_cache]" "$P[False-bf16-freq_cache]"
    step 60 bench-embedding.txt gpu python3 -m dlrm_cache bench kind=embedding num_tables=26 \
        rows_per_table=1000000 embedding_dim=128 batch_size=16384 backends=[hbm,uvm_cache,freq_cache] \
        uvm_algorithms=[lru] cache_ratios=[0.015] warmup=10 iters=30 output="$OUT/bench-embedding.json" figure=null
    step 150 bench-train.txt gpu python3 -m dlrm_cache bench kind=train cardinality_scale=1 \
        embedding_dim=128 batch_size=16384 backends=[hbm,uvm_cache,freq_cache] uvm_algorithms=[lfu] \
        cache_ratios=[0.015,0.05] warmup=10 iters=30 output="$OUT/bench-train.json" figure=null
    # issue 36: the bf16 step at 1.5% (hbm, uvm_cache, freq_cache)
    step 50 bench-train-bf16.txt gpu python3 -m dlrm_cache bench kind=train cardinality_scale=1 \
        embedding_dim=128 batch_size=16384 backends=[hbm,uvm_cache,freq_cache] uvm_algorithms=[lfu] \
        cache_ratios=[0.015] precisions=[bf16] warmup=10 iters=30 output="$OUT/bench-train-bf16.json" figure=null
    # issue 29: the DLRM-DCN step (MLPerf DLRM v2: model=dcn's layers), hbm against freq_cache at 1.5%
    step 60 bench-train-dcn.txt gpu python3 -m dlrm_cache bench kind=train cardinality_scale=1 \
        embedding_dim=128 batch_size=16384 interaction=dcn dcn_num_layers=3 dcn_low_rank_dim=512 \
        backends=[hbm,freq_cache] cache_ratios=[0.015] warmup=10 iters=30 \
        output="$OUT/bench-train-dcn.json" figure=null
    # issue 29: the step on MLPerf multi-hot batches (3.5M ids per batch), hbm against freq_cache at 1.5%
    step 60 bench-train-multihot.txt gpu python3 -m dlrm_cache bench kind=train cardinality_scale=1 \
        embedding_dim=128 batch_size=16384 hotness=mlperf backends=[hbm,freq_cache] cache_ratios=[0.015] \
        warmup=5 iters=20 output="$OUT/bench-train-multihot.json" figure=null
    wait $DATA; echo "quick: data rc=$? at $((SECONDS - T0))s" | tee -a "$OUT/quick.txt"
    # issue 36: hbm twice with one seed (the spread), then freq_cache, at rates where this set trains
    for run in hbm hbm2 freq_cache; do
        emb=${run%2}
        step 45 train-$run.txt gpu python3 -m dlrm_cache train data.path=$Q/processed \
            data.batch_size=16384 data.eval_batch_size=65536 model=mlperf embedding=$emb epochs=3 \
            eval_batches=2 progress=false run_dir=$Q/run-$run $TRAIN_RATES
        cp $Q/run-$run/summary.json "$OUT/train-$run-summary.json" 2>/dev/null
    done
    step 50 bench-planning.txt gpu python3 -m dlrm_cache bench kind=planning cardinality_scale=1 \
        embedding_dim=128 batch_size=16384 cache_ratios=[0.015] planner_threads=[1,2,4] warmup=5 \
        iters=20 sync_count_batches=2 device=cuda output="$OUT/bench-planning.json" figure=null
    step 45 streams.txt gpu python3 scripts/stream_trace.py $Q/processed $Q/trace \
        data.batch_size=16384 embedding.cache_ratio=0.015 model=mlperf
    cp $Q/trace/streams.json "$OUT/streams.json" 2>/dev/null
    step 60 bench-preprocess.txt cpu python3 -m dlrm_cache bench kind=preprocess \
        preprocess_input=$Q/raw workers=[1,4,8,16] repeats=1 peer_lines=0 output="$OUT/bench-preprocess.json"
    echo "quick: done in $((SECONDS - T0))s" | tee -a "$OUT/quick.txt"
    python3 scripts/gpu_summary.py "$OUT" | tee "$OUT/summary.txt"
    exit 0
fi
tail -n 12 "$OUT"/*.txt
