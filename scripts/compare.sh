#!/usr/bin/env bash
# Interleaved runs of two highwater binaries: median events/s of each and their ratio.
# usage: compare.sh OLD NEW INPUT RUNS WORKERS QUERY...   (INPUT: a number of generated events, or a JSON Lines file)
set -euo pipefail
old=$1 new=$2 input=$3 runs=$4 workers=$5; shift 5
if [[ "$input" =~ ^[0-9]+$ ]]; then src=(--events "$input"); else src=(--input "$input"); fi
rate() { # binary query -> events/s (from the summary line)
  "$1" nexmark --query "$2" "${src[@]}" --discard -- -w "$workers" 2>&1 >/dev/null | grep -o 'events/s=[0-9.]*' | head -1 | cut -d= -f2
}
median() { sort -g | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
for q in "$@"; do
  o=(); n=()
  for _ in $(seq "$runs"); do o+=("$(rate "$old" "$q")"); n+=("$(rate "$new" "$q")"); done
  mo=$(printf '%s\n' "${o[@]}" | median); mn=$(printf '%s\n' "${n[@]}" | median)
  printf '%s w=%s old %.2f M new %.2f M ratio %.3f\n' "$q" "$workers" "$(echo "$mo/1000000" | bc -l)" "$(echo "$mn/1000000" | bc -l)" "$(echo "$mn/$mo" | bc -l)"
done
