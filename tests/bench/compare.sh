#!/usr/bin/env bash
# compare.sh — CPU cost per request of ratelimit-proxy vs nginx (limit_req +
# proxy_pass) vs a plain Go httputil.ReverseProxy, all in front of the same
# nginx upstream, on loopback, in one run. See tests/bench/README.md.
#
#   tests/bench/compare.sh                          # defaults below
#   ROUNDS=5 DURATION=20s GOMAXPROCS=2 tests/bench/compare.sh
#   CONTENDERS="proxy nginx" BIN=/path/to/ratelimit-proxy tests/bench/compare.sh
#
# Settings (environment):
#   ROUNDS=3         rounds; each round runs every contender once, the order
#                    alternates between rounds (forward, reversed, forward...)
#   DURATION=10s     measured wrk run per contender and round
#   WARMUP=3s        unmeasured wrk run before each measured one
#   CONNECTIONS=50   wrk connections (wrk -t1)
#   CONTENDERS="proxy nginx plain"
#   GOMAXPROCS=1     for the Go contenders (proxy, plain): one Go P against one
#                    nginx worker process; try 2 too
#   BIN=             prebuilt ratelimit-proxy (default: go build ./cmd/ratelimit-proxy)
#   BASE_BIN=        a second ratelimit-proxy build, the contender "base" (e.g.
#                    the commit before a change): measured in the same run,
#                    interleaved, configured as "proxy"
#   PLAIN_BIN=       prebuilt plainproxy (default: go build ./tests/bench/plainproxy)
#   NGINX=/usr/sbin/nginx  WRK=wrk
#   ALLOW_SOCKET_ERRORS=0  1: report wrk socket errors instead of failing
#   MODE=admitted    refused: every measured request is a 429 (the proxy with
#                    CHAT_RPM=1, nginx with limit_req at 1r/m): the cost of
#                    the over-limit caller's hot path (default contenders
#                    "proxy nginx"); sse: every request is a stream of
#                    SSE_EVENTS events from tests/bench/sseorigin, each its
#                    own chunk, SSE_GAP apart (nginx with proxy_buffering off)
#   SSE_EVENTS=20 SSE_GAP=1ms
#   PROXY_CONFIG=    a TOML file the contender "proxy" starts with (-config;
#                    CHAT_RPM stays set, so its rule comes first)
#   BASE_CONFIG=     the same for "base"; BASE_BIN then defaults to the
#                    proxy's binary: one build under two configurations
#   REDIS=0          1: start a redis-server (loopback, no persistence) the
#                    proxy and base keep their counters in (REDIS_URL); its
#                    CPU during a contender's run is added to that
#                    contender's (proxy + Redis CPU per request)
#
#   Five rules on Redis against one, whole requests, side by side:
#   REDIS=1 CONTENDERS="proxy base" BASE_CONFIG=tests/bench/five-rules.toml \
#     tests/bench/compare.sh
set -euo pipefail

ROUNDS=${ROUNDS:-3}
DURATION=${DURATION:-10s}
WARMUP=${WARMUP:-3s}
CONNECTIONS=${CONNECTIONS:-50}
MODE=${MODE:-admitted}
case $MODE in
admitted) CONTENDERS=${CONTENDERS:-proxy nginx plain} RPM=100000000 NGINX_RATE=1000000r/s ;;
refused) CONTENDERS=${CONTENDERS:-proxy nginx} RPM=1 NGINX_RATE=1r/m ;;
sse) CONTENDERS=${CONTENDERS:-proxy nginx} RPM=100000000 NGINX_RATE=1000000r/s ;;
*) echo "compare.sh: MODE must be admitted, refused or sse, got '$MODE'" >&2 && exit 1 ;;
esac
PROCS=${GOMAXPROCS:-1}
NGINX=${NGINX:-/usr/sbin/nginx}
WRK=${WRK:-wrk}
ALLOW_SOCKET_ERRORS=${ALLOW_SOCKET_ERRORS:-0}
BIN=${BIN:-}
PLAIN_BIN=${PLAIN_BIN:-}
PROXY_CONFIG=${PROXY_CONFIG:-}
BASE_CONFIG=${BASE_CONFIG:-}
REDIS=${REDIS:-0}
PATH_UNDER_TEST=/v1/chat/completions
SSE_EVENTS=${SSE_EVENTS:-20}
SSE_GAP=${SSE_GAP:-1ms}

NAME=compare.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

[[ $ROUNDS =~ ^[1-9][0-9]*$ ]] || die "ROUNDS must be a positive integer, got '$ROUNDS'"
[[ $CONNECTIONS =~ ^[1-9][0-9]*$ ]] || die "CONNECTIONS must be a positive integer, got '$CONNECTIONS'"
[[ $PROCS =~ ^[1-9][0-9]*$ ]] || die "GOMAXPROCS must be a positive integer, got '$PROCS'"
for c in $CONTENDERS; do
	case $c in proxy | base | nginx | plain | origin) ;; *) die "unknown contender '$c' (known: proxy base nginx plain origin)" ;; esac
	[[ $c == base && -z ${BASE_BIN:-} && -z $BASE_CONFIG ]] && die "contender base needs BASE_BIN (a ratelimit-proxy binary) or BASE_CONFIG"
	[[ $MODE == refused && ($c == plain || $c == origin) ]] && die "$c refuses nothing: not a contender with MODE=refused"
done
[[ -n ${CONTENDERS// /} ]] || die "CONTENDERS is empty"
for f in "$PROXY_CONFIG" "$BASE_CONFIG"; do
	[[ -z $f || -r $f ]] || die "configuration file $f not readable"
done
[[ $REDIS == 0 || $REDIS == 1 ]] || die "REDIS must be 0 or 1, got '$REDIS'"
[[ $REDIS == 0 ]] || command -v redis-server >/dev/null || die "REDIS=1 needs redis-server (apt-get install -y redis-server)"
command -v "$WRK" >/dev/null || die "wrk not found (apt-get install -y wrk)"
[[ -x $NGINX ]] || die "nginx not found at $NGINX (apt-get install -y nginx-light)"
command -v curl >/dev/null || die "curl not found"

bench_root

bench_tmp rlp-bench
# nginx workers drop to "nobody" when started as root: let them traverse.
chmod 0755 "$tmp"


# ---------------------------------------------------------------- ports ---
# Random free loopback ports below the usual ephemeral range (32768+), so the
# outgoing connections of wrk and the proxies never collide with them.
pick_port UP_PORT
pick_port NGINX_PORT
pick_port PROXY_PORT
pick_port ADMIN_PORT
pick_port PLAIN_PORT
pick_port BASE_PORT
pick_port BASE_ADMIN_PORT
pick_port REDIS_PORT

# ------------------------------------------------------------- payloads ---
REQ_BODY='{"model":"gpt-4o-mini","messages":[{"role":"system","content":"You are a concise assistant."},{"role":"user","content":"In one sentence, explain why a reverse proxy should rate-limit each caller before it forwards chat requests to an upstream LLM API."}],"temperature":0.2,"max_tokens":64,"stream":false}'
RESP_BODY='{"id":"chatcmpl-bench","object":"chat.completion","created":1700000000,"model":"gpt-4o-mini","choices":[{"index":0,"message":{"role":"assistant","content":"To keep it fair."},"finish_reason":"stop"}],"usage":{"prompt_tokens":48,"completion_tokens":6,"total_tokens":54}}'
printf '%s' "$REQ_BODY" >"$tmp/body.json"
printf '%s' "$RESP_BODY" >"$tmp/expected.json"

cat >"$tmp/post.lua" <<EOF
wrk.method = "POST"
wrk.body = [==[$REQ_BODY]==]
wrk.headers["Content-Type"] = "application/json"
EOF

# ---------------------------------------------------------------- nginx ---
# nginx_common DIR: the top-level settings both nginx instances share. Every path the
# binary would otherwise take from its compiled-in defaults (/var/lib/nginx,
# /run, /var/log) is redirected into DIR.
nginx_common() {
	local dir=$1
	mkdir -p "$dir/tmp"
	cat <<EOF
worker_processes 1;
daemon off;
master_process on;
pid $dir/nginx.pid;
error_log $dir/error.log warn;
events { worker_connections 4096; }
EOF
}
nginx_http_common() {
	local dir=$1
	cat <<EOF
    access_log off;
    client_body_temp_path $dir/tmp/body;
    proxy_temp_path $dir/tmp/proxy;
    fastcgi_temp_path $dir/tmp/fastcgi;
    uwsgi_temp_path $dir/tmp/uwsgi;
    scgi_temp_path $dir/tmp/scgi;
    # Bodies stay in memory; connections are never closed by request count
    # (the default of 1000 would make every contender re-dial).
    client_body_buffer_size 16k;
    client_max_body_size 1m;
    keepalive_requests 1000000;
    keepalive_timeout 120s;
EOF
}

UP_DIR=$tmp/upstream
mkdir -p "$UP_DIR"
{
	nginx_common "$UP_DIR"
	echo "http {"
	nginx_http_common "$UP_DIR"
	cat <<EOF
    server {
        listen 127.0.0.1:$UP_PORT;
        # return discards (reads and drops) the request body, then answers.
        location / {
            default_type application/json;
            return 200 '$RESP_BODY';
        }
        # Accepted connections: how many the contender opened to it.
        location = /__stub_status {
            stub_status;
        }
    }
}
EOF
} >"$UP_DIR/nginx.conf"

NG_DIR=$tmp/nginx
mkdir -p "$NG_DIR"
{
	nginx_common "$NG_DIR"
	echo "http {"
	nginx_http_common "$NG_DIR"
	cat <<EOF
    # admitted: far above any loopback rate, nothing is refused, the zone
    # is still consulted; refused: everything after the first request is.
    limit_req_zone \$binary_remote_addr zone=chat:10m rate=$NGINX_RATE;
    limit_req_status 429;
    upstream backend {
        server 127.0.0.1:$UP_PORT;
        keepalive 256;
        keepalive_requests 1000000;
        keepalive_timeout 120s;
    }
    server {
        listen 127.0.0.1:$NGINX_PORT;
        proxy_http_version 1.1;
        proxy_set_header Connection "";$( [[ $MODE == sse ]] && echo "
        proxy_buffering off;")
        # The same forwarding headers ratelimit-proxy sets (SPEC §4.5).
        proxy_set_header X-Forwarded-For \$remote_addr;
        proxy_set_header X-Forwarded-Proto \$scheme;
        proxy_set_header X-Forwarded-Host \$host;
        location = $PATH_UNDER_TEST {
            limit_req zone=chat$( [[ $MODE == refused ]] || echo " burst=1000000 nodelay");
            proxy_pass http://backend;
        }
        location / {
            proxy_pass http://backend;
        }
    }
}
EOF
} >"$NG_DIR/nginx.conf"

start_nginx() { # start_nginx DIR -> sets LAST_PID
	local dir=$1
	"$NGINX" -t -q -p "$dir" -c "$dir/nginx.conf" -e "$dir/error.log" ||
		die "nginx config $dir/nginx.conf rejected: $(cat "$dir/error.log" 2>/dev/null)"
	"$NGINX" -p "$dir" -c "$dir/nginx.conf" -e "$dir/error.log" >>"$dir/stdout.log" 2>&1 &
	LAST_PID=$!
	PIDS+=("$LAST_PID")
}

# group_pids PID: PID and its direct children (nginx master + workers).
group_pids() {
	local root=$1 f stat rest pid
	local -a fields
	echo "$root"
	for f in /proc/[0-9]*/stat; do
		{ stat=$(<"$f"); } 2>/dev/null || continue
		rest=${stat##*) }
		read -ra fields <<<"$rest"
		pid=${f#/proc/}
		pid=${pid%/stat}
		[[ ${fields[1]} == "$root" ]] && echo "$pid"
	done
	return 0
}

# wakeups PID...: sum of voluntary context switches (each time the process
# slept, in nginx's case in epoll_wait, and was woken again) over the PIDs.
wakeups() {
	local pid total=0 n
	for pid in "$@"; do
		n=$(awk '/^voluntary_ctxt_switches:/ {print $2}' "/proc/$pid/status") || die "process $pid is gone"
		total=$((total + n))
	done
	echo "$total"
}

# cpu_ticks PID...: sum of utime+stime (fields 14 and 15 of /proc/PID/stat,
# in clock ticks) over the PIDs.
cpu_ticks() {
	local total=0 pid stat rest
	local -a fields
	for pid in "$@"; do
		stat=$(<"/proc/$pid/stat") || die "process $pid is gone"
		rest=${stat##*) } # field 3 (state) onwards; comm may hold spaces
		read -ra fields <<<"$rest"
		total=$((total + fields[11] + fields[12]))
	done
	echo "$total"
}

wait_ready() { # wait_ready NAME PID LOG CURL-ARGS...
	local name=$1 pid=$2 logf=$3 i
	shift 3
	for ((i = 0; i < 100; i++)); do
		kill -0 "$pid" 2>/dev/null || die "$name exited during start; log:
$(tail -n 20 "$logf" 2>/dev/null)"
		if curl -fsS -o /dev/null --max-time 1 "$@" 2>/dev/null; then return 0; fi
		sleep 0.1
	done
	die "$name not ready after 10 s; log:
$(tail -n 20 "$logf" 2>/dev/null)"
}

post() { # post URL: POST the benchmark body, print "status" then body to $tmp/got.json
	curl -sS --max-time 5 -o "$tmp/got.json" -w '%{http_code}' \
		-H 'Content-Type: application/json' --data-binary "@$tmp/body.json" "$1"
}

verify() { # verify NAME URL: the POST through it returns 200 and the upstream's body
	local name=$1 url=$2 code
	code=$(post "$url") || die "$name: POST $url failed"
	[[ $code == 200 ]] || die "$name: POST $url answered $code: $(head -c 300 "$tmp/got.json")"
	if [[ $MODE == sse ]]; then
		[[ $(grep -c '^data: ' "$tmp/got.json") == $((SSE_EVENTS + 1)) ]] ||
			die "$name: POST $url did not stream $SSE_EVENTS events: $(head -c 300 "$tmp/got.json")"
		return 0
	fi
	cmp -s "$tmp/got.json" "$tmp/expected.json" ||
		die "$name: POST $url returned an unexpected body: $(head -c 300 "$tmp/got.json")"
}

# --------------------------------------------------------------- start ---
log "building"
if [[ -z $BIN && " $CONTENDERS " == *" proxy "* ]]; then
	go build -o "$tmp/ratelimit-proxy" ./cmd/ratelimit-proxy
	BIN=$tmp/ratelimit-proxy
fi
if [[ -z $PLAIN_BIN && " $CONTENDERS " == *" plain "* ]]; then
	go build -o "$tmp/plainproxy" ./tests/bench/plainproxy
	PLAIN_BIN=$tmp/plainproxy
fi

UP_URL=http://127.0.0.1:$UP_PORT
if [[ $MODE == sse ]]; then
	go build -o "$tmp/sseorigin" ./tests/bench/sseorigin
	"$tmp/sseorigin" -listen "127.0.0.1:$UP_PORT" -events "$SSE_EVENTS" -gap "$SSE_GAP" >"$tmp/sseorigin.log" 2>&1 &
	UP_PID=$!
	PIDS+=("$UP_PID")
	wait_ready "upstream sseorigin" "$UP_PID" "$tmp/sseorigin.log" "$UP_URL/__stub_status"
else
	start_nginx "$UP_DIR"
	UP_PID=$LAST_PID
	wait_ready "upstream nginx" "$UP_PID" "$UP_DIR/error.log" "$UP_URL/"
fi
verify "upstream" "$UP_URL$PATH_UNDER_TEST"
mapfile -t UP_PIDS < <(group_pids "$UP_PID")

REDIS_ENV=()
REDIS_PIDS=()
if [[ $REDIS == 1 ]]; then
	redis-server --bind 127.0.0.1 --port "$REDIS_PORT" --save "" --appendonly no \
		--daemonize no --dir "$tmp" --logfile "$tmp/redis.log" &
	PIDS+=("$!")
	REDIS_PIDS=("$!")
	for ((i = 0; i < 100; i++)); do
		kill -0 "${REDIS_PIDS[0]}" 2>/dev/null || die "redis-server exited during start: $(tail -n 20 "$tmp/redis.log" 2>/dev/null)"
		[[ $(timeout 2 redis-cli -h 127.0.0.1 -p "$REDIS_PORT" PING 2>/dev/null) == PONG ]] && break
		sleep 0.1
	done
	REDIS_ENV=(REDIS_URL="redis://127.0.0.1:$REDIS_PORT/0")
fi

declare -A URL GROUP
for c in $CONTENDERS; do
	case $c in
	nginx)
		start_nginx "$NG_DIR"
		wait_ready "nginx" "$LAST_PID" "$NG_DIR/error.log" "http://127.0.0.1:$NGINX_PORT/"
		URL[nginx]=http://127.0.0.1:$NGINX_PORT$PATH_UNDER_TEST
		GROUP[nginx]=$(group_pids "$LAST_PID" | tr '\n' ' ')
		;;
	proxy | base)
		bin=$BIN port=$PROXY_PORT admin=$ADMIN_PORT conf=$PROXY_CONFIG
		[[ $c == base ]] && bin=${BASE_BIN:-$BIN} port=$BASE_PORT admin=$BASE_ADMIN_PORT conf=$BASE_CONFIG
		conf_args=()
		[[ -n $conf ]] && conf_args=(-config "$conf")
		# A clean environment: only what this benchmark sets reaches the proxy.
		env -i PATH="$PATH" HOME="${HOME:-/}" GOMAXPROCS="$PROCS" "${REDIS_ENV[@]}" \
			UPSTREAM_URL="$UP_URL" LISTEN_ADDR="127.0.0.1:$port" ADMIN_ADDR="127.0.0.1:$admin" \
			CHAT_RPM=$RPM LOG_LEVEL=warn SHUTDOWN_TIMEOUT=2s \
			"$bin" "${conf_args[@]}" >"$tmp/$c.log" 2>&1 &
		LAST_PID=$!
		PIDS+=("$LAST_PID")
		wait_ready "ratelimit-proxy ($c)" "$LAST_PID" "$tmp/$c.log" "http://127.0.0.1:$admin/readyz"
		URL[$c]=http://127.0.0.1:$port$PATH_UNDER_TEST
		# Its Redis works for it alone while it runs: its CPU is the proxy's.
		GROUP[$c]="$LAST_PID ${REDIS_PIDS[*]}"
		;;
	origin)
		# No proxy: wrk straight at the upstream, the baseline for its
		# CPU and wakeups per request at this many connections.
		URL[origin]=$UP_URL$PATH_UNDER_TEST
		GROUP[origin]=
		;;
	plain)
		env -i PATH="$PATH" HOME="${HOME:-/}" GOMAXPROCS="$PROCS" \
			"$PLAIN_BIN" -listen "127.0.0.1:$PLAIN_PORT" -upstream "$UP_URL" >"$tmp/plain.log" 2>&1 &
		LAST_PID=$!
		PIDS+=("$LAST_PID")
		wait_ready "plainproxy" "$LAST_PID" "$tmp/plain.log" "http://127.0.0.1:$PLAIN_PORT/"
		URL[plain]=http://127.0.0.1:$PLAIN_PORT$PATH_UNDER_TEST
		GROUP[plain]=$LAST_PID
		;;
	esac
	verify "$c" "${URL[$c]}"
	if [[ $MODE == refused ]]; then
		code=$(post "${URL[$c]}") || die "$c: POST failed"
		[[ $code == 429 ]] || die "$c: the second POST answered $code, not 429"
	fi
done
if [[ -n ${URL[proxy]:-} ]]; then
	# The guard chain really ran: the proxy answered with its rate-limit headers.
	headers=$(curl -sS --max-time 5 -D - -o /dev/null -H "Content-Type: application/json" \
		--data-binary "@$tmp/body.json" "${URL[proxy]}")
	grep -qi "^x-ratelimit-limit: $RPM" <<<"$headers" ||
		die "ratelimit-proxy: no X-RateLimit-Limit: $RPM header; is the guard chain running?"
fi

# ----------------------------------------------------------------- runs ---
CLK_TCK=$(getconf CLK_TCK)
RESULTS=$tmp/results.tsv
: >"$RESULTS"

# run_wrk DURATION URL OUT: bounded wrk run, output kept in OUT.
run_wrk() {
	timeout --kill-after=5 "$(($(dur_s "$1") + 30))" \
		"$WRK" -t1 -c"$CONNECTIONS" -d"$1" --latency -s "$tmp/post.lua" "$2" >"$3" 2>&1 ||
		die "wrk failed against $2: $(cat "$3")"
}
dur_s() { # 10s / 2m / 10 -> seconds (ceil)
	case $1 in
	*ms) echo 1 ;;
	*s) echo "${1%s}" ;;
	*m) echo $((${1%m} * 60)) ;;
	*h) echo $((${1%h} * 3600)) ;;
	*) echo "$1" ;;
	esac
}
[[ $(dur_s "$DURATION") =~ ^[0-9]+$ && $(dur_s "$WARMUP") =~ ^[0-9]+$ ]] ||
	die "DURATION/WARMUP must look like 10s, 2m (got '$DURATION', '$WARMUP')"

# check_wrk NAME OUT: every response 2xx, no socket errors (unless allowed).
check_wrk() {
	local name=$1 out=$2 non2xx errs
	non2xx=$(awk '/Non-2xx or 3xx responses:/ {print $NF}' "$out")
	if [[ $MODE == refused ]]; then
		# CHAT_RPM=1: a caller is admitted again once a minute.
		local reqs allowed
		reqs=$(awk '/ requests in / {print $1}' "$out")
		allowed=$(($(dur_s "$DURATION") / 60 + 1))
		[[ -n $non2xx ]] && ((reqs - non2xx <= allowed)) ||
			die "$name: not every response was refused ($non2xx non-2xx):
$(cat "$out")"
	else
		[[ -z $non2xx ]] || die "$name: $non2xx responses were not 2xx — something was refused or failed:
$(cat "$out")"
	fi
	errs=$(awk '/Socket errors:/ {gsub(/,/, ""); print $4 + $6 + $8 + $10}' "$out")
	if [[ -n $errs && $errs != 0 ]]; then
		[[ $ALLOW_SOCKET_ERRORS == 1 ]] || die "$name: wrk reported socket errors (ALLOW_SOCKET_ERRORS=1 to accept):
$(cat "$out")"
		log "WARNING: $name: $(grep 'Socket errors' "$out")"
	fi
	grep -q ' requests in ' "$out" || die "$name: cannot parse wrk output:
$(cat "$out")"
}

accepts() { # the upstream's accepted connections so far
	curl -fsS --max-time 2 "$UP_URL/__stub_status" | awk '/^ *[0-9]+ +[0-9]+ +[0-9]+/ {print $1; exit}'
}

measure() { # measure ROUND CONTENDER
	local round=$1 c=$2 url=${URL[$2]} out=$tmp/wrk-$1-$2.txt
	local -a group
	read -ra group <<<"${GROUP[$c]}"
	log "round $round: $c warm-up $WARMUP"
	run_wrk "$WARMUP" "$url" "$out.warmup"
	check_wrk "$c (warm-up)" "$out.warmup"
	log "round $round: $c measured $DURATION"
	local c0 u0 w0 c1 u1 w1 a0 a1
	a0=$(accepts)
	c0=$(cpu_ticks "${group[@]}")
	u0=$(cpu_ticks "${UP_PIDS[@]}")
	w0=$(wakeups "${UP_PIDS[@]}")
	run_wrk "$DURATION" "$url" "$out"
	c1=$(cpu_ticks "${group[@]}")
	u1=$(cpu_ticks "${UP_PIDS[@]}")
	w1=$(wakeups "${UP_PIDS[@]}")
	a1=$(accepts)
	check_wrk "$c" "$out"
	local reqs rps p50 p99
	reqs=$(awk '/ requests in / {print $1}' "$out")
	rps=$(awk '/^Requests\/sec:/ {print $2}' "$out")
	p50=$(awk '$1 == "50%" {print $2}' "$out")
	p99=$(awk '$1 == "99%" {print $2}' "$out")
	[[ $reqs =~ ^[1-9][0-9]*$ ]] || die "$c: wrk served no requests: $(cat "$out")"
	# The stub_status request itself is one accepted connection.
	printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$round" "$c" "$reqs" "$rps" \
		"$((c1 - c0))" "$((u1 - u0))" "${p50:--}" "${p99:--}" "$((a1 - a0 - 1))" "$((w1 - w0))" >>"$RESULTS"
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

# All contenders still alive (no crash mid-run skewing the CPU sums).
for pid in "${PIDS[@]}"; do kill -0 "$pid" 2>/dev/null || die "process $pid died during the run"; done
if [[ -s $tmp/proxy.log ]]; then
	log "ratelimit-proxy logged (LOG_LEVEL=warn):"
	head -n 5 "$tmp/proxy.log" | sed 's/^/#   /' >&2
fi

# --------------------------------------------------------------- report ---
cpu_model=$(awk -F': ' '/^model name/ {print $2; exit}' /proc/cpuinfo 2>/dev/null || true)
echo "## ratelimit-proxy vs nginx: CPU per request"
echo
echo "- $(date -u '+%Y-%m-%d %H:%M UTC'), $(uname -sr), ${cpu_model:-unknown CPU}, $(nproc) CPUs (shared with wrk and the upstream)"
echo "- $("$NGINX" -v 2>&1 | sed 's/^nginx version: //'), $(go version 2>/dev/null | awk '{print $3}'), $(wrk --version 2>&1 | head -n1 | awk '{print $1, $2}')"
echo "- mode $MODE; POST $PATH_UNDER_TEST, ${#REQ_BODY}-byte JSON body, ${#RESP_BODY}-byte JSON answer; wrk -t1 -c$CONNECTIONS, warm-up $WARMUP, measured $DURATION, $ROUNDS rounds (order alternates)"
echo "- Go contenders: GOMAXPROCS=$PROCS; nginx contender and upstream: worker_processes 1; CLK_TCK=$CLK_TCK"
echo "- CPU = Δ(utime+stime) of all the contender's processes over the measured run; upstream = the shared nginx upstream, for information"
echo
echo "| round | contender | requests | req/s | CPU s | CPU µs/req | upstream µs/req | upstream wakeups/req | new upstream conns | p50 | p99 |"
echo "|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
awk -F'\t' -v hz="$CLK_TCK" '{
	printf "| %s | %s | %d | %.0f | %.2f | %.1f | %.1f | %.2f | %d | %s | %s |\n",
		$1, $2, $3, $4, $5 / hz, $5 / hz * 1e6 / $3, $6 / hz * 1e6 / $3, $10 / $3, $9, $7, $8
}' "$RESULTS"
echo

median() { # median FIELD CONTENDER: FIELD is an awk expression over $3..$6
	awk -F'\t' -v c="$2" -v hz="$CLK_TCK" "\$2 == c { print $1 }" "$RESULTS" | sort -g |
		awk '{ v[NR] = $1 } END { if (NR == 0) print "nan"; else if (NR % 2) print v[(NR + 1) / 2]; else print (v[NR / 2] + v[NR / 2 + 1]) / 2 }'
}
declare -A MED_CPU MED_RPS MED_UP MED_CONN MED_WAKE
for c in "${ORDER[@]}"; do
	MED_CPU[$c]=$(median '$5 / hz * 1e6 / $3' "$c")
	MED_RPS[$c]=$(median '$4' "$c")
	MED_UP[$c]=$(median '$6 / hz * 1e6 / $3' "$c")
	MED_CONN[$c]=$(median '$9' "$c")
	MED_WAKE[$c]=$(median '$10 / $3' "$c")
done
ref=${ORDER[0]}
[[ -n ${MED_CPU[nginx]:-} ]] && ref=nginx
echo "| contender (median of $ROUNDS) | CPU µs/req | × $ref | req/s | upstream µs/req | upstream wakeups/req | new upstream conns |"
echo "|---|---:|---:|---:|---:|---:|---:|"
for c in "${ORDER[@]}"; do
	awk -v c="$c" -v cpu="${MED_CPU[$c]}" -v ref="${MED_CPU[$ref]}" -v rps="${MED_RPS[$c]}" -v up="${MED_UP[$c]}" -v conn="${MED_CONN[$c]}" -v wake="${MED_WAKE[$c]}" \
		'BEGIN { printf "| %s | %.1f | %.2f | %.0f | %.1f | %.2f | %.0f |\n", c, cpu, cpu / ref, rps, up, wake, conn }'
done
if [[ -n ${MED_CPU[proxy]:-} && -n ${MED_CPU[nginx]:-} ]]; then
	echo
	awk -v p="${MED_CPU[proxy]}" -v n="${MED_CPU[nginx]}" \
		'BEGIN { printf "**proxy / nginx CPU per request (medians): %.2f**\n", p / n }'
fi
if [[ -n ${MED_CPU[proxy]:-} && -n ${MED_CPU[base]:-} ]]; then
	awk -v p="${MED_CPU[proxy]}" -v n="${MED_CPU[base]}" \
		'BEGIN { printf "\nproxy / base (BASE_BIN) CPU per request (medians): %.2f\n", p / n }'
fi
if [[ -n ${MED_CPU[proxy]:-} && -n ${MED_CPU[plain]:-} ]]; then
	awk -v p="${MED_CPU[proxy]}" -v n="${MED_CPU[plain]}" \
		'BEGIN { printf "\nproxy / plain ReverseProxy CPU per request (medians): %.2f\n", p / n }'
fi
