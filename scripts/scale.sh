#!/usr/bin/env bash
# Scaling over workers, old binary against new (BENCHMARKS.md, "Two-phase
# aggregation"): interleaved runs of both at -w 1 and -w 2 on generated input
# with --discard; per binary the median events/s at each worker count, their
# ratio, and the single runs.
#   scripts/scale.sh OLD NEW RUNS EVENTS QUERY...
set -euo pipefail
old=$1 new=$2 runs=$3 events=$4
shift 4
median() { sort -g | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
rate() { # binary workers query -> events/s (from the summary line)
    "$1" nexmark --query "$3" --events "$events" --discard -- -w "$2" 2>&1 >/dev/null |
        grep -o 'events/s=[0-9.]*' | head -1 | cut -d= -f2
}
for q in "$@"; do
    declare -A r=()
    for _ in $(seq "$runs"); do
        for b in old new; do
            bin=$old
            [ "$b" = new ] && bin=$new
            for w in 1 2; do r[$b$w]+="$(rate "$bin" "$w" "$q") "; done
        done
    done
    for b in old new; do
        m1=$(tr ' ' '\n' <<<"${r[${b}1]}" | grep . | median)
        m2=$(tr ' ' '\n' <<<"${r[${b}2]}" | grep . | median)
        printf '%s %s w1=%s w2=%s ratio=%.3f  [w1: %s] [w2: %s]\n' "$q" "$b" "$m1" "$m2" "$(echo "$m2/$m1" | bc -l)" "${r[${b}1]}" "${r[${b}2]}"
    done
    unset r
done
