#!/usr/bin/env bash
# Quickstart demo: validates the example policy and serves it until Ctrl-C or DEMO_DURATION.
set -euo pipefail
cd "$(dirname "$0")/.."
./bin/infergate validate examples/quickstart/policy.yaml
args=(serve --policy examples/quickstart/policy.yaml --extproc-addr 127.0.0.1:9002 --metrics-addr 127.0.0.1:9090 --xds-addr "")
if [ "${DEMO_DURATION:-0}" != "0" ]; then
  exec timeout --signal=TERM "${DEMO_DURATION}" ./bin/infergate "${args[@]}" || true
fi
exec ./bin/infergate "${args[@]}"
