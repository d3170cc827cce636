#!/usr/bin/env bash
# tools/check_format.sh — checks that the C/C++ lines changed since a base commit follow .clang-format.
#
#   tools/check_format.sh [--fix] [BASE]
#
# BASE: a commit (origin/main, HEAD~3, a hash) or a number N for HEAD~N. Default: origin/main when that exists,
# else HEAD~1. Only lines that differ between BASE and the working tree are looked at (git clang-format), so code
# written before .clang-format is not flagged until someone changes it. Prints the diff clang-format wants and exits
# 1 when there is one, 0 when the changed lines are clean; --fix applies that diff to the working tree instead.
# Needs clang-format and git-clang-format (Debian: clang-format).
set -euo pipefail
cd "$(git -C "$(dirname "$0")" rev-parse --show-toplevel)"

fix=0
base=""
for arg in "$@"; do
  case "$arg" in
    --fix) fix=1 ;;
    -h|--help) sed -n '2,10p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    -*) echo "check_format.sh: unknown option '$arg' (see --help)" >&2; exit 2 ;;
    *) if [[ -n "$base" ]]; then echo "check_format.sh: one BASE only (got '$base' and '$arg')" >&2; exit 2; fi
       base="$arg" ;;
  esac
done
if [[ -z "$base" ]]; then
  if git rev-parse --verify -q origin/main >/dev/null; then base=origin/main; else base=HEAD~1; fi
elif [[ "$base" =~ ^[0-9]+$ ]]; then
  base="HEAD~$base"
fi
if ! git rev-parse --verify -q "$base^{commit}" >/dev/null; then
  echo "check_format.sh: '$base' is not a commit of this repository" >&2
  exit 2
fi
gcf=$(command -v git-clang-format || command -v git-clang-format-14 || true)
if [[ -z "$gcf" ]] || ! command -v clang-format >/dev/null; then
  echo "check_format.sh: clang-format and git-clang-format are needed (apt-get install clang-format)" >&2
  exit 2
fi

exts=c,h,cc,cpp,hpp,cu,cuh
if [[ $fix == 1 ]]; then
  "$gcf" --binary "$(command -v clang-format)" --extensions "$exts" --force "$base" || true
  exit 0
fi
out=$("$gcf" --binary "$(command -v clang-format)" --extensions "$exts" --diff "$base" 2>&1) || true
case "$out" in
  ""|"no modified files to format"|"clang-format did not modify any files")
    echo "check_format.sh: the lines changed since $base follow .clang-format"
    exit 0 ;;
esac
printf '%s\n' "$out"
echo "check_format.sh: the lines above, changed since $base, do not follow .clang-format (tools/check_format.sh --fix $base applies it)" >&2
exit 1
