#!/usr/bin/env bash
# tests/tls/make_ca.sh DIR IP...: a throwaway certificate authority for the
# tests, and a server certificate it signed for the controller, valid for
# the addresses IP... (and localhost): DIR/ca.pem (what clients trust:
# MUSTER_CA_FILE), DIR/cert.pem and DIR/key.pem (--tls-cert, --tls-key).
# ECDSA P-256, one day. Nothing outside DIR is touched.
set -euo pipefail
umask 077 # (the keys are never readable by others, not even for a moment)
dir=${1:?usage: make_ca.sh DIR IP...}
shift
mkdir -p "$dir"
san="DNS:localhost"
for ip in "$@"; do san="$san,IP:$ip"; done
openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 1 \
  -subj "/CN=muster test CA" -keyout "$dir/ca-key.pem" -out "$dir/ca.pem" 2>/dev/null
openssl req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes \
  -subj "/CN=muster-controller" -keyout "$dir/key.pem" -out "$dir/cert.csr" 2>/dev/null
openssl x509 -req -in "$dir/cert.csr" -CA "$dir/ca.pem" -CAkey "$dir/ca-key.pem" \
  -CAcreateserial -days 1 -out "$dir/cert.pem" \
  -extfile <(printf 'subjectAltName=%s\nbasicConstraints=CA:FALSE\nextendedKeyUsage=serverAuth\n' "$san") \
  2>/dev/null
rm -f "$dir/cert.csr" "$dir/ca.srl"
chmod 755 "$dir"
chmod 600 "$dir/key.pem" "$dir/ca-key.pem"
chmod 644 "$dir/ca.pem" "$dir/cert.pem"
