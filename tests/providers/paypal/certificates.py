"""PayPal's certificates for the tests: a certificate authority made here, PayPal's signing certificates (a good one
and one of each kind a check must refuse), a stand-in of PayPal's certificate host serving them over HTTPS on
loopback, and the headers PayPal signs a delivery with."""

import binascii
import datetime
import ssl
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from app.intake.signature import sign

WEBHOOK_ID = "1JE4291016473214C"  # the form of PayPal's sample's webhook_id
PAYPAL_NAME = "messageverificationcerts.paypal.com"  # the subject of PayPal's signing certificate
CERTS = "/v1/notifications/certs/"


def cert_name(label):
    """The stand-in's name for a certificate the tests call label, in PayPal's shape (CERT- and three groups of
    eight hex digits, as PayPal's own URLs: app/providers/paypal/certificates.py, CERT_NAME)."""
    return f"CERT-360caa42-fca2a594-{binascii.crc32(label.encode()):08x}"


def cert_path(label):
    return CERTS + cert_name(label)
DAY = datetime.timedelta(days=1)


# -- a certificate authority, PayPal's certificates and a stand-in of its host -----------------------

def _key():
    return rsa.generate_private_key(public_exponent=65537, key_size=2048)


def _cert(name, key, issuer=None, *, ca=False, start=-DAY, end=365 * DAY, eku=ExtendedKeyUsageOID.SERVER_AUTH,
          san=True):
    """A certificate for name's key, signed by issuer ((cert, key); None: self-signed), with the Web PKI's
    extensions (a CA's basic constraints and key usage; a leaf's subject alternative name: name, or san's)."""
    issuer_cert, issuer_key = issuer or (None, key)
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    now = datetime.datetime.now(datetime.UTC)
    builder = (x509.CertificateBuilder().subject_name(subject)
               .issuer_name(issuer_cert.subject if issuer_cert else subject)
               .public_key(key.public_key()).serial_number(x509.random_serial_number())
               .not_valid_before(now + start).not_valid_after(now + end)
               .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
               .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
               .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(issuer_key.public_key()),
                              critical=False))
    if ca:
        builder = builder.add_extension(x509.KeyUsage(
            digital_signature=True, content_commitment=False, key_encipherment=False, data_encipherment=False,
            key_agreement=False, key_cert_sign=True, crl_sign=True, encipher_only=False, decipher_only=False),
            critical=True)
    else:
        if san:
            alt_name = name if san is True else san
            builder = builder.add_extension(x509.SubjectAlternativeName([x509.DNSName(alt_name)]), critical=False)
        builder = builder.add_extension(x509.KeyUsage(
            digital_signature=True, content_commitment=False, key_encipherment=True, data_encipherment=False,
            key_agreement=False, key_cert_sign=False, crl_sign=False, encipher_only=False, decipher_only=False),
            critical=True)
        if eku is not None:
            builder = builder.add_extension(x509.ExtendedKeyUsage([eku]), critical=False)
    return builder.sign(issuer_key, hashes.SHA256())


def _pem(*certs):
    return b"".join(c.public_bytes(serialization.Encoding.PEM) for c in certs)


class PKI:
    """A root CA (the tests' PAYPAL_CA_FILE), an intermediate under it, and the certificates the stand-in serves,
    by name: PayPal's good one and each kind a check must refuse, with the private keys that sign for them."""

    def __init__(self, tmp):
        root_key, inter_key = _key(), _key()
        self.root = _cert("Test Root CA", root_key, ca=True, end=3650 * DAY)
        self.inter = _cert("Test Intermediate CA", inter_key, (self.root, root_key), ca=True, end=3000 * DAY)
        issuer = (self.inter, inter_key)
        self.key = _key()  # PayPal's signing key
        other_root_key = _key()
        other_root = _cert("Another Root CA", other_root_key, ca=True)
        self.keys = {}
        self.served = {}  # name under /v1/notifications/certs/ -> PEM body
        for name, cert_name, signer, start, end, chain in [
            ("CERT-good", PAYPAL_NAME, issuer, -DAY, 365 * DAY, True),
            ("CERT-sandbox", "messageverificationcerts.sandbox.paypal.com", issuer, -DAY, 365 * DAY, True),
            ("CERT-expired", PAYPAL_NAME, issuer, -30 * DAY, -DAY, True),
            ("CERT-not-yet", PAYPAL_NAME, issuer, DAY, 30 * DAY, True),
            ("CERT-self-signed", PAYPAL_NAME, None, -DAY, 365 * DAY, False),
            ("CERT-other-ca", PAYPAL_NAME, None, -DAY, 365 * DAY, False),
            ("CERT-not-paypal", "messageverificationcerts.example.com", issuer, -DAY, 365 * DAY, True),
            ("CERT-paypal-lookalike", "paypal.com.example.net", issuer, -DAY, 365 * DAY, True),
        ]:
            key = self.key if name == "CERT-good" else _key()
            if name == "CERT-other-ca":
                signer = (other_root, other_root_key)
            cert = _cert(cert_name, key, signer, start=start, end=end)
            self.keys[name] = key
            self.served[name] = _pem(cert, self.inter) if chain else _pem(cert)
        # PayPal's name in the subject alone, or not among the subject alternative names.
        for name, san in [("CERT-no-san", False), ("CERT-san-other", "other.paypal.com")]:
            self.keys[name] = _key()
            self.served[name] = _pem(_cert(PAYPAL_NAME, self.keys[name], issuer, san=san), self.inter)
        # The chain without its intermediate: the leaf alone does not reach the root.
        self.keys["CERT-no-chain"] = self.key
        self.served["CERT-no-chain"] = _pem(x509.load_pem_x509_certificates(self.served["CERT-good"])[0])
        self.served["CERT-not-pem"] = b"<html>maintenance</html>"
        self.ca_file = tmp / "ca.pem"
        self.ca_file.write_bytes(_pem(self.root))
        tls_key = _key()
        self.tls_cert_file, self.tls_key_file = tmp / "tls.pem", tmp / "tls.key"
        self.tls_cert_file.write_bytes(_pem(_cert("localhost", tls_key, issuer), self.inter))
        self.tls_key_file.write_bytes(tls_key.private_bytes(serialization.Encoding.PEM,
                                                            serialization.PrivateFormat.PKCS8,
                                                            serialization.NoEncryption()))


class CertHost:
    """A stand-in of PayPal's certificate host (api.paypal.com/v1/notifications/certs/<name>, the URL PayPal puts
    in PAYPAL-CERT-URL, "Self verification method", https://developer.paypal.com/api/rest/webhooks/rest/): it
    serves each certificate's PEM, with its chain, over HTTPS on loopback, and counts the requests it sees.
    CERT-500 answers 500 (PayPal's host failing), CERT-401 401; every answer waits `slow` seconds first."""

    def __init__(self, pki):
        self.requests = []
        self.slow = 0.0
        self.labels = {}  # a name in PayPal's shape -> the label the tests call its certificate
        host = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):
                host.requests.append(self.path)
                name = self.path.removeprefix(CERTS)
                name = host.labels.get(name, name)
                time.sleep(host.slow)
                if name in ("CERT-500", "CERT-401"):
                    self.send_response(int(name.removeprefix("CERT-")))
                    self.end_headers()
                    return
                if name == "CERT-redirect":
                    self.send_response(302)
                    self.send_header("Location", host.url("CERT-good"))
                    self.end_headers()
                    return
                body = pki.served.get(name) if self.path.startswith(CERTS) else None
                self.send_response(200 if body is not None else 404)
                self.send_header("Content-Length", str(len(body or b"")))
                self.end_headers()
                self.wfile.write(body or b"")

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(pki.tls_cert_file, pki.tls_key_file)
        self.server.socket = context.wrap_socket(self.server.socket, server_side=True)
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def url(self, label, host="localhost"):
        self.labels[cert_name(label)] = label
        return f"https://{host}:{self.port}{cert_path(label)}"

    def close(self):
        self.server.shutdown()
        self.server.server_close()


def paypal_headers(body, pki, cert_host, name="CERT-good", webhook_id=WEBHOOK_ID, timestamp=None, url=None):
    """What PayPal sends: the five PAYPAL-* headers, signed with the private key of the certificate at the URL."""
    return {"Content-Type": "application/json",
            **sign("paypal", body, [webhook_id.encode()], timestamp=timestamp, private_key=pki.keys[name],
                   cert_url=url or cert_host.url(name))}
