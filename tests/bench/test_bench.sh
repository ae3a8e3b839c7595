#!/usr/bin/env bash
# Every bench in bench/ in its quick mode (small N, one repetition: a smoke
# run, not a measurement), so that none rots unnoticed: each must exit 0 and
# print its figures (the line named below), or exit 77 where it cannot run
# here (it says why; reported as skipped). Each gets at most 300 s.
#
# Each bench starts its own controllers on free loopback ports with fresh
# state directories in /tmp, and ends what it started (by pid) whatever
# happens; a timeout sends it SIGTERM first, so that it can.
#
# usage: tests/bench/test_bench.sh BUILD_DIR SOURCE_DIR   (ctest runs it)
# Prints one `ok N - ...` / `not ok N - ...` line per bench, then
# `N passed, M skipped, K failed`; exits 1 if any failed.
set -uo pipefail
build=$(cd "${1:?usage: test_bench.sh BUILD_DIR SOURCE_DIR}" && pwd) || exit 2
src=$(cd "${2:?usage: test_bench.sh BUILD_DIR SOURCE_DIR}" && pwd) || exit 2
command -v timeout >/dev/null || { echo "missing tool: timeout" >&2; exit 2; }

export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
# In a sanitized build, Open MPI's unloaded plugins leave leaks that cannot be
# suppressed by name (see tests/trainer/test_trainer.sh): the benches run
# without leak detection, as tests/run does. Other sanitizer reports still
# fail a bench (its processes exit non-zero).
export ASAN_OPTIONS=${ASAN_OPTIONS:-}:detect_leaks=0
export LSAN_OPTIONS=${LSAN_OPTIONS:-}${LSAN_OPTIONS:+:}suppressions=$src/tests/trainer/lsan.supp
unset MUSTER_URL MUSTER_TOKEN MUSTER_SESSION MUSTER_STATE_DIR

tmp=$(mktemp -d /tmp/muster-bench-test.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
trap 'exit 130' INT TERM
n=0 pass=0 skip=0 fail=0

ok() { n=$((n + 1)) pass=$((pass + 1)); echo "ok $n - $1"; }
skipped() { n=$((n + 1)) skip=$((skip + 1)); echo "ok $n - $1 # SKIP $2"; }
notok() {
  n=$((n + 1)) fail=$((fail + 1))
  echo "not ok $n - $1"
  shift
  for d in "$@"; do printf '#   %s\n' "$d"; done
}

# bench NAME 'PATTERN[;PATTERN...]' [ARGS...]: runs bench/NAME --build BUILD
# --quick ARGS; passes if it exits 0 and its output has a line matching each
# extended regular expression PATTERN (its final figures), skips on 77.
bench() {
  local name=$1 patterns=$2 out rc t0 secs p pats=() missing=() why
  shift 2
  out=$tmp/$name.out
  if [ ! -e "$src/bench/$name" ]; then
    notok "bench/$name --quick: missing ($src/bench/$name)"
    return
  fi
  t0=$(date +%s%N)
  timeout -k 30 300 "$src/bench/$name" --build "$build" --quick "$@" >"$out" 2>&1
  rc=$?
  secs=$((($(date +%s%N) - t0) / 1000000))
  secs=$((secs / 1000)).$(printf '%03d' $((secs % 1000)) | cut -c1)
  if [ $rc = 77 ]; then
    skipped "bench/$name --quick ($secs s)" "$(grep -m1 -i 'skipped' "$out" || tail -1 "$out")"
    return
  fi
  IFS=';' read -ra pats <<<"$patterns"
  for p in "${pats[@]}"; do
    grep -Eq -- "$p" "$out" || missing+=("$p")
  done
  if [ $rc = 0 ] && [ ${#missing[@]} = 0 ]; then
    ok "bench/$name --quick ($secs s)"
    sed 's/^/#   /' "$out"
  else
    case $rc in
      124 | 137) why="timed out after 300 s (exit $rc)" ;;
      *) why="exit $rc" ;;
    esac
    for p in "${missing[@]}"; do why+="; no line matches '$p'"; done
    notok "bench/$name --quick ($secs s): $why" \
      "last lines of its output:"
    tail -25 "$out" | sed 's/^/#     /'
  fi
}

start=$(date +%s)
bench await '^target: muster await on a running worker'
bench away '^1\. exec, largest gap paused/reference: .* ratio;^2\. SIGTERM, workerd gone dead/alive: .* ratio'
bench controller '^\(a\) first page;^\(e\) stop of .* awaits parked;^\(b\) .* heartbeating;^\(c\) bulk stop;^\(d\) launch \+ await;bare libmicrohttpd, same body: .* ratio'
bench launch '^ +10 .*\(target: ratio >= 0\.90\);^await wake-up latency over'
bench web '^state change -> updated row;ratio row/request'
bench trainer '^1\. batch 128: .* ratio;^3\. gradient exchange .* ratio;^4\. step time .* ratio'
bench slurm '^1\. launch -> running, N=3:;^2\. allreduce, 3 workers on 3 nodes, .* ratio'
bench run '^ +wall: muster run .* fixed cost ;^bench/run: done'
bench start '^ratio muster-train/reference: warm;^target: warm <='
bench flood '^idle .* ratio p99;^exec .* ratio p99;^worst p99 of the API under'
bench metrics '^\(a\) reference, sqlite3 alone.* ratio;^\(b\) GET metrics\?names=loss.* ratio;^\(c\) Python log_metrics.* ratio;^\(c\) C muster_log_metrics.* ratio'
bench notebook '^\(a\) await_workers \(long wait\) interrupted: .* ratio;^\(a\) await_workers \(slices wait\) interrupted: .* ratio;^\(b\) _repr_html_\(\) of 1,000 workers: .* ratio'
echo "# took $(($(date +%s) - start)) s"
echo "$pass passed, $skip skipped, $fail failed"
[ "$fail" = 0 ]
