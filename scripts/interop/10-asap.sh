# Suite asap -- RSPLIB's own pool element and pool user against the rserpool registrar, over
# kernel SCTP. Each step is asserted; the suite fails at the first that does not hold.
#
#   1. `rserpool registrar` serves ASAP over SCTP on 127.0.0.1:3863;
#   2. RSPLIB's `rspserver -echo` registers into EchoPool with it (checked in its metrics);
#   3. the registrar keeps it with keep-alives that it answers;
#   4. RSPLIB's `rspterminal` resolves EchoPool through it and gets its line echoed by the PE;
#   5. after `kill -9` of the rspserver the registrar removes the PE; the time from the kill to
#      the removal (as the registrar logs it) is measured and must stay within keep-alive
#      interval + timeout;
#   6. a second rspserver is frozen with SIGSTOP (its SCTP association stays up, the kernel
#      still answers heartbeats): only the registrar's keep-alives can tell, and the PE must be
#      removed for a keep-alive timeout within interval + timeout;
#   7. the registrar stops cleanly on SIGTERM.
KA_INTERVAL_MS=${KA_INTERVAL_MS:-1000}
KA_TIMEOUT_MS=${KA_TIMEOUT_MS:-1000}
# When the registrar logged the removal of a PE (its own clock, the same as ours in the guest).
removal_time() {   # removal_time PE_ID -> seconds since the epoch
    local ts
    ts=$(nocolor < "$W/registrar.log" | grep "removed pool=EchoPool pe=\\$1 " | tail -n1 | awk '{print $1}')
    [ -n "$ts" ] && date -d "$ts" +%s.%N
}


"$RSERPOOL_BIN" registrar --transport sctp --asap 127.0.0.1:3863 --asap-announce off \
    --metrics 127.0.0.1:9100 --identifier 0x5e5e0001 \
    --endpoint-keep-alive-transmission-interval "${KA_INTERVAL_MS}ms" \
    --endpoint-keep-alive-timeout-interval "${KA_TIMEOUT_MS}ms" --keep-alive-jitter 0 \
    --log info > "$W/registrar.log" 2>&1 &
REG=$!; pids+=($REG)
wait_for 60 "the registrar's metrics" curl -sf http://127.0.0.1:9100/healthz
grep -q 'transport=SCTP\|over SCTP' "$W/registrar.log" || fail "the registrar does not serve over SCTP"
say "step 1 ok: rserpool registrar serves ASAP over SCTP on 127.0.0.1:3863"

LOG=("${RSPLIB_LOG[@]}")
stdbuf -oL rspserver -echo -poolhandle=EchoPool -registrar=127.0.0.1:3863 -asapannounce=off \
    "${LOG[@]}" > "$W/pe.log" 2>&1 &
PE=$!; pids+=($PE)
wait_for 30 "the PE's registration" grep -q Identifier "$W/pe.log"
wait_for 10 "the registration in the registrar's metrics" metric_is rserpool_registrar_pool_elements 1
metric_is rserpool_registrar_registrations_total 1 || fail "registrations_total is $(metric rserpool_registrar_registrations_total)"
pe_id=$(grep -m1 -o 'Identifier *= *\$[0-9a-f]*' "$W/pe.log" | awk '{print $NF}')
nocolor < "$W/registrar.log" | grep -q "registered pool=EchoPool pe=\\$pe_id" \
    || fail "the registrar did not log the registration of PE $pe_id"
say "step 2 ok: rspserver registered PE $pe_id into EchoPool: $(nocolor < "$W/registrar.log" | grep -m1 ' registered' | sed 's/.*INFO //')"

wait_for 20 "keep-alive answers" metric_at_least rserpool_registrar_keep_alives_acked_total 2
say "step 3 ok: the PE answers keep-alives ($(metric rserpool_registrar_keep_alives_acked_total) acked, $(metric rserpool_registrar_keep_alives_missed_total) missed)"

MSG="Hello RSerPool through the rserpool registrar"
echo "$MSG" | rspterminal -poolhandle=EchoPool -registrar=127.0.0.1:3863 -asapannounce=off \
    "${LOG[@]}" > "$W/pu.log" 2>&1 &
PU=$!; pids+=($PU)
wait_for 30 "the PE to echo" grep -q 'Echo [0-9]* bytes' "$W/pe.log"
sleep 1; kill -TERM $PU 2>/dev/null; wait $PU 2>/dev/null || true
echo_line=$(nocolor < "$W/pu.log" | grep -F "> $MSG" | head -n1)
[ -n "$echo_line" ] || fail "rspterminal did not print the echo"
metric_at_least rserpool_registrar_handle_resolutions_total 1 || fail "no handle resolution counted"
say "step 4 ok: rspterminal resolved EchoPool through rserpool and got: $echo_line"

removals_before=$(curl -s http://127.0.0.1:9100/metrics | grep '^rserpool_registrar_removals_total' | awk '{s+=$2} END {print s+0}')
t_kill=$(date +%s.%N)
kill -9 $PE
until metric_is rserpool_registrar_pool_elements 0; do
    elapsed=$(awk -v a="$t_kill" -v b="$(date +%s.%N)" 'BEGIN{print b-a}')
    awk -v e="$elapsed" 'BEGIN{exit !(e > 30)}' && fail "the PE was not removed within 30 s of kill -9"
    sleep 0.02
done
t_gone=$(removal_time "$pe_id") || fail "no removal logged for PE $pe_id"
removed_after=$(awk -v a="$t_kill" -v b="$t_gone" 'BEGIN{printf "%.3f", b-a}')
cause=$(curl -s http://127.0.0.1:9100/metrics | grep '^rserpool_registrar_removals_total' | awk '$2>0 {print $1}' | sed 's/.*cause="\([^"]*\)".*/\1/' | tr '\n' ' ')
limit=$(awk -v i="$KA_INTERVAL_MS" -v t="$KA_TIMEOUT_MS" 'BEGIN{print (i+t)/1000 + 1.0}')
awk -v r="$removed_after" -v l="$limit" 'BEGIN{exit !(r <= l)}' \
    || fail "removal took $removed_after s, more than keep-alive interval + timeout + 1 s ($limit s)"
say "step 5 ok: PE removed $removed_after s after kill -9 (cause: ${cause% }; bound: $limit s)"
nocolor < "$W/registrar.log" | grep -m1 ' removed' | sed 's/^/      /' || true

removed_ka() { metric 'rserpool_registrar_removals_total{cause="keep_alive_timeout"}'; }
stdbuf -oL rspserver -echo -poolhandle=EchoPool -registrar=127.0.0.1:3863 -asapannounce=off \
    "${LOG[@]}" > "$W/pe2.log" 2>&1 &
PE2=$!; pids+=($PE2)
wait_for 30 "the second PE's registration" metric_is rserpool_registrar_pool_elements 1
wait_for 20 "keep-alive answers of the second PE" metric_at_least rserpool_registrar_keep_alives_acked_total $(( $(metric rserpool_registrar_keep_alives_acked_total) + 1 ))
ka_before=$(removed_ka)
t_stop=$(date +%s.%N)
kill -STOP $PE2
until metric_is rserpool_registrar_pool_elements 0; do
    elapsed=$(awk -v a="$t_stop" -v b="$(date +%s.%N)" 'BEGIN{print b-a}')
    awk -v e="$elapsed" 'BEGIN{exit !(e > 30)}' && fail "the frozen PE was not removed within 30 s"
    sleep 0.02
done
pe2_id=$(grep -m1 -o 'Identifier *= *\$[0-9a-f]*' "$W/pe2.log" | awk '{print $NF}')
t_gone=$(removal_time "$pe2_id") || fail "no removal logged for PE $pe2_id"
stopped_after=$(awk -v a="$t_stop" -v b="$t_gone" 'BEGIN{printf "%.3f", b-a}')
[ "$(removed_ka)" = $(( ka_before + 1 )) ] || fail "the frozen PE was not removed for a keep-alive timeout"
awk -v r="$stopped_after" -v l="$limit" 'BEGIN{exit !(r <= l)}' \
    || fail "removal of the frozen PE took $stopped_after s, more than $limit s"
say "step 6 ok: PE frozen by SIGSTOP removed $stopped_after s later (cause: keep_alive_timeout; bound: $limit s)"
kill -CONT $PE2 2>/dev/null || true

kill -TERM $REG
for _ in $(seq 50); do kill -0 $REG 2>/dev/null || break; sleep 0.1; done
kill -0 $REG 2>/dev/null && fail "the registrar did not stop on SIGTERM"
wait $REG; rc=$?
[ "$rc" = 0 ] || fail "the registrar exited with $rc on SIGTERM"
grep -q "shutting down" "$W/registrar.log" || fail "no shutdown log line"
say "step 7 ok: the registrar stopped cleanly on SIGTERM"
say "SUITE RESULT: OK"
