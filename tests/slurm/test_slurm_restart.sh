#!/usr/bin/env bash
# A controller restart while Slurm's queue cannot be read, against fake
# Slurm commands on the PATH (no cluster, no root): the workers an earlier
# controller left meet the same fate as when squeue answers at the restart
# (docs/backends.md, "Restart"): a worker whose job was never queued gets
# attempt 2; one whose job ended while the controller was down and left
# squeue fails with Slurm's accounting (sacct) of the end; one stopped while
# it was unmatched has its held job cancelled, never released.
#
# usage: tests/slurm/test_slurm_restart.sh BUILD_DIR   (ctest slurm_restart)
set -uo pipefail
build=$(cd "${1:?usage: test_slurm_restart.sh BUILD_DIR}" && pwd)
tmp=$(mktemp -d /tmp/muster-slurm-restart.XXXXXX)
# (the root controller refuses a state directory its account cannot reach:
# STATE-slurm, where the jobs write their output, sits beside it)
chmod 755 "$tmp"
fake=$tmp/fake
bin=$tmp/bin
mkdir -p "$fake" "$bin"
ctl_pid=
pass=0 fail=0
export ASAN_OPTIONS=${ASAN_OPTIONS:-}:detect_leaks=0

cleanup() {
  [ -n "$ctl_pid" ] && kill -9 "$ctl_pid" 2>/dev/null
  # a fake sbatch left waiting by the killed controller
  [ -f "$fake/sbatch.pid" ] && kill "$(cat "$fake/sbatch.pid")" 2>/dev/null
  if [ "$fail" -gt 0 ] && [ -f "$tmp/controller.log" ]; then
    echo "# the controller's log, last lines:"
    tail -30 "$tmp/controller.log" | sed 's/^/#   /'
  fi
  if [ -n "${KEEP:-}" ]; then echo "# kept $tmp"; else rm -rf "$tmp"; fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# --- fake Slurm, steered by files in $fake:
#   squeue: the queue in $fake/queue.json; fails as Slurm does when it cannot
#     be reached while $fake/squeue_down exists
#   sbatch: --test-only says yes; else, while $fake/sbatch_wait exists, it
#     says it started ($fake/sbatch.pid) and waits (a controller killed during
#     sbatch); else it queues a job (next id from $fake/next_id) RUNNING
#   sacct: logs its arguments to $fake/sacct.log, prints $fake/sacct.out
cat >"$bin/squeue" <<'SH'
#!/usr/bin/env bash
if [ -e "$MUSTER_FAKE/squeue_down" ]; then
  echo "slurm_load_jobs error: Unable to contact slurm controller (connect failure)" >&2
  exit 1
fi
cat "$MUSTER_FAKE/queue.json"
SH
cat >"$bin/sbatch" <<'SH'
#!/usr/bin/env bash
comment=
while [ $# -gt 0 ]; do
  case $1 in
    --test-only) echo "sbatch: Job 1 to start at now using 1 processors on nodes n1 in partition p" >&2; exit 0 ;;
    --comment) comment=$2; shift ;;
  esac
  shift
done
cat >/dev/null
if [ -e "$MUSTER_FAKE/sbatch_wait" ]; then
  echo $$ >"$MUSTER_FAKE/sbatch.pid"
  for _ in $(seq 600); do sleep 0.1; done
  exit 1
fi
id=$(cat "$MUSTER_FAKE/next_id")
echo $((id + 1)) >"$MUSTER_FAKE/next_id"
echo "$comment" >>"$MUSTER_FAKE/sbatch.log"
python3 - "$MUSTER_FAKE/queue.json" "$id" "$comment" <<'PY'
import json, sys
p, id, comment = sys.argv[1], int(sys.argv[2]), sys.argv[3]
q = json.load(open(p))
q["jobs"].append({"job_id": id, "job_state": "RUNNING", "state_reason": "None",
                  "nodes": "n1", "comment": comment})
json.dump(q, open(p + ".new", "w"))
PY
mv "$MUSTER_FAKE/queue.json.new" "$MUSTER_FAKE/queue.json"
echo "$id"
SH
cat >"$bin/sacct" <<'SH'
#!/usr/bin/env bash
echo "$*" >>"$MUSTER_FAKE/sacct.log"
cat "$MUSTER_FAKE/sacct.out" 2>/dev/null
SH
for c in scontrol scancel; do printf '#!/bin/sh\necho "$*" >>"$MUSTER_FAKE/%s.log"\nexit 0\n' "$c" >"$bin/$c"; done
printf '#!/bin/sh\nexit 0\n' >"$bin/sinfo"
# (sbatch runs with the job's environment only: the fakes know $fake by heart)
sed -i "s|\$MUSTER_FAKE|$fake|g; s|^python3 |/usr/bin/python3 |" "$bin"/*
chmod +x "$bin"/*
export PATH=$bin:$PATH
echo '{"jobs": []}' >"$fake/queue.json"
echo 100 >"$fake/next_id"

. "$(dirname "$0")/lib.sh" # check, wait_for, field (m is this test's own, below)
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
m() { MUSTER_URL=http://127.0.0.1:$port MUSTER_TOKEN="$(cat "$tmp/state/token")" "$build/muster" "$@"; }
show() { m show --json "$1" 2>/dev/null | field "$2"; }
is() { [ "$(show "$1" "$2")" = "$3" ]; }
failure_has() { show "$1" failure | grep -qF -- "$2"; }
settled() { [ "$(show "$1" attempt)" != 1 ] || is "$1" status failed; }
not_failed() { is "$1" status scheduling || is "$1" status starting; }
start_controller() {
  "$build/muster-controller" --backend slurm --listen "127.0.0.1:$port" \
    --state-dir "$tmp/state" --workdir "$tmp" --start-timeout 600 >>"$tmp/controller.log" 2>&1 &
  ctl_pid=$!
  wait_for 60 "the controller to answer" curl -sf "http://127.0.0.1:$port/api/v1/health"
}
stop_controller() { kill -9 "$ctl_pid"; wait "$ctl_pid" 2>/dev/null; ctl_pid=; }

# scenario SQUEUE: run, ended: a worker whose job ran (starting, its job id
# recorded) and ended while the controller was down, then left squeue;
# never: a worker whose sbatch had not answered when the controller was
# killed. The restart finds squeue readable, or not (down) until it is up.
scenario() {
  local how=$1
  rm -rf "$tmp/state" "$fake"/{squeue_down,sbatch_wait,sacct.log,sacct.out,sbatch.log}
  echo '{"jobs": []}' >"$fake/queue.json"
  start_controller || return 1
  ran=$(m launch -n 1 --cpu 0.5 --memory 0.25)
  wait_for 30 "$ran to start in its Slurm job" is "$ran" status starting
  ranjob=$(show "$ran" backend_ref)
  touch "$fake/sbatch_wait"
  never=$(m launch -n 1 --cpu 0.5 --memory 0.25)
  wait_for 30 "sbatch of $never to be running" test -s "$fake/sbatch.pid"
  stop_controller
  kill "$(cat "$fake/sbatch.pid")" 2>/dev/null
  rm -f "$fake/sbatch_wait" "$fake/sbatch.pid"
  # While the controller was down, the job of $ran was cancelled and left
  # squeue; Slurm's accounting remembers it.
  echo '{"jobs": []}' >"$fake/queue.json"
  echo "$ranjob|CANCELLED by 0|n1|0:15" >"$fake/sacct.out"
  [ "$how" = down ] && touch "$fake/squeue_down"
  start_controller || return 1
  rm -f "$fake/squeue_down"
  wait_for 30 "$never to leave attempt 1" settled "$never"
  check "squeue $how at the restart: a worker whose job was never queued is submitted again as attempt 2" \
    is "$never" attempt 2 || echo "#   $never: $(m show --json "$never")"
  check "...and not failed (it is scheduling or starting)" not_failed "$never"
  # (the attempt is recorded before its sbatch runs: wait for that, too)
  wait_for 30 "sbatch to be given $never's attempt 2" grep -q "$never:2" "$fake/sbatch.log"
  check "...its new attempt was given to sbatch" grep -q "$never:2" "$fake/sbatch.log"
  wait_for 30 "$ran to fail" is "$ran" status failed
  check "squeue $how at the restart: a worker whose job ended unseen fails with sacct's account" \
    failure_has "$ran" 'cancelled outside muster (Slurm: CANCELLED)' ||
    echo "#   $ran: $(show "$ran" failure)"
  check "...sacct was asked about its job $ranjob" grep -q -- "--jobs $ranjob" "$fake/sacct.log"
  stop_controller
}

# A worker stopped while a restart had not matched it with its job (squeue
# down): once the queue is read, its job (held, never released by the
# controller that died) is cancelled, not adopted and released.
stopped_unmatched() {
  rm -rf "$tmp/state" "$fake"/{squeue_down,sbatch_wait,sacct.log,sacct.out,sbatch.log,scancel.log,scontrol.log}
  echo '{"jobs": []}' >"$fake/queue.json"
  start_controller || return 1
  held=$(m launch -n 1 --cpu 0.5 --memory 0.25)
  wait_for 30 "$held to start in its Slurm job" is "$held" status starting
  heldjob=$(show "$held" backend_ref)
  stop_controller
  # The controller died before it released the job: it is still held.
  python3 - "$fake/queue.json" <<'PY'
import json, sys
q = json.load(open(sys.argv[1]))
for j in q["jobs"]:
    j["job_state"], j["state_reason"] = "PENDING", "JobHeldUser"
json.dump(q, open(sys.argv[1], "w"))
PY
  rm -f "$fake/scontrol.log" "$fake/scancel.log"
  touch "$fake/squeue_down"
  start_controller || return 1
  m stop "$held" >/dev/null
  check "a worker stopped before the restart matched it is stopped" is "$held" status stopped
  rm -f "$fake/squeue_down"
  wait_for 30 "scancel of job $heldjob" grep -q "$heldjob" "$fake/scancel.log"
  check "...and once squeue answers, its held job $heldjob is cancelled" grep -q "$heldjob" "$fake/scancel.log"
  check "...never released" bash -c "! grep -q 'release $heldjob' '$fake/scontrol.log' 2>/dev/null"
  stop_controller
}

stopped_unmatched || { echo "not ok - the stopped-while-unmatched scenario ran to its end"; fail=$((fail + 1)); }
[ -n "$ctl_pid" ] && stop_controller

for how in up down; do
  scenario "$how" || { echo "not ok - the scenario with squeue $how ran to its end"; fail=$((fail + 1)); }
  [ -n "$ctl_pid" ] && stop_controller
done

if grep -q 'ERROR: AddressSanitizer\|runtime error' "$tmp/controller.log"; then
  echo "not ok - the controller's log has a sanitizer report"
  fail=$((fail + 1))
fi
echo "$pass passed, $fail failed"
[ $fail -eq 0 ]
