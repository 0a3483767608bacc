#!/usr/bin/env bash
# Installs what tessera needs to build and test on Debian 12 (run as root, or with sudo).
set -euo pipefail
export DEBIAN_FRONTEND=noninteractive
SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO=sudo
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends \
  build-essential cmake pkg-config git ca-certificates \
  libjansson-dev libpcre2-dev libutf8proc-dev libmicrohttpd-dev libcurl4-gnutls-dev \
  libpng-dev libjpeg62-turbo-dev libwebp-dev zlib1g-dev \
  libavformat-dev libavcodec-dev libswscale-dev libavutil-dev \
  python3 python3-pip tmux clang-14 libclang-rt-14-dev > /dev/null
# Python packages for the parity tests against Hugging Face libraries (not needed to run).
python3 -m pip install -q --disable-pip-version-check -r tests/requirements.txt 2> /dev/null ||
  python3 -m pip install -q --disable-pip-version-check --break-system-packages -r tests/requirements.txt
