#!/usr/bin/env bash
# Installs the system packages the project builds against, when missing: the one list and the one code path
# for both README commands (scripts/demo.sh, the main job, and scripts/setup.sh, the test command's set-up).
#
#   bash scripts/system-packages.sh            # the project's packages (below)
#   bash scripts/system-packages.sh PKG...     # the same steps for other packages (to rehearse them)
#
# Debian/Ubuntu only (dpkg, apt-get). Already-installed packages cost one dpkg query; missing ones are
# installed with apt-get, as root or through sudo (without a terminal, sudo must not need a password). Fails
# loudly when a package cannot be installed; it never skips one.
set -euo pipefail

# pkg-config and libhdf5-dev: the PyTorch-BigGraph crate links the system libhdf5, which hdf5-metno-sys
# finds through pkg-config.
# openmpi-bin, libopenmpi-dev, libclang-dev: the `mpi` feature (ckpt-collective's MpiCollective through rsmpi, whose
# bindings are generated with libclang) and `mpirun` for its tests (crates/collective/tests/mpi.rs, facade/tests/mpi.rs).
PACKAGES=(pkg-config libhdf5-dev openmpi-bin libopenmpi-dev libclang-dev)
[ $# -gt 0 ] && PACKAGES=("$@")

say() { printf '\033[1m[system-packages]\033[0m %s\n' "$*" >&2; }
die() { printf '\033[1;31m[system-packages] error:\033[0m %s\n' "$*" >&2; exit 1; }

installed() { dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q "install ok installed"; }

command -v dpkg-query >/dev/null && command -v apt-get >/dev/null \
  || die "not a Debian-based system (no dpkg-query/apt-get): install the equivalents of ${PACKAGES[*]} yourself"

missing=()
for p in "${PACKAGES[@]}"; do
  installed "$p" || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0

say "installing ${missing[*]}"
SUDO=()
if [ "$(id -u)" -ne 0 ]; then
  command -v sudo >/dev/null || die "${missing[*]} missing: run as root, or install sudo"
  # Without a terminal a password prompt would hang: fail instead.
  if [ -t 0 ]; then
    SUDO=(sudo)
  else
    sudo -n true 2>/dev/null || die "${missing[*]} missing: sudo needs a password and there is no terminal (run as root)"
    SUDO=(sudo -n)
  fi
fi
# Wait for a concurrent apt/dpkg run (another user, unattended-upgrades) instead of failing on its lock.
APT=("${SUDO[@]}" env DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 -q)
"${APT[@]}" update -qq || die "apt-get update failed (as $(id -un)${SUDO[*]:+ through sudo})"
"${APT[@]}" install -y -qq --no-install-recommends "${missing[@]}" || die "apt-get install ${missing[*]} failed"
for p in "${missing[@]}"; do
  installed "$p" || die "$p is still not installed after apt-get install"
done
say "installed ${missing[*]}"
