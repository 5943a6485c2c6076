# lib.sh — what every load script in tests/bench shares: messages, the
# repository root, a temporary directory, the processes it started (ended
# by PID on exit), and free loopback ports. Source it after setting NAME.
#
#	NAME=compare.sh; source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

die() { echo "$NAME: $*" >&2; exit 1; }
log() { echo "# $*" >&2; }

# bench_root: run from the repository root whatever the caller's directory.
bench_root() {
	cd "$(dirname "${BASH_SOURCE[0]}")/../.."
	[[ -f go.mod && -d cmd/ratelimit-proxy ]] || die "cannot find the repository root"
}

# bench_tmp PREFIX: make $tmp and arm the cleanup (KEEP=1 keeps $tmp).
PIDS=()
bench_tmp() {
	tmp=$(mktemp -d "${TMPDIR:-/tmp}/$1.XXXXXX")
	trap bench_cleanup EXIT
	trap 'exit 130' INT
	trap 'exit 143' TERM
}

stop_pid() { # stop_pid PID: TERM, wait up to 10 s, then KILL
	local pid=$1 i
	kill -TERM "$pid" 2>/dev/null || return 0
	for ((i = 0; i < 100; i++)); do
		kill -0 "$pid" 2>/dev/null || break
		sleep 0.1
	done
	kill -KILL "$pid" 2>/dev/null || true
	wait "$pid" 2>/dev/null || true
}

bench_cleanup() {
	local rc=$? pid
	trap - EXIT INT TERM
	for pid in "${PIDS[@]}"; do stop_pid "$pid"; done
	if [[ ${KEEP:-0} == 1 ]]; then
		echo "# kept $tmp" >&2
	else
		rm -rf "$tmp"
	fi
	exit "$rc"
}

# pick_port VAR: a random free loopback port below the usual ephemeral
# range (32768+), so outgoing connections of the load never collide with it.
USED_PORTS=" "
pick_port() {
	local p i
	for ((i = 0; i < 500; i++)); do
		p=$((20000 + RANDOM % 12000))
		[[ $USED_PORTS == *" $p "* ]] && continue
		if ! (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null; then
			USED_PORTS+="$p "
			printf -v "$1" '%s' "$p"
			return 0
		fi
	done
	die "no free port found"
}
