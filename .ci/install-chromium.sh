#!/usr/bin/env bash
# Installs Debian's headless-capable Chromium for the HTML report tests (tests/report/).
# Idempotent: does nothing when a chromium binary is already on PATH.
set -euo pipefail
if command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1; then
  exit 0
fi
SUDO=""
if [ "$(id -u)" != "0" ]; then SUDO="sudo"; fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq chromium fonts-dejavu-core >/dev/null
command -v chromium >/dev/null
