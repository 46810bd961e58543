# Suite csp -- the Component Status Protocol (RSPLIB's monitoring over UDP) both ways, with
# RSPLIB's registrar and server over kernel SCTP, on ports 5600-5699. Each step is asserted; the
# suite fails at the first that does not hold.
#
#   1. RSPLIB's `rspregistrar` and `rspserver -echo` (registered with it) report to
#      `rserpool monitor` (-cspserver=127.0.0.1:5600): the monitor's snapshot shows the
#      registrar with RSPLIB's status line ("1[1] PEs in 1 Pool, 0 Peers") and the PE with that
#      registrar as its home;
#   2. our registrar (SCTP) and our echo PE report to RSPLIB's `cspmonitor -full`
#      (--csp-server 127.0.0.1:5601): cspmonitor shows the registrar with its status line and the
#      PE with its association to the registrar as "ASAP/SCTP".
RS=${RSERPOOL_BIN:?}
# ---------------------------------------------------------------- 1: RSPLIB -> rserpool monitor
RSPREG=127.0.0.1:5610
rspregistrar -asap=$RSPREG -asapannounce=off -enrpannounce=off -enrp=127.0.0.1:5611 \
    -minaddressscope=loopback -identifier=0x5e5e0601 -cspserver=127.0.0.1:5600 -cspinterval=300 \
    "${RSPLIB_LOG[@]}" > "$W/rspregistrar.log" 2>&1 &
pids+=($!)
rspserver -echo -registrar=$RSPREG -asapannounce=off -cspserver=127.0.0.1:5600 -cspinterval=300 \
    "${RSPLIB_LOG[@]}" > "$W/rspserver.log" 2>&1 &
pids+=($!)
# One snapshot collects reports for 2 s; repeated until both components are in it.
snapshot_shows_rsplib() {
    "$RS" monitor --once --csp 127.0.0.1:5600 --refresh 2s > "$W/monitor.out" 2> "$W/monitor.err" || return 1
    # grep -c reads to the end: no reader here stops early (pipefail).
    [ "$(grep -c '\$5e5e0601 .*CSP from .*1\[1\] PEs in 1 Pool, 0 Peers' "$W/monitor.out")" -ge 1 ] &&
        [ "$(sed -n '/^Pool elements/,/^$/p' "$W/monitor.out" | grep -c '\$5e5e0601')" -ge 1 ]
}
wait_for 90 "rserpool monitor to show rspregistrar and rspserver" snapshot_shows_rsplib
say "step 1 ok: rserpool monitor shows RSPLIB's components:"
sed -n '/^Registrars/,/^$/p; /^Pool elements/,/^$/p' "$W/monitor.out"
# ---------------------------------------------------------------- 2: rserpool -> cspmonitor
stdbuf -oL cspmonitor -localaddress=127.0.0.1:5601 -updateinterval=300 -full > "$W/cspmonitor.log" 2>&1 &
pids+=($!)
"$RS" registrar --transport sctp --asap 127.0.0.1:5620 --asap-announce off --identifier 0x5e5e0602 \
    --csp-server 127.0.0.1:5601 --csp-interval 300 --log info > "$W/registrar.log" 2>&1 &
pids+=($!)
"$RS" pe --service echo --transport sctp --registrar 127.0.0.1:5620 --local 10.255.0.1:0 \
    --identifier 0x5e5e0603 --csp-server 127.0.0.1:5601 --csp-interval 300 --log info > "$W/pe.log" 2>&1 &
pids+=($!)
shown() { [ "$(nocolor < "$W/cspmonitor.log" | grep -cF -- "$1")" -ge 1 ]; }
wait_for 60 "cspmonitor to show our registrar" shown 'PR $5e5e0602'
wait_for 60 "cspmonitor to show our registrar's status" shown '"1[1] PEs in 1 Pool, 0 Peers"'
wait_for 60 "cspmonitor to show our PE" shown 'PE $5e5e0603'
wait_for 60 "cspmonitor to show our PE's association to its home over SCTP" shown '-> PR $5e5e0602 ASAP/SCTP'
say "step 2 ok: cspmonitor shows our registrar and PE:"
sed 's/\x1b\[[0-9;]*[A-Za-z]//g' "$W/cspmonitor.log" | tr '\r' '\n' | grep -E 'PR \$5e5e0602|PE \$5e5e0603|-> PR' | tail -n 4
say "SUITE RESULT: OK"
