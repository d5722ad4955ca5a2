#!/bin/sh
# Two pipes one each way over one 32 Mbit/s lab path (20 and 100 ms), against one pipe one way:
# runs the three methods of methods.toml on both paths and prints each pipe's rate (Mbit/s of
# stream bytes, from its --json report).
#   bench/two-way-paced/run.sh [OUT_DIR]   (from the repository root, as root; default OUT_DIR
#   target/bench/two-way-paced/<date-time>). Runs the binaries as built: first
#   cargo build --release -p bulkcast && cargo build --release -p bulkcast-lab --example lab_bench
set -eu
here=$(dirname "$0")
out=${1:-target/bench/two-way-paced/$(date +%Y%m%d-%H%M%S)}
mkdir -p "$out"
export PATH="$PWD/target/release:$PATH" BULKCAST_SECRET=${BULKCAST_SECRET:-$(target/release/bulkcast secret)}
for s in 20 100; do
  target/release/examples/lab_bench "$here/two-$s.toml" --methods-file "$here/methods.toml" \
    --size 1M --timeout 120 --cc bbr --raw-dir "$out/raw$s" > "$out/bench$s.txt" 2>&1
  for m in oneway-udp bidir-udp bidir-tcp; do
    for d in a b; do
      f="$out/raw$s/$m/$d.json"
      [ -f "$f" ] || continue
      python3 -c "import json,sys; j=json.load(open('$f')); print('%s ms %-11s %s %.1f Mbit/s (%.3f of 32) in %.1f s' % ('$s','$m','A->B' if '$d'=='a' else 'B->A', j['mbps'], j['mbps']/32, j['seconds']))"
    done
  done
done
echo "two-way-paced: results in $out" >&2
