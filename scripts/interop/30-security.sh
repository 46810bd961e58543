# Suite security -- RFC 5355's threats against the rserpool registrar over kernel SCTP, with
# RSPLIB's rspserver as the legitimate PE and rspterminal as the legitimate PU; the attacker is
# scripts/interop/asap-client.py (raw ASAP over SCTP) and a second rspserver that claims the
# first one's PE identifier. Each step is asserted; the suite fails at the first that does not
# hold. Ports 5000-5199 (registrar 5000, metrics 5001).
#
#   1. `rserpool registrar` serves ASAP over SCTP, with the flood limits of this suite;
#   2. rspserver (PE A, identifier 0x5ec00001) registers into EchoPool;
#   3. an ASAP_DEREGISTRATION of PE A from another association (127.0.0.2) is refused with
#      cause 0xa, counted; PE A stays;
#   4. a second rspserver claims identifier 0x5ec00001 from its own association: PE A answers
#      the ownership probe, the claim is refused and counted, PE A stays, the claimant is killed;
#      rspterminal is still echoed by PE A (after steps 3 and 4);
#   5. 10 associations send 50 ENDPOINT_UNREACHABLE reports each about PE A: at most 3 probes,
#      no removal, rspterminal still echoed;
#   6. PE A is frozen (SIGSTOP; its association stays up) and a third rspserver with the same
#      identifier registers: the claim is granted once PE A fails the probe, within the probe
#      timeout plus slack;
#   7. one host (127.0.0.2) opens 40 associations (16 allowed per address) and floods handle
#      resolutions on 8 of them, while a pool user on 127.0.0.3 resolves 50 times: every
#      resolution is answered with a PE, the flood is refused past its rate and counted;
#   8. the registrar stops cleanly on SIGTERM.
PORT=5000
METRICS=127.0.0.1:5001
REGISTRAR=127.0.0.1:$PORT
# Periodic keep-alives rarely (60 s): only the probes a claim or reports trigger are sent, so
# step 6 shows the claim's probe, not the periodic schedule, finding the frozen PE.
KA_INTERVAL_MS=60000
# The probe timeout: generous, because in the VM a flood queued ahead of a probe's answer in the
# registrar's one SCTP receive queue can delay it by a second or more (docs/security.md).
KA_TIMEOUT_MS=3000
# The owner of a claimed PE answers within this (RSPLIB's PEs give up on a registration after
# 3 s, so a claim must be answered sooner).
CLAIM_TIMEOUT_MS=1500
PE_ID=0x5ec00001
CLIENT=(python3 "$(dirname "${BASH_SOURCE[0]}")/asap-client.py")
refusals() { metric "rserpool_registrar_security_refusals_total{reason=\"$1\"}"; }
echo_through() {   # echo_through TAG LOGFILE: rspterminal's line must be echoed by that PE
    local msg="security suite $1" before
    before=$(grep -c 'Echo [0-9]* bytes' "$2" || true)
    echo "$msg" | timeout 90 rspterminal -poolhandle=EchoPool -registrar=$REGISTRAR -asapannounce=off \
        "${RSPLIB_LOG[@]}" > "$W/pu-$1.log" 2>&1 &
    local pu=$!
    wait_for 60 "the PE to echo ($1)" bash -c "[ \$(grep -c 'Echo [0-9]* bytes' '$2' || true) -gt $before ]"
    kill -TERM $pu 2>/dev/null; wait $pu 2>/dev/null || true
}

"$RSERPOOL_BIN" registrar --transport sctp --asap $REGISTRAR --asap-announce off \
    --metrics $METRICS --identifier 0x5ec5ec01 \
    --endpoint-keep-alive-transmission-interval ${KA_INTERVAL_MS}ms \
    --endpoint-keep-alive-timeout-interval ${KA_TIMEOUT_MS}ms --keep-alive-jitter 0 \
    --ownership-probe-timeout ${CLAIM_TIMEOUT_MS}ms \
    --max-associations-per-address 16 --max-hr-rate 100 --max-unreachable-probes 3 \
    --unreachable-probe-interval 5m --log info > "$W/registrar.log" 2>&1 &
REG=$!; pids+=($REG)
wait_for 60 "the registrar's metrics" curl -sf "http://$METRICS/healthz"
grep -q 'transport=SCTP\|over SCTP' "$W/registrar.log" || fail "the registrar does not serve over SCTP"
say "step 1 ok: rserpool registrar serves ASAP over SCTP on $REGISTRAR"

stdbuf -oL rspserver -echo -poolhandle=EchoPool -registrar=$REGISTRAR -asapannounce=off \
    -identifier=$PE_ID -rereginterval=5000 "${RSPLIB_LOG[@]}" > "$W/pe-a.log" 2>&1 &
PEA=$!; pids+=($PEA)
wait_for 120 "PE A's registration" metric_is rserpool_registrar_pool_elements 1
say "step 2 ok: rspserver registered PE $PE_ID"

out=$("${CLIENT[@]}" --from 127.0.0.2 dereg $REGISTRAR EchoPool $PE_ID)
[ "$out" = "answer=deregistration_response cause=0xa" ] || fail "foreign deregistration answered: $out"
[ "$(refusals foreign_deregistration)" = 1 ] || fail "foreign deregistration not counted"
metric_is rserpool_registrar_pool_elements 1 || fail "PE A was removed by a foreign deregistration"
metric_is rserpool_registrar_deregistrations_total 0 || fail "a deregistration was counted"
nocolor < "$W/registrar.log" | grep 'refused: deregistration' | grep -q 'peer=Some(\[127.0.0.2\])' \
    || fail "the refusal was not logged with the peer"
say "step 3 ok: foreign deregistration refused ($out), counted, PE A kept, logged: $(nocolor < "$W/registrar.log" | grep -m1 'refused: deregistration' | sed 's/.*WARN //')"

probes_before=$(metric rserpool_registrar_ownership_probes_total)
stdbuf -oL rspserver -echo -poolhandle=EchoPool -registrar=$REGISTRAR -asapannounce=off \
    -identifier=$PE_ID -rereginterval=5000 "${RSPLIB_LOG[@]}" > "$W/pe-b.log" 2>&1 &
PEB=$!; pids+=($PEB)
wait_for 120 "the claim's refusal" bash -c "[ \"\$(curl -s http://$METRICS/metrics | awk '\$1==\"rserpool_registrar_security_refusals_total{reason=\\\"foreign_registration\\\"}\" {print \$2}')\" -ge 1 ]"
metric_at_least rserpool_registrar_ownership_probes_total $(( probes_before + 1 )) || fail "no ownership probe"
metric_at_least rserpool_registrar_keep_alives_acked_total 1 || fail "PE A did not answer the probe"
metric_is rserpool_registrar_claims_granted_total 0 || fail "a claim was granted while PE A answers"
metric_is rserpool_registrar_pool_elements 1 || fail "pool has $(metric rserpool_registrar_pool_elements) PEs"
kill -9 $PEB
echo_through claim "$W/pe-a.log"
say "step 4 ok: a second rspserver claiming $PE_ID was refused after PE A answered the probe ($(refusals foreign_registration) refusals, $(metric rserpool_registrar_ownership_probes_total) probes); rspterminal still echoed by PE A"

removals_total() { curl -s "http://$METRICS/metrics" | grep '^rserpool_registrar_removals_total' | awk '{s+=$2} END {print s+0}'; }
removed_before=$(removals_total)
out=$("${CLIENT[@]}" --from 127.0.0.2 unreachable $REGISTRAR EchoPool $PE_ID 10 50)
wait_for 60 "the reports to be handled" metric_at_least rserpool_registrar_unreachable_reports_total 3
sleep_until=$(( $(date +%s) + KA_TIMEOUT_MS / 1000 + 2 )); while [ "$(date +%s)" -lt $sleep_until ]; do sleep 0.2; done  # probe timeout + slack
probes=$(metric rserpool_registrar_unreachable_probes_total)
[ "$probes" -ge 1 ] && [ "$probes" -le 3 ] || fail "$probes probes for the report flood (1..3 expected)"
[ "$(removals_total)" = "$removed_before" ] || fail "the report flood removed a PE"
metric_is rserpool_registrar_pool_elements 1 || fail "PE A is gone"
echo_through reports "$W/pe-a.log"
say "step 5 ok: report flood ($out): $(metric rserpool_registrar_unreachable_reports_total) counted, $(metric 'rserpool_registrar_rate_limited_total{request="endpoint_unreachable"}') rate-limited, $probes probe(s), $(metric rserpool_registrar_unreachable_probes_suppressed_total) suppressed, no removal"

kill -STOP $PEA
t_claim=$(date +%s.%N)
# PE C re-registers only every 60 s, so no re-registration falls inside step 7's flood: in the VM
# under host load the flood can hold a re-registration's answer in the registrar's one SCTP receive
# queue past RSPLIB's request timeout, and the PE then drops its association and registers again
# (the shared receive queue is a known limit, docs/security.md). Step 7 is about a user's
# resolutions during the flood.
stdbuf -oL rspserver -echo -poolhandle=EchoPool -registrar=$REGISTRAR -asapannounce=off \
    -identifier=$PE_ID -rereginterval=60000 "${RSPLIB_LOG[@]}" > "$W/pe-c.log" 2>&1 &
PEC=$!; pids+=($PEC)
wait_for 120 "the claim of the restarted PE" metric_is rserpool_registrar_claims_granted_total 1
granted_after=$(elapsed_since "$t_claim")
metric_is rserpool_registrar_pool_elements 1 || fail "pool has $(metric rserpool_registrar_pool_elements) PEs"
metric_is 'rserpool_registrar_removals_total{cause="keep_alive_timeout"}' 1 || fail "PE A was not removed for the failed probe"
# From the registrar's log: the claim (probe sent) to the grant.
log_time() { date -d "$(nocolor < "$W/registrar.log" | grep "$1" | tail -n1 | awk '{print $1}')" +%s.%N; }
t_probe=$(log_time 'claims the PE: probing its owner') || fail "no ownership probe logged"
t_grant=$(log_time 'claim granted') || fail "no grant logged"
claim_took=$(awk -v a="$t_probe" -v b="$t_grant" 'BEGIN{printf "%.3f", b-a}')
awk -v c="$claim_took" -v t="$CLAIM_TIMEOUT_MS" 'BEGIN{exit !(c <= t/1000 + 1.0)}' \
    || fail "the claim took $claim_took s, more than the ownership probe timeout + 1 s"
kill -9 $PEA
echo_through restart "$W/pe-c.log"
say "step 6 ok: PE A frozen; a new rspserver with $PE_ID got the identifier $claim_took s after its claim (ownership probe timeout $CLAIM_TIMEOUT_MS ms; $granted_after s after it was started), and serves rspterminal"

out=$("${CLIENT[@]}" --from 127.0.0.2 assoc-flood $REGISTRAR 40 1)
up=$(echo "$out" | sed 's/.* up=\([0-9]*\).*/\1/')
[ "$up" -le 16 ] || fail "association flood: $out"
wait_for 60 "association refusals counted" bash -c "[ \"\$(curl -s http://$METRICS/metrics | awk '\$1==\"rserpool_registrar_security_refusals_total{reason=\\\"associations_per_address\\\"}\" {print \$2}')\" -ge 24 ]"
"${CLIENT[@]}" --from 127.0.0.2 resolve-flood $REGISTRAR EchoPool 8 10 > "$W/flood.out" 2>&1 &
FLOOD=$!; pids+=($FLOOD)
wait_for 60 "the flood to hit the rate limit" metric_at_least 'rserpool_registrar_rate_limited_total{request="handle_resolution"}' 1
legit=$("${CLIENT[@]}" --from 127.0.0.3 resolve $REGISTRAR EchoPool 50)
wait $FLOOD || true
answered=$(echo "$legit" | sed 's/.* with_pe=\([0-9]*\).*/\1/')
[ "$answered" = 50 ] || fail "legitimate user during the flood: $legit"
say "step 7 ok: association flood ($out, $(refusals associations_per_address) refused); resolution flood ($(cat "$W/flood.out")); legitimate user meanwhile: $legit"

kill -TERM $REG
for _ in $(seq 50); do kill -0 $REG 2>/dev/null || break; sleep 0.1; done
kill -0 $REG 2>/dev/null && fail "the registrar did not stop on SIGTERM"
wait $REG; rc=$?
[ "$rc" = 0 ] || fail "the registrar exited with $rc on SIGTERM"
say "step 8 ok: the registrar stopped cleanly on SIGTERM"
say "SUITE RESULT: OK"
