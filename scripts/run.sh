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
token=$(cat "$state/token")
auth="Authorization: Bearer $token"
api() { curl -sS --max-time 120 -H "$auth" -H 'Content-Type: application/json' "$@"; }

echo "== launch 2 workers (0.5 cores, 0.5 GiB each), each running a short Python script"
launched=$(api -X POST "$url/api/v1/workers" -d '{
  "n": 2, "cpu": 0.5, "memory": 0.5, "name": "hello", "session": "demo",
  "code": "import os, socket; print(\"worker\", os.environ[\"CDSW_ENGINE_ID\"], \"at\", os.environ[\"CDSW_IP_ADDRESS\"], \"on\", socket.gethostname())"
}')
ids=$(jq -c '[.workers[].id]' <<<"$launched")
echo "$launched" | jq -r '.workers[] | "  \(.id)  \(.status)"'

echo "== await them (until they finish, 60 s at most)"
result=$(api -X POST "$url/api/v1/workers/await" -d "{\"ids\": $ids, \"wait_for_completion\": true, \"timeout_seconds\": 60}")
echo "$result" | jq -r '.workers[] | "  \(.id)  \(.status)  ip \(.ip_address)  exit \(.exit_code)"'
echo "$result" | jq -r '.failures[] | "  FAILED \(.id)  \(.status)  \(.failure)"'

echo "== their logs"
for id in $(jq -r '.[]' <<<"$ids"); do
  api "$url/api/v1/workers/$id/logs" | sed 's/^/  /'
done

echo "== an idle worker (the kind that mpirun borrows), awaited until running, then stopped"
idle=$(api -X POST "$url/api/v1/workers" -d '{"n": 1, "cpu": 0.5, "memory": 0.5, "session": "demo"}')
iid=$(jq -r '.workers[0].id' <<<"$idle")
api -X POST "$url/api/v1/workers/await" -d "{\"ids\": [\"$iid\"], \"wait_for_completion\": false, \"timeout_seconds\": 30}" \
  | jq -r '.workers[] | "  \(.id)  \(.status)  ip \(.ip_address)  exec port \(.exec_port)"'
api -X POST "$url/api/v1/workers/stop" -d '{"session": "demo"}' | jq -r '.workers[] | "  \(.id)  \(.status)"'

echo
echo "The controller keeps running at $url (token in $state/token)."
echo "Stop it with: kill \$(pgrep -f 'muster-controller --listen $listen')"
failed=$(jq '.failures | length' <<<"$result")
[ "$failed" -eq 0 ]
