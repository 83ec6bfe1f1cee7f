#!/usr/bin/env bash
# Install Apptainer 1.4.x (Debian sid's package) on a Debian bookworm machine without touching
# /usr or /etc: the binaries are pointed at trixie's newer glibc with patchelf and the install
# is made relocatable. For CI/sandbox machines without a system apptainer; machines that have
# one (`apptainer` on PATH) need none of this.
#
# Usage: scripts/setup-apptainer.sh [PREFIX]
#   PREFIX defaults to $PROFBENCH_CACHE/apptainer (PROFBENCH_CACHE: ~/.cache/profbench).
# Idempotent: an existing complete install is reused (about 0.1 s). Prints the apptainer
# binary's path on its last line (put its directory on PATH).
#
# Why each step: see docs/containers.md ("The CI machine"). In short: sid's apptainer needs
# glibc >= 2.38 (bookworm has 2.36), and this sandbox's capability bounding set lacks
# CAP_SYS_RESOURCE, which apptainer's default "full" root capability set requests.
set -euo pipefail

# Why 1.4: the version checked with Snakemake 9.27 and this sandbox. Debian sid only keeps its
# newest revision, so the pin is on the upstream series, not the exact .deb.
APPTAINER_SERIES="1.4."
CACHE=${PROFBENCH_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/profbench}
D=${1:-$CACHE/apptainer}
BIN="$D/app/usr/bin/apptainer"

if [ -x "$BIN" ] && [ -f "$D/.complete" ] && "$BIN" version >/dev/null 2>&1; then
  echo "$BIN"; exit 0
fi
for tool in apt-get dpkg; do
  command -v "$tool" >/dev/null || {
    echo "setup-apptainer: '$tool' not found: this script needs a Debian/Ubuntu machine;" \
         "elsewhere install Apptainer >= 1.1 from https://apptainer.org" >&2; exit 1; }
done
[ "$(id -u)" = 0 ] || { echo "setup-apptainer: must run as root (installs host tools with apt-get)" >&2; exit 1; }

# Host tools: debootstrap (Bootstrap: debootstrap), patchelf (this script), squashfs-tools
# (mksquashfs for .sif), uidmap (userns), fuse bits (unprivileged mounts).
need=()
for p in debootstrap patchelf squashfs-tools uidmap squashfuse fuse2fs fuse3 e2fsprogs \
         libseccomp2 libsqlite3-0; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed" || need+=("$p")
done
if [ ${#need[@]} -gt 0 ]; then
  echo "setup-apptainer: apt-get install ${need[*]}" >&2
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}" >&2 \
    || { apt-get update -qq >&2 && DEBIAN_FRONTEND=noninteractive \
           apt-get install -y -qq --no-install-recommends "${need[@]}" >&2; }
fi

W=$(mktemp -d); trap 'rm -rf "$W"' EXIT
mkdir -p "$W/lists/partial" "$W/debs"
# A private sources list and index: the system's apt configuration stays untouched.
printf 'deb http://deb.debian.org/debian trixie main\ndeb http://deb.debian.org/debian sid main\n' \
  > "$W/sources.list"
A=(-o "Dir::Etc::sourcelist=$W/sources.list" -o "Dir::Etc::sourceparts=-"
   -o "Dir::State::Lists=$W/lists" -o "Debug::NoLocking=1")
apt-get "${A[@]}" update -qq 2>&1 | grep -v 'unsandboxed' >&2 || true
(cd "$W/debs" && apt-get "${A[@]}" download -qq apptainer/sid libc6/trixie 2>&1 \
   | grep -v 'unsandboxed' >&2 || true)
app_deb=$(ls "$W"/debs/apptainer_*.deb 2>/dev/null || true)
libc_deb=$(ls "$W"/debs/libc6_*.deb 2>/dev/null || true)
[ -n "$app_deb" ] && [ -n "$libc_deb" ] || { echo "setup-apptainer: download from deb.debian.org failed" >&2; exit 1; }
ver=$(dpkg-deb -f "$app_deb" Version)
case "$ver" in
  "$APPTAINER_SERIES"*) ;;
  *) echo "setup-apptainer: Debian sid now ships apptainer $ver, expected ${APPTAINER_SERIES}x;" \
          "check it and update APPTAINER_SERIES in $0" >&2; exit 1 ;;
esac

rm -rf "$D"; mkdir -p "$D"
dpkg -x "$app_deb" "$D/app"; dpkg -x "$libc_deb" "$D/glibc"
G=$D/glibc; RP=$G/usr/lib/x86_64-linux-gnu:/usr/lib/x86_64-linux-gnu:/lib/x86_64-linux-gnu
for f in usr/bin/apptainer usr/lib/x86_64-linux-gnu/apptainer/bin/starter; do
  patchelf --set-interpreter "$G/usr/lib64/ld-linux-x86-64.so.2" --force-rpath --set-rpath "$RP" "$D/app/$f"
done
patchelf --force-rpath --set-rpath "$RP" "$D/app/usr/lib/x86_64-linux-gnu/apptainer/lib/offsetpreload.so"
# Relocation: apptainer looks for <bin>/../etc and (starter) <libexec>/../etc and ../var.
mv "$D/app/etc" "$D/app/usr/etc"; ln -s ../etc "$D/app/usr/lib/etc"; ln -s ../var "$D/app/usr/lib/var"
mkdir -p "$D/app/usr/var/lib/apptainer/mnt/session"
# Capabilities: where the bounding set lacks some (this sandbox lacks CAP_SYS_RESOURCE), give
# root every capability it has instead of "full"; otherwise every exec fails with
# "Requesting capability set ... while permitted capability set is ...".
last=$(cat /proc/sys/kernel/cap_last_cap)
bnd=$((16#$(awk '/^CapBnd/ {print $2}' /proc/self/status)))
if [ "$bnd" -ne $(((1 << (last + 1)) - 1)) ]; then
  sed -i 's/^root default capabilities = full/root default capabilities = file/' \
    "$D/app/usr/etc/apptainer/apptainer.conf"
  "$BIN" capability add --user root CAP_ALL >/dev/null 2>&1
  # Linux capability numbers (include/uapi/linux/capability.h), to drop the missing ones.
  caps=(CHOWN DAC_OVERRIDE DAC_READ_SEARCH FOWNER FSETID KILL SETGID SETUID SETPCAP
        LINUX_IMMUTABLE NET_BIND_SERVICE NET_BROADCAST NET_ADMIN NET_RAW IPC_LOCK IPC_OWNER
        SYS_MODULE SYS_RAWIO SYS_CHROOT SYS_PTRACE SYS_PACCT SYS_ADMIN SYS_BOOT SYS_NICE
        SYS_RESOURCE SYS_TIME SYS_TTY_CONFIG MKNOD LEASE AUDIT_WRITE AUDIT_CONTROL SETFCAP
        MAC_OVERRIDE MAC_ADMIN SYSLOG WAKE_ALARM BLOCK_SUSPEND AUDIT_READ PERFMON BPF
        CHECKPOINT_RESTORE)
  for ((i = 0; i <= last && i < ${#caps[@]}; i++)); do
    if (( (bnd >> i & 1) == 0 )); then
      echo "setup-apptainer: bounding set lacks CAP_${caps[i]}: dropping it for root" >&2
      "$BIN" capability drop --user root "CAP_${caps[i]}" >/dev/null
    fi
  done
fi
"$BIN" version >&2
touch "$D/.complete"
echo "$BIN"
