#!/usr/bin/env bash
# Record this checkout's commit and dirty flag in .profbench-git.json, for copies of the tree
# that travel without .git (e.g. to a GPU machine): rules/common.smk reads it when git cannot
# answer, so every result row there still names its commit.
set -euo pipefail
cd "$(dirname "$0")/.."
commit=$(git rev-parse HEAD)
dirty=false
[ -n "$(git status --porcelain --untracked-files=no)" ] && dirty=true
printf '{"commit": "%s", "dirty": %s}\n' "$commit" "$dirty" > .profbench-git.json
cat .profbench-git.json
