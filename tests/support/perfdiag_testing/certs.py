"""Certificates and keys of a throwaway control plane, made with the openssl CLI.

A CA, the apiserver's serving certificate (SANs 127.0.0.1, localhost and the in-cluster names),
an admin client certificate (CN=admin, O=system:masters) and the service-account signing key.
EC P-256 keys keep generation well under a second.
"""

from __future__ import annotations

import secrets
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

VALID_DAYS = 7

_CONFIG = """\
[req]
distinguished_name = dn
prompt = no
[dn]
CN = unused
[ca]
basicConstraints = critical,CA:TRUE
keyUsage = critical,keyCertSign,cRLSign,digitalSignature
subjectKeyIdentifier = hash
[server]
basicConstraints = critical,CA:FALSE
keyUsage = critical,digitalSignature,keyEncipherment
extendedKeyUsage = serverAuth
subjectAltName = {server_sans}
authorityKeyIdentifier = keyid
[client]
basicConstraints = critical,CA:FALSE
keyUsage = critical,digitalSignature,keyEncipherment
extendedKeyUsage = clientAuth
authorityKeyIdentifier = keyid
"""

_EC_KEY = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]


@dataclass(frozen=True)
class ControlPlaneCerts:
    ca_cert: Path
    ca_key: Path
    serving_cert: Path
    serving_key: Path
    admin_cert: Path
    admin_key: Path
    service_account_key: Path
    service_account_public_key: Path


class OpensslError(RuntimeError):
    pass


def _openssl(*args: str, **options: str | Path) -> None:
    """Run openssl; keyword options become `-name value` (`CAkey="…"` → `-CAkey …`)."""
    binary = shutil.which("openssl")
    if binary is None:
        raise OpensslError("the openssl command is needed to make the test certificates")
    argv = [binary, *args]
    for name, value in options.items():
        argv += [f"-{name}", str(value)]
    result = subprocess.run(argv, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise OpensslError(f"{' '.join(argv)} failed:\n{result.stderr.strip()}")


def _sign(directory: Path, name: str, subject: str, extensions: str, config: Path) -> None:
    key, csr, cert = (directory / f"{name}.{ext}" for ext in ("key", "csr", "crt"))
    _openssl("req", "-new", *_EC_KEY, config=config, keyout=key, out=csr, subj=subject)
    _openssl(
        "x509",
        "-req",
        CA=directory / "ca.crt",
        CAkey=directory / "ca.key",
        set_serial=f"0x{secrets.token_hex(12)}",
        days=str(VALID_DAYS),
        extfile=config,
        extensions=extensions,
        out=cert,
        **{"in": csr},
    )
    csr.unlink()
    key.chmod(0o600)


def make_control_plane_certs(
    directory: Path, *, ips: tuple[str, ...], dns_names: tuple[str, ...]
) -> ControlPlaneCerts:
    directory.mkdir(parents=True, exist_ok=True)
    sans = ",".join([*(f"IP:{ip}" for ip in ips), *(f"DNS:{name}" for name in dns_names)])
    config = directory / "openssl.cnf"
    config.write_text(_CONFIG.format(server_sans=sans))
    _openssl(
        "req",
        "-x509",
        *_EC_KEY,
        config=config,
        extensions="ca",
        keyout=directory / "ca.key",
        out=directory / "ca.crt",
        days=str(VALID_DAYS),
        subj="/CN=perfdiag-test-ca",
    )
    _sign(directory, "apiserver", "/CN=kube-apiserver", "server", config)
    _sign(directory, "admin", "/O=system:masters/CN=admin", "client", config)
    sa_key, sa_pub = directory / "service-account.key", directory / "service-account.pub"
    _openssl("genpkey", algorithm="RSA", pkeyopt="rsa_keygen_bits:2048", out=sa_key)
    _openssl("pkey", "-pubout", out=sa_pub, **{"in": sa_key})
    return ControlPlaneCerts(
        ca_cert=directory / "ca.crt",
        ca_key=directory / "ca.key",
        serving_cert=directory / "apiserver.crt",
        serving_key=directory / "apiserver.key",
        admin_cert=directory / "admin.crt",
        admin_key=directory / "admin.key",
        service_account_key=sa_key,
        service_account_public_key=sa_pub,
    )


def make_serving_cert(
    ca_cert: Path,
    ca_key: Path,
    directory: Path,
    name: str,
    *,
    ips: tuple[str, ...] = ("127.0.0.1",),
    dns_names: tuple[str, ...] = ("localhost",),
) -> tuple[Path, Path]:
    """A TLS serving certificate (and key) for another loopback server, e.g. an admission
    webhook the apiserver calls, signed by the control plane's CA. Returns (cert, key)."""
    directory.mkdir(parents=True, exist_ok=True)
    sans = ",".join([*(f"IP:{ip}" for ip in ips), *(f"DNS:{dns}" for dns in dns_names)])
    config = directory / f"{name}.cnf"
    config.write_text(_CONFIG.format(server_sans=sans))
    key, csr, cert = (directory / f"{name}.{ext}" for ext in ("key", "csr", "crt"))
    _openssl("req", "-new", *_EC_KEY, config=config, keyout=key, out=csr, subj=f"/CN={name}")
    _openssl(
        "x509",
        "-req",
        CA=ca_cert,
        CAkey=ca_key,
        set_serial=f"0x{secrets.token_hex(12)}",
        days=str(VALID_DAYS),
        extfile=config,
        extensions="server",
        out=cert,
        **{"in": csr},
    )
    csr.unlink()
    key.chmod(0o600)
    return cert, key
