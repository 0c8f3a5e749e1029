#!/usr/bin/env bash
# Installs the Debian packages celer builds and tests with, when they are missing.
# As root it runs apt-get; otherwise it prints the exact command and fails.
set -euo pipefail
pkgs=(build-essential pkg-config libjansson-dev libpcre2-dev libutf8proc-dev libmicrohttpd-dev libpng-dev libjpeg62-turbo-dev libcurl4-openssl-dev libssl-dev clang libclang-rt-14-dev python3 python3-pip python3-venv xz-utils)
missing=()
for p in "${pkgs[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0
if [ "$(id -u)" -eq 0 ]; then
    echo "installing: ${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq "${missing[@]}" >/dev/null
else
    echo "missing packages; run: sudo apt-get install -y ${missing[*]}" >&2
    exit 1
fi
