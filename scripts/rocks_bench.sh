#!/usr/bin/env bash
# Keyed state on RocksDB against memory, interleaved, for the queries with
# the largest state (BENCHMARKS.md, "The RocksDB state backend"):
#   scripts/rocks_bench.sh NEW_BINARY [OLD_BINARY] [RUNS]
# Each run, per query: NEW on memory, OLD on RocksDB (if given), NEW on
# RocksDB; 10 M generated events, 2 workers, a 64 MiB block cache. Prints
# one line per job: run, query, configuration, events/s, rows, peak RSS.
set -euo pipefail
new=${1:?usage: scripts/rocks_bench.sh NEW_BINARY [OLD_BINARY] [RUNS]}
old=${2:-}
runs=${3:-3}
state=$(mktemp -d)
trap 'rm -rf "$state"' EXIT
job() {
    local binary=$1 query=$2
    shift 2
    "$binary" nexmark --query "$query" --events 10000000 --discard "$@" -- -w 2 2>&1 | tail -1
}
for run in $(seq "$runs"); do
    for q in q20 q18 q19; do
        configs=(memory)
        if [ -n "$old" ]; then configs+=(before); fi
        configs+=(after)
        for cfg in "${configs[@]}"; do
            rm -rf "${state:?}"/*
            rocks=(--state-backend rocksdb --state-dir "$state" --state-cache 64MiB)
            case $cfg in
                memory) out=$(job "$new" "$q") ;;
                before) out=$(job "$old" "$q" "${rocks[@]}") ;;
                after) out=$(job "$new" "$q" "${rocks[@]}") ;;
            esac
            echo "$run $q $cfg $(grep -oE 'events/s=[0-9]+' <<<"$out") $(grep -oE 'rows=[0-9]+' <<<"$out") $(grep -oE 'peak_rss_mib=[0-9]+' <<<"$out")"
        done
    done
done
