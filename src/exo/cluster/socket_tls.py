"""Python `ssl` contexts for sockets of a keyed cluster outside zenoh (a split model's ranks), from the same
certificates as its zenoh links (cluster_tls): mutual TLS 1.3, only the cluster's authority trusted, no host names.

`ssl` loads a certificate and its key only from files: they are written to a private temporary folder for the
moment of loading and removed at once.
"""

import base64
import ssl
import tempfile
from pathlib import Path

from exo.shared.types.tls_link import TlsLinkConfig


def _context(config: TlsLinkConfig, purpose: int) -> ssl.SSLContext:
    context = ssl.SSLContext(purpose)
    context.minimum_version = ssl.TLSVersion.TLSv1_3
    # Membership is the authority's signature, not a name (as on the zenoh links).
    context.check_hostname = False
    context.verify_mode = ssl.CERT_REQUIRED
    context.load_verify_locations(cadata=base64.b64decode(config.root_ca_certificate_base64).decode())
    with tempfile.TemporaryDirectory(prefix="exo-tls-") as folder:
        certificate, key = Path(folder) / "certificate.pem", Path(folder) / "key.pem"
        certificate.write_bytes(base64.b64decode(config.listen_certificate_base64))
        key.touch(mode=0o600)
        key.write_bytes(base64.b64decode(config.listen_private_key_base64))
        context.load_cert_chain(certificate, key)
    return context


def server_context(config: TlsLinkConfig) -> ssl.SSLContext:
    """For accepting: the peer must present a certificate the cluster's authority signed."""
    return _context(config, ssl.PROTOCOL_TLS_SERVER)


def client_context(config: TlsLinkConfig) -> ssl.SSLContext:
    """For dialling: the peer must present a certificate the cluster's authority signed, and so does this end."""
    return _context(config, ssl.PROTOCOL_TLS_CLIENT)
