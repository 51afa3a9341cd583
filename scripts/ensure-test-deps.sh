#!/usr/bin/env bash
# Installs, from Debian's packages, the programs the tests run for real (for example redis-server for the
# quota suite) when they are missing, so `make test` passes on a fresh machine.
# Each entry is "binary:debian-package".
set -euo pipefail
needs=("redis-server:redis-server")
missing=()
for entry in "${needs[@]+"${needs[@]}"}"; do
  command -v "${entry%%:*}" >/dev/null 2>&1 || missing+=("${entry#*:}")
done
[ "${#missing[@]}" -eq 0 ] && exit 0
echo "installing test dependencies: ${missing[*]}" >&2
sudo=""
[ "$(id -u)" -eq 0 ] || sudo="sudo"
$sudo apt-get update -qq
DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
