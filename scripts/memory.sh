#!/usr/bin/env bash
# Memory over long runs (BENCHMARKS.md, "Watermark alignment"): a query on
# the unbounded generator for SECONDS, RSS sampled from /proc every 5 s, at
# -w 1, -w 2 and on two processes of one worker each (-n 2; RSS per process).
#   scripts/memory.sh BINARY SECONDS QUERY... [-- EXTRA NEXMARK ARGS]
set -euo pipefail
bin=$1 seconds=$2
shift 2
queries=()
while [ $# -gt 0 ] && [ "$1" != "--" ]; do queries+=("$1"); shift; done
[ "${1:-}" = "--" ] && shift
extra=("$@")
port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
rss() { awk '/VmRSS/ {printf "%d", $2/1024}' "/proc/$1/status" 2>/dev/null || echo -; }
sample() { # pids... -> one line of RSS per pid
    local out=() t=0
    while [ "$t" -lt "$seconds" ]; do
        sleep 5
        t=$((t + 5))
        local row=""
        for pid in "$@"; do row+="$(rss "$pid")/"; done
        out+=("${row%/}")
    done
    echo "${out[*]}"
}
for q in "${queries[@]}"; do
    for layout in w1 w2 n2; do
        run=("$bin" nexmark --query "$q" --events 100000000000 --discard "${extra[@]}" --)
        pids=()
        case $layout in
        w1) "${run[@]}" -w 1 2>/dev/null & pids+=($!) ;;
        w2) "${run[@]}" -w 2 2>/dev/null & pids+=($!) ;;
        n2)
            hosts=$(mktemp)
            printf '127.0.0.1:%s\n127.0.0.1:%s\n' "$(port)" "$(port)" >"$hosts"
            for p in 0 1; do "${run[@]}" -w 1 -n 2 -p "$p" -h "$hosts" 2>/dev/null & pids+=($!); done
            ;;
        esac
        samples=$(sample "${pids[@]}")
        kill "${pids[@]}" 2>/dev/null || true
        wait "${pids[@]}" 2>/dev/null || true
        echo "$q $layout RSS MiB every 5 s: $samples"
    done
done
