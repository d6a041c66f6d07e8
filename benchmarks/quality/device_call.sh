#!/usr/bin/env bash
# One GPU call of FP8 quality runs with the setup of the kept files (README.md here), for the device machine:
# carry `.whl` (../shared/device/wheels.sh) and run from the project root. Writes $OUT/q.json and $OUT/log.txt.
#
#   bash benchmarks/quality/device_call.sh SEEDS [--mps | --no-mps] [PARALLEL] [DEADLINE_S] [VARIANTS]
#
# Trains bf16 and VARIANTS (default: the fast-accumulation recipe) on SEEDS in this one call, so every FP8 run
# meets the bf16 run of its seed trained beside it: pairs across calls carry a shift of their own (README.md).
# SEEDS that kept files also hold (4-9, say) measure that shift as well, run against run of the same variant.
# The runs share the GPU through CUDA's Multi-Process Service (--mps, the default; if every run fails under it, it
# runs again without MPS in the time left), each with one torch CPU thread (THREADS=N in the environment changes
# that; THREADS=0 keeps torch's default of a thread per core). Six seeds (twelve processes, 80 GB) take about
# 140 s on an H100 this way, against 200-230 s with either alone; neither changes a run's GPU numerics.
# STEPS=N (default 600, the kept files' setup) trains N steps of 32 rows on one pass over 16/15 x N x 32 train
# rows (TRAIN_ROWS=R sets them): a longer setup is a pool of its own, named -N- in the kept files.
set -u
# PARALLEL: processes at once, by default and at most as many as fit the GPU's memory (about 6.5 GB each: 12 on an
# 80 GB H100)
SEEDS=$1; MPS=${2:---mps}; PARALLEL=${3:-auto}; DEADLINE=${4:-470}; VARIANTS=${5:-tensorwise delayed fast accum}
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$PWD GEMTRAIN_ATTN_AUTOTUNE=0
echo "card: $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)"
# A call may land on a smaller card than the kind asked for: never start more processes than its memory holds.
FIT=$(( $(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | head -1) / 6600 ))
if [ "$PARALLEL" = auto ] || [ "$PARALLEL" -gt "$FIT" ]; then
  [ "$PARALLEL" != auto ] && echo "parallel $PARALLEL does not fit this card's memory"
  PARALLEL=$FIT
  echo "parallel: $PARALLEL"
fi
# What bounds a call (GPU or host CPU): GPU utilization and the load average every 10 s, summed up at the end.
( while sleep 10; do
    echo "$(date +%s) $(nvidia-smi --query-gpu=utilization.gpu,memory.used --format=csv,noheader,nounits | head -1)" \
         "$(cut -d' ' -f1 /proc/loadavg)"
  done ) > "$OUT/usage.txt" 2>/dev/null &
sampler=$!
STEPS=${STEPS:-600}; TRAIN_ROWS=${TRAIN_ROWS:-$(( STEPS * 32 * 16 / 15 ))}
overrides=(--data.synth.train_rows="$TRAIN_ROWS" --data.synth.eval_rows=8192 --data.epochs=1 --data.loader.num_threads=2
           --eval.save_predictions=true)
[ "$MPS" = --no-mps ] && MPS=""
THREADS=${THREADS:-1}
if [ "$THREADS" != 0 ]; then overrides+=(--train.torch_threads="$THREADS"); fi
t0=$(date +%s)
quality() {  # $1: --mps or empty, $2: deadline
  python benchmarks/fp8_quality.py $1 --steps "$STEPS" --variants "bf16,$VARIANTS" \
    --seeds "$SEEDS" --parallel "$PARALLEL" --gpus 0 --json "$OUT/q.json" --deadline "$2" -- "${overrides[@]}" \
    > "$OUT/log.txt" 2>&1
  echo "exit $?, $(( $(date +%s) - t0 )) s since the start"
}
quality "$MPS" "$DEADLINE"
ok=$(python3 -c "import json; print(sum(1 for v in json.load(open('$OUT/q.json')).values() if v and 'error' not in v))" \
     2>/dev/null || echo 0)
echo "runs finished: $ok"
if [ "$ok" = 0 ] && [ -n "$MPS" ]; then
  tail -5 "$OUT/log.txt"; mv "$OUT/log.txt" "$OUT/log-mps.txt"
  echo "again without MPS"; quality "" $(( DEADLINE - ($(date +%s) - t0) ))
fi
kill "$sampler" 2>/dev/null
python3 - "$OUT/usage.txt" "$(nproc)" <<'PY'
import statistics, sys
rows = [line.replace(",", " ").split() for line in open(sys.argv[1]) if line.strip()]
rows = [r for r in rows if len(r) == 4]
if rows:
    util, mem, load = ([float(r[i]) for r in rows] for i in (1, 2, 3))
    print(f"usage over {len(rows)} samples: GPU utilization median {statistics.median(util):.0f}% "
          f"(min {min(util):.0f}), memory up to {max(mem) / 1024:.1f} GiB, load average median "
          f"{statistics.median(load):.1f} on {sys.argv[2]} CPUs")
PY
grep -A20 "## FP8 quality" "$OUT/log.txt" | head -20
grep -A8 "## Held-out rows" "$OUT/log.txt"
grep -A8 "## Delayed scaling: casts saturated" "$OUT/log.txt"
