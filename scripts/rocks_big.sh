#!/usr/bin/env bash
# q18/q19/q20 over 200 M generated events on RocksDB with a 512 MiB cache
# (BENCHMARKS.md, "State far larger than memory"): peak RSS from
# /usr/bin/time, the state directory's peak size sampled every 5 s.
#   scripts/rocks_big.sh BINARY QUERY...
bin=$1; shift
for q in "$@"; do
  d=$(mktemp -d)
  ( peak=0; while sleep 5; do s=$(du -sb "$d" 2>/dev/null | cut -f1); [ -n "$s" ] && [ "$s" -gt "$peak" ] && peak=$s && echo "$peak" > "$d.peak"; done ) &
  sampler=$!
  /usr/bin/time -f "maxrss_kb=%M wall=%e" "$bin" nexmark --query "$q" --events 200000000 --state-backend rocksdb --state-dir "$d" --state-cache 512MiB --discard -- -w 2 > /tmp/big-$q.out 2> /tmp/big-$q.err
  kill $sampler
  echo "$q $(tail -2 /tmp/big-$q.err | grep -oE 'events/s=[0-9]+|rows=[0-9]+|peak_rss_mib=[0-9]+|maxrss_kb=[0-9]+|wall=[0-9.]+' | tr '\n' ' ') disk_peak_bytes=$(cat $d.peak)"
  rm -rf "$d" "$d.peak"
done
