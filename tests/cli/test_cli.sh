#!/usr/bin/env bash
# test_cli.sh: black-box tests of the `muster` command-line tool against a
# real controller and real workers.
#
#   tests/cli/test_cli.sh [BUILD_DIR]     (default /work/main/build)
#
# Starts its own controllers on free 127.0.0.1 ports with fresh state
# directories, checks what a user sees (stdout, stderr, exit codes), and
# cleans up everything it started (by pid / process group) on exit.
# Prints one `ok - ...` / `not ok - ...` line per check and at the end
# `N passed, M failed`; exits non-zero if any check failed.
# Needs: jq, curl, sqlite3 (optional, for cleanup), script (util-linux).
# shellcheck disable=SC2034,SC2209  # the checks read variables inside eval strings
set -u

BUILD=${1:-/work/main/build}
BUILD=$(cd "$BUILD" 2>/dev/null && pwd) || { echo "no build dir: ${1:-/work/main/build}" >&2; exit 2; }
MUSTER=$BUILD/muster
CONTROLLER=$BUILD/muster-controller
WORKERD=$BUILD/muster-workerd
for b in "$MUSTER" "$CONTROLLER" "$WORKERD"; do
  [ -x "$b" ] || { echo "missing $b (build first)" >&2; exit 2; }
done
for t in jq curl script timeout; do
  command -v "$t" >/dev/null || { echo "missing tool: $t" >&2; exit 2; }
done

unset MUSTER_URL MUSTER_TOKEN MUSTER_SESSION MUSTER_STATE_DIR
TMP=$(mktemp -d /var/tmp/muster-cli-test.XXXXXX)
chmod 755 "$TMP"  # workers' code runs as muster-worker, which must enter it
PASS=0
FAIL=0
CTL_PIDS=()   # controllers we started
CTL_DIRS=()   # their state directories
CTL_URL=""    # set by start_controller
CTL_PID=""

# ---- reporting ----

ok() { PASS=$((PASS + 1)); echo "ok - $1"; }
notok() {
  FAIL=$((FAIL + 1))
  echo "not ok - $1"
  shift
  for d in "$@"; do printf '#   %s\n' "$d"; done
}
# check NAME COMMAND...: ok if COMMAND succeeds.
check() {
  local name=$1
  shift
  if "$@"; then ok "$name"; else notok "$name" "rc=$RC" "stdout: $(head -c 600 <<<"$OUT")" "stderr: $(head -c 600 <<<"$ERR")"; fi
}

# run [timeout-seconds] CMD...: runs CMD with a bound, sets OUT, ERR, RC and
# MS (wall time in milliseconds).
OUT="" ERR="" RC=0 MS=0
run() {
  local lim=20
  if [[ $1 =~ ^[0-9]+$ ]]; then lim=$1; shift; fi
  local t0 t1
  t0=$(date +%s%N)
  timeout -k 2 "$lim" "$@" >"$TMP/out" 2>"$TMP/err"
  RC=$?
  t1=$(date +%s%N)
  MS=$(((t1 - t0) / 1000000))
  OUT=$(cat "$TMP/out")
  ERR=$(cat "$TMP/err")
}
m() { run "$MUSTER" "$@"; }

. "$(dirname "$0")/../lib/wait.sh"

has() { grep -q -- "$2" <<<"$1"; }       # has TEXT REGEX (basic regex)
hasE() { grep -qE -- "$2" <<<"$1"; }     # extended regex
nlines() { if [ -z "$1" ]; then echo 0; else wc -l <<<"$1"; fi; }

# ---- controllers ----

api() { # api STATEDIR METHOD PATH [BODY]
  local d=$1 url tok
  url=$(cat "$d/url" 2>/dev/null) || return 1
  tok=$(cat "$d/token" 2>/dev/null) || return 1
  if [ $# -ge 4 ]; then
    curl -s -m 5 -X "$2" -H "Authorization: Bearer $tok" -H 'Content-Type: application/json' -d "$4" "$url$3"
  else
    curl -s -m 5 -X "$2" -H "Authorization: Bearer $tok" "$url$3"
  fi
}

# start_controller NAME [extra options]: a controller on a free 127.0.0.1
# port (--listen 127.0.0.1:0: the kernel picks it; the controller writes the
# URL to its state dir) with a fresh state dir $TMP/NAME/state, on the host's
# network (--network host: several run at once; bridge mode is check_network's and
# tests/run's); sets CTL_URL
# and CTL_PID.
start_controller() {
  local name=$1 i
  shift
  local dir=$TMP/$name
  mkdir -p "$dir" "$TMP/$name-wd"
  "$CONTROLLER" --listen 127.0.0.1:0 --network host --state-dir "$dir/state" --workerd "$WORKERD" \
    --workdir "$TMP/$name-wd" "$@" >"$dir/controller.log" 2>&1 &
  CTL_PID=$!
  CTL_PIDS+=("$CTL_PID")
  CTL_DIRS+=("$dir/state")
  for i in $(seq 1 300); do # 30 s at most
    kill -0 "$CTL_PID" 2>/dev/null || break
    if [ -s "$dir/state/url" ] && [ -s "$dir/state/token" ] &&
      curl -sf -m 1 "$(cat "$dir/state/url")/api/v1/health" >/dev/null 2>&1; then
      CTL_URL=$(cat "$dir/state/url")
      [[ $CTL_URL =~ ^http://127\.0\.0\.1:[0-9]+$ ]] && return 0
    fi
    sleep 0.1
  done
  echo "could not start a controller; its log:" >&2
  sed 's/^/#   /' "$dir/controller.log" >&2
  return 1
}

# Stops every worker of a controller, stops the controller, then kills any
# worker process group that is left (the pid each workerd registered, the
# leader of its own process group).
cleanup() {
  local i d pid refs ref live k
  for i in "${!CTL_DIRS[@]}"; do
    d=${CTL_DIRS[$i]}
    pid=${CTL_PIDS[$i]}
    [ -d "$d" ] || continue
    refs=
    if command -v sqlite3 >/dev/null && [ -f "$d/muster.db" ]; then
      refs=$(sqlite3 -readonly "$d/muster.db" 'SELECT pid FROM workers WHERE pid IS NOT NULL' 2>/dev/null)
    fi
    live=$(api "$d" GET '/api/v1/workers?status=scheduling&status=starting&status=running' |
      jq -c '[.workers[]?.id]' 2>/dev/null)
    if [ -n "$live" ] && [ "$live" != "[]" ]; then
      api "$d" POST /api/v1/workers/stop "{\"ids\": $live}" >/dev/null 2>&1
      for k in $(seq 1 30); do # 3 s at most for them to end
        live=$(api "$d" GET '/api/v1/workers?status=scheduling&status=starting&status=running' |
          jq -r '.workers | length' 2>/dev/null)
        [ "${live:-0}" = 0 ] && break
        sleep 0.1
      done
    fi
    if kill -0 "$pid" 2>/dev/null; then
      kill -TERM "$pid" 2>/dev/null
      for k in $(seq 1 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
      kill -KILL "$pid" 2>/dev/null
    fi
    wait "$pid" 2>/dev/null
    for ref in $(tr ' ' '\n' <<<"$refs" | sort -u); do
      [[ $ref =~ ^[0-9]+$ ]] && [ "$ref" -gt 1 ] || continue
      if kill -0 -- "-$ref" 2>/dev/null; then kill -KILL -- "-$ref" 2>/dev/null; fi
    done
  done
  bash "$(dirname "$0")/../cgroup_clean.sh" "$TMP"
  rm -rf "$TMP"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

START=$(date +%s)

# ======================= no controller needed =======================

export MUSTER_STATE_DIR=$TMP/nowhere   # nothing should use ~/.muster

m --help
check "muster --help exits 0 and prints usage" \
  eval '[ $RC = 0 ] && has "$OUT" "^usage: muster" && has "$OUT" "launch" && has "$OUT" "await"'
m -h
check "muster -h exits 0 and prints usage" eval '[ $RC = 0 ] && has "$OUT" "^usage: muster"'
for c in launch await ps ls show stop logs; do
  m "$c" --help
  want=$c
  [ "$c" = ls ] && want=ps
  check "muster $c --help exits 0 and prints its usage" \
    eval '[ $RC = 0 ] && has "$OUT" "^usage: muster $want" && [ -z "$ERR" ]'
done
m launch --help
check "launch --help lists its options" \
  eval 'has "$OUT" "--cpu" && has "$OUT" "--secret-env" && has "$OUT" "--script"'

# The controller refuses a heartbeat interval that its timeout cannot wait
# out (every worker would be failed as lost), before it touches anything.
run 10 "$CONTROLLER" --listen 127.0.0.1:0 --state-dir "$TMP/hb-state" --workerd "$WORKERD" \
  --heartbeat-interval 20 --heartbeat-timeout 15
check "muster-controller --heartbeat-interval 20 --heartbeat-timeout 15 exits 2 naming both" \
  eval '[ $RC = 2 ] && has "$ERR" "heartbeat-interval (20 s) must be shorter than --heartbeat-timeout (15 s)" && [ ! -e "$TMP/hb-state" ]'
run 10 "$CONTROLLER" --listen 127.0.0.1:0 --state-dir "$TMP/hb-state" --workerd "$WORKERD" \
  --heartbeat-interval 15
check "  ... and an interval equal to the timeout (15 s, the default timeout)" \
  eval '[ $RC = 2 ] && has "$ERR" "must be shorter than --heartbeat-timeout (15 s)"'

m frobnicate
check "unknown command exits 2 and names it" eval '[ $RC = 2 ] && has "$ERR" "frobnicate" && [ -z "$OUT" ]'
m
check "no command exits 2" eval '[ $RC = 2 ] && has "$ERR" "usage: muster"'
m run --mode exec --gpu 100 -- true
check "muster run --gpu 100 exits 2 naming the range the controller takes (0 to 64)" \
  eval '[ $RC = 2 ] && has "$ERR" "--gpu must be a whole number from 0 to 64"'
m rank -- true
check "muster rank outside muster run's mpirun exits 2 naming what is missing" \
  eval '[ $RC = 2 ] && has "$ERR" "OMPI_COMM_WORLD_RANK is not set"'
OMPI_COMM_WORLD_RANK=2 MUSTER_EXEC_RANKS=127.0.1.1:1,127.0.1.2:2 MUSTER_EXEC_TOKEN=x m rank -- true
check "muster rank with no worker for its rank exits 2 naming the rank" \
  eval '[ $RC = 2 ] && has "$ERR" "rank 2 has no worker"'
m --bogus-flag ps
check "unknown global option exits 2 and names it" eval '[ $RC = 2 ] && has "$ERR" "--bogus-flag"'
m launch --bogus-flag
check "unknown launch option exits 2 and names it" eval '[ $RC = 2 ] && has "$ERR" "--bogus-flag"'
m launch --cpu 0
check "muster launch --cpu 0 exits 2 naming the range" \
  eval '[ $RC = 2 ] && has "$ERR" "--cpu must be a number from 0.01 to 4096 (cores), not \"0\""'
m run --memory 1e9 -- true
check "muster run --memory 1e9 exits 2 naming the range" \
  eval '[ $RC = 2 ] && has "$ERR" "--memory must be a number from 0.01 to 65536 (GiB), not \"1e9\""'
m await --bogus-flag w-aaaaaaaaaa
check "unknown await option exits 2 and names it" eval '[ $RC = 2 ] && has "$ERR" "--bogus-flag"'
m ps --bogus-flag
check "unknown ps option exits 2 and names it" eval '[ $RC = 2 ] && has "$ERR" "--bogus-flag"'
m logs --bogus-flag w-aaaaaaaaaa
check "unknown logs option exits 2 and names it" eval '[ $RC = 2 ] && has "$ERR" "--bogus-flag"'
m launch -n 0
check "launch -n 0 exits 2 and says why" eval '[ $RC = 2 ] && has "$ERR" "-n" && [ -z "$OUT" ]'
m launch -n abc
check "launch -n abc exits 2" eval '[ $RC = 2 ]'
m launch --cpu -1
check "launch --cpu -1 exits 2" eval '[ $RC = 2 ] && has "$ERR" "--cpu"'
m launch --env NOEQUALS
check "launch --env without = exits 2" eval '[ $RC = 2 ] && has "$ERR" "NOEQUALS"'
m launch --code x -- true
check "launch with --code and a command exits 2" eval '[ $RC = 2 ]'
m await
check "await with no ids exits 2" eval '[ $RC = 2 ]'
m await --timeout
check "await --timeout with no value exits 2" eval '[ $RC = 2 ] && has "$ERR" "--timeout"'
m stop
check "stop with neither ids nor --all exits 2" eval '[ $RC = 2 ]'
m launch --bogus-flag
check "a usage error prints its line and where to read more, not the whole usage" \
  eval '[ $RC = 2 ] && [ "$(nlines "$ERR")" = 2 ] && has "$ERR" "^muster: unknown option --bogus-flag$" && has "$ERR" "^see .muster launch --help.$"'
m stop --sesion x --all
check "a mistyped option: exit 2, did you mean the close one" \
  eval '[ $RC = 2 ] && has "$ERR" "unknown option --sesion (did you mean --session?)" && has "$ERR" "see .muster stop --help."'
m launch -cpu 1
check "an option with one dash too few: did you mean the right one" eval '[ $RC = 2 ] && has "$ERR" "did you mean --cpu?"'
m run --workers 1 -- true
check "muster run without --mode: exit 2, says --mode is needed (no silent allreduce)" \
  eval '[ $RC = 2 ] && has "$ERR" "^muster: --mode is needed: ps, allreduce or exec$"'
m sotp --all
check "a mistyped command: exit 2, did you mean the close one, see muster --help" \
  eval '[ $RC = 2 ] && has "$ERR" "unknown command \"sotp\" (did you mean stop?)" && has "$ERR" "see .muster --help." && [ "$(nlines "$ERR")" = 2 ]'
m launch --frobnicate
check "an option close to none: no suggestion" eval '[ $RC = 2 ] && ! has "$ERR" "did you mean"'
m stop --session
check "an option without its value: says it needs one" eval '[ $RC = 2 ] && has "$ERR" "^muster: --session needs a value$"'
m await -n 3 w-aaaaaaaaaa
check "an option only the help's prose quotes (muster launch -n) is unknown to await, not 'needs a value'" \
  eval '[ $RC = 2 ] && ! has "$ERR" "needs a value" && has "$ERR" "-n"'
m --help
check "muster --help lists every exit code" \
  eval '[ $RC = 0 ] && hasE "$OUT" "^  3 +not found" && hasE "$OUT" "^  4 +refused" && hasE "$OUT" "^  5 +unreachable" && hasE "$OUT" "^  6 +internal"'
m ps --status nonsense
check "ps --status nonsense exits 2 and names it" eval '[ $RC = 2 ] && has "$ERR" "nonsense"'

# No controller listening.
run env -u MUSTER_STATE_DIR MUSTER_URL=http://127.0.0.1:1 MUSTER_TOKEN=x "$MUSTER" ps
check "no controller at MUSTER_URL: exit 5 (unreachable), says it could not reach it" \
  eval '[ $RC = 5 ] && hasE "$ERR" "could not reach|unreachable" && has "$ERR" "127.0.0.1:1"'
run "$MUSTER" --url http://127.0.0.1:1 --token x launch
check "no controller at --url: launch exits 5 (unreachable)" eval '[ $RC = 5 ] && hasE "$ERR" "could not reach|unreachable"'
mkdir -p "$TMP/empty-state"
run env -u MUSTER_URL -u MUSTER_TOKEN MUSTER_STATE_DIR="$TMP/empty-state" "$MUSTER" ps
check "empty state dir and no MUSTER_URL: exit 5 (unreachable), says how to find or start a controller" \
  eval '[ $RC = 5 ] && has "$ERR" "MUSTER_URL" && has "$ERR" "start" && [ -z "$OUT" ]'

# ======================= main controller =======================

start_controller main --cpus 8 --memory 64 || { notok "start a controller"; echo "$PASS passed, $FAIL failed"; exit 1; }
ST=$TMP/main/state
URL=$CTL_URL
TOKEN=$(cat "$ST/token")
export MUSTER_STATE_DIR=$ST

# One controller per state directory: a second would run the same workers
# twice.
run 10 "$CONTROLLER" --listen 127.0.0.1:0 --network host --state-dir "$ST" --workerd "$WORKERD"
check "a second controller on the same state directory is refused, naming the first one's pid" \
  eval '[ $RC != 0 ] && has "$ERR$OUT" "another muster-controller (pid $CTL_PID) uses the state directory"'
check "...and the first one still answers" eval 'curl -sf -m 2 "$URL/api/v1/health" >/dev/null'

run env -u MUSTER_URL -u MUSTER_TOKEN MUSTER_STATE_DIR="$ST" "$MUSTER" ps
check "discovery through MUSTER_STATE_DIR (no MUSTER_URL) works" \
  eval '[ $RC = 0 ] && hasE "$OUT" "^ID +STATUS"'
run env -u MUSTER_STATE_DIR MUSTER_URL="$URL" MUSTER_TOKEN="$TOKEN" "$MUSTER" ps
check "MUSTER_URL + MUSTER_TOKEN works" eval '[ $RC = 0 ] && hasE "$OUT" "^ID +STATUS"'
run "$MUSTER" --url "$URL" --token "$TOKEN" ps
check "--url + --token works" eval '[ $RC = 0 ] && hasE "$OUT" "^ID +STATUS"'
run env -u MUSTER_URL -u MUSTER_TOKEN MUSTER_STATE_DIR="$ST" "$MUSTER" --url "$URL" ps
check "--url alone takes the token from the state directory, as MUSTER_URL does" \
  eval '[ $RC = 0 ] && hasE "$OUT" "^ID +STATUS"'
run env -u MUSTER_URL -u MUSTER_TOKEN MUSTER_STATE_DIR="$ST" "$MUSTER" --url http://192.0.2.7:8470 ps
check "--url to another host without --token: the state directory's token is not sent (exit 4, says why)" \
  eval '[ $RC = 4 ] && has "$ERR" "no API token" && has "$ERR" "loopback"'
run env -u MUSTER_URL -u MUSTER_TOKEN MUSTER_STATE_DIR="$ST" "$MUSTER" --url "${URL#http://}" ps
check "--url HOST:PORT without a scheme is taken as http://" eval '[ $RC = 0 ] && hasE "$OUT" "^ID +STATUS"'
run env -u MUSTER_STATE_DIR MUSTER_URL="${URL#http://}" MUSTER_TOKEN="$TOKEN" "$MUSTER" ps
check "MUSTER_URL=HOST:PORT without a scheme is taken as http:// (libmuster's client)" \
  eval '[ $RC = 0 ] && hasE "$OUT" "^ID +STATUS"'
run "$MUSTER" --url "ftp://${URL#http://}" --token "$TOKEN" ps
check "--url with another scheme: exit 2, says what a URL looks like and names it" \
  eval '[ $RC = 2 ] && has "$ERR" "http://HOST:PORT" && has "$ERR" "ftp://"'
run env -u MUSTER_STATE_DIR MUSTER_URL="$URL" MUSTER_TOKEN=wrong-token "$MUSTER" ps
check "wrong token: exit 4 (refused), says unauthorized" eval '[ $RC = 4 ] && has "$ERR" "unauthorized" && [ -z "$OUT" ]'
run "$MUSTER" --url "$URL" --token wrong-token launch
check "wrong token on launch: exit 4 (refused), says unauthorized" eval '[ $RC = 4 ] && has "$ERR" "unauthorized"'

m launch --cpu 4096
check "launch more cores than the backend has: exit 4 (refused), the controller's message names cpu" \
  eval '[ $RC = 4 ] && has "$ERR" "cpu" && [ -z "$OUT" ]'
m await --running --timeout 5 w-zzzzzzzzzz
check "await an unknown worker: exit 3 (not found), says there is no such worker" \
  eval '[ $RC = 3 ] && has "$ERR" "w-zzzzzzzzzz" && hasE "$ERR" "not.found|no worker"'
m show r-0123456789
check "show of a run's id: exit 2, says it is a run and where runs are listed" \
  eval '[ $RC = 2 ] && has "$ERR" "r-0123456789 is a run; muster show takes worker ids (muster runs lists runs)"'
m stop r-0123456789
check "stop of a run's id: exit 2, says it is a run" eval '[ $RC = 2 ] && has "$ERR" "r-0123456789 is a run; muster stop takes worker ids"'
m show not-an-id
check "show of a malformed id: exit 4 (refused), not 3 (not found), naming the id" \
  eval '[ $RC = 4 ] && has "$ERR" "not-an-id"'

# launch -n 3
m launch -n 3 --cpu 0.1
IDS3=$OUT
bad=$(grep -cvE '^w-[a-z0-9]{10}$' <<<"$IDS3")
check "launch -n 3 --cpu 0.1 prints 3 ids like w-xxxxxxxxxx" \
  eval '[ $RC = 0 ] && [ "$(nlines "$IDS3")" = 3 ] && [ "$bad" = 0 ] && [ "$(sort -u <<<"$IDS3" | wc -l)" = 3 ]'
m await --running --timeout 20 $IDS3
check "await --running on 3 idle workers exits 0" eval '[ $RC = 0 ] && [ "$(nlines "$OUT")" = 3 ]'

# launch | await --running -
run 20 bash -c "set -o pipefail; '$MUSTER' launch -n 3 --cpu 0.1 | tee '$TMP/piped-ids' | '$MUSTER' await --running --timeout 15 -"
PIPED=$(cat "$TMP/piped-ids")
ips=$(awk '{print $3}' <<<"$OUT" | sort -u)
allrun=1
for id in $PIPED; do hasE "$OUT" "^$id +running +127\.[0-9]+\.[0-9]+\.[0-9]+$" || allrun=0; done
check "launch -n 3 | await --running -: exit 0, each id running with an IP" \
  eval '[ $RC = 0 ] && [ "$(nlines "$PIPED")" = 3 ] && [ $allrun = 1 ] && [ "$(nlines "$OUT")" = 3 ]'
check "launch | await: the 3 IPs are distinct 127.x addresses" \
  eval '[ "$(grep -cE "^127\." <<<"$ips")" = 3 ]'

# Failure with an exit code.
m launch --cpu 0.1 --kernel bash --code 'echo out-line-1; echo err-line-1 >&2; echo out-line-2; exit 4'
FAILW=$OUT
m await --completion --timeout 20 "$FAILW"
check "await --completion on code that exits 4: exit 1" eval '[ $RC = 1 ]'
check "  ... its line says failed and exited with code 4" \
  eval 'hasE "$OUT" "^$FAILW +failed .*exited with code 4"'
check "  ... stderr says it did not succeed" eval 'has "$ERR" "did not succeed"'
check "  ... and quotes the last line its script wrote to stderr, indented under it" \
  eval 'hasE "$OUT" "^$FAILW +failed .*exited with code 4; its stderr ended with:$" &&
        [ "$(tail -n 1 <<<"$OUT")" = "    err-line-1" ]'
m ps -a --status failed
check "ps shows the failure on its one line, ending with that stderr line" \
  eval '[ $RC = 0 ] && hasE "$OUT" "^$FAILW .*exited with code 4; its stderr ended with: err-line-1$" &&
        ! has "$OUT" "^ *err-line-1$"'
m show "$FAILW"
check "show prints the stderr line under the failure sentence" \
  eval '[ $RC = 0 ] && has "$OUT" "^failure: .*its stderr ended with:$" &&
        has "$OUT" "^             err-line-1$"'

# A successful one: await --completion exits 0, says succeeded.
m launch --cpu 0.1 --kernel bash --code 'exit 0'
OKW=$OUT
m await --timeout 20 "$OKW"
check "await (default --completion) on code that exits 0: exit 0, says succeeded" \
  eval '[ $RC = 0 ] && hasE "$OUT" "^$OKW +succeeded"'

# logs
m logs "$FAILW"
check "logs ID prints the script's stdout (and not its stderr)" \
  eval '[ $RC = 0 ] && [ "$OUT" = "$(printf "out-line-1\nout-line-2")" ]'
m logs --stderr "$FAILW"
check "logs --stderr ID prints the script's stderr" eval '[ $RC = 0 ] && [ "$OUT" = "err-line-1" ]'
m logs w-zzzzzzzzzz
check "logs of an unknown worker exits 3 with a message" eval '[ $RC = 3 ] && [ -n "$ERR" ]'

# logs -f on a worker that prints its first line, then the others only once
# logs -f has shown that one (the script waits for a file the test makes).
m launch --cpu 0.1 --kernel bash --code "echo tick-1; until [ -e '$TMP/go-on' ]; do sleep 0.05; done; for i in 2 3 4 5; do echo tick-\$i; sleep 0.1; done"
FW=$OUT
m await --running --timeout 15 "$FW"
timeout -k 2 30 "$MUSTER" logs -f "$FW" >"$TMP/follow.out" 2>"$TMP/follow.err" &
FPID=$!
wait_for 15 "logs -f to print the script's first line" grep -qx tick-1 "$TMP/follow.out"
FIRST=$?
t0=$(date +%s%N)
touch "$TMP/go-on"
wait "$FPID"
RC=$?
MS=$((($(date +%s%N) - t0) / 1000000))
OUT=$(cat "$TMP/follow.out")
ERR=$(cat "$TMP/follow.err")
check "logs -f returns by itself when the worker ends, with every line" \
  eval '[ $RC = 0 ] && [ "$OUT" = "$(printf "tick-%s\n" 1 2 3 4 5 | head -c -1)" ]'
check "  ... and it followed (the first line came before the others were written; the rest in ${MS} ms)" \
  eval '[ $FIRST = 0 ] && [ $MS -lt 12000 ]'

# ps / ps -a --json
# USED: cpu seconds and memory, sampled from each worker's cgroup where the
# controller isolates workers (once a second): there, ps until every live
# worker has been sampled.
used_shown() {
  local id
  m ps
  for id in $IDS3 $PIPED; do hasE "$OUT" "^$id +running .* [0-9]+\.[0-9]s/[0-9.]+[KMG] " || return 1; done
}
isolated=0
curl -s "$CTL_URL/api/v1/health" | grep -q '"isolation": *"cgroup"' && isolated=1
if [ $isolated = 1 ]; then
  wait_for 20 "ps's USED column to show every running worker's usage" used_shown
  used_ok=$?
else
  m ps
fi
live_ok=1
for id in $IDS3 $PIPED; do hasE "$OUT" "^$id +running .*127\." || live_ok=0; done
check "ps: a table with a header" eval '[ $RC = 0 ] && hasE "$(head -1 <<<"$OUT")" "^ID +STATUS +SESSION +ROLE +NAME +IP +CPU +MEM +USED"'
if [ $isolated = 1 ]; then
  check "ps: USED shows each running worker's cpu seconds and memory" eval '[ $used_ok = 0 ]'
else
  echo "ok - # SKIP ps USED: the controller isolates no workers here"
fi
check "ps: shows the 6 live workers as running with their IPs" eval '[ $live_ok = 1 ]'
check "ps: does not show finished workers" eval '! has "$OUT" "$FAILW" && ! has "$OUT" "$OKW"'
m ls
check "ls is ps" eval '[ $RC = 0 ] && has "$OUT" "$(head -1 <<<"$IDS3")"'
m ps -a --json
PSJ=$OUT
check "ps -a --json is valid JSON (an array)" eval '[ $RC = 0 ] && jq -e "type == \"array\"" <<<"$PSJ" >/dev/null'
check "ps -a --json includes the finished workers with their status and exit code" \
  eval 'jq -e --arg f "$FAILW" --arg s "$OKW" "(map(select(.id == \$f))[0] | .status == \"failed\" and .exit_code == 4) and (map(select(.id == \$s))[0].status == \"succeeded\")" <<<"$PSJ" >/dev/null'
check "ps -a --json lists every worker launched so far (9)" eval '[ "$(jq length <<<"$PSJ")" = 9 ]'
m ps --json
check "ps --json (live only) lists the 6 live workers" eval '[ $RC = 0 ] && [ "$(jq length <<<"$OUT")" = 6 ]'
m ps -a --status failed --json
check "ps -a --status failed lists only the failed one" \
  eval '[ $RC = 0 ] && [ "$(jq -r ".[].id" <<<"$OUT")" = "$FAILW" ]'

# show
W1=$(head -1 <<<"$IDS3")
m show "$W1"
check "show ID prints status: and ip_address:" \
  eval '[ $RC = 0 ] && hasE "$OUT" "^status: +running$" && hasE "$OUT" "^ip_address: +127\.[0-9.]+$" && hasE "$OUT" "^id: +$W1$"'
m show "$FAILW"
check "show of a failed worker prints its failure and exit code" \
  eval '[ $RC = 0 ] && hasE "$OUT" "^status: +failed$" && hasE "$OUT" "^exit_code: +4$" && has "$OUT" "exited with code 4"'
m show --json "$W1"
check "show --json ID is valid JSON for that worker" \
  eval '[ $RC = 0 ] && jq -e --arg id "$W1" ".id == \$id and .status == \"running\"" <<<"$OUT" >/dev/null'
m show w-zzzzzzzzzz
check "show of an unknown worker exits 3 and says not found" eval '[ $RC = 3 ] && hasE "$ERR" "not.found|no worker|not_found"'

# env, secret env
SECRET="s3cr3t-$RANDOM-$RANDOM-value"
m launch --cpu 0.1 --env GREETING=hello-env --secret-env MY_SECRET="$SECRET" --kernel bash \
  --code 'echo "GREETING=$GREETING"; echo "MY_SECRET=$MY_SECRET"' --json
LJ=$OUT
EW=$(jq -r '.[0].id' <<<"$LJ" 2>/dev/null)
check "launch --json prints the workers as JSON" eval '[ $RC = 0 ] && [[ $EW =~ ^w-[a-z0-9]{10}$ ]]'
check "  ... without the secret's value" eval '! has "$LJ" "$SECRET"'
m await --completion --timeout 20 "$EW"
m logs "$EW"
check "--env K=V reaches the script's environment" eval 'has "$OUT" "^GREETING=hello-env$"'
check "--secret-env K=V reaches the script's environment" eval 'has "$OUT" "^MY_SECRET=$SECRET$"'
m ps -a --json
check "the secret's value is not in ps -a --json" eval '[ $RC = 0 ] && has "$OUT" "$EW" && ! has "$OUT" "$SECRET"'
m show --json "$EW"
check "the secret's value is not in show --json" eval '[ $RC = 0 ] && has "$OUT" "$EW" && ! has "$OUT" "$SECRET"'
m show "$EW"
check "the secret's value is not in show" eval '[ $RC = 0 ] && ! has "$OUT" "$SECRET"'
WJ=$(curl -s -m 5 -H "Authorization: Bearer $TOKEN" "$URL/api/v1/workers/$EW")
check "the CLI sends --secret-env as secret_env, --env as env (the API lists only the secret's key)" \
  eval 'jq -e ".secret_env == [\"MY_SECRET\"] and .env.GREETING == \"hello-env\" and (.env | has(\"MY_SECRET\") | not)" <<<"$WJ" >/dev/null && ! has "$WJ" "$SECRET"'

# -- CMD ARGS
m launch --cpu 0.1 -- printf '[%s]' one 'two words' '$HOME'
CW=$OUT
m await --completion --timeout 20 "$CW"
rc_await=$RC
m logs "$CW"
check "-- CMD ARGS runs the command with its arguments as given" \
  eval '[ $rc_await = 0 ] && [ "$OUT" = "[one][two words][\$HOME]" ]'

# --script FILE with a relative path, from another directory than the controller's
mkdir -p "$TMP/proj/sub"
cat >"$TMP/proj/sub/job.sh" <<'EOF'
echo "job ran with args: $*"
EOF
run 20 bash -c "cd '$TMP/proj' && '$MUSTER' launch --cpu 0.1 --kernel bash --script sub/job.sh --arg a1 --arg a2"
SW=$OUT
check "launch --script with a relative path prints an id" eval '[ $RC = 0 ] && [[ $SW =~ ^w-[a-z0-9]{10}$ ]]'
m await --completion --timeout 20 "$SW"
check "  ... the script runs (the controller works in another directory)" eval '[ $RC = 0 ]'
m logs "$SW"
check "  ... and prints its output with its --arg arguments" eval '[ "$OUT" = "job ran with args: a1 a2" ]'
m show "$SW"
check "  ... show gives the script as an absolute path" eval 'has "$OUT" "^script: .*$TMP/proj/sub/job.sh"'

# stop ID
m stop "$W1"
check "stop ID prints ID stopped" eval '[ $RC = 0 ] && hasE "$OUT" "^$W1 +stopped$" && [ "$(nlines "$OUT")" = 1 ]'
m show "$W1"
check "  ... and show then says stopped" eval 'hasE "$OUT" "^status: +stopped$"'

# stop --all stops only the session's live workers
SESS=cli-test-$$
run env MUSTER_SESSION="$SESS" "$MUSTER" launch -n 2 --cpu 0.1
SIDS=$OUT
m await --running --timeout 15 $SIDS
m ps
check "ps shows each worker's session: a notebook's workers beside the default session's" \
  eval '[ $RC = 0 ] && hasE "$OUT" "^$(head -1 <<<"$SIDS") +running +$SESS " && hasE "$OUT" "^w-[a-z0-9]{10} +running +default "'
run env MUSTER_SESSION="$SESS" "$MUSTER" stop --all
stopped_ok=1
for id in $SIDS; do hasE "$OUT" "^$id +stopped$" || stopped_ok=0; done
check "stop --all (MUSTER_SESSION) stops the session's live workers" \
  eval '[ $RC = 0 ] && [ $stopped_ok = 1 ] && [ "$(nlines "$OUT")" = 2 ]'
m ps --json
check "  ... and only those: the default session's workers still run" \
  eval '[ "$(jq "[.[] | select(.status == \"running\")] | length" <<<"$OUT")" = 5 ] && ! has "$OUT" "$(head -1 <<<"$SIDS")"'
m launch -n 2 --cpu 0.1 --session "$SESS-b"
SIDS2=$OUT
m await --running --timeout 15 $SIDS2
m stop --all --session "$SESS-b"
stopped_ok=1
for id in $SIDS2; do hasE "$OUT" "^$id +stopped$" || stopped_ok=0; done
check "stop --all --session S stops that session's workers, and says how many where" \
  eval '[ $RC = 0 ] && [ $stopped_ok = 1 ] && [ "$(nlines "$OUT")" = 2 ] && has "$ERR" "stopped 2 workers (session $SESS-b)"'
m stop --all --session "$SESS-b"
check "stop --all with nothing live in the session says so on stderr, exit 0" \
  eval '[ $RC = 0 ] && [ -z "$OUT" ] && has "$ERR" "no live workers in session $SESS-b"'

# Progress line of await on a terminal.
m launch -n 2 --cpu 0.1
PIDS2=$(tr '\n' ' ' <<<"$OUT")
run 20 script -qec "env -u MUSTER_URL -u MUSTER_TOKEN MUSTER_STATE_DIR='$ST' '$MUSTER' await --running --timeout 15 $PIDS2" /dev/null
prog_ok=1
for id in $PIDS2; do hasE "$OUT" "$id +running +127\." || prog_ok=0; done
CR=$'\r' ESC=$'\033'
drew=0
grep -qaE "${CR}${ESC}\\[K[0-2]/2 running" <<<"$OUT" && drew=1
check "await on a terminal draws a progress line (\\r\\033[K, then e.g. 2/2 running)" eval '[ $drew = 1 ]'
check "  ... and still prints each worker running, exit 0" eval '[ $prog_ok = 1 ] && [ $RC = 0 ]'
# On a terminal, await on workers already running must answer promptly too:
# the progress line must not hold the answer back (its event stream is
# cancelled, not waited out). The reference is the same await under script(1)
# with stderr not a terminal, measured in the same loop, so that a loaded
# machine slows both; the medians of 3 are compared, so that one run the
# machine stalled decides nothing, while a line that holds every answer back
# still shows.
tty_ms=() ref_ms=() tty_rc=0
for i in 1 2 3; do
  run 20 script -qec "env -u MUSTER_URL -u MUSTER_TOKEN MUSTER_STATE_DIR='$ST' '$MUSTER' await --running --timeout 15 $PIDS2" /dev/null
  [ $RC = 0 ] || tty_rc=$RC
  tty_ms+=("$MS")
  run 20 script -qec "env -u MUSTER_URL -u MUSTER_TOKEN MUSTER_STATE_DIR='$ST' '$MUSTER' await --running --timeout 15 $PIDS2 2>/dev/null" /dev/null
  ref_ms+=("$MS")
done
median() { printf '%s\n' "$@" | sort -n | sed -n "$((($# + 1) / 2))p"; }
tty_med=$(median "${tty_ms[@]}") ref_med=$(median "${ref_ms[@]}")
check "await on a terminal, workers already running: answers as promptly as without one (median of 3: ${tty_med} ms of ${tty_ms[*]}; without a terminal ${ref_med} ms of ${ref_ms[*]}; exit status ${tty_rc})" \
  eval '[ $tty_rc = 0 ] && [ $tty_med -lt $((ref_med + 3000)) ]'
m await --running --timeout 15 $PIDS2
check "await without a terminal draws no progress line" \
  eval '[ $RC = 0 ] && [[ $ERR != *"2/2"* && $ERR != *"$CR"* && $OUT != *"$CR"* ]]'

# ======================= await --timeout on an unschedulable worker =======================

start_controller small --cpus 1 --memory 64 || notok "start a second controller (--cpus 1)"
ST2=$TMP/small/state
run env MUSTER_STATE_DIR="$ST2" "$MUSTER" launch --cpu 1
BIG1=$OUT
run env MUSTER_STATE_DIR="$ST2" "$MUSTER" await --running --timeout 15 "$BIG1"
check "one --cpu 1 idle worker runs on a 1-core controller" eval '[ $RC = 0 ] && hasE "$OUT" "^$BIG1 +running"'
run env MUSTER_STATE_DIR="$ST2" "$MUSTER" launch --cpu 1
BIG2=$OUT
run 10 env MUSTER_STATE_DIR="$ST2" "$MUSTER" await --running --timeout 1 "$BIG2"
check "await --timeout 1 on a worker that can't be scheduled: exit 1" eval '[ $RC = 1 ]'
check "  ... at its timeout, not before (took ${MS} ms; the bound above leaves a loaded machine its delays)" \
  eval '[ $MS -ge 900 ] && [ $MS -lt 9000 ]'
check "  ... says timed out, and the worker is still scheduling" \
  eval 'has "$ERR" "timed out" && hasE "$OUT" "^$BIG2 +scheduling"'
check "  ... and says what the worker still waits for" \
  eval 'hasE "$OUT" "^$BIG2 +scheduling +- +waiting for 1 core \(0 free of 1\)$"'
run env MUSTER_STATE_DIR="$ST2" "$MUSTER" show "$BIG2"
check "  ... the timed-out worker was not stopped" eval 'hasE "$OUT" "^status: +scheduling$"'
# Waits explain themselves: the controller knew why (waiting_for), the user
# saw only "scheduling".
check "muster_show_says_what_a_worker_waits_for (waiting for: 1 core (0 free of 1))" \
  eval '[ $RC = 0 ] && hasE "$OUT" "^waiting for: 1 core \(0 free of 1\)$"'
run env MUSTER_STATE_DIR="$ST2" "$MUSTER" ps
check "muster_ps_shows_a_waiting_workers_reason (WHY: waiting for 1 core (0 free of 1)), one line per worker" \
  eval '[ $RC = 0 ] && hasE "$(head -1 <<<"$OUT")" " WHY$" && hasE "$OUT" "^$BIG2 +scheduling .* waiting for 1 core \(0 free of 1\)$" && [ "$(nlines "$OUT")" = 3 ]'
run 20 script -qec "env -u MUSTER_URL -u MUSTER_TOKEN MUSTER_STATE_DIR='$ST2' '$MUSTER' await --running --timeout 2 $BIG2" /dev/null
check "await's live line on a terminal says what a scheduling worker waits for" \
  eval '[ $RC = 1 ] && has "$OUT" "0/1 running, 1 scheduling (waiting for 1 core (0 free of 1))"'
# On a 40-column terminal each drawing of the line fits in 39 columns, cut
# with "…": a longer line wrapped, and "\r\033[K" cleared only its last
# row, so every redraw left a stale row behind.
run 20 script -qec "stty cols 40; env -u MUSTER_URL -u MUSTER_TOKEN MUSTER_STATE_DIR='$ST2' '$MUSTER' await --running --timeout 2 $BIG2" /dev/null
# (each drawing is "\r\033[K" and "N/M running, ..."; the last clearing is
# followed by await's own output, which is not the live line)
WIDEST=$(printf '%s' "$OUT" | tr '\r' '\n' | sed 's/\x1b\[K//g' | grep -aE '^[0-9]+/[0-9]+ ' |
  LC_ALL=C.UTF-8 awk '{ if (length($0) > w) w = length($0) } END { print w + 0 }')
check "await_live_line_fits_a_40_column_terminal (widest drawing: $WIDEST columns)" \
  eval '[ $RC = 1 ] && [ "$WIDEST" -le 39 ] && has "$OUT" "0/1 running, 1 scheduling (waiting for…"'
# muster run's workers wait behind BIG2: it says for what while it waits,
# and its timeout names it (it said "still not running when the timeout
# passed" after 60 s of silence).
run 40 env MUSTER_STATE_DIR="$ST2" "$MUSTER" run --mode exec --workers 1 --cpu 1 --timeout 3 -- true
check "muster_run_start_timeout_names_what_it_waited_for (did not start in 3 s: worker 0 (w-...) waits for 1 core (0 free of 1))" \
  eval '[ $RC = 1 ] && hasE "$ERR" "^muster run: FAILED: did not start in 3 s: worker 0 \(w-[a-z0-9]{10}\) waits for 1 core \(0 free of 1\)$"'
check "  ... and said what it waited for while it waited, once (it did not change)" \
  eval '[ "$(grep -cE "^muster run: not running yet: worker 0 \(w-[a-z0-9]{10}\) waits for 1 core \(0 free of 1\)$" <<<"$ERR")" = 1 ]'
# A run's workers must run at once: 2 × 1 core never fit 1 core, and the
# launch says so at once (it was accepted and waited out its timeout).
run 40 env MUSTER_STATE_DIR="$ST2" "$MUSTER" run --mode exec --workers 2 --cpu 1 -- true
check "a run that can never fit is refused at once with the arithmetic (exit 4, took ${MS} ms)" \
  eval '[ $RC = 4 ] && has "$ERR" "2 workers × 1 core = 2 cores, but this host has 1 core in all" && [ $MS -lt 10000 ]'
run env MUSTER_STATE_DIR="$ST2" "$MUSTER" stop "$BIG1"
run env MUSTER_STATE_DIR="$ST2" "$MUSTER" await --running --timeout 15 "$BIG2"
check "  ... and it runs once the first one is stopped" eval '[ $RC = 0 ] && hasE "$OUT" "^$BIG2 +running"'

# ======================= logs -f of a worker stopped while it prints =======================
# What the command prints on its way out reaches the controller after the
# stop was recorded (a third controller whose workerds hold back what they
# ship once stopping, 1.5 s: the fault point workerd_ship_after_stop).
# Its workerds also hand the stop's SIGTERM to their command 0.5 s late
# (workerd_stop_term), so that any other SIGTERM would reach it first.
export MUSTER_FAULT=workerd_ship_after_stop:delay=1500,workerd_stop_term:delay=500
start_controller lastwords --cpus 1 --memory 64 || notok "start a third controller (with a fault point)"
unset MUSTER_FAULT
ST3=$TMP/lastwords/state
run env MUSTER_STATE_DIR="$ST3" "$MUSTER" launch --cpu 0.1 --kernel bash \
  --code "trap 'echo last words; exit 0' TERM; echo first words; while :; do sleep 0.05; done"
LW=$OUT
timeout -k 2 30 env MUSTER_STATE_DIR="$ST3" "$MUSTER" logs -f "$LW" >"$TMP/lw.out" 2>"$TMP/lw.err" &
FPID=$!
wait_for 15 "logs -f to print the first line" grep -qx "first words" "$TMP/lw.out"
run env MUSTER_STATE_DIR="$ST3" "$MUSTER" stop "$LW"
wait "$FPID"
RC=$?
OUT=$(cat "$TMP/lw.out")
ERR=$(cat "$TMP/lw.err")
check "logs -f on a worker stopped while it runs shows its last output and returns by itself" \
  eval '[ $RC = 0 ] && [ "$OUT" = "$(printf "first words\nlast words")" ]'

# A stopped worker's command gets one SIGTERM, as in a container: its TERM
# handler (a checkpoint, say) runs once. The controller used to signal the
# command's session too, so the handler ran again when workerd's own TERM
# came.
run env MUSTER_STATE_DIR="$ST3" "$MUSTER" launch --cpu 0.1 --kernel bash \
  --code "n=0; trap 'n=\$((n+1)); echo term \$n; sleep 1; exit 0' TERM; echo up; while :; do :; done"
TW=$OUT
wait_for 15 "the TERM counter to start" eval 'env MUSTER_STATE_DIR="$ST3" "$MUSTER" logs "$TW" | grep -qx up'
run env MUSTER_STATE_DIR="$ST3" "$MUSTER" stop "$TW"
run timeout -k 2 30 env MUSTER_STATE_DIR="$ST3" "$MUSTER" logs -f "$TW"
check "a stopped worker's command gets SIGTERM once (its handler ran: $(tr '\n' ' ' <<<"$OUT"))" \
  eval '[ "$OUT" = "$(printf "up\nterm 1")" ]'

# ======================= where workers start =======================
# A client in $TMP/project (not the controller's --workdir, $TMP/where-wd):
# its workers start there, find a relative script there and find commands
# on its PATH ($TMP/clientbin holds a muster-train the controller's PATH
# lacks), as in CML, where workers share the session's project directory.
start_controller where --cpus 2 --memory 64 || notok "start a controller for where workers start"
ST4=$TMP/where/state
mkdir -p "$TMP/project" "$TMP/clientbin"
printf 'echo "ran in $PWD"\n' >"$TMP/project/where.sh"
printf '#!/bin/sh\necho "muster-train $* in $PWD"\n' >"$TMP/clientbin/muster-train"
chmod +x "$TMP/clientbin/muster-train"
w4() {
  local back=$PWD
  cd "$TMP/project" || return
  run 60 env MUSTER_STATE_DIR="$ST4" PATH="$TMP/clientbin:$PATH" "$MUSTER" "$@"
  cd "$back" || return
}
w4o() { w4 "$@"; echo "$OUT"; }
WID=$(w4o launch --cpu 0.1 --kernel sh --script where.sh)
run env MUSTER_STATE_DIR="$ST4" "$MUSTER" await --completion --timeout 30 "$WID"
run env MUSTER_STATE_DIR="$ST4" "$MUSTER" logs "$WID"
check "a relative script from a client in another directory runs there (not in the controller's --workdir)" \
  eval '[ $RC = 0 ] && [ "$OUT" = "ran in $TMP/project" ]'
WID=$(w4o launch --cpu 0.1 --script fail.py)
run env MUSTER_STATE_DIR="$ST4" "$MUSTER" await --completion --timeout 30 "$WID"
run env MUSTER_STATE_DIR="$ST4" "$MUSTER" show --json "$WID"
check "a missing script fails with \"script DIR/fail.py not found\", not an exit code" \
  eval '[ "$(jq -r .failure <<<"$OUT")" = "script $TMP/project/fail.py not found" ]'
WID=$(w4o launch --cpu 0.1 -- muster-no-such-train --epochs 1)
run env MUSTER_STATE_DIR="$ST4" "$MUSTER" await --completion --timeout 30 "$WID"
run env MUSTER_STATE_DIR="$ST4" "$MUSTER" show --json "$WID"
check "a missing command says it is not found on the worker's PATH, naming the PATH" \
  eval 'jq -r .failure <<<"$OUT" | grep -qF "muster-no-such-train: not found on the worker'"'"'s PATH ($TMP/clientbin:"'
w4 run --mode exec --workers 2 --cpu 0.1 --timeout 30 -- muster-train --epochs 1
check "muster run finds a command on the client's PATH only, and its ranks start in the client's directory" \
  eval '[ $RC = 0 ] && hasE "$OUT" "^\[worker-0\] muster-train --epochs 1 in $TMP/project$" && hasE "$OUT" "^\[worker-1\] muster-train --epochs 1 in $TMP/project$"'
mkdir -p "$TMP/elsewhere"
w4 run --mode exec --workers 1 --cpu 0.1 --timeout 30 --cwd "$TMP/elsewhere" -- muster-train
check "muster run --cwd DIR starts the workers and their ranks in DIR" \
  eval '[ $RC = 0 ] && hasE "$OUT" "^\[worker-0\] muster-train  in $TMP/elsewhere$"'
if command -v mpirun >/dev/null; then
  # The README's own example: muster run --mode allreduce -- muster-train.
  w4 run --mode allreduce --workers 2 --cpu 0.1 --timeout 30 -- muster-train --epochs 1
  check "muster run --mode allreduce finds muster-train on the client's PATH only; its ranks start in the client's directory" \
    eval '[ $RC = 0 ] && hasE "$OUT" "^\[rank-0\] muster-train --epochs 1 in $TMP/project$" && hasE "$OUT" "^\[rank-1\] muster-train --epochs 1 in $TMP/project$"'
  w4 run --mode allreduce --workers 1 --cpu 0.1 --timeout 30 --cwd "$TMP/elsewhere" -- muster-train
  check "muster run --mode allreduce --cwd DIR starts its ranks in DIR" \
    eval '[ $RC = 0 ] && hasE "$OUT" "^\[rank-0\] muster-train  in $TMP/elsewhere$"'
else
  ok "# SKIP muster run --mode allreduce: Open MPI's mpirun is not installed"
fi
w4 launch --cwd no-such-dir-here
check "launch --cwd with a relative directory that is not here: exit 2, naming it" \
  eval '[ $RC = 2 ] && has "$ERR" "no-such-dir-here is not a directory here"'
# A client whose directory and PATH mean nothing on the workers' hosts (a
# laptop, a CI runner) opts out: the controller's --workdir, the worker's PATH.
where() { jq -r '.[0] | "\(.cwd) \(.path)"' <<<"$OUT"; }
w4 launch --cpu 0.1 --cwd '' --no-path --json
check "launch --cwd '' --no-path: the workers start in the controller's --workdir with their own PATH" \
  eval '[ $RC = 0 ] && [ "$(where)" = "null null" ]'
OPTED=$(jq -r '.[0].id' <<<"$OUT")
w4 launch --cpu 0.1 --cwd - --path /usr/bin:/bin --json
check "launch --cwd - --path P: the controller's --workdir, PATH P" \
  eval '[ $RC = 0 ] && [ "$(where)" = "null /usr/bin:/bin" ]'
OPTED="$OPTED $(jq -r '.[0].id' <<<"$OUT")"
MUSTER_SEND_CWD=0 MUSTER_SEND_PATH=0 w4 launch --cpu 0.1 --json
check "MUSTER_SEND_CWD=0 MUSTER_SEND_PATH=0: launch sends neither this shell's directory nor its PATH" \
  eval '[ $RC = 0 ] && [ "$(where)" = "null null" ]'
OPTED="$OPTED $(jq -r '.[0].id' <<<"$OUT")"
run env MUSTER_STATE_DIR="$ST4" PATH=":$TMP/clientbin:.::/usr/bin:/bin:" "$MUSTER" launch --cpu 0.1 --json
check "the PATH a launch sends has no empty or . entries (which would search the project directory)" \
  eval '[ $RC = 0 ] && [ "$(jq -r ".[0].path" <<<"$OUT")" = "$TMP/clientbin:/usr/bin:/bin" ]'
OPTED="$OPTED $(jq -r '.[0].id' <<<"$OUT")"
# shellcheck disable=SC2086
run env MUSTER_STATE_DIR="$ST4" "$MUSTER" stop $OPTED
w4 run --mode exec --workers 1 --cpu 0.1 --timeout 30 --cwd - --no-path -- sh -c 'echo "in $(pwd -P)"'
check "muster run --cwd - --no-path starts the workers in the controller's --workdir, found on their own PATH" \
  eval '[ $RC = 0 ] && hasE "$OUT" "^\[worker-0\] in $(cd "$TMP/where-wd" && pwd -P)$"'
NOTUTF8=$TMP/j$(printf '\374')rgen
mkdir -p "$NOTUTF8"
w4 launch --cpu 0.1 --cwd "$NOTUTF8"
check "launch from a directory whose name is not UTF-8 fails naming cwd (not started elsewhere)" \
  eval '[ $RC != 0 ] && [ -z "$OUT" ] && has "$ERR" "cwd is not UTF-8"'

# --- what the API says cannot drive the reader's terminal: a name with
# escape sequences (a title, a clear, a fake line) is written out by ps and
# show; a worker's output by logs on a terminal, as it is with --raw.
no_esc() { ! LC_ALL=C grep -q $'\x1b' <<<"$1"; }
EVIL=$(printf 'x\033]0;pwned\007\033[2Jfake\nstatus: ok')
WANT='x\x1b]0;pwned\x07\x1b[2Jfake\nstatus: ok'
m launch --cpu 0.1 --name "$EVIL" --session "evil-$$" --kernel bash --code 'printf "a\033[31mred\n"; sleep 600'
EW=$OUT
m await --running --timeout 15 "$EW"
m show "$EW"
check "show writes a name's escape sequences out instead of sending them to the terminal" \
  eval '[ $RC = 0 ] && no_esc "$OUT" && grep -qF -- "name:        $WANT" <<<"$OUT"'
m ps --session "evil-$$"
check "ps does too (the name cut to its column)" \
  eval '[ $RC = 0 ] && no_esc "$OUT" && grep -qF -- "x\x1b]0;" <<<"$OUT"'
m ps --session "evil-$$" --json
check "ps --json keeps the name as it is (JSON escapes it)" \
  eval '[ $RC = 0 ] && [ "$(jq -r ".[0].name" <<<"$OUT")" = "$EVIL" ]'
wait_for 30 "the coloured line in $EW's log" eval 'm logs "$EW"; has "$OUT" "red"'
run 10 script -qec "$MUSTER logs $EW" /dev/null
check "logs on a terminal writes the output's escape sequences out" \
  eval 'no_esc "$OUT" && grep -qF -- "a\x1b[31mred" <<<"$OUT"'
run 10 script -qec "$MUSTER logs --raw $EW" /dev/null
check "...and --raw passes them to the terminal as they are" eval 'grep -qF -- $'"'"'a\033[31mred'"'"' <<<"$OUT"'
m logs "$EW"
check "...as does logs into a pipe or a file" eval 'grep -qF -- $'"'"'a\033[31mred'"'"' <<<"$OUT"'
m stop --session "evil-$$" --all

# ======================= users =======================
# An administrator adds a user, who sees who they are and is refused the
# users' list; a new token revokes the old one; a user is removed.
m whoami
check "whoami with the state directory's token: admin, an administrator" \
  eval '[ $RC = 0 ] && hasE "$OUT" "^admin \(administrator\); workers run as "'
m users add "cli$$" --max-cpu 2 --max-workers 3
UTOK=$OUT
check "users add prints the new user's token alone" eval '[ $RC = 0 ] && hasE "$OUT" "^mu_[0-9a-f]{64}$"'
m users add "cli$$"
check "...a name taken: exit 4, saying so" eval '[ $RC = 4 ] && has "$ERR" "taken"'
m users add "cli$$-b" --max-cpu lots
check "...a limit that is no number: exit 2, naming it" eval '[ $RC = 2 ] && has "$ERR" "--max-cpu"'
m users
check "users lists the user with its limits" \
  eval '[ $RC = 0 ] && hasE "$OUT" "^NAME +ADMIN" && hasE "$OUT" "^cli$$ +no +- +2 +- +- +3 +0$"'
run env -u MUSTER_STATE_DIR MUSTER_URL="$URL" MUSTER_TOKEN="$UTOK" "$MUSTER" whoami --json
check "the user's token names the user (whoami --json)" \
  eval '[ $RC = 0 ] && [ "$(jq -r .user <<<"$OUT")" = "cli$$" ] && [ "$(jq -r .admin <<<"$OUT")" = false ]'
run env -u MUSTER_STATE_DIR MUSTER_URL="$URL" MUSTER_TOKEN="$UTOK" "$MUSTER" users
check "...who is no administrator: users is refused, exit 4" eval '[ $RC = 4 ] && [ -z "$OUT" ]'
m users token "cli$$"
NTOK=$OUT
run env -u MUSTER_STATE_DIR MUSTER_URL="$URL" MUSTER_TOKEN="$UTOK" "$MUSTER" whoami
check "users token: the old token is refused at once" eval '[ $RC = 4 ] && [ -z "$OUT" ]'
run env -u MUSTER_STATE_DIR MUSTER_URL="$URL" MUSTER_TOKEN="$NTOK" "$MUSTER" whoami
check "...and the new one serves" eval '[ $RC = 0 ] && hasE "$OUT" "^cli$$; workers run as "'
m users remove "cli$$"
check "users remove removes the user" eval '[ $RC = 0 ] && has "$OUT" "removed user cli$$"'
run env -u MUSTER_STATE_DIR MUSTER_URL="$URL" MUSTER_TOKEN="$NTOK" "$MUSTER" whoami
check "...whose token is refused from then on" eval '[ $RC = 4 ]'
m users add "cli$$-w"
run env -u MUSTER_STATE_DIR MUSTER_URL="$URL" MUSTER_TOKEN="$OUT" "$MUSTER" launch --cpu 0.1
WW=$OUT
m users remove "cli$$-w"
check "users remove of a user with a live worker: exit 4, saying --stop" \
  eval '[ $RC = 4 ] && has "$ERR" "1 live worker" && has "$ERR" "muster users remove cli$$-w --stop"'
m users remove --stop "cli$$-w"
check "...users remove --stop removes the user and stops the worker" \
  eval '[ $RC = 0 ] && [ "$(run "$MUSTER" show --json "$WW"; jq -r .status <<<"$OUT")" = stopped ]'
m users --json
check "...the user is gone from the users' list" \
  eval '[ $RC = 0 ] && [ "$(jq "[.users[] | select(.name == \"cli$$-w\")] | length" <<<"$OUT")" = 0 ]'
m users remove "nobody$$"
check "users remove of no such user: exit 3" eval '[ $RC = 3 ] && has "$ERR" "nobody$$"'

# ======================= the end =======================
# A notebook's worker, in a session of its own: stop --all (no --session, no
# MUSTER_SESSION) stops it too, with the default session's.
m launch --cpu 0.1 --session "notebook-$$"
NBW=$OUT
m await --running --timeout 15 "$NBW"
m stop --all
check "stop --all stops every session's live workers, a notebook's too, and names the sessions" \
  eval '[ $RC = 0 ] && [ "$(nlines "$OUT")" = 8 ] && ! grep -qv " stopped$" <<<"$OUT" && hasE "$OUT" "^$NBW +stopped$" && has "$ERR" "stopped 8 workers (sessions " && has "$ERR" "notebook-$$" && has "$ERR" "default"'
m ps --json
check "  ... none is left live" eval '[ $RC = 0 ] && [ "$(jq length <<<"$OUT")" = 0 ]'
m stop --all
check "stop --all with nothing live says so on stderr, exit 0" \
  eval '[ $RC = 0 ] && [ -z "$OUT" ] && has "$ERR" "no live workers in any session"'

echo "# took $(($(date +%s) - START)) s"
echo "$PASS passed, $FAIL failed"
[ "$FAIL" = 0 ]
