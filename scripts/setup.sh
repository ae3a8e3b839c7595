#!/usr/bin/env bash
# Installs what muster needs to build, run and test on Debian 12.
# Idempotent: packages already present are not fetched again.
set -euo pipefail

pkgs=(build-essential cmake pkg-config ca-certificates curl jq sqlite3
      libmicrohttpd-dev libjansson-dev libcurl4-openssl-dev libsqlite3-dev
      check libsubunit-dev python3 iproute2 procps
      jupyter-nbconvert python3-ipykernel)

missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' \
    || missing+=("$p")
done

if [ ${#missing[@]} -gt 0 ]; then
  if [ "$(id -u)" -ne 0 ]; then
    echo "setup: missing packages (${missing[*]}); run as root to install them" >&2
    exit 1
  fi
  echo "setup: installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
