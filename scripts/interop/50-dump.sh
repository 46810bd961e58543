# Suite dump -- `rserpool dump` reads the handlespace of RSPLIB's rspregistrar over kernel SCTP,
# as RSPLIB's hsdump does, on ports 5400-5599. Each step is asserted; the suite fails at the
# first that does not hold.
#
#   1. rspregistrar B (ID $5e5e0b0b, ASAP 5420, ENRP 5421 on the guest's site-local address)
#      with three rspserver PEs (two in EchoPool, one in DiscardPool) and 300 PEs that
#      `rserpool bench` holds registered in BulkPool: more than one response's worth;
#   2. `rserpool dump --transport sctp` against B's ENRP address prints each rspserver PE under
#      its pool with home $5e5e0b0b, 303 PEs in 3 pools, and the PE checksum B announced equal to
#      the one computed over its PEs as dumped; exit status 0;
#   3. `rserpool dump --json` parses and lists the same pools and PE IDs (decimal), home B, the
#      300 of BulkPool read over several HANDLE_TABLE_RESPONSEs (M=1 followed, RSPLIB's cursor
#      continuing the table);
#   4. RSPLIB's hsdump lists the same rspserver PEs (the two dumps agree);
#   5. what RSPLIB keeps: the dump's peer entry (it is listed in the peer list B gives a later
#      hsdump until -peermaxtimelastheard + -peermaxtimenoresponse have passed after the dump
#      left), reported, not asserted: it is RSPLIB's behaviour, not ours;
#   6. errors: a dump of a port nothing listens on fails with "cannot reach the registrar"
#      (SCTP ABORT) and a nonzero status;
#   7. rspregistrar's log shows no parse error and no ENRP_ERROR sent for any dump's message.
#
# The 300 PEs register before any dump. Registered after earlier dumps, they once made
# rspregistrar fail to send every answer to the next dump ("Sending HandleTableResponse failed";
# the errno is not logged at -loglevel=2): it sends an ADD_PE HANDLE_UPDATE per registration to
# every peer in its table, the departed dumps included, most likely filling its ENRP socket's
# send buffer for a while. A dump retried after its timeout succeeded; each attempt is logged.
# A suite of 1-2 minutes in the VM (300 PEs registered over SCTP take most of it):
# vm-timeout: 600
SL=10.255.0.1
B_ID=5e5e0b0b
LOG=("${RSPLIB_LOG[@]}")
pe_id_of() { grep -m1 -o 'Identifier *= *\$[0-9a-f]*' "$1" | awk '{print $NF}'; }

rspregistrar -identifier=0x$B_ID -asap=$SL:5420 -enrp=$SL:5421 -asapannounce=off \
    -enrpannounce=off -peerheartbeatcycle=2000 -peermaxtimelastheard=15000 \
    -peermaxtimenoresponse=6000 -mentordiscoverytimeout=2000 "${LOG[@]}" > "$W/B.log" 2>&1 &
pids+=($!)
for pe in echo1:echo:EchoPool echo2:echo:EchoPool discard:discard:DiscardPool; do
    IFS=: read -r name service pool <<<"$pe"
    stdbuf -oL rspserver -$service -poolhandle=$pool -registrar=$SL:5420 -asapannounce=off \
        "${LOG[@]}" > "$W/$name.log" 2>&1 &
    pids+=($!)
done
for name in echo1 echo2 discard; do
    wait_for 30 "$name's registration" grep -q Identifier "$W/$name.log"
done
pe1=$(pe_id_of "$W/echo1.log"); pe2=$(pe_id_of "$W/echo2.log"); pe3=$(pe_id_of "$W/discard.log")
"$RSERPOOL_BIN" bench --transport sctp --registrar $SL:5420 --pool BulkPool --pes 300 \
    --pe-address $SL --workloads none --hold > "$W/bench.log" 2>&1 &
pids+=($!)
wait_for 90 "300 PEs held registered at B" grep -q "holding 300 PE" "$W/bench.log"
say "step 1 ok: rspregistrar \$$B_ID with PEs $pe1, $pe2 (EchoPool), $pe3 (DiscardPool) and 300 in BulkPool"

# Every attempt of a dump, its errors included, goes to dumps.log (shown on failure).
attempt() {   # attempt NAME ARGS... -> $W/NAME.out, exit status of the dump
    local name=$1; shift
    say "      $name: rserpool dump $*" >> "$W/dumps.log"
    "$RSERPOOL_BIN" dump --transport sctp "$@" > "$W/$name.out" 2>> "$W/dumps.log"
}
# rspregistrar may still be starting up (mentor discovery): retry until every PE is listed.
# Each attempt has its own server ID: rspregistrar would continue an interrupted attempt's table
# where it stopped for that ID (its cursor per peer), and step 5 looks for the last one.
tries=0
dump_lists_all() {
    tries=$((tries + 1)); DUMP_ID=$(printf '5e5e0d%02x' $tries)
    local rc=0
    attempt table --server-id 0x$DUMP_ID --timeout 20s $SL:5421 || rc=$?
    if [ "$rc" != 0 ]; then echo "      table: dump exit $rc" >> "$W/dumps.log"; return 1; fi
    for pe in "$pe1" "$pe2" "$pe3"; do grep -qF "$pe" "$W/table.out" || return 1; done
    grep -q "^Total: 3 pool(s), 303 PE(s)" "$W/table.out"
}
wait_for 120 "rserpool dump to list every PE" dump_lists_all
t_dump=$(date +%s)
# The PE's line in the table: "  $PEID  $HOME  POLICY ...", under its pool's heading.
pool_of() { awk -v pe="$1" '/^Pool "/ {pool=$2} $1==pe {print pool}' "$W/table.out"; }
home_of() { awk -v pe="$1" '$1==pe {print $2}' "$W/table.out"; }
for pe in "$pe1" "$pe2"; do
    [ "$(pool_of "$pe")" = '"EchoPool":' ] || fail "PE $pe is not under EchoPool: $(pool_of "$pe")"
done
[ "$(pool_of "$pe3")" = '"DiscardPool":' ] || fail "PE $pe3 is not under DiscardPool"
for pe in "$pe1" "$pe2" "$pe3"; do
    [ "$(home_of "$pe")" = "\$$B_ID" ] || fail "PE $pe: home $(home_of "$pe"), not \$$B_ID"
done
head -n1 "$W/table.out" | grep -q "^Registrar \$$B_ID at $SL:5421 over SCTP: PE checksum" \
    || fail "the dump does not name the registrar: $(head -n1 "$W/table.out")"
head -n1 "$W/table.out" | grep -q "differs" && fail "checksums differ: $(head -n1 "$W/table.out")"
grep -q "^Pool \"BulkPool\": 300 PE(s)" "$W/table.out" || fail "BulkPool: $(grep BulkPool "$W/table.out")"
say "step 2 ok: rserpool dump of rspregistrar over SCTP ($(grep -c ': rserpool dump' "$W/dumps.log") attempt(s); BulkPool's rows left out here):"
awk '/^Pool "BulkPool"/ {skip=1; print; next} /^$/ {skip=0} !skip' "$W/table.out" | sed 's/^/      /'

# The JSON check, written once (a here-document inside a function whose output wait_for
# throws away failed silently in the guest).
cat > "$W/check-json.py" <<'EOF'
import json, sys
doc = json.load(open(sys.argv[1]))
home = int(sys.argv[2], 16)
ids = [int(p.lstrip("$"), 16) for p in sys.argv[3:]]
pools = {p["handle"]: [e["id"] for e in p["pool_elements"]] for p in doc["pools"]}
assert doc["schema"] == 1, doc["schema"]
assert doc["registrar"]["id"] == home, doc["registrar"]
assert doc["registrar"]["transport"] == "sctp", doc["registrar"]
assert sorted(pools) == ["BulkPool", "DiscardPool", "EchoPool"], sorted(pools)
assert pools["EchoPool"] == sorted(ids[:2]), pools["EchoPool"]
assert pools["DiscardPool"] == [ids[2]], pools["DiscardPool"]
bulk = pools["BulkPool"]
assert len(set(bulk)) == 300 and bulk == sorted(bulk), len(bulk)
assert all(e["home_registrar"] == home for p in doc["pools"] for e in p["pool_elements"])
assert all(e["user_transport"]["protocol"] == "sctp" for p in doc["pools"] for e in p["pool_elements"])
assert doc["totals"]["pool_elements"] == 303, doc["totals"]
assert doc["totals"]["responses"] >= 3, doc["totals"]
# B's checksum is known when its PRESENCE came; when known, it is the one over its PEs.
announced = doc["registrar"]["pe_checksum"]
assert announced is None or announced == doc["homes"][0]["pe_checksum"], (announced, doc["homes"])
EOF
json_matches() {
    local rc=0
    attempt json --json --timeout 30s --registrar $SL:5421 || rc=$?
    if [ "$rc" != 0 ]; then echo "      json: dump exit $rc" >> "$W/dumps.log"; return 1; fi
    python3 "$W/check-json.py" "$W/json.out" "$B_ID" "$pe1" "$pe2" "$pe3" >> "$W/dumps.log" 2>&1 || rc=$?
    if [ "$rc" != 0 ]; then echo "      json: check exit $rc" >> "$W/dumps.log"; return 1; fi
}
wait_for 120 "rserpool dump --json to match" json_matches
responses=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["totals"]["responses"])' "$W/json.out")
say "step 3 ok: rserpool dump --json lists the same pools and PEs, home \$$B_ID; 303 PEs in $responses HANDLE_TABLE_RESPONSEs (M=1 followed)"

timeout 40 hsdump $SL:5421 "${LOG[@]}" 2>&1 | nocolor > "$W/hsdump.txt" || true
t_hsdump=$(date +%s)
for pe in "$pe1" "$pe2" "$pe3"; do
    grep -qF "$pe" "$W/hsdump.txt" || fail "RSPLIB's hsdump does not list $pe"
done
say "step 4 ok: RSPLIB's hsdump lists the same PEs"

kept=$(grep -ciF "\$$DUMP_ID" "$W/hsdump.txt" || true)
if [ "$kept" -gt 0 ]; then kept_text="still listed the dump's peer entry \$$DUMP_ID"
else kept_text="no longer listed the dump's peer entry \$$DUMP_ID"; fi
say "step 5: $(( t_hsdump - t_dump )) s after the dump left, rspregistrar $kept_text in hsdump's view (RSPLIB keeps a peer until -peermaxtimelastheard + -peermaxtimenoresponse, here 15 s + 6 s)"

rc=0
attempt unreachable --timeout 20s $SL:5599 || rc=$?
[ "$rc" != 0 ] || fail "a dump of a closed port succeeded"
tail -n1 "$W/dumps.log" | grep -q "cannot reach the registrar at $SL:5599 over SCTP" \
    || fail "unclear error: $(tail -n1 "$W/dumps.log")"
say "step 6 ok: unreachable registrar: $(tail -n1 "$W/dumps.log") (exit $rc)"

nocolor < "$W/B.log" | grep -E "Error while parsing|Sending ENRP Error" > "$W/B-errors.txt" || true
[ -s "$W/B-errors.txt" ] && fail "rspregistrar refused messages of the dump: $(head -n4 "$W/B-errors.txt")"
say "step 7 ok: rspregistrar took every message of the dumps (no parse error, no ENRP_ERROR in its log)"
if [ "$(grep -c ': rserpool dump' "$W/dumps.log")" -gt 3 ]; then
    say "      dumps retried; their errors:"; grep -v ': rserpool dump' "$W/dumps.log" | sed 's/^/      /'
fi
say "SUITE RESULT: OK"
