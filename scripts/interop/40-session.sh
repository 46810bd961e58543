# Suite session -- sessions with failover and cookies between rserpool and RSPLIB, over kernel
# SCTP, on ports 5200-5399. Each step is asserted; the suite fails at the first that does not hold.
#
#   1. `rserpool registrar` serves ASAP over SCTP on 127.0.0.1:5200;
#   2. two `rserpool pe --service pingpong` (sending business cards) register; RSPLIB's
#      `pingpongclient` gets Acks from one of them; it receives our business card and goes on;
#   3. the serving PE is killed with SIGKILL: pingpongclient fails over to the other PE, which
#      restores the reply counter from the echoed cookie (no gap); the time from the kill to the
#      next Ack is measured;
#   4. three `rserpool pe --service calcapp`: RSPLIB's `calcappclient` gets a job accepted; the
#      PE computing it is killed: the job resumes on another PE from its cookie and completes
#      (a kill that lands just after the job ended is tried again, a new PE in the killed one's place);
#   5. two RSPLIB `rspserver -pingpong`: `rserpool pu --service pingpong` fails over from the
#      killed one to the other with the cookie, every Ping answered once, no gap; the time from
#      the kill to the next Pong is measured;
#      then RSPLIB's pingpongclient with RSPLIB's PEs, the same kill -9, for comparison;
#   6. two RSPLIB `rspserver -calcapp`: `rserpool pu --service calcapp` runs a job, the PE is
#      killed after a cookie came, the job resumes on the other and completes;
#   7. RSPLIB's `rspterminal` gets its line echoed by `rserpool pe --service echo`;
#   8. `rserpool pe --service echo` registers with RSPLIB's `rspregistrar` and `rspterminal`, through
#      that registrar, gets its line echoed by it.
# Our PEs register the guest's site-local address 10.255.0.1: RSPLIB's pool users ignore
# loopback addresses in handle resolutions. The guest runs with `set -o pipefail`: no pipeline
# here ends in a reader that stops early (head, grep -m1/-q), which would fail its writer.
RS=${RSERPOOL_BIN:?}
REG=127.0.0.1:5200
METRICS=127.0.0.1:5201
LOG=("${RSPLIB_LOG[@]}" -registrar=$REG -asapannounce=off)
now() { date +%s.%N; }
# kill9 PID: SIGKILL, and reap it quietly.
kill9() { kill -9 "$1"; wait "$1" 2>/dev/null || true; }
# pe_metric PORT NAME: a metric of one of our PEs.
pe_metric() { curl -s "http://127.0.0.1:$1/metrics" | awk -v k="$2" '$1==k {print $2}'; }
pe_metric_at_least() { local v; v=$(pe_metric "$1" "$2"); [ -n "$v" ] && [ "$v" -ge "$3" ]; }
# start_pe NAME SERVICE METRICS_PORT [ARGS...]: one of our PEs, in the background.
start_pe() {
    local name=$1 service=$2 mport=$3; shift 3
    "$RS" pe --service "$service" --transport sctp --registrar $REG --local 10.255.0.1:0 \
        --metrics 127.0.0.1:"$mport" --rereg-interval 5s --log info "$@" > "$W/$name.log" 2>&1 &
    pids+=($!)
    eval "${name}_pid=$!"
}
# tod: the time of day in seconds (RSPLIB's clients print the time of day, to 0.1 ms).
tod() { date +%H:%M:%S.%N | awk -F: '{printf "%.4f", $1*3600 + $2*60 + $3}'; }
# acks_from_others PE: Acks pingpongclient printed from another PE than PE.
acks_from_others() { nocolor < "$W/pingpongclient.log" | grep 'Ack #' | grep -vcF "PE $1 " || true; }
# registered POOL N: the registrar has registered N distinct PEs into POOL.
registered() {
    [ "$(nocolor < "$W/registrar.log" | grep -o " registered pool=$1 pe=\$[0-9a-f]*" | sort -u | wc -l)" -ge "$2" ]
}
acked_by_other() { [ "$(acks_from_others "$1")" -ge 1 ]; }
# echoes_except PORT: cookie echoes at our calcapp PEs other than the one on PORT.
echoes_except() {
    local n=0 p v
    for p in 5221 5222 5223; do
        [ "$p" = "$1" ] && continue
        v=$(pe_metric $p rserpool_pe_cookie_echoes_total 2>/dev/null || true)
        n=$(( n + ${v:-0} ))
    done
    echo $n
}
completed() { nocolor < "$W/calcappclient.log" | grep -c 'completed:' || true; }
completed_more_than() { [ "$(completed)" -gt "$1" ]; }

"$RS" registrar --transport sctp --asap $REG --asap-announce off --metrics $METRICS \
    --min-address-scope loopback --endpoint-keep-alive-transmission-interval 2s \
    --endpoint-keep-alive-timeout-interval 5s --log info > "$W/registrar.log" 2>&1 &
pids+=($!)
wait_for 60 "the registrar's metrics" curl -sf "http://$METRICS/healthz"
say "step 1 ok: rserpool registrar serves ASAP over SCTP on $REG"

# ---------------------------------------------------------------- 2: pingpongclient -> our PEs
start_pe pp1 pingpong 5211 --business-card true --business-card-refresh 500ms
start_pe pp2 pingpong 5212 --business-card true --business-card-refresh 500ms
wait_for 60 "our pingpong PEs to register" registered PingPongPool 2
sleep 1.5   # let each PE resolve the other for its business card (refresh 500 ms)
stdbuf -oL -eL pingpongclient -poolhandle=PingPongPool -interval=200 "${LOG[@]}" -loglevel=4 \
    > "$W/pingpongclient.log" 2>&1 &
PPC=$!; pids+=($PPC)
wait_for 60 "Acks to pingpongclient" grep -q 'Ack #5 from PE' "$W/pingpongclient.log"
served=$(nocolor < "$W/pingpongclient.log" | grep -o 'Ack #1 from PE \$[0-9a-f]*' | awk 'NR==1 {print $NF}' || true)
if grep -q "PE $served serving" "$W/pp1.log"; then victim=pp1; vport=5211; other=pp2; oport=5212
elif grep -q "PE $served serving" "$W/pp2.log"; then victim=pp2; vport=5212; other=pp1; oport=5211
else fail "pingpongclient is served by $served, none of our PEs"; fi
pe_metric_at_least $vport rserpool_pe_business_cards_sent_total 1 \
    || fail "our PE sent pingpongclient no business card"
card_note=$(nocolor < "$W/pingpongclient.log" | grep -i -m1 'business card\|error while parsing' | cut -c1-160 || true)
say "step 2 ok: pingpongclient served by our PE $served ($victim), business card sent; RSPLIB: ${card_note:-nothing logged about it}"

# ---------------------------------------------------------------- 3: kill -9 the serving PE
acks_before=$(nocolor < "$W/pingpongclient.log" | grep -c 'Ack #' || true)
t_kill=$(tod)
kill9 "$(eval echo \$${victim}_pid)"
wait_for 60 "pingpongclient's Acks from the other PE" acked_by_other "$served"
wait_for 30 "the cookie echo at the other PE" pe_metric_at_least $oport rserpool_pe_cookie_echoes_total 1
[ "$(pe_metric $oport rserpool_pe_cookie_echoes_refused_total)" = 0 ] || fail "the other PE refused the cookie"
# The first Ack from the other PE, its time of day.
t_resumed=$(nocolor < "$W/pingpongclient.log" | grep 'Ack #' | grep -vF "PE $served " | awk 'NR==1' \
    | grep -o '[0-9][0-9]:[0-9][0-9]:[0-9.]*' | awk -F: '{printf "%.4f", $1*3600 + $2*60 + $3}' || true)
sleep 1.5
kill -TERM $PPC 2>/dev/null || true
# The reply numbers go on from the cookie: the first reply of the new PE follows the last one
# of the old PE. It may repeat it once: a PE killed between its Pong and the ASAP_COOKIE that
# follows it leaves the client the previous cookie (RSPLIB's design, rspserver alike). A new PE
# without the cookie would start again at reply #1.
last_old=$(nocolor < "$W/pingpongclient.log" | grep 'Ack #' | grep -F "PE $served " | tail -n1 | grep -o 'reply #[0-9]*' | tr -dc 0-9 || true)
first_new=$(nocolor < "$W/pingpongclient.log" | grep 'Ack #' | grep -vF "PE $served " | awk 'NR==1' | grep -o 'reply #[0-9]*' | tr -dc 0-9 || true)
[ -n "$last_old" ] && [ -n "$first_new" ] || fail "no replies before and after the failover"
if [ "$first_new" = $(( last_old + 1 )) ]; then continuity="reply #$first_new after #$last_old"
elif [ "$first_new" = "$last_old" ]; then continuity="reply #$first_new repeated (killed between Pong and cookie)"
else fail "after the failover the reply numbers jump from #$last_old to #$first_new: the cookie was not used"; fi
gaps=$(nocolor < "$W/pingpongclient.log" | grep -c 'Detected gap' || true)
[ "$gaps" -le 1 ] || fail "pingpongclient saw $gaps gaps in the reply numbers"
ppc_failover=$(awk -v a="$t_kill" -v b="$t_resumed" 'BEGIN{d=b-a; if (d < 0) d += 86400; printf "%.3f", d}')
say "step 3 ok: pingpongclient failed over to our other PE with our cookie ($continuity); kill -> next Ack $ppc_failover s"

# ---------------------------------------------------------------- 4: calcappclient -> our PEs
cat > "$W/calcapp-pe.toml" <<'EOF'
[service-config.calcapp]
cookie-max-time = "300ms"
EOF
start_pe ca1 calcapp 5221 --config "$W/calcapp-pe.toml"
start_pe ca2 calcapp 5222 --config "$W/calcapp-pe.toml"
start_pe ca3 calcapp 5223 --config "$W/calcapp-pe.toml"
wait_for 60 "our calcapp PEs to register" registered CalcAppPool 3
stdbuf -oL -eL calcappclient -poolhandle=CalcAppPool -jobsize=6000000 -jobinterval=0.2 \
    -keepalivetransmissioninterval=1000 -keepalivetimeoutinterval=3000 \
    -scalar="$W/ca.sca" -vector="$W/ca.vec" "${LOG[@]}" > "$W/calcappclient.log" 2>&1 &
CAC=$!; pids+=($CAC)
# serving_pe: the port of our calcapp PE with an open session (calcappclient has one session at
# a time, to the PE computing its current job), if any.
serving_pe() {
    local p v
    for p in 5221 5222 5223; do
        v=$(pe_metric $p rserpool_pe_sessions 2>/dev/null || true)
        [ "${v:-0}" -ge 1 ] && { echo $p; return 0; }
    done
    return 0
}
# failovers_after N: the failovers calcappclient noted after its first N.
failovers_after() {
    nocolor < "$W/calcappclient.log" | grep -E 'RSERPOOL_FAILOVER_NECESSARY|Timeout -> Failover' | tail -n +$(( $1 + 1 )) || true
}
job_done() { [ "$(nocolor < "$W/calcappclient.log" | grep -c "Job #$1 completed" || true)" -gt 0 ]; }
# replace_pe PORT: a new PE in place of the killed one, so that the pool keeps three.
replace_pe() {
    case $1 in 5221) start_pe ca1 calcapp 5221 --config "$W/calcapp-pe.toml";;
               5222) start_pe ca2 calcapp 5222 --config "$W/calcapp-pe.toml";;
               5223) start_pe ca3 calcapp 5223 --config "$W/calcapp-pe.toml";; esac
    wait_for 60 "a new calcapp PE on :$1 to register" pe_metric_at_least "$1" rserpool_pe_registered 1
}
resumed=""
for attempt in 1 2 3 4 5; do
    # Kill the PE computing the current job while the job runs. A job may still end between
    # the look and the kill (the guest is slow): then the kill missed, and the next job is tried.
    serving=""
    end=$(( $(date +%s) + 120 ))
    while [ -z "$serving" ]; do
        [ "$(date +%s)" -ge "$end" ] && fail "no calcapp PE computed a job long enough"
        sleep 0.2
        job=$(nocolor < "$W/calcappclient.log" | grep -o 'Job #[0-9]* accepted' | tail -n1 | tr -dc 0-9 || true)
        [ -n "$job" ] && ! job_done "$job" || continue
        serving=$(serving_pe)
        [ -n "$serving" ] && ! job_done "$job" || serving=""
    done
    echoes_before=$(echoes_except "$serving")
    completed_before=$(completed)
    failovers_before=$(failovers_after 0 | grep -c . || true)
    case $serving in 5221) kill9 "$ca1_pid";; 5222) kill9 "$ca2_pid";; 5223) kill9 "$ca3_pid";; esac
    end=$(( $(date +%s) + 30 ))
    while [ "$(date +%s)" -lt "$end" ]; do
        [ "$(echoes_except "$serving")" -gt "$echoes_before" ] && { resumed=$serving; break; }
        sleep 0.1
    done
    [ -n "$resumed" ] && break
    # Why not. No failover noted since the kill: the job had ended before it. A failover
    # without a cookie: the kill came before the job's first one. A failover with a cookie
    # that no other PE saw echoed is a failure.
    since=$(failovers_after "$failovers_before")
    if [ -z "$since" ] && job_done "$job"; then
        say "      (attempt $attempt: job #$job completed before the kill of PE :$serving; a new PE takes its place, trying again)"
    elif [ -n "$since" ] && ! grep -q 'cookie=yes' <<< "$since"; then
        say "      (attempt $attempt: PE :$serving killed before job #$job had a cookie; a new PE takes its place, trying again)"
    else
        fail "calcappclient failed over with job #$job's cookie after the kill of PE :$serving, and no other PE saw the cookie echoed within 30 s"
    fi
    replace_pe "$serving"
done
[ -n "$resumed" ] || fail "in $attempt attempts the kill never met a job that had a cookie"
wait_for 120 "the resumed job to complete" completed_more_than "$completed_before"
job=$(nocolor < "$W/calcappclient.log" | grep 'completed:' | sed -n "$(( completed_before + 1 ))p" | awk '{print $2}' || true)
kill -TERM $CAC 2>/dev/null || true
say "step 4 ok: calcappclient's job resumed on another of our PEs from its cookie after kill -9 of PE :$resumed (attempt $attempt), job $job completed ($completed_before completed before)"

# ---------------------------------------------------------------- 5: our PU -> rspserver -pingpong
for i in 1 2; do
    stdbuf -oL rspserver -pingpong -poolhandle=RspPingPong "${LOG[@]}" > "$W/rsp-pp$i.log" 2>&1 &
    pids+=($!); eval "rpp${i}_pid=$!"
done
wait_for 60 "the rspserver pingpong PEs to register" registered RspPingPong 2
"$RS" pu --service pingpong --pool-handle RspPingPong --transport sctp --registrar $REG \
    --count 40 --interval 200ms --timestamps true > "$W/pu-pp.out" 2> "$W/pu-pp.err" &
PU=$!; pids+=($PU)
wait_for 60 "Pongs from rspserver" grep -q ' Pong #5:' "$W/pu-pp.out"
served=$(grep -m1 -o 'bound to PE \$[0-9a-f]*' "$W/pu-pp.err" | awk '{print $NF}' || true)
if grep -q "${served#\$}" "$W/rsp-pp1.log"; then victim=$rpp1_pid; else victim=$rpp2_pid; fi
t_kill=$(now)
kill9 "$victim"
wait $PU || fail "our PU failed: $(tail -n 3 "$W/pu-pp.err")"
grep -q "failover: PE $served -> " "$W/pu-pp.err" || fail "no failover from $served reported: $(cat "$W/pu-pp.err")"
grep -q "cookie echoed" "$W/pu-pp.err" || fail "the failover echoed no cookie"
grep -q 'pingpong: 40 answered, .* 0 duplicate(s), [01] gap(s), 1 failover(s)' "$W/pu-pp.out" \
    || fail "not every Ping answered once: $(grep 'pingpong:' "$W/pu-pp.out")"
# A gap may only be the last reply number repeated once (rspserver killed between its Pong and
# its cookie); anything else means the cookie was not used.
if grep -q ' gap: ' "$W/pu-pp.out"; then
    grep ' gap: ' "$W/pu-pp.out" | awk '{exit !($4 == $6)}' || fail "reply numbers jumped: $(grep ' gap: ' "$W/pu-pp.out")"
fi
t_resumed=$(awk -v s="$served" '/ Pong #/ && index($0, s) == 0 {print $1; exit}' "$W/pu-pp.out")
pu_failover=$(awk -v a="$t_kill" -v b="$t_resumed" 'BEGIN{printf "%.3f", b-a}')
say "step 5 ok: $(grep 'failover:' "$W/pu-pp.err" | cut -d' ' -f2-); $(grep 'pingpong:' "$W/pu-pp.out" | cut -d' ' -f2-); kill -> next Pong $pu_failover s"
say "      $(grep '^session:' "$W/pu-pp.err")"

# ---------------------------------------------------------------- 5b: RSPLIB alone, for comparison
# RSPLIB's pingpongclient with RSPLIB's PEs in the same run: the same kill -9, the same measure.
stdbuf -oL rspserver -pingpong -poolhandle=RspPingPong "${LOG[@]}" > "$W/rsp-pp3.log" 2>&1 &
pids+=($!); rpp3_pid=$!
wait_for 60 "a third rspserver pingpong PE" registered RspPingPong 3
stdbuf -oL -eL pingpongclient -poolhandle=RspPingPong -interval=200 "${LOG[@]}" > "$W/pingpongclient-rsp.log" 2>&1 &
PPC2=$!; pids+=($PPC2)
wait_for 60 "Acks from rspserver to pingpongclient" grep -q 'Ack #5 from PE' "$W/pingpongclient-rsp.log"
served=$(nocolor < "$W/pingpongclient-rsp.log" | grep -o 'Ack #1 from PE \$[0-9a-f]*' | awk 'NR==1 {print $NF}' || true)
if grep -q "${served#\$}" "$W/rsp-pp3.log"; then victim=$rpp3_pid
elif grep -q "${served#\$}" "$W/rsp-pp1.log"; then victim=$rpp1_pid
else victim=$rpp2_pid; fi
t_kill=$(tod)
kill9 "$victim"
acked_by_other_rsp() { [ "$(nocolor < "$W/pingpongclient-rsp.log" | grep 'Ack #' | grep -vcF "PE $1 " || true)" -ge 1 ]; }
wait_for 60 "pingpongclient's Acks from the other rspserver" acked_by_other_rsp "$served"
t_resumed=$(nocolor < "$W/pingpongclient-rsp.log" | grep 'Ack #' | grep -vF "PE $served " | awk 'NR==1' \
    | grep -o '[0-9][0-9]:[0-9][0-9]:[0-9.]*' | awk -F: '{printf "%.4f", $1*3600 + $2*60 + $3}' || true)
kill -TERM $PPC2 2>/dev/null || true
rsp_failover=$(awk -v a="$t_kill" -v b="$t_resumed" 'BEGIN{d=b-a; if (d < 0) d += 86400; printf "%.3f", d}')
say "step 5b ok: RSPLIB's pingpongclient with RSPLIB's PEs: kill -> next Ack $rsp_failover s"

# ---------------------------------------------------------------- 6: our PU -> rspserver -calcapp
for i in 1 2; do
    # In the work folder: rspserver -calcapp writes its statistics files into the current one.
    (cd "$W" && exec stdbuf -oL rspserver -calcapp -poolhandle=RspCalcApp "${LOG[@]}" > "$W/rsp-ca$i.log" 2>&1) &
    pids+=($!); eval "rca${i}_pid=$!"
done
wait_for 60 "the rspserver calcapp PEs to register" registered RspCalcApp 2
cat > "$W/calcapp-pu.toml" <<'EOF'
[service-config.calcapp-client]
job-size = 9000000.0
fixed-job-size = true
job-interval = "10ms"
EOF
"$RS" pu --service calcapp --pool-handle RspCalcApp --transport sctp --registrar $REG \
    --count 1 --config "$W/calcapp-pu.toml" > "$W/pu-ca.out" 2> "$W/pu-ca.err" &
PU=$!; pids+=($PU)
# rspserver sends a job's first cookie after 5 s (-capcookiemaxtime).
wait_for 60 "a cookie from rspserver -calcapp" grep -q 'cookie received' "$W/pu-ca.err"
served=$(grep -m1 -o 'bound to PE \$[0-9a-f]*' "$W/pu-ca.err" | awk '{print $NF}' || true)
if grep -q "${served#\$}" "$W/rsp-ca1.log"; then victim=$rca1_pid; else victim=$rca2_pid; fi
kill9 "$victim"
wait $PU || fail "our calcapp PU failed: $(tail -n 3 "$W/pu-ca.err")"
grep -q "failover: PE $served -> .*cookie echoed" "$W/pu-ca.err" || fail "no failover with cookie: $(cat "$W/pu-ca.err")"
grep -q 'calcapp: 1 job(s) completed, 1 failover(s)' "$W/pu-ca.out" || fail "the job did not complete: $(cat "$W/pu-ca.out")"
say "step 6 ok: $(grep 'failover:' "$W/pu-ca.err"); $(grep 'completed:' "$W/pu-ca.out")"

# ---------------------------------------------------------------- 7: rspterminal -> our echo PE
start_pe echo echo 5231
wait_for 60 "our echo PE to register" registered EchoPool 1
MSG="Hello from rspterminal through rserpool"
echo "$MSG" | rspterminal -poolhandle=EchoPool "${LOG[@]}" > "$W/rspterminal.log" 2>&1 &
TERM_PID=$!; pids+=($TERM_PID)
wait_for 60 "our echo PE to answer" pe_metric_at_least 5231 rserpool_pe_messages_sent_total 1
sleep 1; kill -TERM $TERM_PID 2>/dev/null; wait $TERM_PID 2>/dev/null || true
line=$(nocolor < "$W/rspterminal.log" | grep -F "$MSG" | awk 'NR==1' || true)
[ -n "$line" ] || fail "rspterminal did not print the echo"
say "step 7 ok: rspterminal got its line back from our echo PE: $line"
# ---------------------------------------------------------------- 8: our PE at RSPLIB's registrar
RSPREG=127.0.0.1:5300
rspregistrar -asap=$RSPREG -asapannounce=off -enrpannounce=off -enrp=127.0.0.1:5301 \
    -minaddressscope=loopback "${RSPLIB_LOG[@]}" > "$W/rspregistrar.log" 2>&1 &
pids+=($!)
"$RS" pe --service echo --pool-handle RspEchoPool --transport sctp --registrar $RSPREG \
    --local 10.255.0.1:0 --metrics 127.0.0.1:5232 --log info > "$W/echo-at-rsp.log" 2>&1 &
pids+=($!)
wait_for 60 "our echo PE to register with rspregistrar" grep -q 'registered pe=' "$W/echo-at-rsp.log"
MSG8="Hello through RSPLIB's registrar to rserpool"
echo "$MSG8" | rspterminal -poolhandle=RspEchoPool "${RSPLIB_LOG[@]}" -registrar=$RSPREG \
    -asapannounce=off > "$W/rspterminal-rsp.log" 2>&1 &
TERM_PID=$!; pids+=($TERM_PID)
wait_for 60 "our echo PE to answer through rspregistrar" pe_metric_at_least 5232 rserpool_pe_messages_sent_total 1
sleep 1; kill -TERM $TERM_PID 2>/dev/null; wait $TERM_PID 2>/dev/null || true
line=$(nocolor < "$W/rspterminal-rsp.log" | grep -F "$MSG8" | awk 'NR==1' || true)
[ -n "$line" ] || fail "rspterminal did not print the echo of our PE registered at rspregistrar"
say "step 8 ok: our echo PE registered with rspregistrar; rspterminal through it got: $line"
say "FIGURES: failover kill->next reply over SCTP (Ping every 200 ms): RSPLIB pingpongclient with our PEs $ppc_failover s; our PU with RSPLIB's PEs $pu_failover s; RSPLIB pingpongclient with RSPLIB's PEs $rsp_failover s"
say "SUITE RESULT: OK"
