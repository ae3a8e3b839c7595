# lib.sh: what the Slurm tests share (sourced, never run). The sourcing
# script sets cluster (cluster.sh's path), build, tmp, and ctl_pid, pass
# and fail, before it calls any of these.

# Kills the test's controller, shows its log's end if a check failed, takes
# the cluster down and removes tmp (unless KEEP is set): the cluster
# tests' EXIT trap.
cluster_cleanup() {
  [ -n "$ctl_pid" ] && kill -9 "$ctl_pid" 2>/dev/null
  if [ "$fail" -gt 0 ] && [ -f "$tmp/controller.log" ]; then
    echo "# the controller's log, last lines:"
    tail -25 "$tmp/controller.log" | sed 's/^/#   /'
  fi
  bash "$cluster" down >/dev/null 2>&1 || echo "# cluster.sh down failed" >&2
  if [ -n "${KEEP:-}" ]; then echo "# kept $tmp"; else rm -rf "$tmp"; fi
}

check() { # check "what a user sees" COMMAND...
  local what=$1
  shift
  if "$@" >/dev/null 2>&1; then
    echo "ok - $what"
    pass=$((pass + 1))
  else
    echo "not ok - $what"
    fail=$((fail + 1))
    return 1
  fi
}

# on the login node
login() { bash "$cluster" exec "$@"; }
m() { login env MUSTER_URL=http://127.0.0.1:8470 MUSTER_TOKEN="$(cat "$tmp/state/token")" \
  "$build/muster" "$@"; }
field() { python3 -c 'import json,sys; w=json.load(sys.stdin); print(w.get(sys.argv[1]) or "")' "$1"; }

wait_for() { # wait_for SECONDS WHAT COMMAND...: polls COMMAND until it succeeds
  local secs=$1 what=$2 end
  shift 2
  end=$((SECONDS + secs))
  until "$@" >/dev/null 2>&1; do
    if [ $SECONDS -ge $end ]; then
      echo "# gave up after ${secs} s waiting for $what" >&2
      return 1
    fi
    sleep 0.2
  done
}
