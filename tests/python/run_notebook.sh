#!/usr/bin/env bash
# Runs tests/python/notebook.ipynb headless against a real muster controller
# and checks what it printed.
#
#   MUSTER_BUILD_DIR=build MUSTER_REPO=. bash tests/python/run_notebook.sh
#
# Starts build/muster-controller on a free 127.0.0.1 port with a fresh state
# directory, exports MUSTER_URL / MUSTER_TOKEN for the notebook's kernel,
# executes the notebook with Debian's jupyter nbconvert and python3 kernel
# (packages jupyter-nbconvert, python3-ipykernel), then asserts that its
# outputs hold exactly two lines "IP 127.x.y.z" with distinct addresses, the
# workers' greeting, and no error. Prints one PASS or FAIL line; exits non-zero
# on failure. The controller and every workerd it started are ended on exit,
# by pid.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "${MUSTER_REPO:-$here/../..}" && pwd)
build=${MUSTER_BUILD_DIR:-$repo/build}
PY=/usr/bin/python3
JUPYTER=/usr/bin/jupyter
NAME="run_notebook"

fail() {
  echo "$NAME: FAIL: $*"
  exit 1
}

[ -x "$build/muster-controller" ] ||
  fail "$build/muster-controller is missing: build muster, or set MUSTER_BUILD_DIR"
if ! [ -x "$JUPYTER" ] || ! "$PY" -c 'import nbconvert, ipykernel' 2>/dev/null; then
  fail "Debian's jupyter nbconvert and ipykernel are needed:" \
       "apt-get install -y --no-install-recommends jupyter-nbconvert python3-ipykernel"
fi
command -v curl >/dev/null || fail "curl is needed"

work=$(mktemp -d "${TMPDIR:-/tmp}/muster-notebook.XXXXXX")
chmod 755 "$work"  # the workers' --workdir: their account (muster-worker) enters it
state="$work/state"
ctl_pid=""
url=""
token=""

# Pids of the processes whose parent is $1.
children_of() {
  local stat f
  for f in /proc/[0-9]*/stat; do
    stat=$(cat "$f" 2>/dev/null) || continue
    stat=${stat##*) }
    # shellcheck disable=SC2086  # split the fields: $2 = state, $3 = ppid
    set -- "$1" $stat
    [ "${3:-}" = "$1" ] && { f=${f#/proc/}; echo "${f%/stat}"; }
  done
  return 0
}

# True if pid $1 is (or was) a workerd of ours: gone (a pid in use as a
# process group id is never handed out again, so the group is ours or empty),
# a zombie, or a muster-workerd.
ours() {
  local stat
  [ -e "/proc/$1" ] || return 0
  stat=$(cat "/proc/$1/stat" 2>/dev/null) || return 0
  stat=${stat##*) }
  [ "${stat%% *}" = Z ] && return 0
  grep -qa muster-workerd "/proc/$1/cmdline" 2>/dev/null
}

cleanup() {
  local rc=$? pids="" pid
  trap - EXIT INT TERM
  set +e
  if [ -n "$ctl_pid" ]; then
    if [ -n "$url" ] && kill -0 "$ctl_pid" 2>/dev/null; then
      # Stop every worker this controller has, then note their workerd pids.
      curl -s -m 10 -H "Authorization: Bearer $token" -X POST \
        "$url/api/v1/workers/stop" -d "{\"session\": \"${MUSTER_SESSION:-default}\"}" >/dev/null || true
      pids=$(curl -s -m 10 -H "Authorization: Bearer $token" "$url/api/v1/workers" |
        "$PY" -c 'import json, sys
for w in json.load(sys.stdin)["workers"]:
    ref = w.get("backend_ref") or ""
    if ref.isdigit(): print(ref)' 2>/dev/null) || true
    fi
    pids="$pids $(children_of "$ctl_pid")"
    kill -TERM "$ctl_pid" 2>/dev/null || true
    for _ in $(seq 100); do
      kill -0 "$ctl_pid" 2>/dev/null || break
      sleep 0.1
    done
    kill -KILL "$ctl_pid" 2>/dev/null || true
    wait "$ctl_pid" 2>/dev/null || true
    for pid in $pids; do
      if [ "$pid" -gt 1 ] 2>/dev/null && ours "$pid"; then
        kill -KILL -- "-$pid" 2>/dev/null
      fi
    done
  fi
  if [ "$rc" -ne 0 ] && [ -f "$work/controller.log" ]; then
    echo "--- controller log (last lines) ---"
    tail -n 20 "$work/controller.log"
  fi
  bash "$(dirname "$0")/../cgroup_clean.sh" "$work"
  if [ -n "${MUSTER_KEEP_STATE:-}" ]; then echo "$NAME: kept $work"; else rm -rf "$work"; fi
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

mkdir -p "$state"
# Port 0: the controller binds a free port itself and writes it to state/url.
"$build/muster-controller" --listen 127.0.0.1:0 --network host --state-dir "$state" --cpus 8 \
  --workdir "$work" </dev/null >"$work/controller.log" 2>&1 &
ctl_pid=$!

for _ in $(seq 150); do
  kill -0 "$ctl_pid" 2>/dev/null || fail "muster-controller exited at start"
  if [ -s "$state/url" ] && [ -s "$state/token" ] &&
     curl -sf -m 2 "$(cat "$state/url")/api/v1/health" >/dev/null; then
    url=$(cat "$state/url")
    token=$(cat "$state/token")
    break
  fi
  sleep 0.1   # the controller is starting; there is nothing to await yet
done
[ -n "$url" ] || fail "muster-controller did not answer within 15 s"

export MUSTER_URL="$url" MUSTER_TOKEN="$token" MUSTER_REPO="$repo"
export MUSTER_SESSION="notebook-$$"
unset MUSTER_STATE_DIR

# The kernel must be Debian's python3 (the one with ipykernel), whatever
# else is first on PATH or installed in the user's Jupyter directories:
# JUPYTER_PATH comes first in Jupyter's kernel search.
mkdir -p "$work/jupyter/kernels/python3" "$work/runtime" "$work/ipython"
cat >"$work/jupyter/kernels/python3/kernel.json" <<EOF
{"argv": ["$PY", "-m", "ipykernel_launcher", "-f", "{connection_file}"],
 "display_name": "Python 3 (Debian)", "language": "python"}
EOF
export JUPYTER_PATH="$work/jupyter" JUPYTER_RUNTIME_DIR="$work/runtime" IPYTHONDIR="$work/ipython"
export PYDEVD_DISABLE_FILE_VALIDATION=1

if ! timeout 300 "$JUPYTER" nbconvert --to notebook --execute \
    --ExecutePreprocessor.timeout=120 --ExecutePreprocessor.kernel_name=python3 \
    --output-dir "$work" --output executed.ipynb "$here/notebook.ipynb" \
    >"$work/nbconvert.log" 2>&1; then
  tail -n 40 "$work/nbconvert.log"
  fail "jupyter nbconvert could not execute the notebook (see above)"
fi

# Check the executed notebook's outputs.
if verdict=$("$PY" - "$work/executed.ipynb" <<'EOF'
import json, re, sys
nb = json.load(open(sys.argv[1]))
lines, errors = [], []
for cell in nb["cells"]:
    for out in cell.get("outputs", []):
        kind = out.get("output_type")
        if kind == "error":
            errors.append("%s: %s" % (out.get("ename"), out.get("evalue")))
        elif kind == "stream":
            if out.get("name") == "stderr":
                continue
            text = out.get("text", "")
            lines += ("".join(text) if isinstance(text, list) else text).splitlines()
        elif kind in ("execute_result", "display_data"):
            text = out.get("data", {}).get("text/plain", "")
            lines += ("".join(text) if isinstance(text, list) else text).splitlines()
problems = []
if errors:
    problems.append("error outputs: " + "; ".join(errors))
ip_lines = [l for l in lines if l.startswith("IP")]
ips = [m.group(1) for m in (re.fullmatch(r"IP (127(?:\.\d{1,3}){3})", l) for l in ip_lines) if m]
if len(ip_lines) != 2 or len(ips) != 2:
    problems.append("expected exactly 2 lines 'IP 127.x.y.z', got %r" % ip_lines)
elif len(set(ips)) != 2:
    problems.append("the two workers have the same address: %r" % ips)
if not any("Hello from a muster worker" in l for l in lines):
    problems.append("no worker log said 'Hello from a muster worker'")
if problems:
    print("; ".join(problems))
    sys.exit(1)
print("2 workers at " + " and ".join(ips))
EOF
); then
  echo "$NAME: PASS: $verdict"
else
  fail "${verdict:-could not read the executed notebook}"
fi
