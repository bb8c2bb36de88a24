#!/usr/bin/env bash
# Fails when a tracked file of the repository refers to something outside it: files that are not in
# the repository, issue numbers, or how the work on kiln was organised. The repository has to read
# on its own; each such reference is written out in the project's own words instead (the workloads
# are in docs/workloads.md, the machines in docs/performance.md and docs/backends/*.md).
#
# Usage: no_outside_references.sh <repository root>
# Every pattern is checked against an example line first, so a pattern that no longer matches
# anything (a typo, a grep without \b) fails the test instead of passing it silently.
set -euo pipefail
root=${1:?usage: no_outside_references.sh <repository root>}
self=tests/repository/no_outside_references.sh

# Case-sensitive: these files exist outside the repository under upper-case names; the repository's
# own docs/workloads.md is lower case.
exact=(
  'WORKLOADS\.md'   'see WORKLOADS.md'
  'DESIGN\.md'      'DESIGN.md lists them'
  'DEVICE\.md'      'as DEVICE.md says'
  'STYLE\.md'       'per STYLE.md'
)
# Case-insensitive (GNU grep -E; \b is a word boundary).
loose=(
  '\.\./shared\b'                      'in ../shared/notes'
  '(^|[^[:alnum:]_.-])/work/'           'cd /work/main'
  '\bthe seeds\b'                      'as the seeds say'
  '\bissues? ?#?[0-9]+'                "Issue 8's targets"
  '(^|[[:space:](])#[0-9]+\b'          'fixed in #13'
  '\b(sessions?|sesi[oó]n(es)?|sess[aã]o|sess[oõ]es)\b' 'the second session'
  '\bengineers?\b'                     'another engineer'
  '\bhelpers?\b'                       'a helper wrote it'
  '\bits own issue\b'                  'lands with its own issue'
  '\bhas not landed\b'                 'whose issue has not landed'
)

fail=0
check_examples() {  # <grep flags> <pattern> <example> ...
  local flags=$1; shift
  while [ $# -gt 0 ]; do
    if ! printf '%s\n' "$2" | grep -q $flags -- "$1"; then
      echo "pattern '$1' does not match its own example '$2'" >&2; fail=1
    fi
    shift 2
  done
}
check_examples -E "${exact[@]}"
check_examples -iE "${loose[@]}"

# The tracked files (a fresh clone in CI, a worktree here); outside git (a source archive), every
# file but what .gitignore leaves out: build trees, logs, caches.
cd "$root"
if git rev-parse --is-inside-work-tree >/dev/null 2>&1; then
  mapfile -t files < <(git ls-files)
else
  mapfile -t files < <(find . -type f -not -path './build*' -not -path './.git/*' -not -path './.device/*' \
                         -not -name .cmake-configure.log -not -path '*/__pycache__/*' | sed 's|^\./||')
fi
files=("${files[@]/#$self/}")

scan() {  # <grep flags> <pattern> <example> ...
  local flags=$1; shift
  while [ $# -gt 0 ]; do
    # -I skips binary files; a C preprocessor line (#include, #if 0) is not an issue number.
    if hits=$(printf '%s\0' "${files[@]}" | xargs -0 grep -nHI $flags -- "$1" 2>/dev/null |
              grep -vE '^[^:]+:[0-9]+:[[:space:]]*#[[:space:]]*(include|if|ifdef|ifndef|elif|else|endif|define|undef|pragma|error)\b'); then
      echo "refers outside the repository (pattern '$1'):" >&2
      echo "$hits" >&2
      fail=1
    fi
    shift 2
  done
}
scan -E "${exact[@]}"
scan -iE "${loose[@]}"

[ "$fail" = 0 ] && echo "no references outside the repository in ${#files[@]} files"
exit "$fail"
