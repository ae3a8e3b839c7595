#!/usr/bin/env bash
# The style check can fail: an injected sprintf, an atoi, a strtol without an
# end pointer, a file off its format and a source over 800 lines are each
# reported (exit 1, naming file and line); a clean file passes; and the tree
# itself passes.
# usage: test_check_style.sh SOURCE_DIR
set -u
src=$1
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
pass=0 fail=0
ok() { echo "ok - $*"; pass=$((pass + 1)); }
not_ok() { echo "not ok - $*"; fail=$((fail + 1)); }

cp "$src/.clang-format" "$tmp/"
cat > "$tmp/clean.c" <<'C'
#include <stdio.h>
#include <stdlib.h>

/* sprintf( in a comment is fine. */
int parse(const char *s, char *buf, size_t n) {
  char *end;
  long v = strtol(s, &end, 10);

  snprintf(buf, n, "%ld", v);
  return *end == '\0';
}
C
sed 's/  snprintf(buf, n, "%ld", v);/  sprintf(buf, "%ld", v);/' "$tmp/clean.c" > "$tmp/sprintf.c"
sed 's/  long v = strtol(s, \&end, 10);/  long v = atoi(s);/' "$tmp/clean.c" > "$tmp/atoi.c"
sed 's/  long v = strtol(s, \&end, 10);/  long v = strtol(s, NULL, 10);/' "$tmp/clean.c" > "$tmp/noend.c"
sed 's/^  return \*end/      return  *end/' "$tmp/clean.c" > "$tmp/drift.c"
{ cat "$tmp/clean.c"; for i in $(seq 200); do printf '\nint f%d(void) {\n  return %d;\n}\n' "$i" "$i"; done; } > "$tmp/long.c"

out=$(bash "$src/scripts/check-style.sh" "$tmp/clean.c" 2>&1); rc=$?
[ $rc -eq 0 ] && ok "a clean file passes" || not_ok "a clean file passes (exit $rc: $out)"
for case in sprintf atoi noend drift long; do
  out=$(bash "$src/scripts/check-style.sh" "$tmp/$case.c" 2>&1); rc=$?
  case $case in
    sprintf) want="sprintf.c:9:.*banned" ;;
    atoi) want="atoi.c:7:.*banned" ;;
    noend) want="noend.c:7:.*no end pointer" ;;
    drift) want="drift.c: not formatted" ;;
    long) want="long.c: 8[0-9][0-9] lines, over 800" ;;
  esac
  if [ $rc -eq 1 ] && echo "$out" | grep -qE "$want"; then
    ok "$case is reported: $(echo "$out" | head -1)"
  else
    not_ok "$case is reported (exit $rc: $out)"
  fi
done
out=$(cd "$src" && bash scripts/check-style.sh 2>&1); rc=$?
[ $rc -eq 0 ] && ok "the tree passes ($out)" || not_ok "the tree passes: $out"

echo "$pass passed, $fail failed"
[ $fail -eq 0 ]
