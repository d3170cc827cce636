#!/usr/bin/env bash
# tools/check_format.sh — checks that the C/C++ sources follow .clang-format.
#
#   tools/check_format.sh [--fix] [BASE]
#
# Without BASE: every tracked C/C++ file of the tree (what CI runs). With BASE (a commit such as origin/main or a
# hash, or a number N for HEAD~N): only the lines that differ between BASE and the working tree (git clang-format),
# which is quicker while working. Prints what clang-format would change and exits 1 when there is something, 0 when
# the sources are clean; --fix rewrites the files (or the changed lines) instead.
# Needs clang-format (and git-clang-format with BASE; Debian: clang-format).
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
if ! command -v clang-format >/dev/null; then
  echo "check_format.sh: clang-format is needed (apt-get install clang-format)" >&2
  exit 2
fi
if [[ -z "$base" ]]; then
  files=()
  while IFS= read -r -d '' f; do files+=("$f"); done < <(git ls-files -z '*.c' '*.h' '*.cc' '*.cpp' '*.hpp' '*.cu' '*.cuh')
  if [[ $fix == 1 ]]; then
    printf '%s\0' "${files[@]}" | xargs -0 -n 50 clang-format -i
    exit 0
  fi
  bad=$(printf '%s\0' "${files[@]}" | xargs -0 -n 50 clang-format --dry-run 2>&1 | grep -o '^[^:]*:[0-9]*:[0-9]*: warning' |
        cut -d: -f1 | sort -u || true)
  if [[ -z "$bad" ]]; then
    echo "check_format.sh: all ${#files[@]} C/C++ files follow .clang-format"
    exit 0
  fi
  for f in $bad; do diff -u "$f" <(clang-format "$f") | head -40 || true; done
  echo "check_format.sh: $(wc -w <<<"$bad") file(s) above do not follow .clang-format (tools/check_format.sh --fix rewrites them):" $bad >&2
  exit 1
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
