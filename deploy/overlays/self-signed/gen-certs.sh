#!/bin/sh
# Make a private CA and a serving certificate for the vfio-dp webhook Service, for
# deploy/overlays/self-signed. Usage: gen-certs.sh [OUT_DIR] (default: ./certs beside this
# script). Needs only openssl. Existing files are replaced (that is how you rotate).
#
# Environment: NAMESPACE (vfio-dp), SERVICE (vfio-dp-webhook), DAYS (365), CA_DAYS (1825).
set -eu

here=$(cd "$(dirname "$0")" && pwd)
out=${1:-"$here/certs"}
ns=${NAMESPACE:-vfio-dp}
svc=${SERVICE:-vfio-dp-webhook}
days=${DAYS:-365}
ca_days=${CA_DAYS:-1825}

mkdir -p "$out"
umask 077
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes \
  -keyout "$tmp/ca.key" -out "$tmp/ca.crt" -days "$ca_days" \
  -subj "/CN=${svc}-ca" \
  -addext "basicConstraints=critical,CA:TRUE" \
  -addext "keyUsage=critical,keyCertSign,cRLSign" 2>/dev/null

openssl req -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes \
  -keyout "$tmp/tls.key" -out "$tmp/tls.csr" -subj "/CN=${svc}.${ns}.svc" 2>/dev/null

cat > "$tmp/ext.cnf" <<EXT
basicConstraints=CA:FALSE
keyUsage=critical,digitalSignature,keyEncipherment
extendedKeyUsage=serverAuth
subjectAltName=DNS:${svc}.${ns}.svc,DNS:${svc}.${ns}.svc.cluster.local
EXT

openssl x509 -req -in "$tmp/tls.csr" -CA "$tmp/ca.crt" -CAkey "$tmp/ca.key" \
  -CAcreateserial -out "$tmp/tls.crt" -days "$days" -extfile "$tmp/ext.cnf" 2>/dev/null

# The CA key is not kept: rotating means making a new CA, which this same apply installs.
cp "$tmp/ca.crt" "$tmp/tls.crt" "$tmp/tls.key" "$out/"
# The caBundle for the MutatingWebhookConfiguration: one JSON-patch op per webhook entry
# (deploy/base/mutatingwebhookconfiguration.yaml has two). One line of base64, no wrapping.
bundle=$(openssl base64 -A -in "$tmp/ca.crt")
{
  for i in 0 1; do
    printf -- '- op: add\n  path: /webhooks/%s/clientConfig/caBundle\n  value: %s\n' "$i" "$bundle"
  done
} > "$out/ca-bundle.patch.yaml"
chmod 0644 "$out/ca.crt" "$out/tls.crt"
chmod 0600 "$out/tls.key"
echo "wrote $out/ca.crt $out/tls.crt $out/tls.key $out/ca-bundle.patch.yaml (for ${svc}.${ns}.svc)"
