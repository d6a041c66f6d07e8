#!/usr/bin/env bash
# Several quality calls in one device command (one start-up, no idle gap between calls), each as
# device_call.sh runs it, each with six seeds of its own. Carry `.whl`; run from the project root.
#
#   bash benchmarks/quality/device_calls.sh FIRST_SEED CALLS [DEADLINE_S]
#
# Call k trains seeds FIRST_SEED + 6k .. FIRST_SEED + 6k + 5 and writes $OUT/seedsA-B/{q.json,log.txt,usage.txt};
# keep each q.json as benchmarks/quality/DATE-h100-gem_medium-600-seedsA-B-fastaccum.json (README.md here).
# A call takes about 140 s on an H100 (155 s with the install): three fit one 600-second device command.
set -u
FIRST=$1; CALLS=$2; DEADLINE=${3:-185}
for ((k = 0; k < CALLS; k++)); do
  a=$(( FIRST + 6 * k )); b=$(( a + 5 ))
  dir="$OUT/seeds$a-$b"; mkdir -p "$dir"
  OUT="$dir" bash "$(dirname "$0")/device_call.sh" "$(seq -s, "$a" "$b")" --mps auto "$DEADLINE" | grep -v '^|'
done
