#!/usr/bin/env bash
# TLS with certificates made here (OpenSSL): a router serving clients over TLS (gRPC and the
# OpenAI HTTP API) and reaching a sim worker over mutual TLS. Shown: a client with the CA gets
# tokens, one without it (plaintext) does not; a worker refuses routers without a client certificate or with one from another CA (they
# never turn ready); a bad key file stops the router at start naming the key; the worker's
# certificate and the router's HTTPS certificate, replaced on disk, are served to new connections
# without a restart.
#   tls_test.sh SOURCE_DIR BIN_DIR
set -euo pipefail
SRC=$1
BIN=$2
d=$(mktemp -d)
pids=()
cleanup() { kill "${pids[@]}" 2>/dev/null || true; wait "${pids[@]}" 2>/dev/null || true; rm -rf "$d"; }
trap cleanup EXIT
fail() { echo "FAIL: $*"; for f in "$d"/*.log; do echo "== $f"; tail -5 "$f"; done; exit 1; }
cd "$d"
# A CA, a rogue CA, and certificates for 127.0.0.1 signed by them.
ca() { openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 2 -subj "/CN=$1" -keyout "$1.key" -out "$1.pem" 2>/dev/null; }
cert() {  # name ca
  openssl req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -subj "/CN=$1" -keyout "$1.key" -out "$1.csr" 2>/dev/null
  printf 'subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth,clientAuth\n' > "$1.ext"
  openssl x509 -req -in "$1.csr" -CA "$2.pem" -CAkey "$2.key" -CAcreateserial -days 2 -extfile "$1.ext" -out "$1.pem" 2>/dev/null
}
ca ca; ca rogue
cert worker ca; cert router ca; cert front ca; cert intruder rogue; cert worker2 ca; cert front2 ca
cp worker.pem worker-live.pem; cp worker.key worker-live.key; cp front.pem front-live.pem; cp front.key front-live.key
port_of() { for _ in $(seq 200); do v=$(sed -n "s/^$2=//p" "$1" 2>/dev/null); [ -n "$v" ] && echo "$v" && return; sleep 0.05; done; return 1; }
ready() { for _ in $(seq "$2"); do curl -sf "localhost:$1/readyz" > /dev/null && return 0; sleep 0.1; done; return 1; }

"$BIN/tailserve-worker" --config "$SRC/ladb_config.yaml" --grpc-port 0 --http-port 0 --listen-host 127.0.0.1 \
  --log-level warn --ports-file w --set worker.tls_cert_file="$d/worker-live.pem" \
  --set worker.tls_key_file="$d/worker-live.key" --set worker.tls_client_ca_file="$d/ca.pem" > worker.log 2>&1 &
pids+=($!)
wport=$(port_of w grpc_port) || fail "worker did not start"
router() {  # name, then flags
  local name=$1; shift
  "$BIN/tailserve-router" --config "$SRC/ladb_config.yaml" --grpc-port 0 --http-port 0 --listen-host 127.0.0.1 \
    --log-level warn --ports-file "$name.ports" --workers "127.0.0.1:$wport" "$@" > "$name.log" 2>&1 &
  pids+=($!)
}
router good --set router.worker_tls_ca_file="$d/ca.pem" --set router.worker_tls_cert_file="$d/router.pem" \
  --set router.worker_tls_key_file="$d/router.key" --set router.tls_cert_file="$d/front-live.pem" \
  --set router.tls_key_file="$d/front-live.key" --set router.api_port=0
router anonymous --set router.worker_tls_ca_file="$d/ca.pem"
router intruder --set router.worker_tls_ca_file="$d/ca.pem" --set router.worker_tls_cert_file="$d/intruder.pem" \
  --set router.worker_tls_key_file="$d/intruder.key"
ready "$(port_of good.ports http_port)" 100 || fail "the router with a client certificate did not reach the worker"
echo "ok   mutual TLS: the router with the CA's client certificate is ready"
gport=$(port_of good.ports grpc_port)
out=$("$BIN/tailserve-generate" --target "127.0.0.1:$gport" --ca-file "$d/ca.pem" --prompt hi --max-tokens 4 --timeout-s 10) ||
  fail "a client with the CA got no tokens"
echo "$out" | grep -q "finish=FINISH_REASON_LENGTH tokens=4" || fail "unexpected output: $out"
echo "ok   a client with the CA gets its tokens over TLS"
if "$BIN/tailserve-generate" --target "127.0.0.1:$gport" --prompt hi --max-tokens 4 --timeout-s 3 > plain.out 2>&1; then
  fail "a plaintext client was served by the TLS port"
fi
if "$BIN/tailserve-generate" --target "127.0.0.1:$gport" --ca-file "$d/rogue.pem" --prompt hi --max-tokens 4 --timeout-s 3 > rogue.out 2>&1; then
  fail "a client trusting another CA was served"
fi
echo "ok   plaintext clients and clients trusting another CA are refused"
aport=$(port_of good.ports api_port)
curl -sf --cacert ca.pem "https://127.0.0.1:$aport/v1/models" | grep -q '"id":"sim"' || fail "HTTPS with the CA failed"
curl -sf --cacert ca.pem "https://127.0.0.1:$aport/v1/completions" -d '{"model":"sim","prompt":[1,2,3],"max_tokens":2}' |
  grep -q '"finish_reason":"length"' || fail "an HTTPS completion failed"
if curl -sf "http://127.0.0.1:$aport/v1/models" -m 3 > /dev/null; then fail "plain HTTP was served on the TLS port"; fi
if curl -sf --cacert rogue.pem "https://127.0.0.1:$aport/v1/models" -m 3 > /dev/null; then fail "a client trusting another CA was served"; fi
echo "ok   the OpenAI API serves HTTPS with the certificate, refuses plain HTTP and other CAs' clients"
for r in anonymous intruder; do
  if ready "$(port_of $r.ports http_port)" 30; then fail "the $r router reached the worker"; fi
done
echo "ok   the worker refuses routers without a certificate or with one from another CA"
if "$BIN/tailserve-router" --config "$SRC/ladb_config.yaml" --grpc-port 0 --http-port 0 --listen-host 127.0.0.1 \
    --workers "127.0.0.1:$wport" --set router.tls_cert_file="$d/front.pem" --set router.tls_key_file="$d/router.key" \
    > badkey.log 2>&1; then
  fail "a router with a mismatched key started"
fi
grep -q "router.tls_key_file: .* is not the private key of router.tls_cert_file" badkey.log || fail "$(cat badkey.log)"
echo "ok   a key that does not match its certificate stops the router naming the key"
# The serial a new connection to port $1 is served, with openssl s_client flags $2.. (empty when the
# handshake fails; callers retry).
serial() { local port=$1; shift; { openssl s_client -connect "127.0.0.1:$port" -CAfile ca.pem "$@" </dev/null 2>/dev/null |
  openssl x509 -noout -serial 2>/dev/null; } || true; }
# Waits up to $1 quarter-seconds for port $2 to serve the certificate file $3 (s_client flags after).
serves() {
  local tries=$1 port=$2 want; want=$(openssl x509 -in "$3" -noout -serial); shift 3
  for _ in $(seq "$tries"); do [ "$(serial "$port" "$@")" = "$want" ] && return 0; sleep 0.25; done
  echo "port $port serves $(serial "$port" "$@"), want $want"; return 1
}
# Replaces live files $1.key/$1.pem by $2's, each by a rename (as a Secret update lands).
rotate() {
  cp "$2.key" "$1.key.tmp"; cp "$2.pem" "$1.pem.tmp"
  mv "$1.key.tmp" "$1.key"; mv "$1.pem.tmp" "$1.pem"
}
client=(-cert router.pem -key router.key)
msg=$(serves 20 "$wport" worker.pem "${client[@]}") || fail "$msg"
rotate worker-live worker2
msg=$(serves 60 "$wport" worker2.pem "${client[@]}") || fail "the rotated certificate is not served: $msg"
out=$("$BIN/tailserve-generate" --target "127.0.0.1:$gport" --ca-file "$d/ca.pem" --prompt again --max-tokens 4 --timeout-s 10) ||
  fail "no tokens after the rotation"
echo "ok   the worker serves its rotated certificate without a restart, and requests still flow"
msg=$(serves 20 "$aport" front.pem) || fail "HTTPS: $msg"
rotate front-live front2
msg=$(serves 60 "$aport" front2.pem) || fail "the rotated HTTPS certificate is not served: $msg"
echo "ok   the router serves its rotated HTTPS certificate without a restart"
