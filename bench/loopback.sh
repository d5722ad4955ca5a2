#!/usr/bin/env bash
# Loopback benchmark for the foundation (issue 2). Prints one table, every figure measured in
# this run on this machine:
#   (a) 1-to-1 bulkcast throughput (chunks hashed, authenticated and verified) against iperf3
#       single-stream on the same path (127.0.0.1);
#   (b) 1-to-8 relay tree against 1-to-8 flat, completion time of the last receiver;
#   (c) peak RSS of the sender, a relay and a leaf for a 4 GiB stream of unknown size;
#   (d) `pipe send`: its default transport against TCP and the paced UDP transport.
# Usage: bench/loopback.sh [--quick]   (--quick: smaller sizes, for a smoke run)
set -euo pipefail
cd "$(dirname "$0")/.."

QUICK=0; [[ ${1:-} == --quick ]] && QUICK=1
ONE_MIB=$((QUICK ? 256 : 2048))      # (a) object size, MiB
TREE_MIB=$((QUICK ? 64 : 512))       # (b)
RSS_GIB=$((QUICK ? 1 : 4))           # (c)

need() { command -v "$1" >/dev/null 2>&1 || { apt-get update -qq && apt-get install -y -qq "$2" >/dev/null; }; }
need iperf3 iperf3; need jq jq; [[ -x /usr/bin/time ]] || need /usr/bin/time time

cargo build --release -q -p bulkcast
BC=$PWD/target/release/bulkcast
W=$(mktemp -d /tmp/bulkcast-bench.XXXXXX)
PIDS=()
kill_agents() { [[ -f $W/pids ]] && xargs -r kill <"$W/pids" 2>/dev/null; rm -f "$W/pids"; sleep 0.2; }
cleanup() { kill_agents || true; for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; rm -rf "$W"; }
trap cleanup EXIT
export BULKCAST_SECRET=$($BC secret)

start_agent() { # dir -> prints address
  local out=$W/agent.$RANDOM
  "$BC" agent --listen 127.0.0.1:0 --dir "$1" >"$out" 2>/dev/null &
  echo $! >>"$W/pids"   # runs in a subshell: remember the pid in a file
  for _ in $(seq 100); do [[ -s $out ]] && break; sleep 0.05; done
  awk '{print $5}' "$out" | tr -d ,
}

gen() { head -c "$(($2 * 1048576))" /dev/urandom >"$1"; }

# (a) iperf3 single stream vs bulkcast 1-to-1 -----------------------------------------------
# Both timed with their CPU (user+system seconds of sender and receiver), so the table can put
# the cost of verification beside the cost of moving the bytes.
cpu() { awk '{print $1 + $2}' "$1"; }   # a /usr/bin/time -f "%U %S" file -> seconds
usr() { awk '{print $1}' "$1"; }; sys() { awk '{print $2}' "$1"; }
/usr/bin/time -f "%U %S" -o "$W/ip.srv" iperf3 -s -1 -B 127.0.0.1 -p 5299 >/dev/null 2>&1 & PIDS+=($!)
IPSRV=$!
sleep 0.5
/usr/bin/time -f "%U %S" -o "$W/ip.cli" iperf3 -c 127.0.0.1 -p 5299 -t 8 -J >"$W/ip.json"
wait $IPSRV 2>/dev/null || true
IPERF=$(jq '.end.sum_received.bits_per_second / 1e6' "$W/ip.json")
IP_GIB=$(jq '.end.sum_received.bytes / 1073741824' "$W/ip.json")
IP_CPU=$(echo "($(cpu "$W/ip.cli") + $(cpu "$W/ip.srv")) / $IP_GIB" | bc -l)
IP_SYS=$(echo "($(sys "$W/ip.cli") + $(sys "$W/ip.srv")) / $IP_GIB" | bc -l)

gen "$W/one.bin" "$ONE_MIB"
cat "$W/one.bin" >/dev/null   # page cache, as iperf3's memory source
# to /dev/null: the like-for-like with iperf3 (memory to memory, but every chunk verified)
T=$( { /usr/bin/time -f "%U %S" -o "$W/a1.send" "$BC" send "$W/one.bin" --expect 1 --listen 127.0.0.1:0 --json --quiet >"$W/a1.json" 2>/dev/null & echo $! >"$W/spid"; } ; sleep 0.3
     TICKET=$(head -1 "$W/a1.json"); /usr/bin/time -f "%U %S" -o "$W/a1.recv" "$BC" recv "$TICKET" --stdout --quiet >/dev/null
     while kill -0 "$(cat "$W/spid")" 2>/dev/null; do sleep 0.05; done )
A1=$(tail -n +2 "$W/a1.json" | jq '.receivers[0].rate_mbps')
BC_CPU=$(echo "($(cpu "$W/a1.send") + $(cpu "$W/a1.recv")) / ($ONE_MIB / 1024)" | bc -l)
BC_SYS=$(echo "($(sys "$W/a1.send") + $(sys "$W/a1.recv")) / ($ONE_MIB / 1024)" | bc -l)
BC_USR=$(echo "($(usr "$W/a1.send") + $(usr "$W/a1.recv")) / ($ONE_MIB / 1024)" | bc -l)
# BLAKE3 on one core, CPU seconds per GiB; every byte is hashed twice (source and receiver).
HASH=$(cargo run --release -q -p bulkcast-proto --example hash_rate 2>/dev/null)
# bulkcast's CPU less the two hashes: what moving the bytes costs it, beside iperf3's cost.
BC_MOVE=$(echo "$BC_CPU - 2 * $HASH" | bc -l)

# to disk through an agent
mkdir -p "$W/a2"; ADDR=$(start_agent "$W/a2")
A2=$("$BC" send "$W/one.bin" --to "$ADDR" --json --quiet 2>/dev/null | jq '.receivers[0].rate_mbps')
kill_agents; rm -rf "$W/a2"

# (b) tree vs flat, 8 receivers ---------------------------------------------------------------
gen "$W/tree.bin" "$TREE_MIB"
declare -A SECS
for strat in flat "tree --fanout 1" "tree --fanout 2"; do
  LIST=""
  for i in $(seq 8); do mkdir -p "$W/rx$i"; LIST+="$(start_agent "$W/rx$i"),"; done
  SECS[$strat]=$("$BC" send "$W/tree.bin" --to "${LIST%,}" --strategy $strat --json --quiet 2>/dev/null | jq '.seconds')
  kill_agents
  rm -rf "$W"/rx*
done

# (d) `pipe send` on loopback: the default transport against each forced one --------------
# Seconds and the sender's peak RSS for the same stream, so the table shows that the default
# (`--transport auto`) takes the cheaper of the two here.
declare -A PIPE_S PIPE_RSS
for t in default tcp udp; do
  port=$((7600 + RANDOM % 1000))
  "$BC" pipe recv --listen 127.0.0.1:$port >/dev/null 2>&1 & PIDS+=($!)
  RX=$!
  sleep 0.3
  args=(); [[ $t != default ]] && args=(--transport "$t")
  /usr/bin/time -f "%e %M" -o "$W/pipe.$t" "$BC" pipe send 127.0.0.1:$port --quiet "${args[@]}" <"$W/one.bin" >/dev/null 2>&1
  wait $RX 2>/dev/null || true
  read -r PIPE_S[$t] kb <"$W/pipe.$t"; PIPE_RSS[$t]=$(echo "$kb / 1024" | bc -l)
done

# (c) peak RSS for a stream of unknown size: sender -> relay -> leaf, both receivers to /dev/null
rss() { grep 'Maximum resident set size' "$1" | awk '{printf "%.1f", $6/1024}'; }
( head -c "$((RSS_GIB * 1073741824))" /dev/zero | /usr/bin/time -v -o "$W/rss.send" \
    "$BC" send - --name stream --expect 2 --fanout 1 --listen 127.0.0.1:0 --quiet >"$W/ticket" 2>/dev/null ) &
SENDER=$!
for _ in $(seq 100); do [[ -s $W/ticket ]] && break; sleep 0.05; done
TICKET=$(head -1 "$W/ticket")
/usr/bin/time -v -o "$W/rss.r1" "$BC" recv "$TICKET" --stdout --quiet --name relay >/dev/null &
R1=$!
/usr/bin/time -v -o "$W/rss.r2" "$BC" recv "$TICKET" --stdout --quiet --name leaf >/dev/null &
R2=$!
wait $SENDER $R1 $R2
S_RSS=$(rss "$W/rss.send"); R1_RSS=$(rss "$W/rss.r1"); R2_RSS=$(rss "$W/rss.r2")

printf '\n%-58s %12s %12s %8s\n' "loopback benchmark ($(nproc) cores)" "measured" "baseline" "ratio"
printf '%-58s %12.0f %12s %8s\n' "(a) iperf3 single stream, Mbit/s" "$IPERF" "" ""
printf '%-58s %12.0f %12.0f %8.2f\n' "(a) bulkcast 1-to-1, ${ONE_MIB} MiB, verified, to /dev/null, Mbit/s" "$A1" "$IPERF" "$(echo "$A1 / $IPERF" | bc -l)"
printf '%-58s %12.2f %12.2f %8.2f\n' "(a) CPU seconds per GiB, bulkcast (both ends) vs iperf3" "$BC_CPU" "$IP_CPU" "$(echo "$BC_CPU / $IP_CPU" | bc -l)"
printf '%-58s %12.2f %12.2f %8s\n' "(a)   user time (hashing, framing), both ends" "$BC_USR" "$(echo "$IP_CPU - $IP_SYS" | bc -l)" ""
printf '%-58s %12.2f %12.2f %8.2f\n' "(a)   system time (system calls, kernel copies), both ends" "$BC_SYS" "$IP_SYS" "$(echo "$BC_SYS / $IP_SYS" | bc -l)"
printf '%-58s %12.2f %12s %8s\n' "(a)   of which verification: BLAKE3 one core, x2 per byte" "$(echo "2 * $HASH" | bc -l)" "" ""
printf '%-58s %12.2f %12.2f %8.2f\n' "(a)   the rest (moving the bytes) vs iperf3" "$BC_MOVE" "$IP_CPU" "$(echo "$BC_MOVE / $IP_CPU" | bc -l)"
printf '%-58s %12.0f %12.0f %8.2f\n' "(a) bulkcast 1-to-1, ${ONE_MIB} MiB, verified, to disk, Mbit/s" "$A2" "$IPERF" "$(echo "$A2 / $IPERF" | bc -l)"
printf '%-58s %12.2f %12.2f %8.2f\n' "(b) 1-to-8 chain (fan-out 1) vs flat, ${TREE_MIB} MiB, s" "${SECS[tree --fanout 1]}" "${SECS[flat]}" "$(echo "${SECS[tree --fanout 1]} / ${SECS[flat]}" | bc -l)"
printf '%-58s %12.2f %12.2f %8.2f\n' "(b) 1-to-8 tree (fan-out 2) vs flat, ${TREE_MIB} MiB, s" "${SECS[tree --fanout 2]}" "${SECS[flat]}" "$(echo "${SECS[tree --fanout 2]} / ${SECS[flat]}" | bc -l)"
printf '%-58s %12.2f %12.2f %8.2f\n' "(d) pipe send ${ONE_MIB} MiB, default vs paced UDP, s" "${PIPE_S[default]}" "${PIPE_S[udp]}" "$(echo "${PIPE_S[default]} / ${PIPE_S[udp]}" | bc -l)"
printf '%-58s %12.2f %12.2f %8.2f\n' "(d) pipe send ${ONE_MIB} MiB, default vs TCP, s" "${PIPE_S[default]}" "${PIPE_S[tcp]}" "$(echo "${PIPE_S[default]} / ${PIPE_S[tcp]}" | bc -l)"
printf '%-58s %12.1f %12.1f %8.2f\n' "(d) pipe send peak RSS, default vs paced UDP, MiB" "${PIPE_RSS[default]}" "${PIPE_RSS[udp]}" "$(echo "${PIPE_RSS[default]} / ${PIPE_RSS[udp]}" | bc -l)"
printf '%-58s %12s %12s %8.2f\n' "(c) peak RSS, sender, ${RSS_GIB} GiB stream, MiB" "$S_RSS" "128" "$(echo "$S_RSS / 128" | bc -l)"
printf '%-58s %12s %12s %8.2f\n' "(c) peak RSS, relay, ${RSS_GIB} GiB stream, MiB" "$R1_RSS" "128" "$(echo "$R1_RSS / 128" | bc -l)"
printf '%-58s %12s %12s %8.2f\n' "(c) peak RSS, leaf, ${RSS_GIB} GiB stream, MiB" "$R2_RSS" "128" "$(echo "$R2_RSS / 128" | bc -l)"
