"""PayPal on this machine, for docs/providers/paypal.md's recipe: a test CA, a certificate issued to PayPal's
name and its key, a loopback stand-in of PayPal's certificate host serving it over HTTPS, and the stand-in of
PayPal's REST API (devservers/paypal_stand_in.py); it prints the service's settings for them.

`python -m devservers.paypal_local` starts both stand-ins in the background and returns once they answer;
`python -m devservers.paypal_local stop` stops them. Their files and log are in .run/paypal/ (PAYPAL_LOCAL_DIR),
their ports 8443 and 8088 (PAYPAL_LOCAL_CERT_PORT, PAYPAL_LOCAL_API_PORT)."""

import datetime
import json
import os
import ssl
import sys
import threading
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from cryptography.x509.oid import NameOID

from . import ROOT, answers_tcp
from .background import Background, shown, wait_for_signal
from .paypal_stand_in import EVENTS_PATH, PayPalStandIn

DIR = Path(os.environ.get("PAYPAL_LOCAL_DIR") or ROOT / ".run" / "paypal")
CERT_PORT = int(os.environ.get("PAYPAL_LOCAL_CERT_PORT") or 8443)
API_PORT = int(os.environ.get("PAYPAL_LOCAL_API_PORT") or 8088)
CERT_HOST = "localhost"  # the TLS certificate's name, and PAYPAL_CERT_HOSTS's entry with CERT_PORT
CERT_NAME = "CERT-360caa42-fca2a594-10ca1000"  # its name under /v1/notifications/certs/, in PayPal's shape
PAYPAL_NAME = "messageverificationcerts.paypal.com"  # the subject (and SAN) of PayPal's signing certificate
WEBHOOK_ID = "1JE4291016473214C"  # the form of the webhook id in PayPal's samples
CERT_URL = f"https://{CERT_HOST}:{CERT_PORT}/v1/notifications/certs/{CERT_NAME}"
API_URL = f"http://127.0.0.1:{API_PORT}"
BACKGROUND = Background("devservers.paypal_local", DIR, "PayPal's stand-ins", plural=True)


def settings():
    """The service's settings for the stand-ins: a `make run` line."""
    stand_in = PayPalStandIn()
    return (f"WEBHOOK_SOURCES=paypal WEBHOOK_PAYPAL_SECRET={WEBHOOK_ID} WEBHOOK_PAYPAL_API_KEY={stand_in.api_key} "
            f"WEBHOOK_PAYPAL_API_BASE={API_URL} PAYPAL_CERT_HOSTS={CERT_HOST}:{CERT_PORT} "
            f"PAYPAL_CA_FILE={shown(DIR / 'ca.pem')} make run")


def publish(event):
    """Make the running API stand-in hold event (a dict, as PayPal sends it), as PayPal's API holds the events it
    sends: the service fetches each event it is sent. (PayPal's API has no such call: this is the stand-in's.)"""
    request = urllib.request.Request(API_URL + EVENTS_PATH.rstrip("/"), json.dumps(event).encode(),
                                     {"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=10) as answer:
        answer.read()


# -- the certificates ---------------------------------------------------------------------------------

def _key():
    return rsa.generate_private_key(public_exponent=65537, key_size=2048)


def _certificate(name, key, ca_key=None, ca_name=None):
    """A CA (self-signed, without ca_key) or a leaf for name under it, with the Web PKI's extensions."""
    now = datetime.datetime.now(datetime.UTC)
    ca = ca_key is None
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    builder = (x509.CertificateBuilder().subject_name(subject).issuer_name(ca_name or subject)
               .public_key(key.public_key()).serial_number(x509.random_serial_number())
               .not_valid_before(now - datetime.timedelta(days=1)).not_valid_after(now + datetime.timedelta(days=365))
               .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
               .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
               .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key((ca_key or key).public_key()),
                              critical=False)
               .add_extension(x509.KeyUsage(digital_signature=True, content_commitment=False,
                                            key_encipherment=not ca, data_encipherment=False, key_agreement=False,
                                            key_cert_sign=ca, crl_sign=ca, encipher_only=False, decipher_only=False),
                              critical=True))
    if not ca:
        builder = builder.add_extension(x509.SubjectAlternativeName([x509.DNSName(name)]), critical=False)
    return builder.sign(ca_key or key, hashes.SHA256())


def _write(path, data):
    path.write_bytes(data)
    path.chmod(0o600)


def _pem(certificate):
    return certificate.public_bytes(serialization.Encoding.PEM)


def _private_pem(key):
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


def make_certificates():
    """The CA (ca.pem), PayPal's certificate (paypal.pem) and its key (paypal.key), the host's TLS certificate and
    key (tls.pem, tls.key) in DIR; kept when they are there, so that a running service's PAYPAL_CA_FILE stays true."""
    DIR.mkdir(parents=True, exist_ok=True)
    if all((DIR / name).exists() for name in ("ca.pem", "paypal.pem", "paypal.key", "tls.pem", "tls.key")):
        return
    ca_key, paypal_key, tls_key = _key(), _key(), _key()
    ca = _certificate("webhook-ledger local test CA", ca_key)
    _write(DIR / "paypal.key", _private_pem(paypal_key))
    _write(DIR / "paypal.pem", _pem(_certificate(PAYPAL_NAME, paypal_key, ca_key, ca.subject)))
    _write(DIR / "tls.key", _private_pem(tls_key))
    _write(DIR / "tls.pem", _pem(_certificate(CERT_HOST, tls_key, ca_key, ca.subject)))
    _write(DIR / "ca.pem", _pem(ca))


# -- the stand-ins ----------------------------------------------------------------------------------

class LocalPayPal(PayPalStandIn):
    """The API stand-in, with one call of its own: POST /v1/notifications/webhooks-events holds the event sent."""

    def _route(self, handler, method, form, fault):
        if method == "POST" and handler.path == EVENTS_PATH.rstrip("/"):
            try:
                event = json.loads(form)
                self.add(event)
            except (ValueError, TypeError, KeyError):
                return 400, json.dumps({"name": "INVALID_REQUEST", "message": "an event with an id"}).encode()
            return 201, json.dumps(event).encode()
        return super()._route(handler, method, form, fault)


def _cert_host():
    """PayPal's certificate host on 127.0.0.1:CERT_PORT over HTTPS: paypal.pem at CERT_URL's path, else 404."""
    body = (DIR / "paypal.pem").read_bytes()
    path = CERT_URL.split(f":{CERT_PORT}", 1)[1]

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):
            found = self.path == path
            self.send_response(200 if found else 404)
            self.send_header("Content-Length", str(len(body) if found else 0))
            self.end_headers()
            if found:
                self.wfile.write(body)

        def log_message(self, format, *args):
            sys.stderr.write(f"certificate host: {format % args}\n")

    server = ThreadingHTTPServer(("127.0.0.1", CERT_PORT), Handler)
    server.daemon_threads = True
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(DIR / "tls.pem", DIR / "tls.key")
    server.socket = context.wrap_socket(server.socket, server_side=True)
    return server


def serve():
    """Run both stand-ins until SIGTERM or SIGINT."""
    cert_host = _cert_host()
    api = LocalPayPal().start(API_PORT)
    threading.Thread(target=cert_host.serve_forever, daemon=True).start()
    wait_for_signal()
    cert_host.shutdown()
    api.close()


# -- start and stop -----------------------------------------------------------------------------------

def stop():
    return BACKGROUND.stop()


def start():
    """Start the stand-ins in the background (stopping those of an earlier start); the lines to print."""
    stop()
    for port, what in [(CERT_PORT, "PAYPAL_LOCAL_CERT_PORT"), (API_PORT, "PAYPAL_LOCAL_API_PORT")]:
        if answers_tcp(port):
            raise SystemExit(f"port {port} is in use: stop what uses it, or set {what}=<another port>")
    make_certificates()
    BACKGROUND.spawn([CERT_PORT, API_PORT])
    return [f"PayPal's certificate host: {CERT_URL} (under the CA {shown(DIR / 'ca.pem')})",
            f"PayPal's API: {API_URL}",
            f"The certificate's signing key: {shown(DIR / 'paypal.key')}; the webhook id: {WEBHOOK_ID}",
            "The service's settings:",
            settings(),
            f"Stop the stand-ins with: {shown(Path(sys.executable))} -m devservers.paypal_local stop"]


def main(argv):
    command = argv[1] if len(argv) > 1 else "start"
    if command == "serve":
        serve()
    elif command == "stop":
        print(stop())  # noqa: T201
    elif command == "start":
        print("\n".join(start()))  # noqa: T201
    else:
        raise SystemExit(f"usage: {argv[0]} [start|stop]")


if __name__ == "__main__":
    main(sys.argv)
