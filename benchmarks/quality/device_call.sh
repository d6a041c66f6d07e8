#!/usr/bin/env bash
# One GPU call of FP8 quality runs with the setup of the kept files (README.md here), for the device machine:
# carry `.whl` (../shared/device/wheels.sh) and run from the project root. Writes $OUT/q.json and $OUT/log.txt.
#
#   bash benchmarks/quality/device_call.sh SEEDS [--mps] [PARALLEL] [DEADLINE_S] [H200_SEEDS]
#
# On an H100 it trains "tensorwise delayed fast accum" alone (--no-bf16) on SEEDS, seeds whose bf16 runs are kept
# here (0-27; 28-47 already hold a fast-accumulation pair), so --pool pairs each run with a kept bf16 run. On any
# other card (the kept bf16 runs are all H100 runs) it trains bf16 and the recipe on H200_SEEDS (fresh seeds,
# default 48-53): pairs of its own. If every run fails under --mps, it runs again without MPS in the time left.
set -u
SEEDS=$1; MPS=${2:-}; PARALLEL=${3:-12}; DEADLINE=${4:-470}; OTHER_SEEDS=${5:-48,49,50,51,52,53}
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$PWD GEMTRAIN_ATTN_AUTOTUNE=0
card=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
echo "card: $card"
NO_BF16=--no-bf16
if ! grep -q H100 <<<"$card"; then
  SEEDS=$OTHER_SEEDS; NO_BF16=""; echo "not an H100: bf16 and the recipe on seeds $SEEDS"
fi
overrides=(--data.synth.train_rows=20480 --data.synth.eval_rows=8192 --data.epochs=1 --data.loader.num_threads=2)
t0=$(date +%s)
quality() {  # $1: --mps or empty, $2: deadline
  python benchmarks/fp8_quality.py $1 $NO_BF16 --steps 600 --variants "tensorwise delayed fast accum" \
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
grep -A20 "## FP8 quality" "$OUT/log.txt" | head -20
