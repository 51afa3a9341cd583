#!/usr/bin/env bash
# Installs, from Debian's packages, the programs the tests run for real (for example redis-server for the
# quota suite, promtool for the alert rules under deploy/observability, ip(8) for the regions in network
# namespaces, test/regionnet) when they are missing, so `make test`
# passes on a fresh machine.
# Each entry is "binary:debian-package".
set -euo pipefail
needs=("redis-server:redis-server" "promtool:prometheus" "ip:iproute2")
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
# Debian's prometheus package (installed for promtool) starts a Prometheus server on :9090, infergate's default
# metrics port, which the tests need free: stop it and keep it from starting at boot. Best effort only.
case " ${missing[*]} " in
  *" prometheus "*)
    if command -v systemctl >/dev/null 2>&1; then
      $sudo systemctl disable prometheus >/dev/null 2>&1 || true
      if [ -d /run/systemd/system ]; then
        $sudo systemctl stop prometheus >/dev/null 2>&1 || true
      fi
    fi
    if command -v service >/dev/null 2>&1; then
      $sudo service prometheus stop >/dev/null 2>&1 || true
    fi
    if command -v update-rc.d >/dev/null 2>&1; then
      $sudo update-rc.d prometheus disable >/dev/null 2>&1 || true
    fi
    ;;
esac
