#!/usr/bin/env bash
# The Python package as a user installs it, and two notebooks run on it
# against a real muster controller.
#
#   MUSTER_BUILD_DIR=build MUSTER_REPO=. bash tests/python/run_notebook.sh
#
# 1. In a fresh virtual environment, `pip install ./sdk/python` (no network:
#    the package's build backend is in the tree) and `import muster` works
#    with no PYTHONPATH, from the environment's site-packages, at the C
#    library's version; in a second one (no system packages at all), the
#    wheel the build made (build/python/muster-<version>-py3-none-any.whl).
# 2. Starts build/muster-controller on a free 127.0.0.1 port with a fresh
#    state directory and executes, with Debian's jupyter nbconvert and a
#    kernel on the first environment's python (ipykernel from Debian's
#    python3-ipykernel through --system-site-packages):
#    - tests/python/notebook.ipynb, the CML blog's code unchanged but for
#      `import muster as cdsw`: exactly two lines "IP 127.x.y.z" with distinct
#      addresses, the workers' greeting, no error;
#    - sdk/python/examples/quickstart.ipynb: no error; its saved output holds
#      the HTML table of two running workers, the failing worker's sentence,
#      the run's table with its latest loss, its metrics and rank 1's log.
#    The executed quickstart is also converted to HTML (nbconvert --to html),
#    copied to $MUSTER_NOTEBOOK_HTML where that is set.
# Prints PASS or FAIL lines; exits non-zero on failure. The controller and
# every workerd it started are ended on exit, by pid.
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
# The workers' --workdir, and where the environments are: their account
# (muster-worker) enters it and runs the first environment's python.
chmod 755 "$work"
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
      # Stop every worker of both notebooks' sessions, then note their
      # workerd pids (a backend_ref is "PID:START").
      for s in executed quickstart; do
        curl -s -m 10 -H "Authorization: Bearer $token" -X POST \
          "$url/api/v1/workers/stop" -d "{\"session\": \"notebook-$$-$s\"}" >/dev/null || true
      done
      pids=$(curl -s -m 10 -H "Authorization: Bearer $token" "$url/api/v1/workers?limit=5000" |
        "$PY" -c 'import json, sys
for w in json.load(sys.stdin)["workers"]:
    ref = (w.get("backend_ref") or "").split(":")[0]
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

# ---- 1. the package, installed as a user installs it ----
version=$(sed -n 's/^__version__ = "\(.*\)"$/\1/p' "$repo/sdk/python/muster/_version.py")
wheel=$build/python/muster-$version-py3-none-any.whl
[ -f "$wheel" ] || fail "no $wheel: build muster first (its python_wheel target)"
"$PY" -m venv --system-site-packages "$work/venv" >"$work/venv.log" 2>&1 ||
  fail "python3 -m venv failed (apt-get install python3-venv): $(tail -n 3 "$work/venv.log")"
"$PY" -m venv "$work/venv-wheel" >>"$work/venv.log" 2>&1 || fail "python3 -m venv failed"
# No index: everything the install needs is in the tree (a fetch would fail).
export PIP_NO_INDEX=1 PIP_DISABLE_PIP_VERSION_CHECK=1
# A copy of the sources, as a user's clone: pip writes nothing into the tree.
cp -r "$repo/sdk/python" "$work/src"
rm -rf "$work/src/build_backend/__pycache__" "$work/src/muster/__pycache__"
"$work/venv/bin/pip" install "$work/src" >>"$work/venv.log" 2>&1 ||
  fail "pip install ./sdk/python failed: $(tail -n 5 "$work/venv.log")"
"$work/venv-wheel/bin/pip" install "$wheel" >>"$work/venv.log" 2>&1 ||
  fail "pip install $wheel failed: $(tail -n 5 "$work/venv.log")"
for env in venv venv-wheel; do
  got=$(cd / && env -u PYTHONPATH "$work/$env/bin/python" -c \
    'import muster, os; d = os.path.dirname(muster.__file__)
print(muster.__version__, d, os.path.exists(os.path.join(d, "py.typed")))' 2>&1) ||
    fail "import muster in $env: $got"
  case $got in
    "$version $work/$env/lib/python3"*"/site-packages/muster True") ;;
    *) fail "$env: import muster gave '$got', not $version from its site-packages with py.typed" ;;
  esac
done
echo "$NAME: PASS: pip install ./sdk/python and the wheel $(basename "$wheel") import muster $version"

# ---- 2. the notebooks, on a kernel of the first environment ----
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

export MUSTER_URL="$url" MUSTER_TOKEN="$token" MUSTER_CLI="$build/muster"
unset MUSTER_STATE_DIR PYTHONPATH MUSTER_REPO

# The kernel is the environment's python (muster installed there; Debian's
# ipykernel through its system site-packages), whatever else is first on
# PATH or installed in the user's Jupyter directories: JUPYTER_PATH comes
# first in Jupyter's kernel search.
mkdir -p "$work/jupyter/kernels/python3" "$work/runtime" "$work/ipython"
cat >"$work/jupyter/kernels/python3/kernel.json" <<EOF
{"argv": ["$work/venv/bin/python", "-m", "ipykernel_launcher", "-f", "{connection_file}"],
 "display_name": "Python 3 (muster)", "language": "python"}
EOF
export JUPYTER_PATH="$work/jupyter" JUPYTER_RUNTIME_DIR="$work/runtime" IPYTHONDIR="$work/ipython"
export PYDEVD_DISABLE_FILE_VALIDATION=1

# execute NOTEBOOK OUT: runs a copy of NOTEBOOK in $work (the kernel's and
# so the workers' directory) and saves it, its outputs in, as $work/OUT.
execute() {
  cp "$1" "$work/in-$2"
  # A session each: one notebook's workers are not the other's.
  if ! MUSTER_SESSION="notebook-$$-${2%.ipynb}" timeout 300 "$JUPYTER" nbconvert --to notebook --execute \
      --ExecutePreprocessor.timeout=120 --ExecutePreprocessor.kernel_name=python3 \
      --output-dir "$work" --output "$2" "$work/in-$2" >"$work/nbconvert-$2.log" 2>&1; then
    tail -n 40 "$work/nbconvert-$2.log"
    fail "jupyter nbconvert could not execute $1 (see above)"
  fi
}

execute "$here/notebook.ipynb" executed.ipynb

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

# ---- the quickstart ----
execute "$repo/sdk/python/examples/quickstart.ipynb" quickstart.ipynb
if verdict=$("$PY" - "$work/quickstart.ipynb" <<'EOF'
import json, re, sys
nb = json.load(open(sys.argv[1]))
html, text, errors = [], [], []
for cell in nb["cells"]:
    for out in cell.get("outputs", []):
        kind = out.get("output_type")
        if kind == "error":
            errors.append("%s: %s" % (out.get("ename"), out.get("evalue")))
        elif kind == "stream" and out.get("name") == "stdout":
            t = out.get("text", "")
            text.append("".join(t) if isinstance(t, list) else t)
        elif kind in ("execute_result", "display_data"):
            for mime, into in (("text/html", html), ("text/plain", text)):
                t = out.get("data", {}).get(mime, "")
                into.append("".join(t) if isinstance(t, list) else t)
problems = []
if errors:
    problems.append("error outputs: " + "; ".join(errors))
tables = [h for h in html
          if 'class="muster-workers"' in h and h.count("muster-worker muster-running") == 2]
if not tables:
    problems.append("no HTML table of 2 running workers")
elif not re.search(r"127(\.\d+){3}", tables[0]) or "/#/workers/w-" not in tables[0]:
    problems.append("the running workers' table has no address or no link to the web UI")
if not any("muster-worker muster-failed" in h and "settings.json" in h for h in html):
    problems.append("no table of the failed worker saying what was missing (settings.json)")
if not any('class="muster-fields"' in h and "/#/runs/r-" in h and "succeeded" in h
           and re.search(r"loss 0\.\d+ \(step 19\)", h) for h in html):
    problems.append("no table of the run, succeeded, with its latest loss at step 19")
if not any("muster-progress" in h for h in html):
    problems.append("no progress display of a wait")
if not re.search(r"rank 1 final loss 0\.\d+", "".join(text)):
    problems.append("rank 1's log was not read back")
if not re.search(r"step 19 rank 1 loss 0\.\d+", "".join(text)):
    problems.append("the run's metrics did not end with step 19 of rank 1")
if len(re.findall(r"hello from", "".join(text))) != 2:
    problems.append("the two greeters' logs were not read back")
if not any(h.count("muster-worker muster-stopped") == 2 for h in html):
    problems.append("stop_workers() did not show the 2 idle workers stopped")
if problems:
    print("; ".join(problems))
    sys.exit(1)
print("tables of running, failed and stopped workers, the run with its latest loss, metrics, logs")
EOF
); then
  echo "$NAME: PASS: quickstart.ipynb: $verdict"
else
  fail "quickstart.ipynb: ${verdict:-could not read the executed notebook}"
fi
"$JUPYTER" nbconvert --to html --output-dir "$work" --output quickstart.html \
  "$work/quickstart.ipynb" >"$work/nbconvert-html.log" 2>&1 ||
  fail "nbconvert --to html of the executed quickstart failed: $(tail -n 5 "$work/nbconvert-html.log")"
if [ -n "${MUSTER_NOTEBOOK_HTML:-}" ]; then
  cp "$work/quickstart.html" "$MUSTER_NOTEBOOK_HTML"
  echo "$NAME: the executed quickstart, as HTML: $MUSTER_NOTEBOOK_HTML"
fi
