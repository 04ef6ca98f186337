#!/usr/bin/env bash
# Makes a throw-away certificate authority and certificates for TLS tests and trials:
#   DIR/ca.pem DIR/ca.key        the CA
#   DIR/server.pem DIR/server.key ferry-ps (names 127.0.0.1, ::1, localhost, and $FERRY_CERT_HOSTS)
#   DIR/client.pem DIR/client.key a trainer (CN ferry-trainer), for mutual TLS
#   DIR/other-ca.pem, DIR/other-client.pem/.key  a second, unrelated CA and a client of it
# EC P-256 keys, valid 30 days, made with Debian's openssl. Usage: make-test-certs.sh DIR
set -euo pipefail
dir=${1:?usage: make-test-certs.sh DIR}
mkdir -p "$dir"
cd "$dir"
umask 077
san="IP:127.0.0.1,IP:::1,DNS:localhost"
for h in ${FERRY_CERT_HOSTS:-}; do
    if [[ $h =~ ^[0-9.:]+$ ]]; then san="$san,IP:$h"; else san="$san,DNS:$h"; fi
done
key() { openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out "$1" 2>/dev/null; }
ca() { # NAME CN
    key "$1.key"
    openssl req -x509 -new -key "$1.key" -subj "/CN=$2" -days 30 -out "$1.pem" \
        -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign" 2>/dev/null
}
leaf() { # NAME CN CA EXT
    key "$1.key"
    openssl req -new -key "$1.key" -subj "/CN=$2" -out "$1.csr" 2>/dev/null
    printf '%s\n' "$4" >"$1.ext"
    openssl x509 -req -in "$1.csr" -CA "$3.pem" -CAkey "$3.key" -CAcreateserial -days 30 \
        -extfile "$1.ext" -out "$1.pem" 2>/dev/null
    rm -f "$1.csr" "$1.ext"
}
ca ca "ferry test CA"
leaf server ferry-ps ca "subjectAltName=$san
extendedKeyUsage=serverAuth"
leaf client ferry-trainer ca "extendedKeyUsage=clientAuth"
ca other-ca "another CA"
leaf other-client intruder other-ca "extendedKeyUsage=clientAuth"
rm -f ./*.srl
echo "certificates in $dir: ca.pem, server.pem/.key, client.pem/.key (+ other-ca, other-client)" >&2
