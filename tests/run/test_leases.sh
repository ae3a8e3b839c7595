#!/usr/bin/env bash
# Sessions' leases and runs' restarts, as a user meets them, against a real
# controller, real workers and Open MPI: a muster run killed with kill -9
# leaves no workers behind (ttl + 2 s); a controller restart while a lease is
# renewed stops nothing, and a lease nobody renews gets one ttl of grace
# after a restart; muster launch --lease stops its workers on SIGTERM; a run
# restarted after a worker was killed resumes from its checkpoint and ends
# with the loss of an uninterrupted run; --max-restarts 0 fails as before.
# Usage: test_leases.sh BUILD_DIR SOURCE_DIR
set -uo pipefail
build=$(cd "${1:-build}" && pwd)
src=$(cd "${2:-.}" && pwd)
muster=$build/muster
train=$build/muster-train
tmp=$(mktemp -d /tmp/muster-lease-test-XXXXXX)
pass=0
fail=0
ctl_pid=
bg_pids=()
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export LSAN_OPTIONS=${LSAN_OPTIONS:-}${LSAN_OPTIONS:+:}suppressions=$src/tests/trainer/lsan.supp
# Open MPI's plugins leak in sanitized builds (see tests/run/test_run.sh).
export ASAN_OPTIONS=${ASAN_OPTIONS:-}:detect_leaks=0
export MUSTER_STATE_DIR=$tmp/state MUSTER_RUN_DIR=$tmp/runs
unset MUSTER_URL MUSTER_TOKEN MUSTER_SESSION
TTL=3

stop_controller() {  # $1: TERM or KILL
  [ -n "$ctl_pid" ] || return 0
  kill "-$1" "$ctl_pid" 2>/dev/null
  for _ in $(seq 50); do kill -0 "$ctl_pid" 2>/dev/null || break; sleep 0.1; done
  kill -KILL "$ctl_pid" 2>/dev/null
  wait "$ctl_pid" 2>/dev/null
  ctl_pid=
}

cleanup() {
  for p in "${bg_pids[@]}"; do kill -KILL "$p" 2>/dev/null; done
  stop_controller TERM
  if [ -f "$tmp/state/muster.db" ]; then
    for ref in $(sqlite3 "$tmp/state/muster.db" "SELECT pid FROM workers WHERE pid IS NOT NULL" 2>/dev/null); do
      kill -KILL -- "-$ref" 2>/dev/null; kill -KILL "$ref" 2>/dev/null
    done
  fi
  bash "$(dirname "$0")/../cgroup_clean.sh" "$tmp"
  rm -rf "$tmp"
  # the restarted run's checkpoint, where a failure left it
  [ -z "${rs_id:-}" ] || rm -rf "${acct_home:?}/.muster/runs/$rs_id"
}
trap cleanup EXIT

ok() { echo "ok - $*"; pass=$((pass + 1)); }
not_ok() { echo "not ok - $*"; fail=$((fail + 1)); }
check() { local what=$1; shift; if "$@"; then ok "$what"; else not_ok "$what"; fi; }
le() { python3 -c "import sys; sys.exit(0 if float('$1') <= float('$2') else 1)"; }
now() { date +%s.%N; }
since() { python3 -c "print(round($(now) - $1, 2))"; }
last_json() { grep -o '{"mode".*}' "$1" | tail -1; }
json_field() { python3 -c "import json,sys; print(json.loads(sys.argv[1])['$2'])" "$1"; }

# One fixed port: clients keep talking to the controller across its restarts.
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
start_controller() {  # with MUSTER_FAULT=$ctl_fault, if set
  MUSTER_FAULT=${ctl_fault:-} "$build/muster-controller" --listen "127.0.0.1:$port" --network host --state-dir "$tmp/state" --cpus 8 \
    --heartbeat-interval 0.5 >> "$tmp/controller.log" 2>&1 &
  ctl_pid=$!
  for _ in $(seq 300); do
    curl -sf "http://127.0.0.1:$port/api/v1/health" > /dev/null 2>&1 && return 0
    sleep 0.1
  done
  echo "not ok - the controller did not start: $(tail -5 "$tmp/controller.log")"
  exit 1
}
mkdir -p "$tmp/state" "$tmp/runs"
chmod 755 "$tmp"; chmod 777 "$tmp/runs"  # rank 0 (muster-worker) checkpoints there
start_controller

# Statuses of session $1's workers, sorted, one word each ("" if none).
statuses() { "$muster" ps -a --session "$1" --json | python3 -c 'import json,sys; print(" ".join(sorted(w["status"] for w in json.load(sys.stdin))))'; }
failures() { "$muster" ps -a --session "$1" --json | python3 -c 'import json,sys; print("|".join(sorted(set(str(w["failure"]) for w in json.load(sys.stdin)))))'; }
# Waits up to $2 s until session $1's workers are all $3 (e.g. "running running").
wait_statuses() {
  local deadline; deadline=$(python3 -c "print($(now) + $2)")
  while le "$(now)" "$deadline"; do
    [ "$(statuses "$1")" = "$3" ] && return 0
    sleep 0.05
  done
  return 1
}
run_of() { "$muster" runs --session "$1" --json | python3 -c "import json,sys; r=json.load(sys.stdin); print(r[0]['$2'] if r else '')"; }
. "$(dirname "$0")/../lib/wait.sh"
# Whether session $1 holds no lease (none taken, given back, or run out):
# the controller's list of sessions shows none for it.
no_lease() {
  curl -sf -H "Authorization: Bearer $(cat "$tmp/state/token")" "http://127.0.0.1:$port/api/v1/sessions" |
    python3 -c 'import json,sys; sys.exit(1 if any(s["name"] == sys.argv[1] and s["lease"] for s in json.load(sys.stdin)["sessions"]) else 0)' "$1"
}
# Seconds from $2 (date +%s.%N) to the end of session $1's last worker, as
# the controller recorded it (finished_at).
ended_after() {
  "$muster" ps -a --session "$1" --json | python3 -c '
import datetime, json, sys
t = max(w["finished_at"] for w in json.load(sys.stdin))
end = datetime.datetime.strptime(t, "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=datetime.timezone.utc)
print(round(end.timestamp() - float(sys.argv[1]), 3))' "$2"
}
# Whether the 2 workers of a --mode exec run whose command prints "started"
# run it: muster run's output $1 has both lines.
both_started() { [ "$(grep -c '\] started$' "$1")" = 2 ]; }

# --- bad input: a clear error naming what was wrong, nothing stored
tok=$(cat "$tmp/state/token")
call() {  # METHOD PATH [BODY] -> "STATUS BODY"
  curl -s -o "$tmp/call.out" -w '%{http_code}' -X "$1" -H "Authorization: Bearer $tok" \
    ${3:+-d "$3"} "http://127.0.0.1:$port$2"
  printf ' '; cat "$tmp/call.out"
}
expect() {  # WHAT STATUS FIELD-OR-TEXT METHOD PATH [BODY]
  local what=$1 st=$2 want=$3; shift 3
  local got; got=$(call "$@")
  if [ "${got%% *}" = "$st" ] && grep -qF -- "$want" <<<"$got"; then
    ok "$what: $st naming $want"
  else
    not_ok "$what: $st naming $want (got $got)"
  fi
}
expect "a lease with ttl 0" 422 '"field":"ttl_seconds"' PUT /api/v1/sessions/s1/lease '{"ttl_seconds": 0}'
expect "a lease with an unknown field" 422 'unknown field \"ttl\"' PUT /api/v1/sessions/s1/lease '{"ttl": 5}'
expect "a lease of a bad session name" 422 '"field":"name"' PUT '/api/v1/sessions/bad%21name/lease' '{}'
expect "giving back a lease never taken" 404 'holder default holds no part of session s1' DELETE /api/v1/sessions/s1/lease
expect "a run without a mode" 422 '"field":"mode"' POST /api/v1/runs '{"command": ["x"]}'
expect "a run whose command is not an array" 422 '"field":"command"' POST /api/v1/runs '{"mode": "exec", "command": "x"}'
expect "a run naming a worker that is not there" 422 'is no worker' POST /api/v1/runs '{"mode": "exec", "command": ["x"], "holder": "h1", "workers": ["w-0000000000"]}'
expect "an unknown run" 404 'there is no run r-0000000000' GET /api/v1/runs/r-0000000000
expect "a launch into an unknown run" 422 '"field":"run"' POST /api/v1/workers '{"n": 1, "run": "r-0000000000"}'
expect "a run without its holder" 422 '"field":"holder"' POST /api/v1/runs '{"mode": "exec", "command": ["x"], "session": "s1"}'
call PUT /api/v1/sessions/s1/lease '{"ttl_seconds": 60, "holder": "h1"}' > /dev/null
rid=$(call POST /api/v1/runs '{"mode": "exec", "command": ["x"], "session": "s1", "holder": "h1", "max_restarts": 1}' | python3 -c 'import json,sys; print(json.loads(sys.stdin.read().split(" ", 1)[1])["id"])')
expect "a launch into a run of another session" 422 'belongs to session s1' POST /api/v1/workers "{\"n\": 1, \"run\": \"$rid\", \"session\": \"s2\"}"
expect "a first restart" 200 '"restarts":1' POST "/api/v1/runs/$rid/restarts" '{"cause": "first"}'
expect "a restart past max_restarts" 409 'used all of its restarts' POST "/api/v1/runs/$rid/restarts" '{"cause": "second"}'
expect "a run's end" 200 '"status":"failed"' POST "/api/v1/runs/$rid/end" '{"status": "failed", "failure": "done"}'
expect "a second end" 409 "has ended (failed)" POST "/api/v1/runs/$rid/end" '{"status": "succeeded"}'
expect "a launch into an ended run" 409 'has ended' POST /api/v1/workers "{\"n\": 1, \"run\": \"$rid\", \"session\": \"s1\"}"
check "...and none of those launches stored a worker" \
  test "$(sqlite3 "$tmp/state/muster.db" "SELECT count(*) FROM workers")" = 0
check "an ended run cannot change, even by SQL" \
  bash -c "! sqlite3 '$tmp/state/muster.db' \"UPDATE runs SET status = 'running' WHERE id = '$rid'\" 2>/dev/null"

# --- two holders of one session's lease: each renews its own part with its
# own ttl; a renewal that comes after the holder's part ran out says so
# (201, not 200), and whether the session's workers were stopped then
expect "a first holder's part" 201 '"previous":"none"' PUT /api/v1/sessions/two/lease '{"ttl_seconds": 120, "holder": "long"}'
expect "a renewal" 200 '"holder":"long"' PUT /api/v1/sessions/two/lease '{"ttl_seconds": 120, "holder": "long"}'
two=$(call POST /api/v1/workers '{"n": 1, "cpu": 0.1, "session": "two"}' | grep -o 'w-[a-z0-9]\{10\}' | head -1)
wait_statuses two 60 running || echo "# gave up after 60 s waiting for session two's worker to be running ($(statuses two))"
expect "a second holder's shorter part" 201 '"holder":"short"' PUT /api/v1/sessions/two/lease "{\"ttl_seconds\": $TTL, \"holder\": \"short\"}"
expect "a lease bound to expire" 201 '"session":"short"' PUT /api/v1/sessions/short/lease "{\"ttl_seconds\": $TTL}"
wait_for $((TTL + 10)) "the lease of session short to run out" no_lease short
check "the shorter holder's silence does not end the longer holder's part ($(statuses two))" test "$(statuses two)" = running
expect "the shorter holder's renewal after its part ran out" 201 '"previous":"expired","workers_stopped":false' PUT /api/v1/sessions/two/lease "{\"ttl_seconds\": $TTL, \"holder\": \"short\"}"
expect "a renewal after the lease ran out is a new lease" 201 '"previous":"expired","workers_stopped":true' PUT /api/v1/sessions/short/lease "{\"ttl_seconds\": $TTL}"
expect "giving back a part" 200 '"holder":"short"' DELETE '/api/v1/sessions/two/lease?holder=short'
expect "...and the last one" 200 '"lease":null' DELETE '/api/v1/sessions/two/lease?holder=long'
expect "...and the other session's" 200 '"lease":null' DELETE /api/v1/sessions/short/lease
expect "a run naming one worker twice" 422 'names '"$two"' again' POST /api/v1/runs "{\"mode\": \"exec\", \"command\": [\"x\"], \"session\": \"two\", \"holder\": \"long\", \"workers\": [\"$two\", \"$two\"]}"
call POST /api/v1/workers/stop "{\"ids\": [\"$two\"]}" > /dev/null
# A client that joins a session another holder holds ends only its own part.
expect "a notebook's lease" 201 '"session":"shared"' PUT /api/v1/sessions/shared/lease '{"ttl_seconds": 60, "holder": "notebook"}'
timeout 60 "$muster" launch --lease --session shared -n 1 --cpu 0.1 -- true > /dev/null 2> "$tmp/shared.err"; rc=$?
expect "after muster launch --lease --session shared ended (exit $rc), the notebook's part is still there" \
  200 '"holders":[{"holder":"notebook","ttl_seconds":60' GET /api/v1/sessions/shared
call DELETE '/api/v1/sessions/shared/lease?holder=notebook' > /dev/null

# --- kill -9 of muster run mid-training: its workers stop within ttl + 2 s
"$muster" run --mode allreduce --workers 2 --cpu 1 --session lk --lease-ttl $TTL -- \
  "$train" --mode allreduce --epochs 500 --quiet > "$tmp/lk.out" 2> "$tmp/lk.err" &
run_pid=$!
bg_pids+=("$run_pid")
has_mpirun() { pgrep -P "$run_pid" -x mpirun > /dev/null; }
if wait_statuses lk 60 "running running" && wait_for 30 "muster run to start its mpirun" has_mpirun &&
  [ "$(run_of lk status)" = running ]; then
  mpirun_pid=$(pgrep -P "$run_pid" -x mpirun | head -1)
  kill -KILL "$run_pid"
  t0=$(now)
  wait_statuses lk $((TTL + 30)) "stopped stopped"
  # When the controller stopped them, as it recorded it (a loaded machine
  # slows this script's polling, not the controller's expiry).
  took=$(ended_after lk "$t0")
  check "after kill -9 of muster run, its 2 workers are stopped ($(statuses lk))" \
    test "$(statuses lk)" = "stopped stopped"
  check "...within ttl + 2 s (ttl $TTL s, stopped $took s after the kill)" le "$took" $((TTL + 2))
  check "...each with \"stopped: the session's lease expired\" ($(failures lk))" \
    test "$(failures lk)" = "stopped: the session's lease expired"
  check "...and the run is failed, saying why ($(run_of lk failure))" \
    test "$(run_of lk status)/$(run_of lk failure)" = "failed/the session's lease expired: the client that ran it is gone"
  # Its mpirun (this test's grandchild) ends once its daemons are gone.
  if [ -n "$mpirun_pid" ]; then
    for _ in $(seq 100); do kill -0 "$mpirun_pid" 2>/dev/null || break; sleep 0.1; done
    check "...and its orphaned mpirun ended by itself" bash -c "! kill -0 $mpirun_pid 2>/dev/null"
    kill -KILL "$mpirun_pid" 2>/dev/null
  fi
else
  not_ok "muster run's workers never ran: $(tail -3 "$tmp/lk.err")"
fi
wait "$run_pid" 2>/dev/null

# --- a controller restart while a lease is renewed stops nothing
"$muster" launch --lease --lease-ttl $TTL -n 2 --cpu 0.1 --session keep > "$tmp/keep.ids" 2> "$tmp/keep.err" &
keep_pid=$!
bg_pids+=("$keep_pid")
# --- and a lease nobody renews any more gets one ttl of grace after it
"$muster" launch --lease --lease-ttl $TTL -n 1 --cpu 0.1 --session grace > /dev/null 2> "$tmp/grace.err" &
grace_pid=$!
bg_pids+=("$grace_pid")
if wait_statuses keep 30 "running running" && wait_statuses grace 30 "running"; then
  check "the session list shows keep's lease" \
    bash -c "curl -s -H 'Authorization: Bearer $(cat "$tmp/state/token")' http://127.0.0.1:$port/api/v1/sessions | grep -q '\"name\":\"keep\",\"live_workers\":2,\"lease\":{\"ttl_seconds\":3'"
  check "/metrics has keep's lease" \
    bash -c "curl -s http://127.0.0.1:$port/metrics | grep -q '^muster_session_lease_seconds_left{session=\"keep\"} '"
  kill -KILL "$grace_pid"          # nobody renews grace's lease from now on
  stop_controller KILL
  # Longer than the ttl: grace's lease ran out meanwhile. (A time, not an
  # event: with the controller down nothing marks it, and it passing is what
  # this part is about; a slow machine only makes it longer.)
  sleep $((TTL + 1))
  t_up=$(now)
  start_controller
  t_answered=$(now)
  wait_statuses grace $((TTL + 30)) stopped
  # (its end as the controller recorded it, to the millisecond it keeps)
  ended=$(ended_after grace "$t_up")
  check "after the restart, grace's worker still ran for one ttl of grace (it ended $ended s after, ttl $TTL s)" \
    le "$((TTL - 1)).999" "$ended"
  # (the grace began between t_up and the first answer: the lower bound is
  # taken from before the start, the upper one from after it)
  ended_answered=$(ended_after grace "$t_answered")
  check "...then it is stopped when that ttl ran out (it ended $ended_answered s after the controller answered, ttl $TTL s)" \
    bash -c "[ '$(statuses grace)' = stopped ] && $(le "$ended_answered" $((TTL + 2)) && echo true || echo false)"
  check "...with the lease sentence ($(failures grace))" \
    test "$(failures grace)" = "stopped: the session's lease expired"
  # Two ttl later by the controller's clock: a lease of 2 ttl that nobody
  # renews runs out (had keep's renewals been lost, its lease would have
  # run out by the same pass).
  expect "a lease of 2 ttl, to tell the time" 201 '"session":"clock"' PUT /api/v1/sessions/clock/lease "{\"ttl_seconds\": $((2 * TTL))}"
  wait_for $((2 * TTL + 10)) "the lease of session clock (2 ttl) to run out" no_lease clock
  check "keep's workers, whose lease was renewed across the restart, still run after 2 ttl ($(statuses keep))" \
    test "$(statuses keep)" = "running running"
  check "...and their holder is still there" kill -0 "$keep_pid"
  # muster launch --lease: SIGTERM stops its workers at once.
  kill -TERM "$keep_pid"
  t0=$(now)
  wait "$keep_pid"; rc=$?
  wait_statuses keep 2 "stopped stopped"
  check "SIGTERM to muster launch --lease stops its workers at once ($(statuses keep), $(since "$t0") s) and it exits 1 (got $rc)" \
    bash -c "[ '$(statuses keep)' = 'stopped stopped' ] && [ $rc = 1 ]"
  check "...and gives the lease back" \
    bash -c "curl -s -H 'Authorization: Bearer $(cat "$tmp/state/token")' http://127.0.0.1:$port/api/v1/sessions/keep | grep -q '\"lease\":null'"
else
  not_ok "the leased launches never ran: $(tail -3 "$tmp/keep.err") $(tail -3 "$tmp/grace.err")"
fi

# --- a run survives a lost worker: --max-restarts 1 resumes from the checkpoint
EPOCHS=12
timeout 300 "$muster" run --mode allreduce --workers 2 --cpu 1 --session ref -- \
  "$train" --mode allreduce --epochs $EPOCHS --quiet > "$tmp/ref.out" 2> "$tmp/ref.err"; rc=$?
check "an uninterrupted run of $EPOCHS epochs succeeds (exit $rc)" test $rc -eq 0
# Its checkpoint goes where muster run puts it by default: the home of the
# account the workers' code runs as (muster-worker), not this client's.
acct_home=$(getent passwd muster-worker | cut -d: -f6)
timeout 300 env -u MUSTER_RUN_DIR "$muster" run --mode allreduce --workers 2 --cpu 1 --session rs \
  --max-restarts 1 -- "$train" --mode allreduce --epochs $EPOCHS --quiet \
  > "$tmp/rs.out" 2> "$tmp/rs.err" &
rs_pid=$!
bg_pids+=("$rs_pid")
victim=
rs_id=
for _ in $(seq 300); do
  rs_id=$(sqlite3 "$tmp/state/muster.db" "SELECT id FROM runs WHERE session = 'rs'" 2>/dev/null)
  [ -n "$rs_id" ] && break
  sleep 0.1
done
for _ in $(seq 3000); do
  if [ -n "$rs_id" ] && [ -s "$acct_home/.muster/runs/$rs_id/checkpoint" ]; then
    victim=$(sqlite3 "$tmp/state/muster.db" "SELECT id || ' ' || pid FROM workers WHERE session = 'rs' AND status = 'running' AND role = 'worker' ORDER BY rowid DESC LIMIT 1")
    break
  fi
  sleep 0.02
done
if [ -n "$victim" ]; then
  vid=${victim% *}; vpid=${victim#* }
  kill -KILL "$vpid"
  wait "$rs_pid"; rc=$?
  check "after worker $vid's workerd was killed past the first checkpoint, --max-restarts 1 succeeds (exit $rc)" \
    test $rc -eq 0
  check "...printing one restart with its cause" \
    bash -c "[ \$(grep -c '^muster run: restart ' '$tmp/rs.err') = 1 ] && grep -q '^muster run: restart 1: worker [01] ($vid) failed: muster-workerd (pid $vpid) was killed by signal 9' '$tmp/rs.err'"
  r=$(last_json "$tmp/ref.out"); s=$(last_json "$tmp/rs.out")
  if [ -n "$r" ] && [ -n "$s" ]; then
    check "...and ends with the uninterrupted run's loss ($(json_field "$s" final_loss) vs $(json_field "$r" final_loss))" \
      python3 -c "import sys; sys.exit(0 if abs($(json_field "$s" final_loss) - $(json_field "$r" final_loss)) <= 1e-6 else 1)"
    check "...and test accuracy ($(json_field "$s" test_accuracy) vs $(json_field "$r" test_accuracy))" \
      test "$(json_field "$s" test_accuracy)" = "$(json_field "$r" test_accuracy)"
    check "...having resumed: fewer steps in its last attempt ($(json_field "$s" steps) < $(json_field "$r" steps))" \
      test "$(json_field "$s" steps)" -lt "$(json_field "$r" steps)"
  else
    not_ok "no summary: $(tail -3 "$tmp/rs.err")"
  fi
  check "...and the run's record says succeeded with 1 restart and its cause" \
    bash -c "[ '$(run_of rs status)/$(run_of rs restarts)' = succeeded/1 ] && '$muster' runs --session rs --json | grep -q 'killed by signal 9'"
  check "...and its checkpoint directory, no longer needed, is gone" \
    test ! -e "$acct_home/.muster/runs/$rs_id"
  check "...and lists the 2 replacements among its 4 workers" \
    test "$("$muster" runs --session rs --json | python3 -c 'import json,sys; print(len(json.load(sys.stdin)[0]["workers"]))')" = 4
else
  not_ok "no checkpoint appeared in $acct_home/.muster/runs, or no worker ran: $(tail -3 "$tmp/rs.err")"
  kill -KILL "$rs_pid" 2>/dev/null; wait "$rs_pid" 2>/dev/null
fi

# --- a worker stopped by the user ends the run: stopping is no failure to restart
# The stop's event reaches muster run a second after the command's own exit
# through the exec channel (the controller's events_before_send fault point,
# compiled into test builds): the run must still name the stop, not "exited
# with code 143".
stop_controller TERM
ctl_fault=events_before_send:delay=1000 start_controller
"$muster" run --mode exec --workers 2 --cpu 0.2 --session us --max-restarts 2 -- \
  sh -c 'echo started; exec sleep 60' > "$tmp/us.out" 2> "$tmp/us.err" &
us_pid=$!
bg_pids+=("$us_pid")
if wait_statuses us 30 "running running" &&
  wait_for 30 "the run's command to start in both workers" both_started "$tmp/us.out"; then
  "$muster" stop "$(sqlite3 "$tmp/state/muster.db" "SELECT id FROM workers WHERE session = 'us' AND status = 'running' LIMIT 1")" > /dev/null
  wait "$us_pid"; rc=$?
  check "muster stop of one of a run's workers ends it (exit $rc) without a restart, though 2 were allowed" \
    bash -c "[ $rc = 1 ] && ! grep -q 'restart [0-9]' '$tmp/us.err' && grep -q 'was stopped: stopped by the user' '$tmp/us.err'"
  check "...and its record is failed with 0 restarts" test "$(run_of us status)/$(run_of us restarts)" = failed/0
else
  not_ok "us's workers never ran: $(tail -3 "$tmp/us.err")"
fi
stop_controller TERM
ctl_fault= start_controller

# --- --max-restarts 0: the first lost worker ends the run, named
"$muster" run --mode exec --workers 2 --cpu 0.2 --session r0 -- \
  sh -c 'echo started; exec sleep 60' > "$tmp/r0.out" 2> "$tmp/r0.err" &
r0_pid=$!
bg_pids+=("$r0_pid")
if wait_statuses r0 30 "running running" &&
  wait_for 30 "the run's command to start in both workers" both_started "$tmp/r0.out"; then
  victim=$(sqlite3 "$tmp/state/muster.db" "SELECT id || ' ' || pid FROM workers WHERE session = 'r0' AND status = 'running' LIMIT 1")
  vid=${victim% *}; vpid=${victim#* }
  kill -KILL "$vpid"
  wait "$r0_pid"; rc=$?
  check "with --max-restarts 0, killing a worker fails the run (exit $rc), naming it: $(grep FAILED "$tmp/r0.err")" \
    bash -c "[ $rc = 1 ] && grep -q 'FAILED: worker [01] ($vid) failed: muster-workerd (pid $vpid) was killed by signal 9' '$tmp/r0.err' && ! grep -q 'restart [0-9]' '$tmp/r0.err'"
  check "...and its record is failed with 0 restarts" test "$(run_of r0 status)/$(run_of r0 restarts)" = failed/0
else
  not_ok "r0's workers never ran: $(tail -3 "$tmp/r0.err")"
fi

echo "$pass passed, $fail failed"
[ $fail -eq 0 ]
