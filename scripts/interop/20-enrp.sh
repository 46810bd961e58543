# Suite enrp -- the rserpool registrar and RSPLIB's rspregistrar as ENRP peers (RFC 5353), over
# kernel SCTP. Each step is asserted; the suite fails at the first that does not hold. Ports
# 4800-4999. Registrar IDs: ours A=$5e5e0001 (the lowest, so it wins RSPLIB's arbitration),
# rspregistrar B=$5e5e0002, C=$5e5e0003, D=$5e5e0004.
#
#   1. A (rserpool, --peer B) and B (rspregistrar, -peer=A) become ENRP peers both ways;
#   2. an rspserver PE registered at A and one registered at B are each visible at the other:
#      A's metrics count 2 PEs (one learned over ENRP), hsdump against B lists A's PE, and
#      RSPLIB's hsdump against A prints A's handlespace with both PEs (A answers hsdump's
#      HANDLE_TABLE_REQUEST and LIST_REQUEST);
#   3. rspregistrars C and D join (peered with A and B) and take the table;
#   4. kill -9 B: A takes B's PE over (INIT_TAKEOVER acknowledged by C and D, TAKEOVER_SERVER),
#      the rspserver PE adopts A after the H=1 ENDPOINT_KEEP_ALIVE (it answers over the new
#      association: A's adopted-PE counter), and C's hsdump shows the PE at home A; the time
#      from the kill to the adoption is measured;
#   5. kill -9 A: exactly one rspregistrar (C or D) takes A's PEs over, and the other's hsdump
#      shows both PEs at home with it;
#   6. a PU resolves EchoPool at the taker and gets its line echoed by a PE that was A's.
#
# Four registrars and two takeovers take 1-4 minutes in the VM, more on a loaded host:
# vm-timeout: 600
SL=10.255.0.1
A_ID=5e5e0001; B_ID=5e5e0002; C_ID=5e5e0003; D_ID=5e5e0004
METRICS=127.0.0.1:4890
LOG=("${RSPLIB_LOG[@]}")
# ENRP timers shorter than the defaults on both sides, but generous enough for a VM on a loaded
# host (binaries there run several times slower, and a stalled guest must not look like a dead
# peer). A detects a dead peer sooner than the rspregistrars (8 s + 4 s against 15 s + 6 s), so
# that it is the first to start the takeover of B: whoever starts first wins unless a lower ID
# races it.
RSP_TIMERS=(-peerheartbeatcycle=2000 -peermaxtimelastheard=15000 -peermaxtimenoresponse=6000
    -takeoverexpiryinterval=15000 -mentordiscoverytimeout=2000 -asapannounce=off -enrpannounce=off
    -minaddressscope=loopback)
OUR_TIMERS=(--peer-heartbeat-cycle 2s --peer-max-time-last-heard 8s --peer-max-time-no-response 4s
    --takeover-expiry-interval 15s --mentor-discovery-timeout 2s --asap-announce off --enrp-announce off
    --min-address-scope loopback)

hsdump_of() {   # hsdump_of ADDR:PORT -> hsdump's output without colours
    timeout 40 hsdump "$1" "${LOG[@]}" 2>&1 | nocolor
    date +%s > "$W/last-hsdump"
}
pe_id_of() { grep -m1 -o 'Identifier *= *\$[0-9a-f]*' "$1" | awk '{print $NF}'; }
# hsdump prints a PE as "- idx:#0001: $PEID flags=..." and on the next line "chsum=... home=$REGID".
pe_home_in() {   # pe_home_in HSDUMP_FILE PE_ID -> the home registrar ID printed for that PE
    grep -A1 -F "idx:#" "$1" | grep -A1 -F "$2" | grep -m1 -o 'home=\$[0-9a-f]*' | cut -d= -f2
}
rsp_takeover_done() { grep -q 'Takeover of peer .* completed' "$@"; }

"$RSERPOOL_BIN" registrar --transport sctp --asap $SL:4810 --enrp $SL:4811 --peer $SL:4821 \
    --metrics $METRICS --identifier 0x$A_ID "${OUR_TIMERS[@]}" --log info > "$W/A.log" 2>&1 &
A=$!; pids+=($A)
rspregistrar -identifier=0x$B_ID -asap=$SL:4820 -enrp=$SL:4821 -peer=$SL:4811 "${RSP_TIMERS[@]}" \
    "${LOG[@]}" > "$W/B.log" 2>&1 &
B=$!; pids+=($B)
wait_for 30 "A's metrics" curl -sf http://$METRICS/healthz
grep -q 'transport=SCTP\|over SCTP' "$W/A.log" || fail "A does not serve over SCTP"
wait_for 60 "A to know B as a peer" metric_is rserpool_registrar_enrp_peers 1
in_log() { nocolor < "$1" | grep -qF "$2"; }
wait_for 30 "A to hear B's PRESENCE" in_log "$W/A.log" "ENRP peer up peer=\$$B_ID"
say "step 1 ok: A (rserpool) and B (rspregistrar) are ENRP peers: $(nocolor < "$W/A.log" | grep -m1 'ENRP peer up' | sed 's/.*INFO //')"

stdbuf -oL rspserver -echo -poolhandle=EchoPool -registrar=$SL:4810 -asapannounce=off \
    "${LOG[@]}" > "$W/peA.log" 2>&1 &
PEA=$!; pids+=($PEA)
stdbuf -oL rspserver -echo -poolhandle=EchoPool -registrar=$SL:4820 -asapannounce=off \
    "${LOG[@]}" > "$W/peB.log" 2>&1 &
PEB=$!; pids+=($PEB)
wait_for 30 "PE-A's registration" grep -q Identifier "$W/peA.log"
wait_for 30 "PE-B's registration" grep -q Identifier "$W/peB.log"
pe_a=$(pe_id_of "$W/peA.log"); pe_b=$(pe_id_of "$W/peB.log")
wait_for 30 "both PEs at A" metric_is rserpool_registrar_pool_elements 2
hsdump_of $SL:4821 > "$W/hsdump-B.txt"
grep -qF "$pe_a" "$W/hsdump-B.txt" || fail "hsdump of B does not list A's PE $pe_a"
hsdump_of $SL:4811 > "$W/hsdump-A.txt"
grep -qF "$pe_a" "$W/hsdump-A.txt" || fail "hsdump of A does not list A's own PE $pe_a"
grep -qF "$pe_b" "$W/hsdump-A.txt" || fail "hsdump of A does not list B's PE $pe_b"
say "step 2 ok: PE $pe_a (at A) and PE $pe_b (at B) are in both handlespaces; hsdump of A:"
awk '/^Handlespace/{p=1} /^\*-- Selection/{p=0} p' "$W/hsdump-A.txt" | grep -E 'Handlespace|Pool "|idx:|home=|regT|userT' | sed 's/^/      /'

rspregistrar -identifier=0x$C_ID -asap=$SL:4830 -enrp=$SL:4831 -peer=$SL:4811 -peer=$SL:4821 \
    "${RSP_TIMERS[@]}" "${LOG[@]}" > "$W/C.log" 2>&1 &
C=$!; pids+=($C)
rspregistrar -identifier=0x$D_ID -asap=$SL:4840 -enrp=$SL:4841 -peer=$SL:4811 -peer=$SL:4821 \
    "${RSP_TIMERS[@]}" "${LOG[@]}" > "$W/D.log" 2>&1 &
D=$!; pids+=($D)
wait_for 60 "A to know B, C and D" metric_is rserpool_registrar_enrp_peers 3
holds_both() { local d; d=$(hsdump_of "$1"); grep -qF "$pe_a" <<<"$d" && grep -qF "$pe_b" <<<"$d"; }
wait_for 60 "C to hold both PEs" holds_both $SL:4831
wait_for 60 "D to hold both PEs" holds_both $SL:4841
say "step 3 ok: rspregistrars C and D joined and hold both PEs; A knows $(metric rserpool_registrar_enrp_peers) peers"

won() { metric 'rserpool_registrar_enrp_takeovers_total{outcome="won"}'; }
adopted() { metric rserpool_registrar_pool_elements_adopted_total; }
t_kill=$(date +%s.%N)
kill -9 $B
wait_for 120 "A to take B over" metric_is 'rserpool_registrar_enrp_takeovers_total{outcome="won"}' 1
wait_for 90 "PE-B to adopt A as its home" metric_at_least rserpool_registrar_pool_elements_adopted_total 1
# From A's own log (the guest's clock, as t_kill): when it won, when the PE adopted it.
since_kill() { awk -v a="$t_kill" -v b="$(date -d "$1" +%s.%N)" 'BEGIN{printf "%.3f", b-a}'; }
ts_won=$(nocolor < "$W/A.log" | grep -m1 'takeover won' | awk '{print $1}')
ts_adopted=$(nocolor < "$W/A.log" | grep -m1 "adopted this registrar as its home.* pe=\\$pe_b " | awk '{print $1}')
[ -n "$ts_won" ] || fail "A counted a takeover won but did not log it"
[ -n "$ts_adopted" ] || fail "A counted an adopted PE but did not log PE $pe_b's adoption"
won_after=$(since_kill "$ts_won"); adopted_after=$(since_kill "$ts_adopted")
hsdump_of $SL:4831 > "$W/hsdump-C.txt"
home=$(pe_home_in "$W/hsdump-C.txt" "$pe_b" || true)
say "      C's hsdump, PE $pe_b: $(grep -A1 -F "$pe_b" "$W/hsdump-C.txt" | head -n2 | tr -s ' ' | tr '\n' ' ')"
[ "$home" = "\$$A_ID" ] || fail "C does not show A as PE $pe_b's home (got '${home:-none}')"
rsp_takeover_done "$W/C.log" "$W/D.log" && fail "an rspregistrar completed a takeover of B too"
say "step 4 ok: kill -9 B -> A won the takeover $won_after s after the kill, and PE $pe_b adopted A (it answered the H=1 keep-alive, or re-registered over the association the keep-alive opened) $adopted_after s after the kill: $(nocolor < "$W/A.log" | grep -m1 'takeover won' | sed 's/.*INFO //')"

# hsdump joins as an ENRP peer for a moment, and an rspregistrar keeps it in its peer table for
# -peermaxtimelastheard + -peermaxtimenoresponse (15 s + 6 s) after it left. RSPLIB's takeover
# waits for an acknowledgement from every peer in that table, so a takeover started while such
# an entry is still there expires unanswered. Kill A once the last hsdump is gone from C's and
# D's tables.
settled=$(( $(cat "$W/last-hsdump") + 15 + 6 + 3 ))
while [ "$(date +%s)" -lt "$settled" ]; do sleep 0.5; done
t_kill=$(date +%s.%N)
kill -9 $A
wait_for 120 "an rspregistrar to take A over" rsp_takeover_done "$W/C.log" "$W/D.log"
takers=$(grep -l 'Takeover of peer .* completed' "$W/C.log" "$W/D.log" | wc -l)
[ "$takers" = 1 ] || fail "$takers rspregistrars completed the takeover of A"
taker=$(grep -l 'Takeover of peer .* completed' "$W/C.log" "$W/D.log")
taker=$(basename "$taker" .log)
if [ "$taker" = C ]; then TAKER_ID=$C_ID; OTHER=$SL:4841; ASAP_T=$SL:4830
else TAKER_ID=$D_ID; OTHER=$SL:4831; ASAP_T=$SL:4840; fi
# RSPLIB stamps its log lines "01-Dec-2026 12:46:21.1439: ..." (the guest's clock, as t_kill).
rsp_after=$(since_kill "$(nocolor < "$W/$taker.log" | grep -m1 'Takeover of peer .* completed' | awk '{sub(/:$/, "", $2); print $1, $2}')" 2>/dev/null) || rsp_after="?"
say "      $taker: $(nocolor < "$W/$taker.log" | grep -m1 -o 'Takeover of peer .* completed') $rsp_after s after the kill"
check_homes() {
    hsdump_of $OTHER > "$W/hsdump-other.txt"
    for pe in "$pe_a" "$pe_b"; do
        [ "$(pe_home_in "$W/hsdump-other.txt" "$pe")" = "\$$TAKER_ID" ] || return 1
    done
}
wait_for 90 "the other rspregistrar to show both PEs at home $taker" check_homes
say "step 5 ok: kill -9 A -> $taker took A's PEs ($pe_a, $pe_b) over, as the other rspregistrar's hsdump shows"

MSG="Hello after two takeovers"
echo "$MSG" | rspterminal -poolhandle=EchoPool -registrar=$ASAP_T -asapannounce=off \
    "${LOG[@]}" > "$W/pu.log" 2>&1 &
PU=$!; pids+=($PU)
wait_for 30 "an echo" in_log "$W/pu.log" "> $MSG"
kill -TERM $PU 2>/dev/null || true
say "step 6 ok: rspterminal through $taker: $(nocolor < "$W/pu.log" | grep -F "> $MSG" | head -n1)"
say "SUITE RESULT: OK"
