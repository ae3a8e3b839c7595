#!/usr/bin/env bash
# Checks the C sources against the style guide's rules that a machine can
# check: clang-format (.clang-format) without drift; none of the banned
# functions (strcpy, strcat, sprintf, vsprintf, strtok, atoi, gets); no
# strtol/strtoul/strtoll/strtoull/strtod/strtof without an end pointer; no C or
# CUDA source over 800 lines (one job per file: split it by responsibility).
#
# usage: scripts/check-style.sh [FILE...]   (default: every tracked .c, .h, .cu)
# Exits 1 naming each file and line that breaks a rule, 0 when all is well.
set -uo pipefail
cd "$(dirname "$0")/.."

if [ $# -gt 0 ]; then
  files=("$@")
else
  mapfile -t files < <(git ls-files '*.c' '*.h' '*.cu')
fi
fmt=$(command -v clang-format || command -v clang-format-14 || true)
if [ -z "$fmt" ]; then
  echo "check-style: clang-format is not installed (scripts/setup.sh installs it)" >&2
  exit 1
fi

bad=0
for f in "${files[@]}"; do
  if ! "$fmt" --dry-run --Werror "$f" >/dev/null 2>&1; then
    first=$("$fmt" --dry-run "$f" 2>&1 | grep -m1 -o '^[^:]*:[0-9]*' || true)
    echo "$f: not formatted as .clang-format says (first at ${first:-?}; fix with: $fmt -i $f)"
    bad=1
  fi
done

# Code lines only: a line that is a comment (starts with /*, * or //) says
# what it likes.
code_lines() {
  grep -nE "$1" "${files[@]}" /dev/null 2>/dev/null |
    grep -vE '^[^:]+:[0-9]+:[[:space:]]*(/\*|\*|//)'
}

hits=$(code_lines '(^|[^a-zA-Z0-9_])(strcpy|strcat|sprintf|vsprintf|strtok|atoi|gets)[[:space:]]*\(')
if [ -n "$hits" ]; then
  echo "$hits" | sed 's/$/   <- banned by the style guide: use the bounded forms (snprintf, strtol with an end check)/'
  bad=1
fi
hits=$(code_lines '(^|[^a-zA-Z0-9_])strto(l|ul|ll|ull|d|f|ld)[[:space:]]*\([^;]*,[[:space:]]*NULL')
if [ -n "$hits" ]; then
  echo "$hits" | sed 's/$/   <- no end pointer: check where the number ended/'
  bad=1
fi

# One job per file: a source past 800 lines does more than one.
for f in "${files[@]}"; do
  case $f in *.c | *.cu) ;; *) continue ;; esac
  n=$(wc -l < "$f")
  if [ "$n" -gt 800 ]; then
    echo "$f: $n lines, over 800: split it by responsibility (docs/internals/ maps each file's one job)"
    bad=1
  fi
done

if [ $bad -eq 0 ]; then
  echo "check-style: ${#files[@]} files follow the style rules"
fi
exit $bad
