#!/usr/bin/env bash
# Each executable given must load the shared libstdc++ before any LibTorch library: LibTorch's
# libtorch.so exports its own std::filesystem functions, and whichever comes first in the
# executable's dynamic dependencies wins symbol lookup (docs/dependencies.md).
set -uo pipefail
status=0
for exe in "$@"; do
  needed=$(readelf -d "$exe" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p')
  stdcxx=$(grep -n -x 'libstdc++.so.6' <<<"$needed" | head -1 | cut -d: -f1)
  torch=$(grep -n -E '^lib(torch|torch_cpu|torch_cuda|c10)\.so$' <<<"$needed" | head -1 | cut -d: -f1)
  # An executable that needs no LibTorch library directly has nothing to order.
  if [ -z "$torch" ]; then echo "ok  $exe (no direct LibTorch dependency)"; continue; fi
  if [ -z "$stdcxx" ] || [ "$stdcxx" -gt "$torch" ]; then
    echo "FAIL $exe: libstdc++.so.6 must be a dynamic dependency listed before LibTorch; NEEDED is:"
    sed 's/^/       /' <<<"$needed"
    status=1
  else
    echo "ok  $exe (libstdc++.so.6 is dependency $stdcxx, LibTorch's first is $torch)"
  fi
done
exit $status
