#!/usr/bin/env bash
# Run "$@" as root inside a fresh user namespace with an identity uid/gid map 0..65535.
#
# Why: in a new user namespace the process gets a FULL capability set (including
# CAP_SYS_RESOURCE, which some sandboxes' bounding set lacks), and `apptainer build` insists
# on the full set to run %post. `--fakeroot` / `--userns` alone do not help there.
# Needs root (to write an identity map) and user namespaces (unshare -U).
# Usage: scripts/userns-root.sh apptainer build out.sif def
set -euo pipefail
command -v unshare >/dev/null || { echo "userns-root: 'unshare' (util-linux) not found" >&2; exit 1; }
[ "$(id -u)" = 0 ] || { echo "userns-root: must run as root (non-root users: apptainer build --fakeroot)" >&2; exit 1; }
fifo=$(mktemp -u); mkfifo "$fifo"
trap 'rm -f "$fifo"' EXIT
# The child waits on the fifo until its uid/gid maps are written, then execs the command.
unshare -U -m --propagation private bash -c 'read -r _ < "$0"; exec "$@"' "$fifo" "$@" &
pid=$!
while [ "$(readlink /proc/$pid/ns/user 2>/dev/null)" = "$(readlink /proc/self/ns/user)" ]; do
  kill -0 "$pid" 2>/dev/null || { echo "userns-root: unshare -U failed (user namespaces disabled?)" >&2; exit 1; }
  sleep 0.05
done
echo "0 0 65536" > /proc/$pid/uid_map
echo "0 0 65536" > /proc/$pid/gid_map
echo go > "$fifo"
wait "$pid"
