#!/usr/bin/env bash
# Fails when a file tracked by git is larger than 1 MiB or is a compiled
# program (ELF, Mach-O or PE, or any executable without a #! line): build
# outputs belong in bin/ or a cache, never in every clone and Docker context.
# Run by `make lint`.
set -euo pipefail
cd "$(git rev-parse --show-toplevel)"
LIMIT=$((1024 * 1024))
bad=0
while IFS= read -r -d '' entry; do
  mode=${entry%% *}
  path=${entry#*$'\t'}
  [ -f "$path" ] || continue # deleted in the work tree, or a submodule
  size=$(stat -c %s "$path")
  if [ "$size" -gt "$LIMIT" ]; then
    echo "$path: $size bytes; tracked files must be at most 1 MiB" >&2
    bad=1
  fi
  magic=$(head -c 4 "$path" | od -An -tx1 | tr -d ' \n')
  case "$magic" in
    7f454c46) kind="an ELF executable" ;;
    cafebabe | feedface | feedfacf | cefaedfe | cffaedfe) kind="a Mach-O executable" ;;
    4d5a*) kind="a Windows (PE) executable" ;;
    2321*) kind="" ;; # "#!": a script
    *) if [ "$mode" = 100755 ]; then kind="an executable without a #! line"; else kind=""; fi ;;
  esac
  if [ -n "$kind" ]; then
    echo "$path: $kind; build outputs must not be tracked (.gitignore them)" >&2
    bad=1
  fi
done < <(git ls-files -s -z)
exit "$bad"
