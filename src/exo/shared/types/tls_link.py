"""The certificates of one keyed link, as zenoh's TLS transport and a split model's relays both take them."""

from pydantic import BaseModel, ConfigDict


class TlsLinkConfig(BaseModel):
    """zenoh's `transport/link/tls` section (PEM files, base64-encoded)."""

    model_config = ConfigDict(frozen=True)

    root_ca_certificate_base64: str
    listen_private_key_base64: str
    listen_certificate_base64: str
    connect_private_key_base64: str
    connect_certificate_base64: str
    # Both ends present a certificate: the listener refuses a dialer without one from the authority.
    enable_mtls: bool = True
    # Nodes are dialled by whatever address they were found at (multicast, --peer, an IP): membership is what the
    # authority's signature proves, not a host name.
    verify_name_on_connect: bool = False
