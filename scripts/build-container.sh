#!/usr/bin/env bash
# Build the profbench Apptainer image from containers/profbench.def into a cache keyed by
# the definition's hash and build arguments, so an unchanged definition is never rebuilt.
# The build_container rule (rules/container.smk) and tests/test_container.py both call this.
#
# Usage: scripts/build-container.sh [options]
#   --variant cuda|cpu   image variant (default cuda)
#   --torch SPEC         pip requirement or the path of a torch wheel on this machine
#                        (default: torch==2.13.0 for cuda; for cpu the 2.13.0+cpu cp311
#                        wheel if one lies in a pip find-links directory, else
#                        torch==2.13.0+cpu from the PyTorch CPU index)
#   --torch-index URL    extra pip index for torch, or "pypi" (default: pypi for cuda,
#                        https://download.pytorch.org/whl/cpu for a cpu requirement)
#   --compression gzip|zstd
#                        squashfs compression of the image (default: zstd for cpu, gzip for
#                        cuda). zstd packs the CPU image 25x faster than gzip and starts each
#                        job's Python faster; gzip is what every kernel and squashfuse mounts
#                        (the CUDA image goes to clusters whose kernels we do not know)
#   --link PATH          also hard-link (or copy) the cached image to PATH
#   --force              rebuild even if the cached image exists
#   --print-path         print the cached image path and exit (no build)
#   --apt-check-valid-until true|false
#                        apt's Acquire::Check-Valid-Until during the build (default: the
#                        host's setting, read with `apt-config shell`; true without apt)
#   --print-apt-check-valid-until   print that value and exit (no build)
# Prints the cached image's path on its last stdout line; progress goes to stderr.
# Environment: PROFBENCH_CACHE (default ~/.cache/profbench): images go to
#   $PROFBENCH_CACHE/images/profbench-<variant>-<key12>.sif (+ .json with build facts).
#   APPTAINER_TMPDIR: where the build's root filesystem is assembled (CUDA: ~10 GB).
set -euo pipefail
# Everything runs inside main(): bash reads a script as it goes, so editing this file during
# a build would otherwise break the running build.
main() {

# The host's Acquire::Check-Valid-Until as true/false: one key, read whole by apt-config
# (`/b` normalizes no/off/0 to false). Not `apt-config dump | grep -q`: under pipefail that
# was false whenever grep exited at the match before apt-config had written the rest of its
# output (apt-config then died of SIGPIPE, status 141), so the answer depended on timing.
host_apt_check_valid_until() {
  local out=""
  if command -v apt-config >/dev/null; then
    out=$(apt-config shell v Acquire::Check-Valid-Until/b 2>/dev/null) || out=""
  fi
  [ "$out" = "v='false'" ] && echo false || echo true
}

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
DEF="$ROOT/containers/profbench.def"
NSYS_SCRIPT="$ROOT/scripts/install-nsys.sh"
CACHE=${PROFBENCH_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/profbench}

variant=cuda torch="" torch_index="" link="" force=0 print_only=0 apt_valid_until="" comp=""
while [ $# -gt 0 ]; do
  case "$1" in
    --variant) variant=$2; shift 2 ;;
    --torch) torch=$2; shift 2 ;;
    --torch-index) torch_index=$2; shift 2 ;;
    --compression) comp=$2; shift 2 ;;
    --link) link=$2; shift 2 ;;
    --force) force=1; shift ;;
    --print-path) print_only=1; shift ;;
    --apt-check-valid-until) apt_valid_until=$2; shift 2 ;;
    --print-apt-check-valid-until) print_only=apt; shift ;;
    -h|--help) sed -n '2,28p' "$0"; exit 0 ;;
    *) echo "build-container: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done
case "$variant" in
  cuda) torch=${torch:-torch==2.13.0}; torch_index=${torch_index:-pypi} ;;
  cpu) # Default: the CPU wheel from a local find-links directory of pip's (PIP_FIND_LINKS
       # or pip's configuration: CI machines without access to download.pytorch.org), else
       # the PyTorch CPU index.
       if [ -z "$torch" ]; then
         links="${PIP_FIND_LINKS:-} $(python3 -m pip config list 2>/dev/null \
           | sed -n "s/^[^=]*find-links='\(.*\)'$/\1/p" | tr '\n' ' ')"
         for d in $links; do
           w=$(ls "${d#file://}"/torch-2.13.0+cpu-cp311-cp311-manylinux*_x86_64.whl 2>/dev/null | head -n1 || true)
           [ -n "$w" ] && { torch=$w; break; }
         done
       fi
       torch=${torch:-torch==2.13.0+cpu}
       [ -f "$torch" ] && torch_index=${torch_index:-pypi}
       torch_index=${torch_index:-https://download.pytorch.org/whl/cpu} ;;
  *) echo "build-container: --variant must be cuda or cpu, not '$variant'" >&2; exit 2 ;;
esac
[ "$variant" = cpu ] && comp=${comp:-zstd}
comp=${comp:-gzip}
case "$comp" in
  gzip) squash_args=() ;;  # apptainer's default
  zstd) squash_args=(--mksquashfs-args "-comp zstd -Xcompression-level 3") ;;
  *) echo "build-container: --compression must be gzip or zstd, not '$comp'" >&2; exit 2 ;;
esac
case "$apt_valid_until" in
  "") apt_valid_until=$(host_apt_check_valid_until) ;;
  true|false) ;;
  *) echo "build-container: --apt-check-valid-until must be true or false, not '$apt_valid_until'" >&2; exit 2 ;;
esac
[ "$print_only" = apt ] && { echo "$apt_valid_until"; exit 0; }
for f in "$DEF" "$NSYS_SCRIPT" "$ROOT/pyproject.toml"; do
  [ -f "$f" ] || { echo "build-container: missing $f" >&2; exit 1; }
done

sha() { sha256sum "$1" | cut -c1-64; }
def_sha=$(sha "$DEF")
# The image key: everything that decides the image's content except the project's own
# packages (the pipeline bind-mounts the working tree, whose copies shadow them).
if [ -f "$torch" ]; then
  torch=$(readlink -f "$torch")
  torch_id="wheel:$(basename "$torch"):$(sha "$torch")"
else
  torch_id="pip:$torch"
fi
key=$(printf 'def=%s\nnsys=%s\nvariant=%s\ntorch=%s\nindex=%s\n%s' \
  "$def_sha" "$(sha "$NSYS_SCRIPT")" "$variant" "$torch_id" "$torch_index" \
  "$([ "$comp" = gzip ] || echo "compression=$comp")" | sha256sum | cut -c1-12)
mkdir -p "$CACHE/images"
image="$CACHE/images/profbench-$variant-$key.sif"
[ "$print_only" = 1 ] && { echo "$image"; exit 0; }

do_link() {
  [ -n "$link" ] || return 0
  mkdir -p "$(dirname "$link")"
  rm -f "$link"
  # A hard link costs nothing; across filesystems fall back to a copy.
  ln "$image" "$link" 2>/dev/null || cp --reflink=auto "$image" "$link"
  # Snakemake compares mtimes: the link is "made now" even when the image came from the cache.
  touch "$link"
}

# One builder per key at a time (the test and a pipeline run may race).
mkdir -p "$CACHE/images/locks"
exec 9>"$CACHE/images/locks/$(basename "$image").lock"
flock 9
if [ -s "$image" ] && [ "$force" = 0 ]; then
  echo "build-container: cached $image" >&2
  do_link; echo "$image"; exit 0
fi

# apptainer: the system's, else the project's relocatable install (Debian machines).
if command -v apptainer >/dev/null; then app=$(command -v apptainer)
elif command -v singularity >/dev/null; then app=$(command -v singularity)
else
  echo "build-container: apptainer not on PATH; using scripts/setup-apptainer.sh (cached install)" >&2
  app=$("$ROOT/scripts/setup-apptainer.sh" | tail -n1)
fi
command -v debootstrap >/dev/null || [ -x /usr/sbin/debootstrap ] || {
  echo "build-container: 'debootstrap' not found (Bootstrap: debootstrap needs it; apt-get install debootstrap)" >&2; exit 1; }

# Build context: only what %files needs, without caches or results.
ctx=$(mktemp -d "$CACHE/images/ctx.XXXXXX")
# The root filesystem is assembled in APPTAINER_TMPDIR (CUDA: ~10 GB); by default a private
# folder next to the cache instead of the shared /tmp.
if [ -z "${APPTAINER_TMPDIR:-}" ]; then
  export APPTAINER_TMPDIR="$ctx.tmp"; mkdir -p "$APPTAINER_TMPDIR"
fi
trap 'rm -rf "$ctx" "$ctx.tmp" "$image.tmp"' EXIT
optional=(); [ -f "$ROOT/README.md" ] && optional=(README.md)
(cd "$ROOT" && tar --exclude=__pycache__ --exclude='*.pyc' -cf - containers/profbench.def \
   pyproject.toml scripts/install-nsys.sh workloads analysis pipeline "${optional[@]}") \
  | tar -xf - -C "$ctx"
[ -f "$ctx/README.md" ] || : > "$ctx/README.md"   # pyproject's readme; not needed to run

args=(--build-arg "VARIANT=$variant" --build-arg "TORCH_INDEX=$torch_index"
      --build-arg "DEF_SHA256=$def_sha")
if [ -f "$torch" ]; then
  args+=(--bind "$(dirname "$torch"):/mnt/wheels" --build-arg "TORCH=/mnt/wheels/$(basename "$torch")")
else
  args+=(--build-arg "TORCH=$torch")
fi
# Frozen archive mirrors (this sandbox's) serve expired Release files: the build follows the
# host's apt policy on that, or --apt-check-valid-until. Always passed, so the log shows it.
args+=(--build-arg "APT_CHECK_VALID_UNTIL=$apt_valid_until")
# A TLS-intercepting proxy's CA (this sandbox): trusted during the build only.
if ls /usr/local/share/ca-certificates/*.crt >/dev/null 2>&1; then
  args+=(--bind /usr/local/share/ca-certificates:/mnt/host-ca)
fi

# How to get the capabilities %post needs: root with a full bounding set builds directly;
# root in a sandbox that lacks some capabilities builds in a fresh user namespace; other
# users use --fakeroot.
runner=()
if [ "$(id -u)" = 0 ]; then
  last=$(cat /proc/sys/kernel/cap_last_cap)
  bnd=$((16#$(awk '/^CapBnd/ {print $2}' /proc/self/status)))
  [ "$bnd" -eq $(((1 << (last + 1)) - 1)) ] || runner=("$ROOT/scripts/userns-root.sh")
else
  args+=(--fakeroot)
fi

echo "build-container: building $image (variant=$variant torch=$torch_id compression=$comp)" >&2
start=$(date +%s)
(cd "$ctx" && "${runner[@]}" "$app" build --force "${squash_args[@]}" "${args[@]}" "$image.tmp" \
   containers/profbench.def >&2)
secs=$(( $(date +%s) - start ))
mv "$image.tmp" "$image"
size=$(stat -c %s "$image")
cat > "${image%.sif}.json" <<JSON
{"image": "$image", "variant": "$variant", "definition_sha256": "$def_sha", "key": "$key",
 "torch": "$torch_id", "torch_index": "$torch_index", "compression": "$comp",
 "apt_check_valid_until": $apt_valid_until, "build_seconds": $secs,
 "size_bytes": $size, "built_at": "$(date -u +%Y-%m-%dT%H:%M:%SZ)"}
JSON
echo "build-container: built in ${secs}s, $((size / 1048576)) MiB" >&2
do_link
echo "$image"
}

main "$@"; exit
