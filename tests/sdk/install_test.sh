#!/usr/bin/env bash
# install_test.sh: installs muster into a temporary prefix and builds a small
# client program against the installed libmuster three ways: with
# pkg-config, with CMake's find_package(muster), and statically.
#
#   tests/sdk/install_test.sh BUILD_DIR SOURCE_DIR
#
# Prints one `ok - ...` / `not ok - ...` line per check and at the end
# `N passed, M failed`; exits non-zero if any check failed.
# shellcheck disable=SC2034  # the checks read variables inside eval strings
set -u

BUILD=${1:-/work/main/build}
SRC=${2:-$(cd "$(dirname "$0")/../.." && pwd)}
BUILD=$(cd "$BUILD" 2>/dev/null && pwd) || { echo "no build dir: $1" >&2; exit 2; }
SRC=$(cd "$SRC" 2>/dev/null && pwd) || { echo "no source dir: $2" >&2; exit 2; }
CC=${CC:-cc}
for t in cmake pkg-config "$CC" readelf nm timeout; do
  command -v "$t" >/dev/null || { echo "missing tool: $t" >&2; exit 2; }
done

TMP=$(mktemp -d /tmp/muster-install-test.XXXXXX)
trap 'bash "$(dirname "$0")/../cgroup_clean.sh" "$TMP"; rm -rf "$TMP"' EXIT
P=$TMP/prefix
PASS=0
FAIL=0

ok() { PASS=$((PASS + 1)); echo "ok - $1"; }
notok() {
  FAIL=$((FAIL + 1))
  echo "not ok - $1"
  shift
  for d in "$@"; do printf '%s\n' "$d" | head -n 40 | sed 's/^/#   /'; done
}
# check NAME COMMAND...: ok if COMMAND succeeds; on failure shows $LOG.
LOG=""
check() {
  local name=$1
  shift
  if "$@"; then ok "$name"; else notok "$name" "$LOG"; fi
}
# cap CMD...: runs CMD (bounded); its output in LOG, its status in RC.
RC=0
cap() {
  LOG=$(timeout -k 2 120 "$@" 2>&1)
  RC=$?
  return $RC
}

# ---- install ----
cap cmake --install "$BUILD" --prefix "$P"
check "cmake --install $BUILD --prefix <tmp>" eval '[ $RC = 0 ]'
for b in muster muster-controller muster-workerd muster-train muster-launcher; do
  LOG="$(ls -l "$P/bin" 2>&1)"
  check "installed bin/$b" test -x "$P/bin/$b"
done
# The CPU trainer needs no CUDA library; its CUDA plugin, where one was built,
# is installed where the installed muster-train looks for it.
LOG="$(readelf -d "$P/bin/muster-train" 2>&1)"
check "the installed muster-train names no CUDA library" \
  eval '! readelf -d "$P/bin/muster-train" | grep -Eq "NEEDED.*(libcudart|libcublas|libnccl)"'
if [ -e "$BUILD/libmuster-train-cuda.so" ]; then
  LOG="$(ls -lR "$P/lib" 2>&1 | head -40)"
  check "installed the CUDA plugin beside libmuster (lib*/muster/libmuster-train-cuda.so)" \
    eval 'ls "$P"/lib*/muster/libmuster-train-cuda.so >/dev/null 2>&1'
  cap "$P/bin/muster-train" --device cuda --steps 1 --synthetic 1000
  check "the installed muster-train finds its plugin (trains on a GPU, or exit 2 naming the GPU or a CUDA library, not \"built without CUDA\")" \
    eval '[ $RC = 0 ] || { [ $RC = 2 ] && echo "$LOG" | grep -Eq "no CUDA device|needs lib"; }'
fi
# The public headers: the SDK's own, and the tables it shares with every
# part (they live in common/, the bottom layer).
for h in sdk/include/muster.h common/muster_errors.h common/muster_status.h; do
  LOG="$(ls -l "$P/include" 2>&1)"
  check "installed include/${h##*/} (same as the source's $h)" cmp -s "$P/include/${h##*/}" "$SRC/$h"
done
LIBDIR=$(dirname "$(find "$P" -name libmuster.a -print -quit 2>/dev/null)" 2>/dev/null)
LOG="$(find "$P" -name 'libmuster*' 2>&1)"
check "installed libmuster.a and libmuster.so in the same lib dir" \
  eval '[ -f "$LIBDIR/libmuster.a" ] && [ -e "$LIBDIR/libmuster.so" ] && [ -e "$LIBDIR/libmuster.so.4" ]'
# The shared library exports its API and nothing else: every function it
# defines for its users is declared in the installed headers.
LOG=$(nm -D --defined-only "$LIBDIR/libmuster.so" 2>&1 | awk '$2 == "T" {print $3}' |
  while read -r sym; do cat "$P/include/muster.h" "$P/include/muster_errors.h" | grep -qw "$sym" || echo "$sym"; done)
check "libmuster.so exports only what muster.h and muster_errors.h declare (not: ${LOG:-none})" \
  eval '[ -z "$LOG" ] && [ -n "$(nm -D --defined-only "$LIBDIR/libmuster.so" 2>/dev/null)" ]'
[ -n "$LIBDIR" ] || LIBDIR=$P/lib
PC=$LIBDIR/pkgconfig
LOG="$(find "$P" -name '*.pc' -o -name 'musterConfig*.cmake' 2>&1)"
check "installed pkgconfig/muster.pc and cmake/muster/musterConfig.cmake" \
  eval '[ -f "$PC/muster.pc" ] && [ -f "$LIBDIR/cmake/muster/musterConfig.cmake" ]'

cap env -u LD_LIBRARY_PATH "$P/bin/muster" --version
check "the installed muster CLI runs from the prefix (finds its libmuster)" \
  eval '[ $RC = 0 ] && grep -q "^muster [0-9]" <<<"$LOG"'
cap env LD_LIBRARY_PATH="$LIBDIR" "$P/bin/muster" --help
check "the installed muster CLI prints its usage (with LD_LIBRARY_PATH)" \
  eval '[ $RC = 0 ] && grep -q "^usage: muster" <<<"$LOG"'
cap timeout 10 "$P/bin/muster-controller" --help
check "the installed muster-controller runs (--help)" eval '[ $RC = 0 ] && grep -q "^usage: muster-controller" <<<"$LOG"'

# The Python client is installed where the build's python3 imports from (or
# the MUSTER_PYTHON_DIR it was configured with).
PYDIR=$(sed -n 's/^MUSTER_PYTHON_DIR:STRING=//p' "$BUILD/CMakeCache.txt")
case $PYDIR in /*) ;; *) PYDIR=$P/$PYDIR ;; esac
PY=$(sed -n 's/^Python3_EXECUTABLE:[A-Z]*=//p' "$BUILD/CMakeCache.txt")
check "installed the Python package muster in MUSTER_PYTHON_DIR ($PYDIR)" \
  test -f "$PYDIR/muster/__init__.py" -a -f "$PYDIR/muster/py.typed" -a -f "$PYDIR/muster/_client.py"
cap env PYTHONPATH="$PYDIR" "${PY:-python3}" -c 'import muster; print(muster.__file__)'
check "  ... python3 imports it from there" eval '[ $RC = 0 ] && [ "$(realpath "$LOG")" = "$(realpath "$PYDIR/muster/__init__.py")" ]'
cap find "$PYDIR/muster" -name __pycache__
check "  ... without the source tree's bytecode" eval '[ $RC = 0 ] && [ -z "$LOG" ]'

# The installed controller serves the installed web files, not the source
# tree's: a marker added to the installed index.html comes back.
echo "<!-- installed copy $$ -->" >>"$P/share/muster/web/index.html"
# index_served: starts the installed controller (no backend), fetches its
# index.html into LOG (its log appended), stops it.
index_served() {
  local ctl url
  mkdir -p "$TMP/state"
  rm -f "$TMP/state/url"
  "$P/bin/muster-controller" --listen 127.0.0.1:0 --state-dir "$TMP/state" --backend external \
    >"$TMP/ctl.log" 2>&1 &
  ctl=$!
  for _ in $(seq 300); do [ -s "$TMP/state/url" ] && break; kill -0 $ctl 2>/dev/null || break; sleep 0.1; done
  url=$(cat "$TMP/state/url" 2>/dev/null)
  cap curl -sf --max-time 10 "$url/index.html"
  kill $ctl 2>/dev/null
  wait $ctl 2>/dev/null
  LOG="$LOG
$(cat "$TMP/ctl.log")"
}
index_served
check "the installed muster-controller serves the installed web UI (share/muster/web)" \
  eval 'grep -qF "<!-- installed copy $$ -->" <<<"$LOG"'
# ... but not one that someone else could have made or filled: with share/
# writable by others (as /tmp/share would be, for a build in /tmp/b), the
# controller keeps the source tree's web/.
chmod o+w "$P/share"
index_served
chmod o-w "$P/share"
check "  ... and not a web directory others may write to (it serves the source tree's then)" \
  eval '[ $RC = 0 ] && ! grep -qF "<!-- installed copy $$ -->" <<<"$LOG" && grep -q "<html" <<<"$LOG"'

# A library built with MUSTER_SANITIZE needs its programs linked with the
# same sanitizer runtimes (the ASan runtime must come first).
SAN=""
if nm -A "$LIBDIR/libmuster.a" 2>/dev/null | grep -qE "__(asan|ubsan)_"; then
  SAN="-fsanitize=address,undefined"
  echo "# libmuster is built with sanitizers: programs get $SAN"
fi

# ---- the client program ----
mkdir -p "$TMP/app"
cat >"$TMP/app/t.c" <<'EOF'
#include <muster.h>
#include <stdio.h>

int main(void) {
  muster_client *c = NULL;
  muster_worker w;
  int rc = muster_client_new("http://127.0.0.1:1", "tok", &c);
  if (rc != 0) {
    printf("muster_client_new: %s\n", muster_error_name(rc));
    return 1;
  }
  rc = muster_get(c, "w-aaaaaaaaaa", &w);
  printf("%s\n", muster_error_name(rc));
  if (rc == 0)
    muster_worker_cleanup(&w);
  muster_client_free(c);
  return 0;
}
EOF

# 1. pkg-config, shared.
export PKG_CONFIG_PATH=$PC
cap pkg-config --cflags --libs muster
PCFLAGS=$LOG
check "pkg-config --cflags --libs muster (PKG_CONFIG_PATH=<tmp>/lib/pkgconfig)" eval '[ $RC = 0 ]'
# The -I and -L directories, canonical (a relocatable .pc says ${pcfiledir}/../..).
PCDIRS=$(for f in $PCFLAGS; do case $f in -I* | -L*) echo "${f:0:2}$(realpath -m "${f:2}")" ;; esac; done)
check "pkg-config flags point into the install prefix (-I$P/include, -L$LIBDIR)" \
  eval 'grep -qxF -- "-I$(realpath -m "$P/include")" <<<"$PCDIRS" && grep -qxF -- "-L$(realpath -m "$LIBDIR")" <<<"$PCDIRS"'
cap pkg-config --modversion muster
check "pkg-config --modversion muster is a version" eval 'grep -qE "^[0-9]+\.[0-9]+\.[0-9]+$" <<<"$LOG"'
# shellcheck disable=SC2046
cap "$CC" -std=c11 -Wall -Wextra -Werror $SAN -o "$TMP/app/t_pc" "$TMP/app/t.c" $(pkg-config --cflags --libs muster)
check "compile and link with pkg-config --cflags --libs muster" eval '[ $RC = 0 ]'
cap env LD_LIBRARY_PATH="$LIBDIR" "$TMP/app/t_pc"
check "  ... it runs and muster_get says unreachable" eval '[ $RC = 0 ] && [ "$LOG" = unreachable ]'
cap env LD_LIBRARY_PATH="$LIBDIR" ldd "$TMP/app/t_pc"
check "  ... linked against the installed libmuster.so.4" eval 'grep -qF "$LIBDIR/libmuster.so.4" <<<"$LOG"'

# 2. CMake find_package(muster), shared.
mkdir -p "$TMP/cm"
cat >"$TMP/cm/CMakeLists.txt" <<'EOF'
cmake_minimum_required(VERSION 3.16)
project(muster_install_test C)
find_package(muster REQUIRED)
message(STATUS "found muster ${muster_VERSION}")
add_executable(x ../app/t.c)
target_link_libraries(x muster::muster)
EOF
cap cmake -S "$TMP/cm" -B "$TMP/cm/build" -DCMAKE_PREFIX_PATH="$P" -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_C_FLAGS="$SAN" -DCMAKE_EXE_LINKER_FLAGS="$SAN"
check "cmake find_package(muster REQUIRED) with -DCMAKE_PREFIX_PATH=<tmp>" \
  eval '[ $RC = 0 ] && grep -q "found muster [0-9]" <<<"$LOG"'
cap cmake --build "$TMP/cm/build"
check "  ... builds x linked to muster::muster" eval '[ $RC = 0 ] && [ -x "$TMP/cm/build/x" ]'
cap env LD_LIBRARY_PATH="$LIBDIR" "$TMP/cm/build/x"
check "  ... x runs and muster_get says unreachable" eval '[ $RC = 0 ] && [ "$LOG" = unreachable ]'

# 3. Static, with pkg-config --static: libmuster.a by name (-l:libmuster.a),
#    its dependencies from pkg-config. The full --static closure also names
#    libcurl's own private dependencies, whose static/dev files a machine
#    may lack; then libmuster.a is linked with muster's own private libs and
#    its Requires.private (libcurl, jansson) as shared libraries.
cap pkg-config --static --libs muster
PCSTATIC=$LOG
check "pkg-config --static --libs muster names libcurl and jansson" \
  eval '[ $RC = 0 ] && grep -q -- "-lcurl" <<<"$PCSTATIC" && grep -q -- "-ljansson" <<<"$PCSTATIC"'
# shellcheck disable=SC2046
cap "$CC" -std=c11 -Wall -Wextra -Werror $SAN -o "$TMP/app/t_static" "$TMP/app/t.c" \
  $(pkg-config --cflags muster) $(sed 's/-lmuster\b/-l:libmuster.a/' <<<"$PCSTATIC")
if [ $RC != 0 ] && grep -q "cannot find -l" <<<"$LOG" && ! grep -qE "cannot find -l(:libmuster|curl|jansson)" <<<"$LOG"; then
  echo "# the full pkg-config --static closure does not link here ($(grep -o 'cannot find -l[^:]*' <<<"$LOG" | sort -u | tr '\n' ' '));"
  echo "# linking libmuster.a with its Requires.private as shared libraries"
  REQPRIV=$(pkg-config --print-requires-private muster | awk '{print $1}' | tr '\n' ' ')
  # muster's own Libs.private: in the --static list, but neither in --libs
  # nor in its requirements' --static lists.
  OWNPRIV=$(tr ' ' '\n' <<<"$PCSTATIC" | grep -v '^$' |
    grep -vxF -f <(pkg-config --libs muster | tr ' ' '\n'; pkg-config --static --libs $REQPRIV | tr ' ' '\n' | grep -v '^$') | tr '\n' ' ')
  # shellcheck disable=SC2046,SC2086
  cap "$CC" -std=c11 -Wall -Wextra -Werror $SAN -o "$TMP/app/t_static" "$TMP/app/t.c" \
    $(pkg-config --cflags muster) -L"$LIBDIR" -l:libmuster.a $OWNPRIV $(pkg-config --libs $REQPRIV)
fi
check "compile and link statically against libmuster.a (pkg-config --static)" eval '[ $RC = 0 ]'
cap readelf -d "$TMP/app/t_static"
check "  ... the program does not need libmuster.so" eval '[ $RC = 0 ] && ! grep -q "libmuster" <<<"$LOG"'
cap env -u LD_LIBRARY_PATH "$TMP/app/t_static"
check "  ... it runs without LD_LIBRARY_PATH and muster_get says unreachable" \
  eval '[ $RC = 0 ] && [ "$LOG" = unreachable ]'

# 4. CMake find_package(muster), static target.
mkdir -p "$TMP/cms"
cat >"$TMP/cms/CMakeLists.txt" <<'EOF'
cmake_minimum_required(VERSION 3.16)
project(muster_install_test_static C)
find_package(muster REQUIRED)
add_executable(xs ../app/t.c)
target_link_libraries(xs muster::muster_static)
EOF
cap bash -c "cmake -S '$TMP/cms' -B '$TMP/cms/build' -DCMAKE_PREFIX_PATH='$P' -DCMAKE_C_FLAGS='$SAN' -DCMAKE_EXE_LINKER_FLAGS='$SAN' && cmake --build '$TMP/cms/build'"
check "cmake: a program linked to muster::muster_static configures and builds" \
  eval '[ $RC = 0 ] && [ -x "$TMP/cms/build/xs" ]'
cap env -u LD_LIBRARY_PATH "$TMP/cms/build/xs"
check "  ... it runs and muster_get says unreachable" eval '[ $RC = 0 ] && [ "$LOG" = unreachable ]'

echo "$PASS passed, $FAIL failed"
[ "$FAIL" = 0 ]
