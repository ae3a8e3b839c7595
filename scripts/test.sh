#!/usr/bin/env bash
# Runs every muster test: installs what is missing (Debian 12, as root),
# builds twice (plain, and with AddressSanitizer + UBSan) and runs the
# whole ctest suite in each build.
set -euo pipefail
cd "$(dirname "$0")/.."

bash scripts/setup.sh

# The tests' workers run their code as muster-worker, from this checkout
# (the trainer, the tests' scripts, MNIST): it must be able to reach it. A
# clone in a 0700 home is out of its reach, and this script does not open
# a home to it.
if [ "$(id -u)" -eq 0 ] && ! runuser -u muster-worker -- test -r "$PWD/CMakeLists.txt"; then
  echo "test.sh: the account muster-worker, which runs the workers' code, cannot read" \
    "$PWD/CMakeLists.txt: clone muster where every account may read it (/opt, /srv, /var/tmp)," \
    "or let it through the directories above: setfacl -m u:muster-worker:x DIR" >&2
  exit 1
fi

# Two accounts of the tests' own users (`muster-controller user add
# --unix-user`): workers of two users run as two accounts, here and on the
# Slurm test cluster. System accounts without a login, as muster-worker.
if [ "$(id -u)" -eq 0 ]; then
  for acct in muster-test-u1 muster-test-u2; do
    getent passwd "$acct" >/dev/null ||
      useradd --system --create-home --home-dir "/var/lib/$acct" --shell /usr/sbin/nologin "$acct"
  done
fi

status=0
# The style rules a machine can check (format, banned functions, number
# parsing): a failure fails the run, after the tests have run too.
echo "== style =="
bash scripts/check-style.sh || status=1

# The fuzzers (clang libFuzzer + ASan + UBSan), about 20 s each, from the
# seed corpus in tests/fuzz/corpus.
echo "== fuzz =="
bash scripts/fuzz.sh 20 || status=1

jobs=$(nproc)
# The main job (scripts/run.sh) builds with optimisation, where gcc sees
# more (a format's truncation, say) and -Werror fails on it: that build
# must build too.
echo "== release build =="
cmake -S . -B build-test-release -DCMAKE_BUILD_TYPE=Release >/dev/null
if ! cmake --build build-test-release -j"$jobs" >build-test-release.log 2>&1; then
  grep -B2 -A6 "error" build-test-release.log | head -60
  echo "test.sh: the release build (scripts/run.sh's) failed; its log: build-test-release.log" >&2
  status=1
fi
for variant in plain sanitize; do
  dir=build-test-$variant
  flags=(-DCMAKE_BUILD_TYPE=Debug)
  [ "$variant" = sanitize ] && flags+=(-DMUSTER_SANITIZE=ON)
  echo "== $variant build =="
  cmake -S . -B "$dir" "${flags[@]}" >/dev/null
  cmake --build "$dir" -j"$jobs" >/dev/null
  echo "== $variant tests =="
  # Sanitizer reports of the daemons land in their logs, which the
  # black-box harness reads; the test binaries themselves abort on one.
  if ! (cd "$dir" && ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 \
        UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
        ctest --output-on-failure); then
    status=1
  fi
done
exit $status
