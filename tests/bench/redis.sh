#!/usr/bin/env bash
# redis.sh — decisions per second and latency of the Redis store (limits.Redis
# through the production go-redis client, tests/bench/redisload) against
# redis-benchmark sending the same EVALSHA: the floor. One redis-server on
# loopback, one run, alternating order. See tests/bench/README.md.
#
#   tests/bench/redis.sh                           # defaults below
#   LIMIT=20 KEYS=1000 tests/bench/redis.sh        # mostly refused decisions
#   ROUNDS=5 CONTENDERS="benchmark store raw" tests/bench/redis.sh
#
# Settings (environment):
#   ROUNDS=3          rounds; each runs every contender once, the order
#                     alternates (forward, reversed, forward...)
#   N=200000          decisions per run (redis-benchmark -n, redisload -n)
#   C=64              concurrent callers (redis-benchmark -c, redisload -c)
#   KEYS=100000       distinct caller keys (redis-benchmark -r, redisload -keys)
#   LIMIT=1000000000  the rule's limit per minute: the default admits and
#                     records every decision; 20 (with few KEYS) refuses most
#   MODE=admitted     refused: every decision is a refusal over a full window
#                     (defaults KEYS=1 LIMIT=1000 PREFILL=LIMIT), the
#                     over-limit caller's hot path
#   PREFILL=0         before each run, admit this many decisions on every key
#                     (KEYS of them) with the same script
#   CONTENDERS="benchmark store"
#                     benchmark: redis-benchmark EVALSHA (the floor)
#                     store:     redisload, limits.Redis.Decide + NewRedisClient
#                     raw:       redisload -raw, a hand-written EVALSHA client,
#                                one connection per caller (diagnosis)
#   POOL=0            > 0: redisload adds ?pool_size=POOL to its REDIS_URL
#   GOMAXPROCS        passed to redisload when set (default: the Go default)
#   REDISLOAD_ARGS=   extra flags for redisload (e.g. -cpuprofile /tmp/cpu.out)
#   REDIS_SERVER=redis-server REDIS_CLI=redis-cli REDIS_BENCHMARK=redis-benchmark
set -euo pipefail

ROUNDS=${ROUNDS:-3}
N=${N:-200000}
C=${C:-64}
MODE=${MODE:-admitted}
case $MODE in
admitted) ;;
refused)
	KEYS=${KEYS:-1}
	LIMIT=${LIMIT:-1000}
	PREFILL=${PREFILL:-$LIMIT}
	;;
*) echo "redis.sh: MODE must be admitted or refused, got '$MODE'" >&2 && exit 1 ;;
esac
KEYS=${KEYS:-100000}
LIMIT=${LIMIT:-1000000000}
PREFILL=${PREFILL:-0}
CONTENDERS=${CONTENDERS:-benchmark store}
POOL=${POOL:-0}
REDISLOAD_ARGS=${REDISLOAD_ARGS:-}
REDIS_SERVER=${REDIS_SERVER:-redis-server}
REDIS_CLI=${REDIS_CLI:-redis-cli}
REDIS_BENCHMARK=${REDIS_BENCHMARK:-redis-benchmark}
WINDOW_US=60000000 # the rule's window: one minute, as redisload's
MAX_SLOTS=1000     # limits.maxSlots, the script's fourth ARGV

NAME=redis.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

for v in ROUNDS N C KEYS; do
	[[ ${!v} =~ ^[1-9][0-9]*$ ]] || die "$v must be a positive integer, got '${!v}'"
done
[[ $LIMIT =~ ^[0-9]+$ ]] || die "LIMIT must be a non-negative integer, got '$LIMIT'"
[[ $POOL =~ ^[0-9]+$ ]] || die "POOL must be a non-negative integer, got '$POOL'"
((KEYS < 1000000000000)) || die "KEYS must be below 10^12 (12-digit __rand_int__)"
for c in $CONTENDERS; do
	case $c in benchmark | store | raw) ;; *) die "unknown contender '$c' (known: benchmark store raw)" ;; esac
done
[[ -n ${CONTENDERS// /} ]] || die "CONTENDERS is empty"
for t in "$REDIS_SERVER" "$REDIS_CLI" "$REDIS_BENCHMARK"; do
	command -v "$t" >/dev/null || die "$t not found (apt-get install -y redis-server redis-tools)"
done
command -v sha1sum >/dev/null || die "sha1sum not found"

bench_root

bench_tmp rlp-redis-bench

pick_port PORT
ADDR=127.0.0.1:$PORT
cli() { timeout 30 "$REDIS_CLI" -h 127.0.0.1 -p "$PORT" "$@"; }

# ---------------------------------------------------------------- start ---
log "building redisload"
go build -o "$tmp/redisload" ./tests/bench/redisload

"$REDIS_SERVER" --bind 127.0.0.1 --port "$PORT" --save "" --appendonly no \
	--daemonize no --dir "$tmp" --logfile "$tmp/redis.log" &
REDIS_PID=$!
PIDS+=("$REDIS_PID")
for ((i = 0; i < 100; i++)); do
	kill -0 "$REDIS_PID" 2>/dev/null || die "redis-server exited during start: $(tail -n 20 "$tmp/redis.log" 2>/dev/null)"
	[[ $(cli PING 2>/dev/null) == PONG ]] && break
	sleep 0.1
done
[[ $(cli PING 2>/dev/null) == PONG ]] || die "redis-server not ready after 10 s"

# The exact script the store embeds (go:embed redis.lua), loaded by SCRIPT LOAD.
SHA=$(cli -x SCRIPT LOAD <limits/redis.lua)
[[ $SHA =~ ^[0-9a-f]{40}$ ]] || die "SCRIPT LOAD failed: $SHA"
[[ $SHA == "$(sha1sum limits/redis.lua | awk '{print $1}')" ]] || die "SCRIPT LOAD returned $SHA, not the file's SHA1"

# ---------------------------------------------------------------- runs ---
LOAD0=$(cut -d' ' -f1-3 /proc/loadavg)
CLK_TCK=$(getconf CLK_TCK)
RESULTS=$tmp/results.tsv
: >"$RESULTS"
GOMAX_ENV=()
[[ -n ${GOMAXPROCS:-} ]] && GOMAX_ENV=(GOMAXPROCS="$GOMAXPROCS")

redis_ticks() { # utime+stime of redis-server (fields 14 and 15 of /proc/PID/stat)
	local stat rest
	local -a f
	stat=$(<"/proc/$REDIS_PID/stat") || die "redis-server is gone"
	rest=${stat##*) }
	read -ra f <<<"$rest"
	echo $((f[11] + f[12]))
}

# cmdstat NAME FIELD: a field of INFO commandstats (0 when never called).
cmdstat() {
	awk -F'[:,=]' -v c="cmdstat_$1" -v f="$2" '$1 == c { for (i = 2; i < NF; i += 2) if ($i == f) v = $(i + 1) } END { print v + 0 }' "$tmp/stats"
}

# timed OUT CPU CMD...: run CMD (bounded), its output to OUT and the user+sys
# seconds of it and its children to CPU.
timed() {
	local out=$1 cpu=$2
	shift 2
	(
		rc=0
		timeout --kill-after=5 600 "$@" >"$out" 2>&1 || rc=$?
		# Not in a pipeline: a pipeline's subshell has no children of its own.
		times >"$cpu.times"
		awk 'NR == 2 { n = split($0, t, " "); s = 0
			for (i = 1; i <= n; i++) { split(t[i], ms, "m"); sub(/s$/, "", ms[2]); s += ms[1] * 60 + ms[2] }
			print s }' "$cpu.times" >"$cpu"
		exit "$rc"
	)
}

# prefill: admit PREFILL decisions on each of the KEYS keys, as a caller
# who has spent its budget.
prefill() {
	((PREFILL > 0)) || return 0
	local k key
	for ((k = 0; k < KEYS; k++)); do
		printf -v key '%012d' "$k"
		"$REDIS_BENCHMARK" -h 127.0.0.1 -p "$PORT" -c 1 -n "$PREFILL" -q \
			EVALSHA "$SHA" 2 "ratelimit-proxy:{chat_rpm|caller=ip:$key}:w" "ratelimit-proxy:{chat_rpm|caller=ip:$key}:l" \
			1 0 0 "$MAX_SLOTS" 0 0 w "$LIMIT" "$WINDOW_US" 1 >/dev/null || die "prefill failed"
	done
}

measure() { # measure ROUND CONTENDER
	local round=$1 c=$2 out=$tmp/run-$1-$2.txt t0 t1 rate p50 p99
	cli FLUSHALL >/dev/null
	prefill
	cli CONFIG RESETSTAT >/dev/null
	log "round $round: $c"
	t0=$(redis_ticks)
	case $c in
	benchmark)
		timed "$out" "$out.cpu" "$REDIS_BENCHMARK" -h 127.0.0.1 -p "$PORT" -c "$C" -n "$N" -r "$KEYS" --csv --precision 3 \
			EVALSHA "$SHA" 2 "ratelimit-proxy:{chat_rpm|caller=ip:__rand_int__}:w" "ratelimit-proxy:{chat_rpm|caller=ip:__rand_int__}:l" \
			1 0 0 "$MAX_SLOTS" 0 0 w "$LIMIT" "$WINDOW_US" 1 ||
			die "redis-benchmark failed: $(cat "$out")"
		t1=$(redis_ticks)
		# "test","rps","avg_latency_ms","min_latency_ms","p50_latency_ms","p95_latency_ms","p99_latency_ms","max_latency_ms"
		read -r rate p50 p99 < <(awk -F'","' '$1 ~ /^"EVALSHA/ { print $2, $5 * 1000, $7 * 1000 }' "$out")
		;;
	store | raw)
		local -a args=(-addr "$ADDR" -n "$N" -c "$C" -keys "$KEYS" -limit "$LIMIT" -prefix "ratelimit-proxy:" -script limits/redis.lua)
		[[ $c == raw ]] && args+=(-raw)
		[[ $c == store && $POOL != 0 ]] && args+=(-pool "$POOL")
		# shellcheck disable=SC2206 # REDISLOAD_ARGS is a flag list
		[[ $c == store && -n $REDISLOAD_ARGS ]] && args+=($REDISLOAD_ARGS)
		timed "$out" "$out.cpu" env "${GOMAX_ENV[@]}" "$tmp/redisload" "${args[@]}" ||
			die "redisload failed: $(cat "$out")"
		t1=$(redis_ticks)
		grep -q "script_sha=$SHA\$" "$out" || die "redisload used another script than the one loaded: $(cat "$out")"
		read -r rate p50 p99 < <(tr ' ' '\n' <"$out" | awk -F= '{ v[$1] = $2 } END { print v["rate"], v["p50_us"], v["p99_us"] }')
		;;
	esac
	[[ -n ${rate:-} && -n ${p50:-} && -n ${p99:-} ]] || die "$c: cannot parse the output: $(cat "$out")"
	# The server's own account: every decision was one successful EVALSHA of
	# the loaded script (no EVAL fallback, no error); one write of the
	# window's string per admission (SET, or SETRANGE of its header when
	# the admission joins the newest slot).
	cli INFO commandstats >"$tmp/stats"
	tr -d '\r' <"$tmp/stats" >"$tmp/stats.tmp" && mv "$tmp/stats.tmp" "$tmp/stats"
	local calls failed eval admitted
	calls=$(cmdstat evalsha calls)
	failed=$(($(cmdstat evalsha failed_calls) + $(cmdstat evalsha rejected_calls)))
	eval=$(cmdstat eval calls)
	admitted=$(($(cmdstat set calls) + $(cmdstat setrange calls)))
	[[ $calls == "$N" && $failed == 0 && $eval == 0 ]] ||
		die "$c: the server saw $calls EVALSHA ($failed failed) and $eval EVAL for $N decisions: $(cat "$out")"
	printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$round" "$c" "$rate" "$p50" "$p99" \
		"$((t1 - t0))" "$(cat "$out.cpu")" "$admitted" "$(cli DBSIZE)" >>"$RESULTS"
}

read -ra ORDER <<<"$CONTENDERS"
for ((r = 1; r <= ROUNDS; r++)); do
	if ((r % 2 == 1)); then
		list=("${ORDER[@]}")
	else
		list=()
		for ((i = ${#ORDER[@]} - 1; i >= 0; i--)); do list+=("${ORDER[i]}"); done
	fi
	for c in "${list[@]}"; do measure "$r" "$c"; done
done
kill -0 "$REDIS_PID" 2>/dev/null || die "redis-server died during the run"
LOAD1=$(cut -d' ' -f1-3 /proc/loadavg)

# --------------------------------------------------------------- report ---
name() {
	case $1 in
	benchmark) echo "redis-benchmark (floor)" ;;
	store) echo "redisload (limits.Redis)" ;;
	raw) echo "redisload -raw" ;;
	esac
}
cpu_model=$(awk -F': ' '/^model name/ {print $2; exit}' /proc/cpuinfo 2>/dev/null || true)
gomax=$(grep -ho 'gomaxprocs=[0-9]*' "$tmp"/run-*-store.txt "$tmp"/run-*-raw.txt 2>/dev/null | head -n1 | cut -d= -f2 || true)
pool=$(grep -ho ' pool=[a-z0-9]*' "$tmp"/run-*-store.txt 2>/dev/null | head -n1 | cut -d= -f2 || true)
echo "## Redis store: decisions per second against redis-benchmark"
echo
echo "- $(date -u '+%Y-%m-%d %H:%M UTC'), $(uname -sr), ${cpu_model:-unknown CPU}, $(nproc) CPUs (shared by redis-server and the client)"
echo "- $("$REDIS_SERVER" --version | awk '{print $1, $3}' | sed 's/v=//'), $("$REDIS_BENCHMARK" --version), $(go version | awk '{print $3}')"
echo "- script limits/redis.lua, SHA1 $SHA; mode $MODE; $N decisions per run, $C concurrent callers, $KEYS keys, limit $LIMIT per minute, $PREFILL admissions per key before each run; $ROUNDS rounds (order alternates)"
echo "- load average (1/5/15 min) before: $LOAD0, after: $LOAD1 (anything else running skews the rates)"
echo "- redisload: GOMAXPROCS=${gomax:--}, pool size ${pool:--} (default: 10 × GOMAXPROCS)"
echo "- redis CPU and client CPU: µs of utime+stime per decision; admitted: writes of a window's string (SET, SETRANGE) seen by the server"
echo
echo "| round | contender | decisions/s | p50 µs | p99 µs | redis CPU µs | client CPU µs | admitted | keys in Redis |"
echo "|---:|---|---:|---:|---:|---:|---:|---:|---:|"
while IFS=$'\t' read -r round c rate p50 p99 ticks cpu admitted dbsize; do
	awk -v r="$round" -v c="$(name "$c")" -v rate="$rate" -v p50="$p50" -v p99="$p99" -v t="$ticks" -v hz="$CLK_TCK" \
		-v cpu="$cpu" -v n="$N" -v a="$admitted" -v k="$dbsize" \
		'BEGIN { printf "| %s | %s | %.0f | %.0f | %.0f | %.1f | %.1f | %d | %d |\n", r, c, rate, p50, p99, t / hz * 1e6 / n, cpu * 1e6 / n, a, k }'
done <"$RESULTS"
echo

median() { # median FIELD CONTENDER
	awk -F'\t' -v c="$2" -v hz="$CLK_TCK" -v n="$N" "\$2 == c { print $1 }" "$RESULTS" | sort -g |
		awk '{ v[NR] = $1 } END { if (NR == 0) print "nan"; else if (NR % 2) print v[(NR + 1) / 2]; else print (v[NR / 2] + v[NR / 2 + 1]) / 2 }'
}
declare -A RATE P50 P99 RCPU CCPU
for c in "${ORDER[@]}"; do
	RATE[$c]=$(median '$3' "$c")
	P50[$c]=$(median '$4' "$c")
	P99[$c]=$(median '$5' "$c")
	RCPU[$c]=$(median '$6 / hz * 1e6 / n' "$c")
	CCPU[$c]=$(median '$7 * 1e6 / n' "$c")
done
ref=${ORDER[0]}
[[ -n ${RATE[benchmark]:-} ]] && ref=benchmark
echo "| contender (median of $ROUNDS) | decisions/s | × $(name "$ref") | p50 µs | p99 µs | redis CPU µs | client CPU µs |"
echo "|---|---:|---:|---:|---:|---:|---:|"
for c in "${ORDER[@]}"; do
	awk -v c="$(name "$c")" -v rate="${RATE[$c]}" -v ref="${RATE[$ref]}" -v p50="${P50[$c]}" -v p99="${P99[$c]}" \
		-v rc="${RCPU[$c]}" -v cc="${CCPU[$c]}" \
		'BEGIN { printf "| %s | %.0f | %.2f | %.0f | %.0f | %.1f | %.1f |\n", c, rate, rate / ref, p50, p99, rc, cc }'
done
if [[ -n ${RATE[store]:-} && -n ${RATE[benchmark]:-} ]]; then
	echo
	awk -v s="${RATE[store]}" -v b="${RATE[benchmark]}" 'BEGIN {
		r = s / b
		printf "**redisload / redis-benchmark decisions per second (medians): %.3f — %s the 0.90 target**\n", r, (r >= 0.9 ? "meets" : "misses")
	}'
fi
