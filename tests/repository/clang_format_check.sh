#!/usr/bin/env bash
# Fails when a tracked C or C++ file of the repository is not formatted as .clang-format says.
# Formatting differs between clang-format releases, so the check runs only with the release the
# tree is formatted with (Debian 12's clang-format, 14; scripts/setup installs it) and otherwise
# exits 77, which ctest reports as skipped, with the reason.
#
# Usage: clang_format_check.sh <repository root>
set -uo pipefail
root=${1:?usage: clang_format_check.sh <repository root>}
want=14
cf=$(command -v "clang-format-$want" || command -v clang-format || true)
if [ -z "$cf" ]; then echo "skipped: clang-format is not installed (scripts/setup installs it)"; exit 77; fi
have=$("$cf" --version | sed -n 's/.*clang-format version \([0-9]*\).*/\1/p')
if [ "$have" != "$want" ]; then
  echo "skipped: $cf is release $have; the tree is formatted with release $want, whose output differs"
  exit 77
fi
cd "$root" || exit 1
mapfile -t files < <(git ls-files '*.c' '*.cc' '*.cpp' '*.h' '*.hpp' '*.cu')
if [ ${#files[@]} -eq 0 ]; then echo "no tracked sources under $root (not a git checkout?)"; exit 1; fi
bad=()
for f in "${files[@]}"; do
  "$cf" --style=file --dry-run --Werror "$f" >/dev/null 2>&1 || bad+=("$f")
done
if [ ${#bad[@]} -gt 0 ]; then
  echo "${#bad[@]} of ${#files[@]} files differ from .clang-format; format them with"
  echo "  $cf -i ${bad[*]}"
  echo "first difference:"
  "$cf" --style=file --dry-run "${bad[0]}" 2>&1 | head -12
  exit 1
fi
echo "all ${#files[@]} tracked C/C++ files follow .clang-format ($cf, release $have)"
