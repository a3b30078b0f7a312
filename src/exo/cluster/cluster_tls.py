"""A keyed cluster's links: zenoh's TLS transport with mutual authentication, its trust rooted in the cluster key.

Every node derives the same certificate authority from the key and the cluster's name (an Ed25519 key from scrypt,
so guessing a key from a captured certificate costs a slow hash per guess), and signs a certificate of its own with
it for a fresh key drawn at start. Each end of a link checks that the other's certificate was signed by that
authority: a program without the key can neither open a link nor accept one, and everything on a link is
encrypted. Nothing is written to disk; zenoh takes the certificates inline.
"""

import base64
import datetime
import functools
import hashlib

from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ed25519
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from exo.shared.types.tls_link import TlsLinkConfig

# scrypt's cost: about 0.1 s and 32 MiB once per process; it only slows down guessing a key offline.
_SCRYPT_N = 2**15
_SCRYPT_R = 8
_VALID_FROM = datetime.datetime(2020, 1, 1, tzinfo=datetime.UTC)
# Certificates never expire: the key is the credential, and changing it is how a cluster revokes a member.
_VALID_UNTIL = datetime.datetime(9999, 12, 31, 23, 59, 59, tzinfo=datetime.UTC)


def _pem_base64(data: bytes) -> str:
    return base64.b64encode(data).decode()


@functools.cache
def _authority(key: str, cluster: str) -> tuple[ed25519.Ed25519PrivateKey, x509.Certificate]:
    """The cluster's certificate authority: the same key and certificate on every node holding `key`."""
    seed = hashlib.scrypt(
        key.encode(), salt=f"exo cluster {cluster}".encode(), n=_SCRYPT_N, r=_SCRYPT_R, p=1, maxmem=64 * 2**20, dklen=32
    )
    private_key = ed25519.Ed25519PrivateKey.from_private_bytes(seed)
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"exo cluster {cluster}")])
    certificate = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(private_key.public_key())
        .serial_number(1)
        .not_valid_before(_VALID_FROM)
        .not_valid_after(_VALID_UNTIL)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=False,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .sign(private_key, None)
    )
    return private_key, certificate


@functools.cache
def tls_link_config(key: str, cluster: str) -> TlsLinkConfig:
    """zenoh's `transport/link/tls` section for this process: its own certificate, signed by the cluster's
    authority, for both the links it accepts and those it opens, and that authority as the only one it trusts."""
    authority_key, authority = _authority(key, cluster)
    own_key = ed25519.Ed25519PrivateKey.generate()
    certificate = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"exo node of {cluster}")]))
        .issuer_name(authority.subject)
        .public_key(own_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(_VALID_FROM)
        .not_valid_after(_VALID_UNTIL)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False
        )
        .sign(authority_key, None)
    )
    own_key_pem = _pem_base64(
        own_key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )
    certificate_pem = _pem_base64(certificate.public_bytes(serialization.Encoding.PEM))
    return TlsLinkConfig(
        root_ca_certificate_base64=_pem_base64(authority.public_bytes(serialization.Encoding.PEM)),
        listen_private_key_base64=own_key_pem,
        listen_certificate_base64=certificate_pem,
        connect_private_key_base64=own_key_pem,
        connect_certificate_base64=certificate_pem,
    )
