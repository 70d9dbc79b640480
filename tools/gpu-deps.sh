#!/usr/bin/env bash
# Run on a machine with Debian's apt (not on the GPU machine, which has no network): downloads
# the packages a GPU image may lack and unpacks them into .deps/root, which the `gpu` preset
# searches first. Carry .deps to the GPU machine alongside the checkout.
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p .deps/debs .deps/root
cd .deps/debs
apt-get download librapidcheck-dev libcli11-dev libfmt-dev libfmt9 nlohmann-json3-dev
for d in *.deb; do dpkg -x "$d" ../root; done
echo "gpu-deps: unpacked $(ls | wc -l) packages into .deps/root"
