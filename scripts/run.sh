#!/usr/bin/env bash
# The main job: builds muster, starts a local controller if none answers,
# then trains on real MNIST across two workers with
#   muster run --mode allreduce --workers 2 -- muster-train
# and prints the trainer's summary and where the web UI is. Installs what is
# missing (Debian 12, as root).
set -euo pipefail
cd "$(dirname "$0")/.."

bash scripts/setup.sh
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build -j"$(nproc)" >/dev/null

# Workers run their code as the account muster-worker, never as root, and
# it may not reach this checkout (a clone in root's 0700 home): what the
# job runs is installed where every account may read it and only root may
# write it, MNIST beside it, and the job starts there.
prefix=${MUSTER_PREFIX:-/opt/muster}
(
  umask 022
  cmake --install build --prefix "$prefix" >/dev/null
  mkdir -p "$prefix/share/muster/mnist"
  cp -u data/mnist/*-ubyte "$prefix/share/muster/mnist/"
)
bin=$prefix/bin

state=${MUSTER_STATE_DIR:-$HOME/.muster}
listen=${MUSTER_LISTEN:-127.0.0.1:8470}
url="http://$listen"

if ! curl -sf "$url/api/v1/health" >/dev/null 2>&1; then
  echo "== starting muster-controller on $url (state in $state)"
  mkdir -p -m 0700 "$state"
  nohup "$bin/muster-controller" --listen "$listen" --state-dir "$state" \
    >>"$state/controller.log" 2>&1 &
  for _ in $(seq 100); do
    curl -sf "$url/api/v1/health" >/dev/null 2>&1 && break
    sleep 0.1
  done
  curl -sf "$url/api/v1/health" >/dev/null || { echo "the controller did not start; see $state/controller.log" >&2; exit 1; }
fi
export MUSTER_STATE_DIR=$state
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
muster=$bin/muster
train=$bin/muster-train
cd "$prefix"  # the workers' directory: their account reads it

echo "== muster run --mode allreduce --workers 2 -- muster-train (real MNIST, 3 epochs)"
echo "   two workers are launched and awaited; mpirun runs here and starts its daemons"
echo "   inside the workers through their exec channels (no SSH); the workers stop at the end"
out=$(mktemp)
status=0
"$muster" run --mode allreduce --workers 2 --cpu 1 --memory 1 --timeout 60 -- \
  "$train" --mode allreduce --epochs 3 --data "$prefix/share/muster/mnist" | tee "$out" || status=1
summary=$(grep -o '{"mode".*}' "$out" | tail -1)
rm -f "$out"
echo
if [ -n "$summary" ]; then
  echo "== the trainer's summary"
  echo "$summary" | jq .
fi

echo "== the same workers API by hand: launch, await, logs, stop"
ids=$("$muster" launch -n 2 --cpu 0.5 --memory 0.5 --name hello --session demo --code \
  'import os, socket; print("worker", os.environ["CDSW_ENGINE_ID"], "at", os.environ["CDSW_IP_ADDRESS"], "on", socket.gethostname())')
echo "$ids" | "$muster" await --completion --timeout 60 - | sed 's/^/  /' || status=1
for id in $ids; do
  "$muster" logs "$id" | sed 's/^/  /'
done

echo
echo "The controller keeps running at $url (token in $state/token)."
# The sign-in link carries the API token: on a terminal only, never into a
# file this script's output may be going to.
if [ -t 1 ]; then
  echo "Web UI: $url/?token=$(cat "$state/token")"
else
  echo "Web UI: $url/?token=<the token in $state/token>"
fi
echo "Try: MUSTER_STATE_DIR=$state $muster ps -a"
echo "Stop it with: kill \$(pgrep -f 'muster-controller --listen $listen')"
exit $status
