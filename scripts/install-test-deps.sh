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
packages=()
if [ ${#missing[@]} -gt 0 ]; then
  echo "install-test-deps: missing ${missing[*]}" >&2
  packages=(chromium nodejs debootstrap patchelf squashfs-tools uidmap fuse2fs squashfuse)
fi
# These packages and a single-node Slurm cluster's for tests/test_slurm.py (Slurm, munge,
# MariaDB), in one apt-get call: one index update, one dpkg run.
"$here/slurm-local.sh" install "${packages[@]}" >/dev/null
"$here/install-nsys.sh" >/dev/null
echo "install-test-deps: chromium, node, debootstrap, nsys and Slurm are ready"
