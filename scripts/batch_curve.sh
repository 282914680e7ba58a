#!/usr/bin/env bash
# The micro-batch curve (BENCHMARKS.md, "Micro-batch versus event at a
# time"): for each query, worker count and batch size, RUNS runs at full
# speed (no pacing: under --rate-limit a batch is only a cap on what a read
# takes) with --latency, printing CSV of the medians: throughput, and the p99
# of the query's latency (q1: read → sink; windowed queries: watermark → sink).
#   scripts/batch_curve.sh BINARY RUNS EVENTS "q1 q7" "1 10 100 1000 10000 100000" "1 2" > docs/batch_curve.csv
set -euo pipefail
bin=$1 runs=$2 events=$3 queries=$4 sizes=$5 workers=$6
shift 6
median() { sort -g | awk '{a[NR]=$1} END {m=int((NR+1)/2); print a[m]}'; }
echo "query,workers,batch_size,events_per_s,p50_us,p99_us,kind"
for q in $queries; do
    kind=read
    case $q in q1 | q0 | q2 | q3) ;; *) kind=watermark ;; esac
    for w in $workers; do
        for b in $sizes; do
            out=$(mktemp)
            for _ in $(seq "$runs"); do
                "$bin" nexmark --query "$q" --events "$events" --rate 1000 --batch-size "$b" \
                    --watermark-delay 0ms --latency --discard "$@" -- -w "$w" 2>>"$out" >/dev/null
            done
            lines=$(grep "^latency $kind" "$out")
            field() { sed -n "s/.* $1=\([0-9.]*\).*/\1/p" <<<"$lines" | median; }
            rate=$(sed -n 's/.* events\/s=\([0-9.]*\).*/\1/p' "$out" | median)
            echo "$q,$w,$b,$rate,$(field p50),$(field p99),$kind"
            rm -f "$out"
        done
    done
done
