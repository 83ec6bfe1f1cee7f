#!/usr/bin/env bash
# Install the Nsight Systems CLI from Debian's non-free archive into a cache folder, for
# machines without NVIDIA's installer (CI, CPU-only laptops). Touches nothing outside the cache.
# Prints the nsys binary's path on its last line; reuses an existing install.
#
# Usage: scripts/install-nsys.sh [CACHE_DIR]   (default: $PROFBENCH_CACHE or ~/.cache/profbench)
#
# Why these exact packages and fix-ups: see docs/nsys-on-debian.md. The version is pinned
# because the Python nvtx package must match its NVTX payload ABI (nvtx<=0.2.11).
set -euo pipefail

NSYS_DEB_VERSION="2024.2.3.38~12.5.0-2+b1"
ARROW_DEB_VERSION="0~~12.5.0-2+b1"
CACHE=${1:-${PROFBENCH_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/profbench}}
PREFIX="$CACHE/nsys-2024.2.3"
NSYS="$PREFIX/usr/lib/nsight-systems/bin/nsys"

if [ -x "$NSYS" ] && [ -f "$PREFIX/.complete" ]; then
  echo "$NSYS"; exit 0
fi
for tool in apt-get dpkg; do
  command -v "$tool" >/dev/null || { echo "install-nsys: '$tool' not found (needs a Debian/Ubuntu machine)" >&2; exit 1; }
done

work=$(mktemp -d); trap 'rm -rf "$work"' EXIT
mkdir -p "$work/lists/partial" "$work/debs"
# A private sources list and package index: the system's apt configuration stays untouched.
cat > "$work/sources.list" <<SRC
deb http://deb.debian.org/debian experimental non-free
deb http://deb.debian.org/debian bookworm main
deb http://deb.debian.org/debian-security bookworm-security main
SRC
apt_opts=(-o "Dir::Etc::sourcelist=$work/sources.list" -o "Dir::Etc::sourceparts=-"
          -o "Dir::State::Lists=$work/lists" -o "Debug::NoLocking=1")
echo "install-nsys: fetching Nsight Systems $NSYS_DEB_VERSION from Debian (~200 MB)" >&2
apt-get "${apt_opts[@]}" update -qq >&2
(cd "$work/debs" && apt-get "${apt_opts[@]}" download -qq \
   "nsight-systems=$NSYS_DEB_VERSION" "nsight-systems-target=$NSYS_DEB_VERSION" \
   "libarrow500=$ARROW_DEB_VERSION" "libparquet500=$ARROW_DEB_VERSION" libssh-4 2>&1 \
   | grep -v 'Download is performed unsandboxed' >&2 || true)
[ "$(ls "$work/debs"/*.deb | wc -l)" -eq 5 ] || { echo "install-nsys: download incomplete" >&2; exit 1; }

rm -rf "$PREFIX"; mkdir -p "$PREFIX"
for deb in "$work/debs"/*.deb; do dpkg -x "$deb" "$PREFIX"; done
host="$PREFIX/usr/lib/nsight-systems/host-linux-x64"
target="$PREFIX/usr/lib/nsight-systems/target-linux-x64"
libdir="$PREFIX/usr/lib/x86_64-linux-gnu"
# Fix-up 1: the importer is looked up next to target-linux-x64 (Debian's postinst layout).
ln -sfn ../../nsight-systems/host-linux-x64 "$libdir/nsight-systems/host-linux-x64"
# Fix-up 2: the importer's Arrow/Parquet/libssh dependencies, where its RPATH finds them.
cp -a "$libdir"/libarrow.so.500* "$libdir"/libparquet.so.500* "$libdir"/libssh.so.4* "$host/"
ln -sfn libssh.so.4 "$host/libssh.so"
# Fix-up 3: `nsys stats` imports these from host-linux-x64/python/lib.
mkdir -p "$host/python/lib"
cp -a "$target"/python/lib/nsysstats.py "$target"/python/lib/gpustats.py "$host/python/lib/" 2>/dev/null \
  || cp -a "$(readlink -f "$target")"/python/lib/{nsysstats,gpustats}.py "$host/python/lib/"
# The GUI is not needed for CLI profiling; drop its largest pieces.
rm -f "$host"/nsys-ui.bin "$host"/libQt6WebEngine*.so.6
rm -rf "$PREFIX/usr/share/doc"

"$NSYS" --version >&2
touch "$PREFIX/.complete"
echo "$NSYS"
