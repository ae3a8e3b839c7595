#!/usr/bin/env bash
# muster's slurm backend on a real multi-node Slurm cluster: three slurmd
# nodes, each in its own network namespace with its own address and
# hostname (tests/slurm/cluster.sh), and the controller on the login node,
# as a user would run it. Checks what a user sees: workers on the nodes'
# addresses, Slurm's queue reason while a launch waits, refusals naming the
# field, stops that end steps and jobs, Slurm's ends as sentences, adoption
# after a controller restart, and a 503 when Slurm is down.
#
# usage: tests/slurm/test_slurm.sh BUILD_DIR   (as root; ctest runs it)
set -uo pipefail
build=$(cd "${1:?usage: test_slurm.sh BUILD_DIR}" && pwd)
# Network namespaces and munge need root, and Slurm must be installed
# (scripts/setup.sh does it): elsewhere this test says why and skips (77).
if [ "$(id -u)" -ne 0 ] || ! command -v slurmctld >/dev/null; then
  echo "skipped: the Slurm test cluster needs root and slurm-wlm (scripts/setup.sh)"
  exit 77
fi
here=$(cd "$(dirname "$0")" && pwd)
cluster=$here/cluster.sh

# In a sanitized build, Open MPI's unloaded plugins leave leaks that cannot
# be suppressed by name (see tests/trainer/test_trainer.sh): the processes
# of this test, MPI ranks included, run without leak detection, as in
# tests/run. The controller's and workerd's leaks are checked by check_api
# and check_sdk; this test still fails on any other sanitizer report in the
# controller's log.
export ASAN_OPTIONS=${ASAN_OPTIONS:-}:detect_leaks=0

# A cluster of this test's own, torn down whatever happens.
export MUSTER_SLURM_PREFIX=msb$$
export MUSTER_SLURM_DIR=/tmp/muster-slurm-test-$$
net=${MUSTER_SLURM_NET:-10.78.0}
tmp=$(mktemp -d /tmp/muster-slurm-ctl.XXXXXX)
chmod 755 "$tmp"
# (workers run as muster-worker, the root controller's account: what they
# write goes here)
mkdir -m 1777 "$tmp/shared"
ctl_pid=
pass=0 fail=0

. "$here/lib.sh"
trap cluster_cleanup EXIT
trap 'exit 130' INT TERM

api() { # api METHOD PATH [BODY]: prints the body, then the status on a line
  login curl -s -X "$1" -H "Authorization: Bearer $(cat "$tmp/state/token")" \
    -H 'Content-Type: application/json' ${3:+-d "$3"} -w '\n%{http_code}\n' \
    "http://127.0.0.1:8470$2"
}
status_of() { m show --json "$1" 2>/dev/null | field status; }
is_status() { [ "$(status_of "$1")" = "$2" ]; }
le() { python3 -c 'import sys; sys.exit(0 if float(sys.argv[1]) <= float(sys.argv[2]) else 1)' "$1" "$2"; }
ge() { python3 -c 'import sys; sys.exit(0 if float(sys.argv[1]) >= float(sys.argv[2]) else 1)' "$1" "$2"; }
near() { # near A B TOLERANCE: |A - B| <= TOLERANCE
  python3 -c 'import sys; a, b, t = map(float, sys.argv[1:]); sys.exit(0 if abs(a - b) <= t else 1)' "$@"
}
last_json() { grep -o '{"mode".*}' "$1" | tail -1; }
json_field() { python3 -c 'import json,sys; print(json.loads(sys.argv[1])[sys.argv[2]])' "$1" "$2"; }
max_diff() { # max_diff A.bin B.bin: the largest difference of two float32 dumps
  python3 - "$1" "$2" 2>/dev/null <<'PY'
import array, sys
a = array.array('f'); a.frombytes(open(sys.argv[1], 'rb').read())
b = array.array('f'); b.frombytes(open(sys.argv[2], 'rb').read())
print(max(abs(x - y) for x, y in zip(a, b)) if len(a) == len(b) and a else 1e9)
PY
}
failure_has() { m show --json "$1" | field failure | grep -qF -- "$2"; }

start_controller() { # [more controller options]
  # Not through login(): $! must be the controller itself (cluster.sh exec
  # execs into it), not a subshell around it.
  bash "$cluster" exec "$build/muster-controller" --backend slurm --listen 0.0.0.0:8470 \
    --advertise-url "http://$net.1:8470" --state-dir "$tmp/state" --workdir "$tmp" \
    --start-timeout 30 "$@" >>"$tmp/controller.log" 2>&1 &
  ctl_pid=$!
  wait_for 20 "the controller to answer" login curl -sf http://127.0.0.1:8470/api/v1/health
}

bash "$cluster" up >"$tmp/up.log" 2>&1 || { cat "$tmp/up.log"; echo "not ok - the Slurm cluster came up"; exit 1; }
start_controller || { tail -20 "$tmp/controller.log"; exit 1; }

# --- a launch runs on the nodes, each worker at its node's address
mapfile -t ids < <(m launch -n 3 --cpu 0.5 --memory 0.25)
check "muster launch -n 3 printed 3 worker ids" test ${#ids[@]} -eq 3
m await --running --timeout 60 "${ids[@]}" >/dev/null
for id in "${ids[@]}"; do
  ip=$(m show --json "$id" | field ip_address)
  host=$(m show --json "$id" | field hostname)
  check "$id runs at a node's own address ($ip), not loopback" bash -c "[[ '$ip' == $net.1[0-9] ]]"
  check "...with its node's hostname ($host)" bash -c "[[ '$host' == n[1-3] ]]"
done
job=$(login squeue --noheader --format='%i %k' | awk -v id="${ids[0]}" 'index($2, id) {print $1}')
check "the launch is one Slurm job (job $job) whose comment names its three workers" \
  bash -c "[ \"\$(wc -w <<<'$job')\" = 1 ] && bash '$cluster' exec squeue --noheader --format=%k --jobs='$job' | grep -q '${ids[0]}:1' && bash '$cluster' exec squeue --noheader --format=%k --jobs='$job' | grep -q '${ids[1]}:1' && bash '$cluster' exec squeue --noheader --format=%k --jobs='$job' | grep -q '${ids[2]}:1'"
events() { login curl -s --max-time 2 -H "Authorization: Bearer $(cat "$tmp/state/token")" \
  "http://127.0.0.1:8470/api/v1/events?since=0"; }
events >"$tmp/events.txt"
check "the worker's events say how its 0.5 cores round in Slurm" \
  grep -q "\"worker_id\":\"${ids[0]}\".*submitted to the slurm backend's queue: 1 core per worker (0.5 asked; Slurm allocates whole cores), 256 MiB per core" "$tmp/events.txt"

# --- stopping one worker ends its step only; stopping the rest, the job
m stop "${ids[0]}" >/dev/null
wait_for 10 "the step of ${ids[0]} to end" \
  bash -c "! bash '$cluster' exec squeue --steps --noheader --format=%j --jobs='$job' | grep -q '${ids[0]}'"
check "a stopped worker's step ends" test $? -eq 0
check "...and the others run on" bash -c "[ \"\$(bash '$cluster' exec squeue --steps --noheader --format=%j --jobs='$job' | grep -c '^w-')\" = 2 ]"
check "...still running for muster" is_status "${ids[1]}" running
m stop "${ids[1]}" "${ids[2]}" >/dev/null
wait_for 10 "job $job to be cancelled" \
  bash -c "bash '$cluster' exec squeue -t all --noheader --format=%T --jobs='$job' | grep -q CANCELLED"
check "stopping every worker of a launch cancels its job" test $? -eq 0

# --- what Slurm can never run is refused at launch, naming the field
out=$(api POST /api/v1/workers '{"n": 1, "cpu": 3}')
check "a worker of 3 cores (no node has 3) is refused with 422" bash -c "[ '$(tail -1 <<<"$out")' = 422 ]"
check "...naming the field cpu and quoting Slurm" \
  bash -c "grep -q '\"field\": *\"cpu\"' <<<'$out' && grep -q 'Requested node configuration is not available' <<<'$out'"
out=$(api POST /api/v1/workers '{"n": 1, "cpu": 1, "memory": 5}')
check "a worker of 5 GiB (nodes have 2) is refused naming memory" \
  bash -c "[ '$(tail -1 <<<"$out")' = 422 ] && grep -q '\"field\": *\"memory\"' <<<'$out'"

# --- a wrong token is refused (401), and nothing is queued in Slurm
count_workers() { m ls -a --json | python3 -c 'import json,sys; print(len(json.load(sys.stdin)))'; }
queued_before=$(login squeue -t all --noheader --format=%i | wc -l)
workers_before=$(count_workers)
code=$(login curl -s -o /dev/null -w '%{http_code}' -X POST -H 'Authorization: Bearer not-the-token' \
  -H 'Content-Type: application/json' -d '{"n": 1, "cpu": 1}' http://127.0.0.1:8470/api/v1/workers)
check "a launch with a wrong token is refused with 401 ($code)" test "$code" = 401
check "...and records no worker" test "$(count_workers)" = "$workers_before"
# (and queues nothing in Slurm: checked below, once the backend's thread has
# taken a later launch, after which it would have submitted this one)

# --- a gang Slurm refuses at submission (four 2-core tasks; the partition
# has 6 cores in all, while one such task fits): failed with Slurm's words
mapfile -t gang < <(m launch -n 4 --cpu 2 --memory 0.25)
check "the gang's launch gave 4 worker ids" test "${#gang[@]}" -eq 4
# (each of the gang is reported on its own: wait for all of them)
for id in "${gang[@]}"; do wait_for 20 "$id of the gang to fail" is_status "$id" failed; done
check "the launch with a wrong token queued nothing in Slurm (the backend's thread has since submitted a later one)" \
  test "$(login squeue -t all --noheader --format=%i | wc -l)" = "$queued_before"
check "a gang Slurm refuses fails every worker of it, quoting Slurm" \
  bash -c "for id in ${gang[*]}; do bash '$cluster' exec env MUSTER_URL=http://127.0.0.1:8470 MUSTER_TOKEN=$(cat "$tmp/state/token") '$build/muster' show --json \$id | grep -q 'the backend refused it: .*processors' || exit 1; done"

# --- a launch that must wait is scheduling, with Slurm's reason
mapfile -t big < <(m launch -n 3 --cpu 2 --memory 0.5)
m await --running --timeout 60 --json "${big[@]}" >"$tmp/big.json"
check "three workers of 2 cores: await --running gives three node addresses and hostnames n1..n3" \
  python3 -c '
import json, re, sys
a = json.load(open(sys.argv[1]))
ws = a["workers"]
assert not a["failures"] and not a["timed_out"] and len(ws) == 3, a
assert sorted(w["hostname"] for w in ws) == ["n1", "n2", "n3"], ws
ips = {w["ip_address"] for w in ws}
assert len(ips) == 3 and all(re.fullmatch(re.escape(sys.argv[2]) + r"\.1\d", ip) for ip in ips), ips
' "$tmp/big.json" "$net" || sed 's/^/#   /' "$tmp/big.json"
small=$(m launch --cpu 1 --memory 0.25)
wait_for 15 "$small to show Slurm's reason" \
  bash -c "bash '$cluster' exec env MUSTER_URL=http://127.0.0.1:8470 MUSTER_TOKEN=$(cat "$tmp/state/token") '$build/muster' show --json '$small' | grep -q 'the Slurm queue: Resources'"
check "a launch Slurm cannot place now waits: scheduling, 'the Slurm queue: Resources'" test $? -eq 0
check "...its status is scheduling" is_status "$small" scheduling
m await --running --timeout 2 --json "$small" >"$tmp/small.json" 2>/dev/null
rc=$?
check "...and await --running --timeout 2 answers timed_out, listing it as scheduling (exit $rc)" \
  python3 -c '
import json, sys
a = json.load(open(sys.argv[1]))
assert a["timed_out"] is True and not a["workers"], a
assert [(w["id"], w["status"]) for w in a["failures"]] == [(sys.argv[2], "scheduling")], a
 ' "$tmp/small.json" "$small" || sed 's/^/#   /' "$tmp/small.json"
check "...exiting 1" test $rc -eq 1

# --- a controller restart adopts what Slurm still runs or queues
kill -9 "$ctl_pid"
wait "$ctl_pid" 2>/dev/null
# (any heartbeat recorded after this moment reached the restarted controller)
restarted_at=$(date -u +%Y-%m-%dT%H:%M:%S.%3NZ)
start_controller
# Re-attached, not only recorded as running: each workerd's heartbeats reach
# the restarted controller (every 2 s), and its exec channel still answers
# on its own node.
beats_again() {
  local id
  for id in "${big[@]}"; do
    [[ "$(m show --json "$id" | field last_heartbeat)" > "$restarted_at" ]] || return 1
  done
}
wait_for 15 "heartbeats of ${big[*]} after the restart" beats_again
check "after a kill -9 and restart, all three running workers re-attach (heartbeats after the restart)" \
  beats_again
answers_on_node() {
  local id host
  for id in "${big[@]}"; do
    host=$(m show --json "$id" | field hostname)
    [ "$(status_of "$id")" = running ] && [ -n "$host" ] &&
      [ "$(timeout 30 bash "$cluster" exec env MUSTER_URL=http://127.0.0.1:8470 \
        MUSTER_TOKEN="$(cat "$tmp/state/token")" "$build/muster" exec -n "$id" -- hostname)" = "$host" ] ||
      return 1
  done
}
check "...each still running, its exec channel answering on its node" answers_on_node
check "...and the queued one still scheduling" is_status "$small" scheduling
m stop "${big[@]}" >/dev/null
m await --running --timeout 60 "$small" >/dev/null
check "room freed in Slurm starts the queued worker" is_status "$small" running

# --- Slurm's ends become sentences
sjob=$(login squeue --noheader --format='%i %k' | awk -v id="$small" 'index($2, id) {print $1}' | head -1)
login scancel "$sjob"
wait_for 15 "$small to fail" is_status "$small" failed
check "a job cancelled outside muster fails its worker saying so" \
  bash -c "bash '$cluster' exec env MUSTER_URL=http://127.0.0.1:8470 MUSTER_TOKEN=$(cat "$tmp/state/token") '$build/muster' show --json '$small' | grep -q 'cancelled outside muster (Slurm: CANCELLED)'"

# --- a script runs on a node and its end is reported
sid=$(m launch --cpu 1 --memory 0.25 -- sh -c 'echo "on $(hostname)"; exit 3')
m await --timeout 60 --json "$sid" >"$tmp/sid.json" 2>/dev/null
check "a script's exit code comes back in await's failures (failed, exit 3)" \
  python3 -c '
import json, sys
f = json.load(open(sys.argv[1]))["failures"]
assert [(w["id"], w["status"], w["exit_code"]) for w in f] == [(sys.argv[2], "failed", 3)], f
' "$tmp/sid.json" "$sid"
check "...and its output, written on a node, is in its logs" \
  bash -c "bash '$cluster' exec env MUSTER_URL=http://127.0.0.1:8470 MUSTER_TOKEN=$(cat "$tmp/state/token") '$build/muster' logs '$sid' | grep -q 'on n[1-3]'"

# --- GPUs (the test cluster's nodes declare two each, backed by no
# device): a worker asking for one gets a node's GPU from Slurm; three are
# refused, naming the field
gid=$(m launch --cpu 1 --memory 0.25 --gpu 1 -- sh -c 'echo "gpus on node: $SLURM_GPUS_ON_NODE"')
m await --timeout 60 "$gid" >/dev/null
check "a worker of 1 GPU is given one by Slurm (SLURM_GPUS_ON_NODE=1)" \
  bash -c "bash '$cluster' exec env MUSTER_URL=http://127.0.0.1:8470 MUSTER_TOKEN=$(cat "$tmp/state/token") '$build/muster' logs '$gid' | grep -q 'gpus on node: 1'"
out=$(api POST /api/v1/workers '{"n": 1, "cpu": 1, "memory": 0.25, "nvidia_gpu": 3}')
check "a worker of 3 GPUs (nodes have 2) is refused with 422 naming nvidia_gpu" \
  bash -c "[ '$(tail -1 <<<"$out")' = 422 ] && grep -q '\"field\": *\"nvidia_gpu\"' <<<'$out'"

# --- a script past its memory: Slurm's cgroup kills it (where the host has
# the cgroup v1 memory controller, which tests/slurm/cluster.sh then gives
# each node), and the worker says why, with the limit it hit
if grep -q '^TaskPlugin=task/cgroup' "$MUSTER_SLURM_DIR/etc/slurm/slurm.conf"; then
  oid=$(m launch --cpu 1 --memory 0.25 -- python3 -c 'x = bytearray(600 << 20); import time; time.sleep(5)')
  wait_for 60 "$oid to fail" is_status "$oid" failed
  check "a script past its 0.25 GiB fails: 'killed: out of memory (limit 0.25 GiB)'" \
    failure_has "$oid" 'killed: out of memory (limit 0.25 GiB)' ||
    echo "#   $(m show --json "$oid" | field failure)"
else
  echo "ok - # SKIP out of memory: this host has no cgroup v1 memory controller, so the test cluster confines no memory"
fi

# --- muster run across the nodes (memory is enforced: a trainer holds MNIST,
# some 200 MB as floats): allreduce (one Open MPI daemon per node,
# ranks over TCP between them), and ps with PS and workers of different
# shapes as one heterogeneous job
train=$build/muster-train
# The same 60 steps at global batch 96 in one process, then over 3 ranks:
# the same steps to float rounding (muster-train's contract), so the same
# final loss and weights. (Every training here is bounded: a hang is a
# failure, exit 124.)
timeout 120 "$train" --steps 60 --batch 96 --quiet --dump-params "$tmp/single.bin" >"$tmp/single.out" 2>&1
timeout 300 bash "$cluster" exec env MUSTER_URL=http://127.0.0.1:8470 MUSTER_TOKEN="$(cat "$tmp/state/token")" \
  "$build/muster" run --mode allreduce --workers 3 --cpu 2 --memory 1 --session ar --timeout 60 -- \
  "$train" --mode allreduce --steps 60 --batch 96 --quiet --dump-params "$tmp/shared/ar.bin" >"$tmp/ar.out" 2>&1
rc=$?
check "muster run --mode allreduce on 3 nodes succeeds (exit $rc)" test $rc -eq 0 ||
  tail -20 "$tmp/ar.out" | sed 's/^/#   /'
check "...rank 0 reports 3 ranks and a test accuracy" grep -q '"ranks": 3,.*"test_accuracy"' "$tmp/ar.out"
hosts=$(m ls -a --session ar --json | python3 -c 'import json,sys; print(" ".join(sorted({w["hostname"] for w in json.load(sys.stdin)})))')
check "...its workers were on three nodes ($hosts)" test "$hosts" = "n1 n2 n3"
s1=$(last_json "$tmp/single.out") a=$(last_json "$tmp/ar.out")
ls1=$(json_field "$s1" final_loss 2>/dev/null || echo nan) la=$(json_field "$a" final_loss 2>/dev/null || echo nan)
check "...to the final loss of muster-train --mode single ($la vs $ls1, within 1e-4)" near "$la" "$ls1" 1e-4
d=$(max_diff "$tmp/single.bin" "$tmp/shared/ar.bin")
check "...and its weights (max difference ${d:-none} <= 1e-4)" le "${d:-1e9}" 1e-4

# PS 1 + 2 workers, --sync (--batch is the global batch: the PS sums the
# workers' halves), 2 epochs: the steps of --mode single to float rounding.
# Over 936 steps that rounding drifts the weights apart by some 1e-3 (the
# sums run in another order), and the final loss by some 1e-5: the loss must
# agree within 1e-3 (a PS that lost a worker's half of a batch, or a shard,
# ends far from it). And, with the same model and settings
# (layers, batch 128, SGD lr 0.1 momentum 0.9, cosine decay, 2 epochs),
# the test accuracy PyTorch reaches in one process. The two start from
# different random weights, so "reaches" allows 0.5 points.
timeout 120 "$train" --epochs 2 --quiet >"$tmp/single2.out" 2>&1
timeout 600 bash "$cluster" exec env MUSTER_URL=http://127.0.0.1:8470 MUSTER_TOKEN="$(cat "$tmp/state/token")" \
  "$build/muster" run --mode ps --ps 1 --ps-cpu 1 --ps-memory 1 --workers 2 --cpu 2 --memory 1 --session ps \
  --timeout 60 -- "$train" --mode ps --sync --epochs 2 --quiet >"$tmp/ps.out" 2>&1
rc=$?
check "muster run --mode ps with a 1-core PS and 2-core workers succeeds (exit $rc)" test $rc -eq 0 ||
  tail -20 "$tmp/ps.out" | sed 's/^/#   /'
p=$(last_json "$tmp/ps.out") s2=$(last_json "$tmp/single2.out")
lp=$(json_field "$p" final_loss 2>/dev/null || echo nan) ls2=$(json_field "$s2" final_loss 2>/dev/null || echo nan)
check "...to the final loss of muster-train --mode single ($lp vs $ls2, within 1e-3)" near "$lp" "$ls2" 1e-3
ps_acc=$(json_field "$p" test_accuracy 2>/dev/null || echo 0)
if /usr/bin/python3 -c 'import torch' 2>/dev/null; then
  data=$("$train" --help | sed -n 's/.*the four MNIST IDX files (default \(.*\))/\1/p')
  timeout 300 /usr/bin/python3 "$here/../../bench/torch_mlp.py" --data "$data" --epochs 2 \
    >"$tmp/torch.out" 2>"$tmp/torch.err"
  torch_acc=$(json_field "$(tail -1 "$tmp/torch.out")" test_accuracy 2>/dev/null || echo none)
  check "...and reaches PyTorch's test accuracy on MNIST ($ps_acc vs $torch_acc, within 0.005)" \
    python3 -c 'import sys; sys.exit(0 if float(sys.argv[1]) >= float(sys.argv[2]) - 0.005 else 1)' \
    "$ps_acc" "$torch_acc" || tail -3 "$tmp/torch.err" | sed 's/^/#   /'
else
  echo "ok - # SKIP PyTorch's accuracy: python3-torch is not installed (scripts/setup.sh installs it)"
fi
psid=$(m ls -a --session ps --role ps --json | python3 -c 'import json,sys; print(json.load(sys.stdin)[0]["id"])')
login squeue -t all --json >"$tmp/queue.json"
check "...as one heterogeneous Slurm job: two components, one comment naming all three" \
  python3 -c '
import json, sys
jobs = [j for j in json.load(open(sys.argv[1]))["jobs"] if sys.argv[2] in (j.get("comment") or "")]
leaders = {j["het_job_id"] for j in jobs}
assert len(jobs) == 2 and len(leaders) == 1 and 0 not in leaders, jobs
assert sorted(j["cpus"] for j in jobs) == [1, 4], [j["cpus"] for j in jobs]
' "$tmp/queue.json" "$psid"

# --- a workerd that cannot start on the node: the worker fails with srun's
# words, not after the start timeout
kill -9 "$ctl_pid"
wait "$ctl_pid" 2>/dev/null
printf '#!/nonexistent/sh\n' >"$tmp/broken-workerd"
chmod 711 "$tmp/broken-workerd" # root's, unreadable to the account, as a root controller asks
start_controller --workerd "$tmp/broken-workerd"
bid=$(m launch --cpu 1 --memory 0.25)
wait_for 40 "$bid to fail" is_status "$bid" failed
check "a workerd that cannot start on its node fails the worker within seconds, quoting Slurm" \
  bash -c "bash '$cluster' exec env MUSTER_URL=http://127.0.0.1:8470 MUSTER_TOKEN=$(cat "$tmp/state/token") '$build/muster' show --json '$bid' | grep -q 'error: execve().*No such file or directory'"

# --- a partition Slurm does not have: launches are refused with 422, in
# Slurm's words
kill -9 "$ctl_pid"
wait "$ctl_pid" 2>/dev/null
start_controller --slurm-partition nosuch
out=$(api POST /api/v1/workers '{"n": 1, "cpu": 1}')
check "with --slurm-partition nosuch, a launch is refused with 422 quoting Slurm" \
  bash -c "[ '$(tail -1 <<<"$out")' = 422 ] && grep -q 'Invalid partition name specified' <<<'$out'"

# --- a job's time limit (--slurm-arg passes sbatch options): the worker
# fails saying so, in Slurm's words (Slurm's shortest limit is a minute).
# Slurm shows why a job ended only once its processes are gone (until then
# squeue says COMPLETING), and workerd reports its SIGTERM before that: the
# controller waits for Slurm's account. The fault makes that account come 8 s
# late, past the 5 s a stop from outside otherwise waits for it.
late_account=slurm_after_ending:delay=8000
kill -9 "$ctl_pid"
wait "$ctl_pid" 2>/dev/null
MUSTER_FAULT=$late_account start_controller --slurm-arg --time=1
tid=$(m launch --cpu 1 --memory 0.25)
m await --running --timeout 60 "$tid" >/dev/null
wait_for 120 "$tid to hit its time limit" is_status "$tid" failed
check "a worker whose job hits its time limit fails: 'hit the job's time limit (Slurm: TIMEOUT)'" \
  bash -c "bash '$cluster' exec env MUSTER_URL=http://127.0.0.1:8470 MUSTER_TOKEN=$(cat "$tmp/state/token") '$build/muster' show --json '$tid' | grep -q \"hit the job's time limit (Slurm: TIMEOUT)\""

# --- a node that dies: Slurm fails the job (NODE_FAIL, after its
# SlurmdTimeout of 30 s) and every worker of the gang fails naming the node.
# muster's heartbeat timeout is set past that here; by default (15 s) it
# notices first and says "lost: no heartbeat".
kill -9 "$ctl_pid"
wait "$ctl_pid" 2>/dev/null
MUSTER_FAULT=$late_account start_controller --heartbeat-timeout 120
mapfile -t nf < <(m launch -n 3 --cpu 2 --memory 0.25)
m await --running --timeout 60 "${nf[@]}" >/dev/null
victim=$(m show --json "${nf[1]}" | field hostname)
# Everything on that node dies at once, as with a power cut (by pid: the
# processes of its network namespace).
kill -9 $(ip netns pids "$MUSTER_SLURM_PREFIX-$victim") 2>/dev/null
wait_for 120 "${nf[1]} to fail with its node" is_status "${nf[1]}" failed
for id in "${nf[@]}"; do wait_for 30 "$id of its gang to fail too" is_status "$id" failed; done
check "a node that dies fails its gang: 'node $victim failed (Slurm: NODE_FAIL)'" \
  bash -c "for id in ${nf[*]}; do bash '$cluster' exec env MUSTER_URL=http://127.0.0.1:8470 MUSTER_TOKEN=$(cat "$tmp/state/token") '$build/muster' show --json \$id | grep -q 'node $victim failed (Slurm: NODE_FAIL)' || exit 1; done" ||
  for id in "${nf[@]}"; do
    echo "#   $id: $(m show --json "$id" | python3 -c 'import json,sys; w=json.load(sys.stdin); print(w.get("status"), w.get("hostname"), w.get("failure"))')"
  done

# (whether squeue showed the job COMPLETING, so that the fault delayed
# Slurm's account: a poll may miss a short COMPLETING)
grep -q "Slurm job .* is ending (COMPLETING)" "$tmp/controller.log" ||
  echo "# note: no poll saw the dead node's job COMPLETING this time"

# --- Slurm down: 503 with Slurm's words, nothing recorded
before=$(m ls -a --json 2>/dev/null | python3 -c 'import json,sys; print(len(json.load(sys.stdin)))')
bash "$cluster" ctld stop >"$tmp/ctld.log" 2>&1 || { cat "$tmp/ctld.log"; echo "not ok - slurmctld stopped"; exit 1; }
out=$(api POST /api/v1/workers '{"n": 2, "cpu": 1}')
check "with slurmctld down, a launch gets 503 backend_unavailable" \
  bash -c "[ '$(tail -1 <<<"$out")' = 503 ] && grep -q backend_unavailable <<<'$out'"
check "...quoting Slurm's own words" bash -c "grep -Eq 'Slurm cannot be reached: [A-Za-z].{10,}' <<<'$out'"
after=$(m ls -a --json 2>/dev/null | python3 -c 'import json,sys; print(len(json.load(sys.stdin)))')
check "...and records no worker ($before before, $after after)" \
  bash -c "[ -n '$before' ] && [ '$before' = '$after' ]"

# --- Slurm gone after a launch was accepted (the fault holds the sbatch 3 s,
# and the test stops slurmctld meanwhile): the worker waits saying why, and
# its job is queued once Slurm is back. Once: the fault also loses the answer
# of the first sbatch that queues it, and the controller finds that job by its
# comment instead of queueing a second.
bash "$cluster" ctld start >"$tmp/ctld.log" 2>&1 || { cat "$tmp/ctld.log"; echo "not ok - slurmctld started again"; exit 1; }
kill -9 "$ctl_pid"
wait "$ctl_pid" 2>/dev/null
MUSTER_FAULT=slurm_before_submit:delay=3000,slurm_sbatch_answer_lost:fail=1 start_controller --retain 3
uid=$(m launch --cpu 1 --memory 0.25 2>"$tmp/launch.err")
bash "$cluster" ctld stop >"$tmp/ctld.log" 2>&1 || { cat "$tmp/ctld.log"; echo "not ok - slurmctld stopped"; exit 1; }
check "a launch while Slurm answers is accepted" test -n "$uid" || sed 's/^/#   /' "$tmp/launch.err"
waits_for_slurm() { m show --json "$uid" | field waiting_for | grep -q 'Slurm cannot be reached: .*Unable to contact'; }
wait_for 30 "$uid to wait for Slurm" waits_for_slurm
check "a worker accepted just before Slurm went away waits: 'Slurm cannot be reached: ...'" waits_for_slurm
check "...its status is scheduling" is_status "$uid" scheduling
bash "$cluster" ctld start >"$tmp/ctld.log" 2>&1 || { cat "$tmp/ctld.log"; echo "not ok - slurmctld started again"; exit 1; }
m await --running --timeout 90 "$uid" >/dev/null
check "...and runs once Slurm is back" is_status "$uid" running
# (the job was queued held: it runs only once the controller has found it
# and released it)
wait_for 30 "the controller to find the job of $uid" \
  grep -q 'was queued by an sbatch that could not answer' "$tmp/controller.log"
check "...in a job the controller found by its comment, after the answer of the sbatch that queued it was lost" \
  grep -q 'was queued by an sbatch that could not answer' "$tmp/controller.log"
check "...the only Slurm job of that worker" \
  bash -c "[ \$(bash '$cluster' exec squeue -t all --noheader --format=%k | grep -c '$uid') = 1 ]"
# A second job of the same launch (as an sbatch that answered too late would
# have queued) is cancelled before it starts anything.
ucomment=$(login squeue --noheader --format=%k | grep -F "$uid" | head -1)
copy=$(login sbatch --parsable --hold --comment "$ucomment" --wrap 'sleep 300')
copy_cancelled() { [ "$(login squeue -t all --noheader -j "$copy" --format=%T)" = CANCELLED ]; }
wait_for 15 "the copy (job $copy) to be cancelled" copy_cancelled
check "a second Slurm job with a launch's comment is cancelled (job $copy)" copy_cancelled
check "...and the worker runs on" is_status "$uid" running

# --- retention: with --retain 3, the output of every job that ended goes;
# the running job's stays
ujob=$(login squeue --noheader --format='%i %k' | awk -v id="$uid" 'index($2, id) {print $1}')
# (the jobs run as muster-worker: their output is in STATE-slurm, its own)
only_running_output() { [ "$(cd "$tmp/state-slurm" && ls -- *.out)" = "$ujob.out" ]; }
wait_for 15 "old Slurm job output to be removed" only_running_output
check "with --retain 3, ended jobs' output goes and the running job's ($ujob.out) stays" \
  only_running_output || ls "$tmp/state-slurm" | sed 's/^/#   /'

# --- a job that ended while the controller was down, longer ago than squeue
# remembers (MinJobAge, lowered to 2 s here): after the restart its worker
# fails with Slurm's account of the end, from sacct (the test cluster keeps
# accounting where slurmdbd and MariaDB are installed)
if [ -f "$MUSTER_SLURM_DIR/etc/slurm/slurmdbd.conf" ]; then
  kill -9 "$ctl_pid"
  wait "$ctl_pid" 2>/dev/null
  login scancel "$ujob"
  sed -i 's/^MinJobAge=.*/MinJobAge=2/' "$MUSTER_SLURM_DIR/etc/slurm/slurm.conf"
  login scontrol reconfigure
  # (the whole queue read without an error, and the job not in it)
  forgotten() {
    local all
    all=$(login squeue -t all --noheader --format=%i) && ! grep -qx "$ujob" <<<"$all"
  }
  # (slurmctld purges ended jobs older than MinJobAge in a pass every 60 s,
  # and a cancelled job first waits out COMPLETING: up to two passes)
  wait_for 180 "squeue to forget job $ujob" forgotten
  start_controller
  check "a worker whose job was cancelled while the controller was down, and left squeue, fails with sacct's account" \
    failure_has "$uid" 'cancelled outside muster (Slurm: CANCELLED)' ||
    echo "#   $(m show --json "$uid" | field failure)"
  check "...which the controller read from sacct" \
    grep -q "$uid: its Slurm job $ujob ended while the controller was down: .*(sacct)" "$tmp/controller.log"
else
  echo "ok - # SKIP sacct after a restart: the test cluster has no accounting (slurmdbd, MariaDB)"
fi

if grep -q 'ERROR: AddressSanitizer\|runtime error' "$tmp/controller.log"; then
  echo "not ok - the controller's log has a sanitizer report"
  grep -m5 'ERROR: AddressSanitizer\|runtime error' "$tmp/controller.log"
  fail=$((fail + 1))
fi
echo "$pass passed, $fail failed"
[ $fail -eq 0 ]
