# Shared by the interop suites (sourced inside the guest): a work folder, timestamps, failure
# with the logs, waiting for a condition, reading the registrar's metrics. A suite sets
# METRICS (host:port of the registrar's metrics) before it uses metric*.
W=$(mktemp -d /tmp/interop.XXXXXX)
T0=$(date +%s.%N)
METRICS=${METRICS:-127.0.0.1:9100}
say() { printf '[%6.2fs] %s\n' "$(awk -v a="$T0" -v b="$(date +%s.%N)" 'BEGIN{print b-a}')" "$*"; }
nocolor() { sed 's/\x1b\[[0-9;]*m//g'; }
pids=()
cleanup() { for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null || true; done; }
trap cleanup EXIT
trap 'fail "command failed at line $LINENO: $BASH_COMMAND"' ERR
fail() {
    trap - ERR
    say "FAILED: $*"
    for f in "$W"/*.log; do echo "---- $f"; nocolor < "$f" | tail -n 25; done
    # The whole work folder, for what the tails above leave out (INTEROP_LOGS is on the host).
    if [ -n "${INTEROP_LOGS:-}" ] && mkdir -p "$INTEROP_LOGS"; then
        cp -r "$W" "$INTEROP_LOGS/" && say "all logs kept in $INTEROP_LOGS/$(basename "$W")"
    fi
    exit 1
}
wait_for() {   # wait_for SECONDS DESCRIPTION COMMAND...
    local t=$1 what=$2; shift 2
    local end=$(( $(date +%s) + t ))
    until "$@" >/dev/null 2>&1; do
        [ "$(date +%s)" -ge "$end" ] && fail "timed out waiting for $what"
        sleep 0.1
    done
}
elapsed_since() { awk -v a="$1" -v b="$(date +%s.%N)" 'BEGIN{printf "%.3f", b-a}'; }
metric() { curl -s "http://$METRICS/metrics" | awk -v k="$1" '$1==k {print $2}'; }
metric_is() { [ "$(metric "$1")" = "$2" ]; }
metric_at_least() { local v; v=$(metric "$1"); [ -n "$v" ] && [ "$v" -ge "$2" ]; }
# RSPLIB's PE only registers site-local (or wider) addresses: give the guest one.
ip link add rsp0 type dummy 2>/dev/null && ip addr add 10.255.0.1/24 dev rsp0 && ip link set rsp0 up || true
RSPLIB_LOG=(-logcolor=off -loglevel=2)
