#!/usr/bin/env bash
# Records real RSPLIB PingPong and CalcApp traffic (with cookies and cookie echoes after a
# failover) into pingpong-rsplib.pcap and calcapp-rsplib.pcap beside this script.
# Needs kernel SCTP and RSPLIB (rsplib-registrar, rsplib-services, tcpdump, tshark); on a host without
# SCTP run it in the SCTP VM:  ../shared/sctp-vm/run -- crates/services/tests/data/capture-rsplib.sh
set -euo pipefail
OUT=$(cd "$(dirname "$0")" && pwd)
W=$(mktemp -d /tmp/capture.XXXXXX)
pids=()
cleanup() { for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null || true; done; }
trap cleanup EXIT
say() { echo "[$(date +%T)] $*"; }
wait_for() { # wait_for SECONDS DESCRIPTION COMMAND...
    local end=$(( $(date +%s) + $1 )) what=$2; shift 2
    until "$@" >/dev/null 2>&1; do
        [ "$(date +%s)" -ge "$end" ] && { say "timed out waiting for $what"; tail -n 30 "$W"/*.log; exit 1; }
        sleep 0.2
    done
}
ip link add rsp0 type dummy 2>/dev/null && ip addr add 10.255.0.1/24 dev rsp0 && ip link set rsp0 up || true
LIB=(-registrar=127.0.0.1:3863 -asapannounce=off -logcolor=off -loglevel=2)

start_registrar() {
    rspregistrar -asap=127.0.0.1:3863 -enrp=10.255.0.1:9901 -asapannounce=off -enrpannounce=off \
        -minaddressscope=loopback -logcolor=off -loglevel=2 >"$W/registrar.log" 2>&1 &
    pids+=($!)
    sleep 1
}

capture() { # capture FILE: tcpdump on lo, SCTP only, full packets
    tcpdump -i lo -s 0 -U -w "$1" sctp >"$W/tcpdump.log" 2>&1 &
    TCPDUMP=$!
    pids+=($TCPDUMP)
    wait_for 20 "tcpdump" grep -q "listening on" "$W/tcpdump.log"
}
stop_capture() { sleep 0.5; kill -INT "$TCPDUMP"; wait "$TCPDUMP" || true; }

start_registrar

# ---- PingPong: two PEs, each aborts its session after 4 replies: the client fails over with
# the last cookie (ASAP_COOKIE_ECHO) and the reply numbers continue.
capture "$W/pingpong.pcap"
for i in 1 2; do
    stdbuf -oL rspserver -pingpong -pppfailureafter=4 "${LIB[@]}" >"$W/pp-pe$i.log" 2>&1 &
    pids+=($!)
done
wait_for 30 "PingPong PEs registered" bash -c "[ \$(grep -c 'Identifier' $W/pp-pe1.log $W/pp-pe2.log | awk -F: '{s+=\$2} END{print s}') -ge 2 ]"
stdbuf -oL pingpongclient -interval=150 "${LIB[@]}" >"$W/pp-pu.log" 2>&1 &
PU=$!; pids+=($PU)
wait_for 60 "PingPong replies #10" grep -q "reply #10)" "$W/pp-pu.log"
kill -TERM $PU || true
stop_capture
say "PingPong client:"; sed 's/\x1b\[[0-9;]*m//g' "$W/pp-pu.log" | grep -E "Ack|gap|FAILOVER" | head -20

# ---- CalcApp: two PEs with cookies every 0.5 s; the serving PE is killed mid-job, the client
# times out, fails over and the other PE resumes the job from the cookie.
capture "$W/calcapp.pcap"
for i in 1 2; do
    stdbuf -oL rspserver -calcapp -capcapacity=200000 -capcookiemaxtime=0.5 -capmaxjobs=4 \
        -capkeepalivetransmissioninterval=500 -capkeepalivetimeoutinterval=1500 \
        -capvector="$W/pe$i.vec" -capscalar="$W/pe$i.sca" "${LIB[@]}" >"$W/ca-pe$i.log" 2>&1 &
    eval "CA_PE$i=$!"; pids+=($!)
done
wait_for 30 "CalcApp PEs registered" bash -c "[ \$(grep -c 'Identifier' $W/ca-pe1.log $W/ca-pe2.log | awk -F: '{s+=\$2} END{print s}') -ge 2 ]"
stdbuf -oL calcappclient -jobinterval=1 -jobsize=1000000 -keepalivetransmissioninterval=500 \
    -keepalivetimeoutinterval=1000 -vector="$W/pu.vec" -scalar="$W/pu.sca" "${LIB[@]}" >"$W/ca-pu.log" 2>&1 &
PU=$!; pids+=($PU)
# Wait for a job of at least 1M calculations (5 s on a PE), let it send a few cookies, then kill
# the PE that runs it.
JOB=""; VICTIM=""
end=$(( $(date +%s) + 90 ))
while [ -z "$VICTIM" ]; do
    [ "$(date +%s)" -ge "$end" ] && { say "no long job seen"; tail -n 30 "$W"/ca-*.log; exit 1; }
    sleep 0.2
    for n in $(sed -n 's/^Job #\([0-9]*\) accepted$/\1/p' "$W/ca-pu.log"); do
        for i in 1 2; do
            # RSPLIB prints the size as a C++ double: 1M and more in exponent form (1.2e+06).
            if grep -q "^Job [0-9]*/$n of size [0-9.]*e+0[6-9] accepted$" "$W/ca-pe$i.log" &&
                ! grep -q "^Job [0-9]*/$n is complete" "$W/ca-pe$i.log"; then
                JOB=$n; eval "VICTIM=\$CA_PE$i"; break 2
            fi
        done
    done
done
sleep 1.6
say "killing the CalcApp PE ($VICTIM) running job $JOB"
kill -9 "$VICTIM"
wait_for 60 "job $JOB resumed from a cookie echo" grep -q "^Job [0-9]*/$JOB of size .* accepted from cookie echo" "$W/ca-pe1.log" "$W/ca-pe2.log"
wait_for 60 "job $JOB completed" grep -q "^Job #$JOB completed" "$W/ca-pu.log"
kill -TERM $PU || true
stop_capture
say "CalcApp PEs:"; grep -h -E "accepted|complete|rejected" "$W"/ca-pe*.log | head -20

# Keep only the frames with PingPong or CalcApp messages, ASAP_COOKIE or ASAP_COOKIE_ECHO.
KEEP='sctp.data_payload_proto_id == 33 || sctp.data_payload_proto_id == 34 || asap.message_type == 0x0b || asap.message_type == 0x0c'
tshark -r "$W/pingpong.pcap" -Y "$KEEP" -F pcap -w "$OUT/pingpong-rsplib.pcap"
tshark -r "$W/calcapp.pcap" -Y "$KEEP" -F pcap -w "$OUT/calcapp-rsplib.pcap"
ls -l "$OUT"/*.pcap
