#!/usr/bin/env bash
# The main job: builds muster, starts a local controller if none answers,
# launches two workers that each report where they run, awaits them, shows
# their logs and stops what is left. Installs what is missing (Debian 12).
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)

bash scripts/setup.sh
cmake -S . -B build -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build build -j"$(nproc)" >/dev/null

state=${MUSTER_STATE_DIR:-$HOME/.muster}
listen=${MUSTER_LISTEN:-127.0.0.1:8470}
url="http://$listen"

if ! curl -sf "$url/api/v1/health" >/dev/null 2>&1; then
  echo "== starting muster-controller on $url (state in $state)"
  mkdir -p "$state"
  nohup "$root/build/muster-controller" --listen "$listen" --state-dir "$state" \
    >>"$state/controller.log" 2>&1 &
  for _ in $(seq 100); do
    curl -sf "$url/api/v1/health" >/dev/null 2>&1 && break
    sleep 0.1
  done
  curl -sf "$url/api/v1/health" >/dev/null || { echo "the controller did not start; see $state/controller.log" >&2; exit 1; }
fi
export MUSTER_STATE_DIR=$state
muster=$root/build/muster

echo "== muster launch: 2 workers (0.5 cores, 0.5 GiB each) running a short Python script"
ids=$("$muster" launch -n 2 --cpu 0.5 --memory 0.5 --name hello --session demo --code \
  'import os, socket; print("worker", os.environ["CDSW_ENGINE_ID"], "at", os.environ["CDSW_IP_ADDRESS"], "on", socket.gethostname())')
echo "$ids" | sed 's/^/  /'

echo "== muster await --completion (60 s at most)"
status=0
echo "$ids" | "$muster" await --completion --timeout 60 - | sed 's/^/  /' || status=1

echo "== muster logs"
for id in $ids; do
  "$muster" logs "$id" | sed 's/^/  /'
done

echo "== an idle worker (the kind mpirun borrows): launch, await --running, ps, stop"
iid=$("$muster" launch --cpu 0.5 --memory 0.5 --session demo)
"$muster" await --running --timeout 30 "$iid" | sed 's/^/  /'
"$muster" ps --session demo | sed 's/^/  /'
"$muster" stop --all --session demo | sed 's/^/  /'

echo
echo "The controller keeps running at $url (token in $state/token)."
echo "Try: MUSTER_STATE_DIR=$state $muster ps -a"
echo "Stop it with: kill \$(pgrep -f 'muster-controller --listen $listen')"
exit $status
