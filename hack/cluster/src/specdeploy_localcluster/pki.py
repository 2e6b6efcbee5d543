"""The local cluster's PKI: a cluster CA, serving certificates, one client certificate per identity, the
service-account signing key and the front-proxy CA that API aggregation needs — what kubeadm would write to
/etc/kubernetes/pki, written with `cryptography` (ECDSA P-256, valid a year) — and the kubeconfigs that use
them. Which identities exist is the cluster's business (cluster.py); this module only issues them."""

from __future__ import annotations

import datetime as dt
import ipaddress
import json
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # `down` and `status` run without `cryptography`
    from cryptography import x509
    from cryptography.hazmat.primitives.asymmetric import ec

    KeyPair = tuple[ec.EllipticCurvePrivateKey, x509.Certificate]


@dataclass(frozen=True)
class ClientIdentity:
    """A client certificate `<file>.crt`/`<file>.key`: user `user`, in group `group` (its O) if any."""

    file: str
    user: str
    group: str | None = None


@dataclass(frozen=True)
class ServingIdentity:
    """A serving certificate `<file>.crt`/`<file>.key` for the names and addresses clients dial."""

    file: str
    common_name: str
    dns_names: tuple[str, ...]
    ips: tuple[str, ...]


def write_pki(pki: Path, servers: Iterable[ServingIdentity], clients: Iterable[ClientIdentity]) -> None:
    """`ca.crt`/`ca.key` and everything it signs (`servers`, `clients`); `front-proxy-ca` and its
    `front-proxy-client`; `sa.key`/`sa.pub` for service-account tokens. Keys are readable by their owner
    only."""
    from cryptography import x509  # noqa: PLC0415
    from cryptography.hazmat.primitives import hashes, serialization  # noqa: PLC0415
    from cryptography.hazmat.primitives.asymmetric import ec  # noqa: PLC0415
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID  # noqa: PLC0415

    pki.mkdir(parents=True, exist_ok=True)
    now = dt.datetime.now(dt.UTC) - dt.timedelta(minutes=5)
    later = now + dt.timedelta(days=365)

    def new_key() -> ec.EllipticCurvePrivateKey:
        return ec.generate_private_key(ec.SECP256R1())

    def save_key(name: str, key: ec.EllipticCurvePrivateKey) -> None:
        path = pki / f"{name}.key"
        path.write_bytes(
            key.private_bytes(
                serialization.Encoding.PEM,
                serialization.PrivateFormat.TraditionalOpenSSL,
                serialization.NoEncryption(),
            )
        )
        path.chmod(0o600)

    def save_cert(name: str, cert: x509.Certificate) -> None:
        (pki / f"{name}.crt").write_bytes(cert.public_bytes(serialization.Encoding.PEM))

    def name_of(cn: str, org: str | None = None) -> x509.Name:
        attrs = [x509.NameAttribute(NameOID.COMMON_NAME, cn)]
        if org:
            attrs.append(x509.NameAttribute(NameOID.ORGANIZATION_NAME, org))
        return x509.Name(attrs)

    def make_ca(name: str, cn: str) -> KeyPair:
        key = new_key()
        subject = name_of(cn)
        cert = (
            x509.CertificateBuilder()
            .subject_name(subject)
            .issuer_name(subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now)
            .not_valid_after(later)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .add_extension(
                x509.KeyUsage(
                    digital_signature=True,
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
            .sign(key, hashes.SHA256())
        )
        save_key(name, key)
        save_cert(name, cert)
        return key, cert

    def issue(name: str, ca: KeyPair, subject: x509.Name, serving: ServingIdentity | None = None) -> None:
        key = new_key()
        usage = ExtendedKeyUsageOID.SERVER_AUTH if serving else ExtendedKeyUsageOID.CLIENT_AUTH
        builder = (
            x509.CertificateBuilder()
            .subject_name(subject)
            .issuer_name(ca[1].subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now)
            .not_valid_after(later)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
        )
        if serving is not None:
            sans: list[x509.GeneralName] = [x509.DNSName(d) for d in serving.dns_names]
            sans += [x509.IPAddress(ipaddress.ip_address(ip)) for ip in serving.ips]
            builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
        save_key(name, key)
        save_cert(name, builder.sign(ca[0], hashes.SHA256()))

    ca = make_ca("ca", "specdeploy-local-ca")
    for server in servers:
        issue(server.file, ca, name_of(server.common_name), serving=server)
    for client in clients:
        issue(client.file, ca, name_of(client.user, client.group))
    front = make_ca("front-proxy-ca", "specdeploy-front-proxy-ca")
    issue("front-proxy-client", front, name_of("front-proxy-client"))
    sa = new_key()
    save_key("sa", sa)
    (pki / "sa.pub").write_bytes(
        sa.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )
    )


def kubeconfig_text(server: str, pki: Path, identity: ClientIdentity) -> str:
    """A kubeconfig for `identity` against the apiserver at `server`, trusting the cluster CA in `pki`."""
    user = identity.file
    doc = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {
                "name": "specdeploy-local",
                "cluster": {"server": server, "certificate-authority": str(pki / "ca.crt")},
            }
        ],
        "users": [
            {
                "name": user,
                "user": {
                    "client-certificate": str(pki / f"{identity.file}.crt"),
                    "client-key": str(pki / f"{identity.file}.key"),
                },
            }
        ],
        "contexts": [{"name": "specdeploy-local", "context": {"cluster": "specdeploy-local", "user": user}}],
        "current-context": "specdeploy-local",
        "preferences": {},
    }
    return json.dumps(doc, indent=2) + "\n"  # JSON is YAML: every client reads it
