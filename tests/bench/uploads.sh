#!/usr/bin/env bash
# uploads.sh — memory of ratelimit-proxy under concurrent large uploads.
# Fires N (100) concurrent 10 MiB multipart uploads at POST /api/chat through
# the proxy, in front of the built-in mock API (`ratelimit-proxy -mock`, which
# streams file parts to io.Discard), and samples the proxy's VmRSS / VmHWM
# every 50 ms. 100 concurrent 300-byte chat requests are the comparison. See
# tests/bench/README.md ("uploads.sh").
#
#   tests/bench/uploads.sh                           # small, binary, text
#   SCENARIOS="binary" BATCHES=3 tests/bench/uploads.sh
#   GCTRACE=1 tests/bench/uploads.sh                 # + GODEBUG=gctrace=1 summary
#
# Settings (environment):
#   N=100              concurrent requests per batch
#   BODY_BYTES=10485760  size of each upload body (the whole multipart body)
#   SMALL_BYTES=300    size of the small JSON chat body
#   SCENARIOS="small binary text"
#                      small:  N x SMALL_BYTES JSON {"message": ...}
#                      binary: N x BODY_BYTES multipart, file part doc.pdf
#                              (application/pdf, random bytes)
#                      text:   N x BODY_BYTES multipart, file part notes.txt
#                              (text/plain, English-like words): every byte
#                              goes through the token counter
#   BATCHES=2          batches per scenario, back to back on the same proxy
#                      process (a fresh proxy per scenario)
#   MAX_RSS_MIB=300    fail when a scenario's VmHWM passes it (0: never fail)
#   GCTRACE=0          1: run the proxy with GODEBUG=gctrace=1 and summarise
#   GOMAXPROCS=        passed to the proxy when set
#   BIN=, HELPER_BIN=  prebuilt ratelimit-proxy / tests/bench/uploads helper
#   TIMEOUT=600        seconds, per batch
#   KEEP=0             1: keep the temp dir (logs, bodies) and print its path
#   SPOOL_DIR=         the proxy's TMPDIR, where bodies over 256 KiB are spooled
#                      (default: a fresh dir under the temp dir, on its file
#                      system); e.g. a dir under /dev/shm to see a tmpfs spool
set -euo pipefail

N=${N:-100}
BODY_BYTES=${BODY_BYTES:-10485760}
SMALL_BYTES=${SMALL_BYTES:-300}
SCENARIOS=${SCENARIOS:-small binary text}
BATCHES=${BATCHES:-2}
MAX_RSS_MIB=${MAX_RSS_MIB:-300}
GCTRACE=${GCTRACE:-0}
PROCS=${GOMAXPROCS:-}
BIN=${BIN:-}
HELPER_BIN=${HELPER_BIN:-}
TIMEOUT=${TIMEOUT:-600}
KEEP=${KEEP:-0}
SPOOL_DIR=${SPOOL_DIR:-}

NAME=uploads.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

for v in N BODY_BYTES SMALL_BYTES BATCHES TIMEOUT; do
	[[ ${!v} =~ ^[1-9][0-9]*$ ]] || die "$v must be a positive integer, got '${!v}'"
done
[[ $MAX_RSS_MIB =~ ^[0-9]+$ ]] || die "MAX_RSS_MIB must be a non-negative integer, got '$MAX_RSS_MIB'"
for s in $SCENARIOS; do
	case $s in small | binary | text) ;; *) die "unknown scenario '$s' (known: small binary text)" ;; esac
done
command -v curl >/dev/null || die "curl not found"
[[ -r /proc/self/status ]] || die "needs Linux /proc"

bench_root

bench_tmp rlp-uploads



wait_http() { # wait_http URL: up to 10 s for a 200
	local i
	for ((i = 0; i < 100; i++)); do
		[[ $(curl -s -o /dev/null -w '%{http_code}' --max-time 1 "$1" || true) == 200 ]] && return 0
		sleep 0.1
	done
	return 1
}

# ---------------------------------------------------------------- build ---
if [[ -z $BIN ]]; then
	log "building ratelimit-proxy"
	go build -o "$tmp/ratelimit-proxy" ./cmd/ratelimit-proxy
	BIN=$tmp/ratelimit-proxy
fi
if [[ -z $HELPER_BIN ]]; then
	go build -o "$tmp/uploads" ./tests/bench/uploads
	HELPER_BIN=$tmp/uploads
fi
[[ -x $BIN ]] || die "BIN=$BIN is not executable"

# --------------------------------------------------------------- bodies ---
declare -A CTYPE FILEB
for s in $SCENARIOS; do
	case $s in
	small) read -r fb ct < <("$HELPER_BIN" gen -kind small -bytes "$SMALL_BYTES" -out "$tmp/small.body") ;;
	binary) read -r fb ct < <("$HELPER_BIN" gen -kind binary -bytes "$BODY_BYTES" -seed 1 -out "$tmp/binary.body") ;;
	text) read -r fb ct < <("$HELPER_BIN" gen -kind text -bytes "$BODY_BYTES" -seed 2 -out "$tmp/text.body") ;;
	esac
	[[ -n ${ct:-} ]] || die "generating the $s body failed"
	CTYPE[$s]=$ct
	FILEB[$s]=$fb
	log "$s body: $(stat -c %s "$tmp/$s.body") bytes, Content-Type: $ct"
done

# ------------------------------------------------------------- upstream ---
pick_port UP_PORT
env -i PATH="$PATH" LISTEN_ADDR="127.0.0.1:$UP_PORT" LOG_LEVEL=warn \
	"$BIN" -mock >"$tmp/upstream.log" 2>&1 &
PIDS+=($!)
wait_http "http://127.0.0.1:$UP_PORT/healthz" || die "the mock upstream did not start: $(cat "$tmp/upstream.log")"
printf 'hello upstream\n' >"$tmp/probe.txt"
got=$(curl -s --max-time 10 -F message=hi -F "file=@$tmp/probe.txt;type=text/plain" \
	"http://127.0.0.1:$UP_PORT/api/chat")
[[ $got == *'"files":'* ]] || die "the mock upstream's POST /api/chat answered: $got"
log "mock upstream on 127.0.0.1:$UP_PORT (pid ${PIDS[-1]}) answers /api/chat"

# --------------------------------------------------------------- proxy ---
PROXY_PID=
start_proxy() { # start_proxy NAME
	pick_port PROXY_PORT
	pick_port ADMIN_PORT
	SPOOL=${SPOOL_DIR:-$tmp/spool-$1}
	mkdir -p "$SPOOL"
	local extra=()
	[[ -n $PROCS ]] && extra+=("GOMAXPROCS=$PROCS")
	[[ $GCTRACE == 1 ]] && extra+=("GODEBUG=gctrace=1")
	env -i PATH="$PATH" TMPDIR="$SPOOL" "${extra[@]}" \
		UPSTREAM_URL="http://127.0.0.1:$UP_PORT" \
		LISTEN_ADDR="127.0.0.1:$PROXY_PORT" ADMIN_ADDR="127.0.0.1:$ADMIN_PORT" \
		CHAT_RPM=1000000 MAX_FILE_BYTES=10485760 MAX_INPUT_TOKENS=100000000 \
		LOG_LEVEL=warn \
		"$BIN" >"$tmp/proxy-$1.log" 2>&1 &
	PROXY_PID=$!
	PIDS+=("$PROXY_PID")
	wait_http "http://127.0.0.1:$ADMIN_PORT/healthz" || die "the proxy did not start: $(cat "$tmp/proxy-$1.log")"
}

status_kb() { # status_kb PID FIELD
	awk -v f="$2:" '$1 == f { print $2 }' "/proc/$1/status"
}
mib() { awk -v k="$1" 'BEGIN { printf "%.1f", k / 1024 }'; }
field() { # field KEY RESULTLINE
	local kv
	for kv in $2; do [[ $kv == "$1="* ]] && { echo "${kv#*=}"; return; }; done
	echo "-"
}

ROWS=()
FAILED=0
for s in $SCENARIOS; do
	start_proxy "$s"
	sleep 1 # let the start settle (token encodings are loaded at start)
	idle_rss=$(mib "$(status_kb "$PROXY_PID" VmRSS)")
	idle_fds=$(ls "/proc/$PROXY_PID/fd" | wc -l)
	# A probe through the proxy: the whole guard chain, then the mock.
	code=$(curl -s -o "$tmp/probe.out" -w '%{http_code}' --max-time 60 -H "Content-Type: ${CTYPE[$s]}" \
		--data-binary "@$tmp/$s.body" "http://127.0.0.1:$PROXY_PORT/api/chat" || true)
	[[ $code == 200 ]] || die "$s probe through the proxy: HTTP $code: $(head -c 300 "$tmp/probe.out")"
	log "$s: proxy pid $PROXY_PID on 127.0.0.1:$PROXY_PORT, idle VmRSS $idle_rss MiB, $idle_fds fds"
	fb=${FILEB[$s]}
	for ((b = 1; b <= BATCHES; b++)); do
		log "$s batch $b/$BATCHES: $N concurrent POST /api/chat"
		rc=0
		line=$(timeout "$TIMEOUT" "$HELPER_BIN" fire -url "http://127.0.0.1:$PROXY_PORT/api/chat" \
			-body "$tmp/$s.body" -type "${CTYPE[$s]}" -n "$N" -pid "$PROXY_PID" -interval 50ms \
			-metrics "http://127.0.0.1:$ADMIN_PORT/metrics" -file-bytes "$fb" -upstream-port "$UP_PORT" \
			-timeout "$((TIMEOUT - 10))s") || rc=$?
		[[ $rc == 0 ]] || FAILED=1
		leftover=$(find "$SPOOL" -maxdepth 1 -name 'ratelimit-proxy-body-*' | wc -l)
		[[ $leftover == 0 ]] || { log "FAIL: $leftover ratelimit-proxy-body-* files left in TMPDIR"; FAILED=1; }
		hwm=$(field hwm_after_mib "$line")
		verdict=ok
		[[ $rc == 0 ]] || verdict=FAIL
		if [[ $MAX_RSS_MIB != 0 && $hwm != - ]] && awk -v h="$hwm" -v m="$MAX_RSS_MIB" 'BEGIN { exit !(h > m) }'; then
			verdict="FAIL (> $MAX_RSS_MIB MiB)"
			FAILED=1
		fi
		ROWS+=("| $s | $b | $(field n "$line") × $(field body_bytes "$line") B | $(field ok "$line") | $(field wall_s "$line") | $(field cpu_s "$line") | $idle_rss | $(field rss_before_mib "$line") | $(field rss_peak_mib "$line") | $hwm | $(field rss_after_mib "$line") | $(field heap_inuse_peak_mib "$line") / $(field go_sys_peak_mib "$line") | $idle_fds → $(field fds_peak "$line") → $(field fds_after "$line") ($(field client_conns_after "$line") + $(field upstream_conns_after "$line")) | $(field spool_peak "$line") / $(field spool_after "$line") / $leftover | $verdict |")
	done
	if [[ $GCTRACE == 1 ]]; then
		# gc N @t s P%: a+b+c ms clock, ... ms cpu, START->END->LIVE MB, GOAL MB goal, ...
		awk '/^gc [0-9]+ @/ { n++; split($11, h, "->"); for (i in h) if (h[i] + 0 > mx) mx = h[i] + 0; if ($13 + 0 > g) g = $13 + 0 }
			END { printf "# %s gctrace: %d GCs, largest heap %d MB, largest goal %d MB\n", s, n, mx, g }' \
			s="$s" "$tmp/proxy-$s.log" >&2
	fi
	stop_pid "$PROXY_PID"
done

cat <<EOF
## ratelimit-proxy: $N concurrent uploads ($(date -u +%Y-%m-%dT%H:%MZ), $(nproc) CPUs, $(go env GOVERSION))

| scenario | batch | requests | 200s | wall s | proxy CPU s | idle RSS MiB | RSS before | RSS peak (50 ms samples) | VmHWM | RSS after | Go heap_inuse / sys peak MiB | fds idle → peak → after (client + upstream conns after) | spooled files peak / open after / in TMPDIR | |
|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|
$(printf '%s\n' "${ROWS[@]}")

MiB = 2^20 bytes. VmHWM is the process's peak RSS since it started (one fresh proxy per scenario).
EOF
[[ $FAILED == 0 ]] || die "some checks failed (see above)"
