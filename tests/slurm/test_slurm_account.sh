#!/usr/bin/env bash
# A worker's code never runs as root on Slurm, no step of a job can take
# another's identity, and two users' jobs run as their two accounts, on
# the real test cluster
# (tests/slurm/cluster.sh) with a root controller and its default account
# (muster-worker, scripts/setup.sh):
#   - `id -u` in a worker is the account's, not 0;
#   - a worker's script that looks for tokens everywhere a step of its job
#     can look (every /proc/PID/environ, the memory of every process of its
#     account, `scontrol write batch_script`, its own environment) and
#     tries each one it finds on its sibling (register, heartbeat, and the
#     job's claim), gets nowhere; the sibling runs to its end;
#   - a job's claim whose answer was lost (its controller crashed after
#     committing it) is made again, and its worker runs.
#
# usage: tests/slurm/test_slurm_account.sh BUILD_DIR   (as root; ctest runs it)
set -uo pipefail
build=$(cd "${1:?usage: test_slurm_account.sh BUILD_DIR}" && pwd)
if [ "$(id -u)" -ne 0 ] || ! command -v slurmctld >/dev/null; then
  echo "skipped: the Slurm test cluster needs root and slurm-wlm (scripts/setup.sh)"
  exit 77
fi
account=muster-worker
if ! id -u "$account" >/dev/null 2>&1; then
  echo "skipped: there is no account $account (scripts/setup.sh makes it)"
  exit 77
fi
here=$(cd "$(dirname "$0")" && pwd)
cluster=$here/cluster.sh
export ASAN_OPTIONS=${ASAN_OPTIONS:-}:detect_leaks=0
# A cluster of this test's own (its own address range: it may run beside
# test_slurm.sh's), torn down whatever happens.
export MUSTER_SLURM_PREFIX=msa$$
export MUSTER_SLURM_DIR=/tmp/muster-slurm-acct-$$
export MUSTER_SLURM_NET=${MUSTER_SLURM_ACCOUNT_NET:-10.79.0}
net=$MUSTER_SLURM_NET
tmp=$(mktemp -d /tmp/muster-slurm-acct.XXXXXX)
chmod 755 "$tmp"
ctl_pid=
pass=0 fail=0

. "$here/lib.sh"
trap cluster_cleanup EXIT
trap 'exit 130' INT TERM

bash "$cluster" up >"$tmp/up.log" 2>&1 || { cat "$tmp/up.log"; echo "not ok - the Slurm cluster came up"; exit 1; }
# ctl_up [FAULTS]: starts the test's controller (MUSTER_FAULT=FAULTS when
# given) and waits until it answers; its pid in ctl_pid.
ctl_up() {
  MUSTER_FAULT=${1:-} bash "$cluster" exec "$build/muster-controller" --backend slurm \
    --listen 0.0.0.0:8470 --advertise-url "http://$net.1:8470" --state-dir "$tmp/state" \
    --workdir "$tmp" --start-timeout 60 >>"$tmp/controller.log" 2>&1 &
  ctl_pid=$!
  wait_for 20 "the controller to answer" login curl -sf http://127.0.0.1:8470/api/v1/health ||
    { tail -20 "$tmp/controller.log"; exit 1; }
}
# ctl_down: ends it (SIGTERM), or reaps it if it is gone.
ctl_down() {
  kill -TERM "$ctl_pid" 2>/dev/null
  wait "$ctl_pid" 2>/dev/null
}

ctl_up

# --- a worker's code runs as the account, never as root: its command, its
# step's muster-workerd (the command's parent) and its Slurm job
uid=$(id -u "$account")
wid=$(m launch --cpu 1 --memory 0.25 --no-path -- /bin/sh -c \
  'echo "uid=$(id -u) user=$(id -un)"; echo "home=$HOME/$USER/$LOGNAME"; echo "step=$(awk "/^Uid:/ {print \$2}" /proc/$PPID/status)"; squeue --noheader --format="job=%u" --jobs "$SLURM_JOB_ID"')
m await --timeout 90 "$wid" >/dev/null 2>&1
m logs "$wid" >"$tmp/id.out" 2>/dev/null
said=$(grep -o '^uid=.*' "$tmp/id.out" | head -1)
step=$(grep -o '^step=.*' "$tmp/id.out" | head -1)
job=$(grep -o '^job=.*' "$tmp/id.out" | head -1)
check "id -u in a worker is not 0 ($said)" bash -c "[[ '$said' == uid=* && '$said' != uid=0* ]]"
check "...it is $account's ($uid)" test "$said" = "uid=$uid user=$account"
check "its step's muster-workerd runs as $account too, not root ($step)" test "$step" = "step=$uid"
check "...in a Slurm job of $account's ($job)" test "$job" = "job=$account"
home=$(grep -o '^home=.*' "$tmp/id.out" | head -1)
ahome=$(getent passwd "$account" | cut -d: -f6)
check "its HOME, USER and LOGNAME are $account's, not root's ($home)" \
  test "$home" = "home=$ahome/$account/$account"

# --- two users' workers run as their two unix accounts (user add
# --unix-user), as Slurm runs a job as its owner: their code, their jobs in
# squeue and, where the cluster keeps accounting, in sacct -u
if id -u muster-test-u1 >/dev/null 2>&1 && id -u muster-test-u2 >/dev/null 2>&1; then
  for u in 1 2; do
    "$build/muster-controller" user add "u$u" --unix-user "muster-test-u$u" \
      --state-dir "$tmp/state" >"$tmp/u$u.token" 2>>"$tmp/users.err"
  done
  declare -A ujob
  for u in 1 2; do
    wid=$(login env MUSTER_URL=http://127.0.0.1:8470 MUSTER_TOKEN="$(cat "$tmp/u$u.token")" \
      "$build/muster" launch --cpu 1 --memory 0.25 --no-path -- /bin/sh -c \
      'echo "user=$(id -un) jobid=$SLURM_JOB_ID"; squeue --noheader --format="job=%u" --jobs "$SLURM_JOB_ID"')
    m await --timeout 90 "$wid" >/dev/null 2>&1
    m logs "$wid" >"$tmp/u$u.out" 2>/dev/null
    said=$(grep -o '^user=[^ ]*' "$tmp/u$u.out" | head -1)
    job=$(grep -o '^job=.*' "$tmp/u$u.out" | head -1)
    ujob[$u]=$(grep -o 'jobid=[0-9]*' "$tmp/u$u.out" | head -1 | cut -d= -f2)
    check "user u$u's worker runs as muster-test-u$u ($said)" test "$said" = "user=muster-test-u$u"
    check "...in a Slurm job of muster-test-u$u's ($job)" test "$job" = "job=muster-test-u$u"
    check "...its job's output in muster-test-u$u's own directory" \
      test "$(stat -c %U "$tmp/state-slurm-users/muster-test-u$u")" = "muster-test-u$u"
  done
  if grep -q '^AccountingStorageType=accounting_storage/slurmdbd' "$MUSTER_SLURM_DIR/etc/slurm/slurm.conf"; then
    for u in 1 2; do
      # (slurmdbd learns of an ended job a moment after it ends)
      wait_for 60 "sacct to list job ${ujob[$u]:-?} under muster-test-u$u" bash -c \
        "bash '$cluster' exec sacct -n -X -u muster-test-u$u --format=JobID%20 | grep -qw '${ujob[$u]:-none}'"
      check "sacct -u muster-test-u$u lists job ${ujob[$u]:-?}, and no other user's" bash -c \
        "[ \"\$(bash '$cluster' exec sacct -n -X -j '${ujob[$u]:-0}' --format=User%30 | tr -d ' ')\" = muster-test-u$u ]"
    done
  else
    echo "# skipped: sacct per user (this cluster has no accounting: slurmdbd or MariaDB missing)"
  fi
else
  echo "# skipped: two users' accounts (muster-test-u1 and muster-test-u2 come from scripts/test.sh)"
fi

# --- muster-workerd is non-dumpable from exec for the account: root-owned,
# mode 0711, so no process of the account opens a launcher's or a
# workerd's /proc environ before its first line; a readable copy refuses a
# root controller's job rather than run dumpable
check "muster-workerd is root-owned, mode 0711 ($(stat -c '%U %a' "$build/muster-workerd"))" \
  test "$(stat -c '%u %a' "$build/muster-workerd")" = "0 711"
cp "$build/muster-workerd" "$tmp/wd-readable" && chmod 755 "$tmp/wd-readable"
job_env=(env MUSTER_JOB_ACCOUNT=$account MUSTER_JOB_SECRET=x MUSTER_CONTROLLER_URL=http://127.0.0.1:9)
runuser -u "$account" -- "${job_env[@]}" "$tmp/wd-readable" --job /dev/null >"$tmp/readable.out" 2>&1
check "a muster-workerd $account can read refuses a root controller's job" \
  grep -q "readable by $account.*started dumpable" "$tmp/readable.out"
runuser -u "$account" -- "${job_env[@]}" "$build/muster-workerd" --job /dev/null >"$tmp/built.out" 2>&1
check "...the built one (0711) starts non-dumpable and goes on" \
  bash -c "! grep -q dumpable '$tmp/built.out' && grep -q 'names no worker' '$tmp/built.out'"

# --- a token that reached another process is noticed: root stands in for
# a process of the account that read a step's token from its srun (the
# memory, or the stdin pipe, of a dumpable process of the account; root
# finds it in the launcher's memory, which keeps it while the step runs)
# and registers with it after the real workerd did. The worker fails, saying
# so, rather than answering the intruder or ignoring it.
victim=$(m launch --cpu 1 --memory 0.25 --no-path -- sleep 60)
wait_for 60 "$victim to run" bash -c "bash '$cluster' exec env MUSTER_URL=http://127.0.0.1:8470 MUSTER_TOKEN=$(cat "$tmp/state/token") '$build/muster' show --json '$victim' | grep -q '\"running\"'"
python3 - "$victim" >"$tmp/intruder.out" 2>&1 <<'PY'
import glob, re, sys
victim = sys.argv[1]
found = set()
for d in glob.glob("/proc/[0-9]*"):
    try:
        cmd = open(d + "/cmdline", "rb").read().split(b"\0")
        step = cmd[0].endswith(b"srun") and victim.encode() in cmd
        launcher = b"--job" in cmd and any(a.endswith(b"muster-workerd") for a in cmd)
        if not step and not launcher:
            continue
        with open(d + "/maps") as maps, open(d + "/mem", "rb", 0) as mem:
            for line in maps:
                rng, perms = line.split()[:2]
                if "r" not in perms or "w" not in perms:
                    continue
                a, b = (int(x, 16) for x in rng.split("-"))
                # The first 64 MiB of each mapping, a MiB at a time (with
                # a tail so that no token is cut): AddressSanitizer's shadow
                # is terabytes of rw mappings, and its reserve may sit right
                # after the data a token lives in
                for at in range(a, min(b, a + (64 << 20)), 1 << 20):
                    try:
                        mem.seek(at)
                        chunk = mem.read(min((1 << 20) + 64, b - at))
                    except (OSError, ValueError, OverflowError, MemoryError):
                        continue
                    found.update(re.findall(rb"(?<![0-9a-f])[0-9a-f]{48}(?![0-9a-f])", chunk))
    except OSError:
        pass
print("candidates: %d" % len(found))
for h in sorted(found):
    print(h.decode())
PY
grep '^candidates' "$tmp/intruder.out" | sed 's/^/# srun memory: /'
for t in $(tail -n +2 "$tmp/intruder.out"); do
  login curl -s -o /dev/null -X POST -H "Authorization: Bearer $t" -H 'Content-Type: application/json' \
    -d '{"ip_address": "127.0.0.1", "pid": 4242, "attempt": 1, "rotate": true}' \
    "http://127.0.0.1:8470/api/v1/workers/$victim/register"
done
m show --json "$victim" >"$tmp/victim.json" 2>/dev/null
check "a second registrant with its step's token fails the worker, saying so" \
  grep -q 'two processes registered as worker' "$tmp/victim.json"

# --- a step cannot take its sibling's identity. The thief looks for
# secrets wherever a step of its job can, then tries each on its sibling.
cat >"$tmp/thief.py" <<'PY'
import glob, json, os, re, subprocess, sys, time, urllib.request

me = os.environ["MUSTER_WORKER_ID"]
url = os.environ["MUSTER_CONTROLLER_URL"]
job = os.environ.get("SLURM_JOB_ID", "")
hexes = re.compile(rb"(?<![0-9a-f])[0-9a-f]{48}(?![0-9a-f])|(?<![0-9a-f])[0-9a-f]{64}(?![0-9a-f])")
found, where = set(), {}

def take(blob, place):
    for h in hexes.findall(blob):
        if h not in found:
            found.add(h)
            where[h] = place

# the sibling: the other step of this job
sibling = ""
for _ in range(100):
    out = subprocess.run(["squeue", "--steps", "--noheader", "--format=%j", "--jobs", job],
                         capture_output=True).stdout.decode()
    names = [n for n in out.split() if n.startswith("w-") and n != me]
    if names:
        sibling = names[0]
        break
    time.sleep(0.2)
print("sibling:", sibling or "none")
take(b"\0".join(k.encode() + b"=" + v.encode() for k, v in os.environ.items()), "own env")
readable_env = readable_mem = 0
for d in glob.glob("/proc/[0-9]*"):
    try:
        take(open(d + "/environ", "rb").read(), d + "/environ")
        readable_env += 1
    except OSError:
        pass
    try:
        if os.stat(d).st_uid != os.getuid() or int(d[6:]) == os.getpid():
            continue
        with open(d + "/maps") as maps, open(d + "/mem", "rb", 0) as mem:
            for line in maps:
                rng, perms = line.split()[:2]
                if "r" not in perms or "w" not in perms:
                    continue
                a, b = (int(x, 16) for x in rng.split("-"))
                if b - a > 64 << 20:
                    continue
                try:
                    mem.seek(a)
                    take(mem.read(b - a), d + "/mem")
                except (OSError, ValueError, OverflowError):
                    pass
        readable_mem += 1
    except (OSError, ValueError):
        pass
script = subprocess.run(["scontrol", "write", "batch_script", job, "-"], capture_output=True)
take(script.stdout, "batch_script")
print("read: %d environs, %d processes' memory, batch script %s; %d secrets found"
      % (readable_env, readable_mem, "read" if script.returncode == 0 else "refused", len(found)))

def call(path, tok, body):
    req = urllib.request.Request(url + path, data=json.dumps(body).encode(), method="POST",
                                 headers={"Authorization": "Bearer " + tok,
                                          "Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code
    except OSError:
        return 0

taken = 0
for h in sorted(found):
    tok = h.decode()
    codes = [call("/api/v1/workers/%s/register" % sibling, tok,
                  {"ip_address": "127.0.0.1", "pid": os.getpid(), "attempt": 1}),
             call("/api/v1/workers/%s/heartbeat" % sibling, tok, {}),
             call("/api/v1/workers/%s/claim" % me, tok,
                  {"workers": [{"id": me, "attempt": 1}, {"id": sibling, "attempt": 1}]}),
             call("/api/v1/workers/%s/claim" % sibling, tok,
                  {"workers": [{"id": sibling, "attempt": 1}, {"id": me, "attempt": 1}]})]
    if any(c not in (401, 403, 0) for c in codes):
        taken += 1
        print("TAKEN with a secret from %s: %s" % (where[h], codes))
print("secrets that worked as the sibling's: %d" % taken)
PY
chmod 644 "$tmp/thief.py"
# Two workers of one gang (one Slurm job), a core each: the nodes have
# two, so both steps share a node with the job's first process. The first
# is the thief.
mapfile -t pair < <(login curl -s -X POST -H "Authorization: Bearer $(cat "$tmp/state/token")" -H 'Content-Type: application/json' \
  -d "{\"groups\": [{\"n\": 1, \"cpu\": 1, \"memory\": 0.25, \"role\": \"thief\", \"command\": [\"/usr/bin/python3\", \"$tmp/thief.py\"]}, {\"n\": 1, \"cpu\": 1, \"memory\": 0.25, \"role\": \"sibling\", \"command\": [\"/bin/sh\", \"-c\", \"sleep 25; echo sibling-ran-to-its-end\"]}]}" \
  http://127.0.0.1:8470/api/v1/workers | python3 -c 'import json,sys; [print(w["id"]) for w in json.load(sys.stdin)["workers"]]')
check "a gang of a thief and its sibling was launched (one Slurm job)" test ${#pair[@]} -eq 2
thief=${pair[0]:-none} sib=${pair[1]:-none}
m await --timeout 120 "$thief" "$sib" >/dev/null 2>&1
m logs "$thief" >"$tmp/thief.out" 2>/dev/null
sed 's/^/#   thief: /' "$tmp/thief.out"
check "the thief found its sibling's step" grep -q "^sibling: $sib" "$tmp/thief.out"
check "...looked through /proc, the memory of its account's processes and the batch script" \
  grep -q '^read: [0-9]* environs, [0-9]* processes' "$tmp/thief.out"
check "...and no secret it found worked as its sibling's (register, heartbeat, the job's claim)" \
  grep -q '^secrets that worked as the sibling.s: 0$' "$tmp/thief.out"
check "the sibling ran to its end" bash -c "[ \"\$(bash '$cluster' exec env MUSTER_URL=http://127.0.0.1:8470 MUSTER_TOKEN=$(cat "$tmp/state/token") '$build/muster' show --json '$sib' | python3 -c 'import json,sys; print(json.load(sys.stdin)[\"status\"])')\" = succeeded ]"
check "...its output in its log" bash -c "bash '$cluster' exec env MUSTER_URL=http://127.0.0.1:8470 MUSTER_TOKEN=$(cat "$tmp/state/token") '$build/muster' logs '$sib' | grep -q sibling-ran-to-its-end"

# --- a process that registers first with a step's token and keeps it (no
# trade) is no workerd of this job: the worker fails, saying so. Played by
# a workerd told to keep its token (the fault point register_keeps_token,
# which every workerd of this controller's jobs gets).
ctl_down
ctl_up register_keeps_token:fail=1
kept=$(m launch --cpu 1 --memory 0.25 --no-path -- sleep 30)
m await --timeout 90 "$kept" >/dev/null 2>&1
why=$(m show --json "$kept" 2>/dev/null | python3 -c 'import json,sys; w=json.load(sys.stdin); print(w["status"], w.get("failure") or "")' 2>/dev/null)
check "a register that keeps its step's token fails the worker, saying so ($why)" \
  bash -c "[[ '${why//\'/}' == failed*without\ trading\ the\ token* ]]"

# --- a claim whose answer was lost is made again, and gets the same
# tokens: the controller dies (the fault point claim_committed, abort)
# after it committed the claim of a job of two workers, before answering;
# the job's launcher makes the claim again of the restarted controller,
# and both workers run to their end. (The secret was dead once claimed:
# the launcher was refused, and the workers failed at their start timeout.)
ctl_down
ctl_up claim_committed:abort
mapfile -t gang < <(login curl -s -m 30 -X POST -H "Authorization: Bearer $(cat "$tmp/state/token")" \
  -H 'Content-Type: application/json' -d '{"groups": [{"n": 1, "cpu": 1, "memory": 0.25, "role": "first", "command": ["/bin/echo", "ran-after-its-claim-was-made-again"]}, {"n": 1, "cpu": 1, "memory": 0.25, "role": "second", "command": ["/bin/echo", "second-ran"]}]}' \
  http://127.0.0.1:8470/api/v1/workers | python3 -c 'import json,sys; [print(w["id"]) for w in json.load(sys.stdin)["workers"]]')
again=${gang[0]:-none} second=${gang[1]:-none}
wait_for 90 "the controller to die after committing the job's claim" \
  grep -q 'fault injection: claim_committed: killed' "$tmp/controller.log"
check "the controller died after committing the claim of a job of two workers, before answering it" \
  grep -q 'fault injection: claim_committed: killed' "$tmp/controller.log"
# A thief who read the job's secret (here from slurmctld's saved state,
# root's alone) and claims while the launcher is held (SIGSTOP) gets
# nothing: the claim made again needs the launcher's own key. (Had any
# claim with the secret been taken again, one naming only the worker not
# yet registered would have given its token away.) The launcher is this
# cluster's: its job's id, and its controller's address.
jobid=$(login squeue --noheader --format='%i %k' | awk -v w="$again" 'index($2, w) {print $1; exit}')
secret=$(cat "$MUSTER_SLURM_DIR"/state/hash.*/job."${jobid:-none}"/environment 2>/dev/null |
  tr '\0' '\n' | sed -n 's/^MUSTER_JOB_SECRET=\([0-9a-f]*\)$/\1/p' | head -1)
launcher=$(python3 - "${jobid:-none}" "http://$net.1:8470" <<'PY'
import os, sys
want = {("SLURM_JOB_ID=%s" % sys.argv[1]).encode(), ("MUSTER_CONTROLLER_URL=%s" % sys.argv[2]).encode()}
found = []
for p in os.listdir("/proc"):
    try:
        cmd = open("/proc/%s/cmdline" % p, "rb").read().split(b"\0")
        env = set(open("/proc/%s/environ" % p, "rb").read().split(b"\0"))
    except OSError:
        continue
    if any(c.endswith(b"muster-workerd") for c in cmd) and b"--job" in cmd and want <= env:
        found.append(p)
print(found[0] if len(found) == 1 else "")
PY
)
check "the thief has the job's secret and its launcher is found (job ${jobid:-none}, pid ${launcher:-none})" \
  test -n "$secret" -a -n "$launcher"
if [ -n "$launcher" ]; then
  kill -STOP "$launcher"
  trap 'kill -CONT "$launcher" 2>/dev/null; cluster_cleanup' EXIT
fi
ctl_down
ctl_up
thief_claim() { # thief_claim ID BODY: the HTTP status of a claim on worker ID's path
  login curl -s -m 10 -o /dev/null -w '%{http_code}' -X POST -H "Authorization: Bearer $secret" \
    -H 'Content-Type: application/json' -d "$2" "http://127.0.0.1:8470/api/v1/workers/$1/claim"
}
key=$(printf '7%.0s' $(seq 64))
code=$(thief_claim "$second" "{\"workers\": [{\"id\": \"$second\", \"attempt\": 1}]}")
check "...its claim of the second worker alone, with no key, is refused ($code)" test "$code" = 403
code=$(thief_claim "$second" "{\"workers\": [{\"id\": \"$second\", \"attempt\": 1}], \"claim_key\": \"$key\"}")
check "...and with a key of its own ($code)" test "$code" = 403
code=$(thief_claim "$again" "{\"workers\": [{\"id\": \"$again\", \"attempt\": 1}, {\"id\": \"$second\", \"attempt\": 1}], \"claim_key\": \"$key\"}")
check "...and so is its claim of both ($code)" test "$code" = 403
if [ -n "$launcher" ]; then
  kill -CONT "$launcher"
  trap cluster_cleanup EXIT
fi
m await --timeout 90 "$again" "$second" >/dev/null 2>&1
how=$(m show --json "$again" 2>/dev/null | python3 -c 'import json,sys; w=json.load(sys.stdin); print(w["status"], w.get("failure") or "")' 2>/dev/null)
check "...its job made the claim again and its first worker ran to its end ($how)" \
  bash -c "[[ '${how//\'/}' == succeeded* ]]"
how=$(m show --json "$second" 2>/dev/null | python3 -c 'import json,sys; w=json.load(sys.stdin); print(w["status"], w.get("failure") or "")' 2>/dev/null)
check "...and its second ($how)" bash -c "[[ '${how//\'/}' == succeeded* ]]"
check "...the first's output in its log" bash -c "bash '$cluster' exec env MUSTER_URL=http://127.0.0.1:8470 MUSTER_TOKEN=$(cat "$tmp/state/token") '$build/muster' logs '$again' | grep -q ran-after-its-claim-was-made-again"
check "...the restarted controller says it answered the same claim again" \
  grep -q "$again: its job claimed the tokens of 2 workers again" "$tmp/controller.log"

if grep -q 'ERROR: AddressSanitizer\|runtime error' "$tmp/controller.log"; then
  echo "not ok - the controller's log has a sanitizer report"
  fail=$((fail + 1))
fi
echo "$pass passed, $fail failed"
[ $fail -eq 0 ]
