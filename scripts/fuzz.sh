#!/usr/bin/env bash
# Builds and runs muster's fuzzers (clang libFuzzer with AddressSanitizer and
# UBSan) over the parsers that read outside input, each for SECONDS (default
# 20), from the seed corpus in tests/fuzz/corpus/NAME (kept in the
# repository; inputs found on the way go to a scratch corpus, not into the
# tree). A crash, leak or undefined-behaviour report fails the run and its
# input is kept in build-fuzz/artifacts/ (add it to the seed corpus once
# fixed, as a regression input).
#
# usage: scripts/fuzz.sh [SECONDS] [NAME...]
#   (names: launch worker idx sse ps hostport exec)
set -euo pipefail
cd "$(dirname "$0")/.."
secs=${1:-20}
shift || true
names=("$@")
[ ${#names[@]} -gt 0 ] || names=(launch worker idx sse ps hostport exec)

cc=$(command -v clang || command -v clang-14 || true)
if [ -z "$cc" ]; then
  echo "fuzz: clang is not installed (scripts/setup.sh installs it)" >&2
  exit 1
fi
out=build-fuzz
mkdir -p "$out/artifacts"
flags=(-g -O1 -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=all -D_GNU_SOURCE
       -DMUSTER_VERSION='"fuzz"' -Icommon -Isdk/include -Icontroller -Itrainer)
# libmuster's files, for the targets that need the whole library (but the
# one a target includes itself, to reach its static functions)
sdk_lib_but() { local f; for f in sdk/lib/*.c; do [ "$f" = "$1" ] || echo "$f"; done; }

build() { # name sources... -- libs...
  local name=$1; shift
  local srcs=() libs=()
  while [ $# -gt 0 ] && [ "$1" != -- ]; do srcs+=("$1"); shift; done
  [ $# -gt 0 ] && shift
  libs=("$@")
  "$cc" "${flags[@]}" -o "$out/fuzz_$name" "${srcs[@]}" "${libs[@]}"
}

status=0
for name in "${names[@]}"; do
  case $name in
    launch) build launch tests/fuzz/fuzz_launch.c controller/validate.c common/errors.c common/utf8.c \
              -- $(pkg-config --cflags --libs jansson) ;;
    worker) build worker tests/fuzz/fuzz_worker.c controller/validate.c common/errors.c common/utf8.c \
              -- $(pkg-config --cflags --libs jansson) ;;
    ps) build ps tests/fuzz/fuzz_ps.c trainer/tr_ps_wire.c common/util.c common/hostport.c \
          common/errors.c -- $(pkg-config --cflags --libs jansson) -lm ;;
    exec) build exec tests/fuzz/fuzz_exec.c $(sdk_lib_but none) \
            common/errors.c common/hostport.c common/utf8.c -- \
            $(pkg-config --cflags --libs jansson libcurl gnutls) -lpthread ;;
    hostport) build hostport tests/fuzz/fuzz_hostport.c common/hostport.c ;;
    idx) build idx tests/fuzz/fuzz_idx.c trainer/tr_data.c common/errors.c -- -lm ;;
    sse) build sse tests/fuzz/fuzz_sse.c $(sdk_lib_but sdk/lib/events.c) common/errors.c \
           common/hostport.c common/utf8.c -- $(pkg-config --cflags --libs jansson libcurl gnutls) \
           -lpthread ;;
    *) echo "fuzz: no fuzzer named $name" >&2; exit 2 ;;
  esac
  scratch=$(mktemp -d)
  echo "== fuzz_$name for ${secs} s"
  if ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 \
     "$out/fuzz_$name" -max_total_time="$secs" -print_final_stats=1 -rss_limit_mb=2048 \
       -artifact_prefix="$out/artifacts/$name-" "$scratch" "tests/fuzz/corpus/$name" \
       > "$out/fuzz_$name.log" 2>&1; then
    grep -E '^stat::(number_of_executed_units|peak_rss_mb)|^#[0-9]+.*DONE' "$out/fuzz_$name.log" |
      tail -3 | sed 's/^/   /'
    grep -oE 'cov: [0-9]+ ft: [0-9]+' "$out/fuzz_$name.log" | tail -1 | sed 's/^/   /'
  else
    echo "fuzz_$name FOUND A PROBLEM: see $out/fuzz_$name.log and $out/artifacts/"
    grep -E 'ERROR|runtime error|SUMMARY' "$out/fuzz_$name.log" | head -5 | sed 's/^/   /'
    status=1
  fi
  rm -rf "$scratch"
done
rm -rf /dev/shm/muster-fuzz-idx-* 2>/dev/null || true
exit $status
