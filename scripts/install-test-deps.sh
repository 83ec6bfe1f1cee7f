#!/usr/bin/env bash
# System tools the tests drive for real: headless Chromium (the HTML report), debootstrap and
# friends (the Apptainer image build), Node.js (Perfetto's trace processor, which loads the
# traces in tests/test_trace.py), Nsight Systems (the profiles; cached, no root) and a Slurm
# cluster's packages (tests/test_slurm.py; scripts/slurm-local.sh install).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
missing=()
command -v chromium >/dev/null || missing+=(chromium)
command -v node >/dev/null || missing+=(nodejs)
for tool in debootstrap patchelf mksquashfs unsquashfs; do
  command -v "$tool" >/dev/null || missing+=("$tool")
done
if [ ${#missing[@]} -gt 0 ]; then
  if [ "$(id -u)" -ne 0 ] || ! command -v apt-get >/dev/null; then
    echo "install-test-deps: missing ${missing[*]}; install them (Debian: apt-get install" \
         "chromium nodejs debootstrap patchelf squashfs-tools) and rerun" >&2
    exit 1
  fi
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends chromium nodejs debootstrap patchelf squashfs-tools \
      uidmap fuse2fs squashfuse >/dev/null
fi
"$here/install-nsys.sh" >/dev/null
# A single-node Slurm cluster for tests/test_slurm.py (Slurm, munge, MariaDB; apt as above).
"$here/slurm-local.sh" install >/dev/null
echo "install-test-deps: chromium, node, debootstrap, nsys and Slurm are ready"
