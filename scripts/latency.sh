#!/usr/bin/env bash
# Latency of Nexmark queries below saturation (BENCHMARKS.md, "Latency"):
# for each query, rate and worker count, RUNS runs of 5 s of paced input,
# printing the median of each percentile.
#   scripts/latency.sh BINARY RUNS "q1 q7" "100000 1000000" "1 2" [extra args...]
set -euo pipefail
bin=$1 runs=$2 queries=$3 rates=$4 workers=$5
shift 5
median() { sort -g | awk '{a[NR]=$1} END {m=int((NR+1)/2); print a[m]}'; }
printf '%-4s %8s %2s  %-10s %8s %8s %8s %8s %9s\n' query rate w kind n p50_us p99_us p999_us events/s
for q in $queries; do
    for r in $rates; do
        for w in $workers; do
            out=$(mktemp)
            for _ in $(seq "$runs"); do
                "$bin" nexmark --query "$q" --events $((r * 5)) --rate 1000 --rate-limit "$r" \
                    --watermark-delay 0ms --latency --discard "$@" -- -w "$w" 2>>"$out" >/dev/null
            done
            for kind in read watermark; do
                lines=$(grep "^latency $kind" "$out")
                field() { sed -n "s/.* $1=\([0-9.]*\).*/\1/p" <<<"$lines" | median; }
                rate=$(sed -n 's/.* events\/s=\([0-9.]*\).*/\1/p' "$out" | median)
                printf '%-4s %8s %2s  %-10s %8s %8s %8s %8s %9s\n' "$q" "$r" "$w" "$kind" \
                    "$(field n)" "$(field p50)" "$(field p99)" "$(field p99.9)" "$rate"
            done
            rm -f "$out"
        done
    done
done
