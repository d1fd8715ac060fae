#!/usr/bin/env bash
# Downloads, on a machine with Debian/Ubuntu package access, the .deb files of the
# dependencies that GPU nodes usually lack, for scripts/setup.sh --deps-dir DIR on the node.
#
#   scripts/fetch-offline-deps.sh DIR [extra package ...]
#
# Default set: Boost.Program_options (runtime and headers), nlohmann-json, libjpeg-turbo's
# TurboJPEG and libpng. The packages are Debian 12's; their libraries need glibc 2.36 or newer (Ubuntu
# 22.10+, Debian 12+). Nothing is installed on this machine.
set -euo pipefail

[ $# -ge 1 ] || { sed -n '2,9p' "$0"; exit 2; }
dir=$1
shift
mkdir -p "$dir"
dir=$(cd "$dir" && pwd)

packages=(
  libboost-program-options1.74.0 libboost-program-options1.74-dev libboost1.74-dev
  nlohmann-json3-dev libturbojpeg0 libturbojpeg0-dev libpng16-16 libpng-dev
  "$@"
)
# apt-get download writes into the current directory; as root it warns that the _apt user
# cannot write there, which is harmless.
(cd "$dir" && apt-get download "${packages[@]}" 2>&1 | grep -v "couldn't be accessed by user '_apt'" || true)
count=$(ls "$dir"/*.deb 2>/dev/null | wc -l)
[ "$count" -ge ${#packages[@]} ] || { echo "fetch-offline-deps.sh: only $count of ${#packages[@]} packages downloaded" >&2; exit 1; }
echo "fetched $count packages into $dir; on the node: scripts/setup.sh --deps-dir $dir"
