"""TLS and basic auth for the agent's HTTP port, from a Prometheus exporter-toolkit web config.

The same file format as node_exporter's ``--web.config.file``, so one file and one runbook
serve every exporter on a node::

    tls_server_config:
      cert_file: /etc/roofwatch/tls.crt
      key_file: /etc/roofwatch/tls.key
      client_auth_type: RequireAndVerifyClientCert   # optional: mTLS
      client_ca_file: /etc/roofwatch/ca.crt
      min_version: TLS12
    http_server_config:
      headers: {Strict-Transport-Security: max-age=31536000}
    basic_auth_users:
      prometheus: $2y$10$...                          # bcrypt (htpasswd -nBC 10 "" | tr -d ':\\n')

Keys roofwatch does not implement (``cipher_suites``, ``curve_preferences``, ``http2``, ...)
are refused by name rather than silently ignored: a security setting that does nothing is worse
than an error.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import re
import ssl
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import bcrypt
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from agent.context.file_input import FileInputError, read_text_file
from agent.context.yaml_input import YamlInputError, load_yaml

ClientAuth = Literal["NoClientCert", "RequestClientCert", "RequireAnyClientCert", "VerifyClientCertIfGiven",
                     "RequireAndVerifyClientCert"]
_TLS_VERSIONS = {"TLS10": ssl.TLSVersion.TLSv1, "TLS11": ssl.TLSVersion.TLSv1_1, "TLS12": ssl.TLSVersion.TLSv1_2,
                 "TLS13": ssl.TLSVersion.TLSv1_3}
_VERIFY = {"NoClientCert": ssl.CERT_NONE, "RequestClientCert": ssl.CERT_OPTIONAL,
           "RequireAnyClientCert": ssl.CERT_REQUIRED, "VerifyClientCertIfGiven": ssl.CERT_OPTIONAL,
           "RequireAndVerifyClientCert": ssl.CERT_REQUIRED}
"""Python verifies any client certificate it asks for, so the two "any" modes (which in Go accept
an unverified certificate) verify too, against client_ca_file: stricter, never looser."""
REALM = "roofwatch"
MAX_PASSWORD_BYTES = 72
"""bcrypt reads at most 72 bytes; a longer password is refused (401), as exporter-toolkit does."""
UNAUTHENTICATED_PATHS = frozenset({"/healthz", "/readyz"})
"""Liveness and readiness probes cannot carry a password; /healthz and /readyz say only whether the collector
runs, how many GPUs are up, and which source the agent waits for and why (URLs without credentials)."""


class WebConfigError(ValueError):
    """The web config cannot be used; the message names the file and the field."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class TlsServerConfig(_Strict):
    cert_file: str = Field(min_length=1)
    key_file: str = Field(min_length=1)
    client_auth_type: ClientAuth = "NoClientCert"
    client_ca_file: str | None = None
    min_version: Literal["TLS10", "TLS11", "TLS12", "TLS13"] = "TLS12"
    max_version: Literal["TLS10", "TLS11", "TLS12", "TLS13"] = "TLS13"


_TOKEN = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
"""An HTTP field name (RFC 9110 5.1): a token, nothing else."""
RESERVED_HEADERS = frozenset({
    # framing and hop-by-hop: a second Content-Length or a Transfer-Encoding breaks every answer
    "content-length", "transfer-encoding", "connection", "keep-alive", "proxy-connection", "te", "trailer",
    "upgrade",
    # set by the agent per answer: a fixed value would break content negotiation, gzip or auth
    "content-type", "content-encoding", "www-authenticate", "date", "server", "retry-after", "allow",
})
"""Header names the web config may not set: they would change how an answer is framed or read."""


class HttpServerConfig(_Strict):
    headers: dict[str, str] = Field(default_factory=dict)

    @field_validator("headers")
    @classmethod
    def _safe_headers(cls, headers: dict[str, str]) -> dict[str, str]:
        for name, value in headers.items():
            if any(c in name + value for c in "\r\n") or not name.strip():
                raise ValueError(f"header {name!r}: names and values must be one line")
            if not _TOKEN.fullmatch(name):
                raise ValueError(f"header {name!r}: not a valid header name (letters, digits and !#$%&'*+-.^_`|~)")
            if name.lower() in RESERVED_HEADERS:
                raise ValueError(f"header {name!r}: set by the agent itself (framing, hop-by-hop or negotiated); "
                                 "it cannot be configured")
            if any(ord(c) < 0x20 and c != "\t" or ord(c) == 0x7F for c in value):
                raise ValueError(f"header {name!r}: the value holds a control character")
        return headers


MIN_BCRYPT_COST = 4
"""bcrypt's own minimum (its libraries refuse less)."""
MAX_BCRYPT_COST = 14
"""The highest cost accepted. Each step doubles a check: 10 takes about 70 ms on a current core, 12
about 0.3 s, 14 about 1.1 s (exporter-toolkit's docs and ``htpasswd -B`` users pick 10 to 12). Past
14 a first scrape, or a wrong password on one of the 4 worker threads, takes seconds, and cost 31
(accepted before) takes more than a day: the agent, checking each hash as it loaded, never started."""


_REHASH = "make the hash again with a cost of 10 to 12 (htpasswd -nBC 10)"


def bcrypt_cost(hashed: str) -> int | None:
    """The cost of a ``$2?$NN$...`` hash (two ASCII digits), or None when it has none."""
    digits = hashed[4:6]
    return int(digits) if len(hashed) > 6 and hashed[6] == "$" and digits.isascii() and digits.isdigit() else None


def with_cost(hashed: str, cost: int) -> str:
    """``hashed`` with its cost field replaced: the same salt, checked at another cost."""
    return f"{hashed[:4]}{cost:02d}{hashed[6:]}"


def _check_time(cost: int) -> str:
    seconds = 0.07 * 2.0 ** (cost - 10)  # about 70 ms at cost 10 on a current core
    if seconds < 7200:
        return f"about {seconds:.0f} s"
    return f"about {seconds / 3600:.0f} hours" if seconds < 3 * 86400 else f"about {seconds / 86400:.0f} days"


class WebConfigFile(_Strict):
    tls_server_config: TlsServerConfig | None = None
    http_server_config: HttpServerConfig = Field(default_factory=HttpServerConfig)
    basic_auth_users: dict[str, str] = Field(default_factory=dict)

    @field_validator("basic_auth_users")
    @classmethod
    def _bcrypt_hashes(cls, users: dict[str, str]) -> dict[str, str]:
        for user, hashed in users.items():
            if ":" in user or not user:
                raise ValueError(f"user {user!r}: a user name must be non-empty and hold no ':'")
            if not hashed.startswith(("$2a$", "$2b$", "$2y$")) or len(hashed) != 60:
                raise ValueError(f"user {user!r}: expected a bcrypt hash ($2y$..., 60 characters), not a password")
            cost = bcrypt_cost(hashed)
            if cost is None:
                raise ValueError(f"user {user!r}: not a valid bcrypt hash (the cost is not two digits)")
            if cost < MIN_BCRYPT_COST:
                raise ValueError(f"user {user!r}: bcrypt cost {cost} is below {MIN_BCRYPT_COST}, bcrypt's minimum; "
                                 f"{_REHASH}")
            if cost > MAX_BCRYPT_COST:  # before any bcrypt work: cost 31 is a day and more per check
                raise ValueError(f"user {user!r}: bcrypt cost {cost} is above {MAX_BCRYPT_COST}, the most roofwatch "
                                 f"accepts (every step doubles a check: {cost} would take {_check_time(cost)}); "
                                 f"{_REHASH}")
            try:  # a bad salt passes the shape check and fails every login: refuse it now, at the least cost
                bcrypt.checkpw(b"roofwatch-config-check", with_cost(hashed, MIN_BCRYPT_COST).encode("ascii"))
            except (ValueError, UnicodeEncodeError):
                raise ValueError(f"user {user!r}: not a valid bcrypt hash (bad salt)") from None
        return users


_DUMMY_HASH = bcrypt.hashpw(b"roofwatch-dummy", bcrypt.gensalt(rounds=MIN_BCRYPT_COST)).decode()
"""A valid salt for the dummy check; its cost field is set per web config (:class:`BasicAuth`)."""


class BasicAuth:
    """Checks ``Authorization: Basic`` against bcrypt hashes, remembering what already passed.

    bcrypt costs tens of milliseconds by design; Prometheus sends the same credentials every
    scrape, so a verified (user, password) is remembered by its SHA-256 and later scrapes cost a
    hash. An unknown user is checked against a dummy hash at the highest cost among the users (a
    cost-4 dummy beside cost-10 hashes told names apart by a 70 ms difference), so timing does not
    reveal which names exist; the dummy never costs more than ``MAX_BCRYPT_COST``, and the users'
    costs were bounded when the file was loaded. Failures are never remembered, so a changed
    password cannot pass from cache.
    """

    def __init__(self, users: dict[str, str]) -> None:
        self._users = {user: hashed.encode() for user, hashed in users.items()}
        # The dummy costs what the dearest real user costs (within the bounds the file was checked
        # against), so a failure for an unknown name takes as long as one for a known name.
        costs = [c for c in map(bcrypt_cost, users.values()) if c is not None]
        self._dummy = with_cost(_DUMMY_HASH, min(max([MIN_BCRYPT_COST, *costs]), MAX_BCRYPT_COST)).encode()
        self._passed: set[bytes] = set()
        self._lock = threading.Lock()

    @property
    def enabled(self) -> bool:
        return bool(self._users)

    @property
    def users(self) -> list[str]:
        return list(self._users)

    def quick_verdict(self, header: str | None) -> bool | None:
        """The verdict when it costs no bcrypt: True for remembered credentials, False for none or
        unreadable ones; None when a bcrypt check must decide (call :meth:`allows` off the event loop)."""
        if not self._users:
            return True
        credentials = _decode_basic(header)
        if credentials is None:
            return False
        with self._lock:
            return True if _remembered_key(*credentials) in self._passed else None

    def allows(self, header: str | None) -> bool:
        if not self._users:
            return True
        credentials = _decode_basic(header)
        if credentials is None:
            return False
        user, password = credentials
        secret = password.encode()
        digest = _remembered_key(user, password)
        with self._lock:
            if digest in self._passed:
                return True
        hashed = self._users.get(user)
        if len(secret) > MAX_PASSWORD_BYTES:  # bcrypt 5 raises past 72 bytes; Go's bcrypt refuses them too
            bcrypt.checkpw(secret[:MAX_PASSWORD_BYTES], self._dummy)  # the same time as any failure
            return False
        ok = bcrypt.checkpw(secret, hashed if hashed is not None else self._dummy) and hashed is not None
        if ok:
            with self._lock:
                if len(self._passed) < 1024:  # a handful of scrapers; bound it regardless
                    self._passed.add(digest)
        return ok


def _remembered_key(user: str, password: str) -> bytes:
    """What a passed check is remembered by: a digest, so the passwords themselves are never kept."""
    return hashlib.sha256(user.encode() + b"\0" + password.encode()).digest()


def _decode_basic(header: str | None) -> tuple[str, str] | None:
    if not header or not header[:6].lower() == "basic ":
        return None
    try:  # non-ASCII text is a ValueError of its own, not a binascii.Error
        text = base64.b64decode(header[6:].strip(), validate=True).decode("utf-8")
    except (binascii.Error, ValueError):
        return None
    user, sep, password = text.partition(":")
    return (user, password) if sep else None


@dataclass(frozen=True)
class Posture:
    """What a web config promises a client, for comparing two of them at reload."""

    tls: bool = False
    client_auth: str = "NoClientCert"
    users: frozenset[str] = frozenset()
    headers: tuple[tuple[str, str], ...] = ()
    certificate: str | None = None
    """SHA-256 of the certificate file's bytes: a rotation is a change worth a log line."""

    def weakened_by(self, new: Posture) -> list[str]:
        """What ``new`` would give up against this one: auth, TLS, the client-certificate check."""
        lost = []
        if self.users and not new.users:
            lost.append("basic auth")
        if self.tls and not new.tls:
            lost.append("TLS")
        elif self.tls and _CLIENT_AUTH_RANK[new.client_auth] < _CLIENT_AUTH_RANK[self.client_auth]:
            lost.append(f"client certificates ({self.client_auth} -> {new.client_auth})")
        return lost

    def changes_to(self, new: Posture) -> list[str]:
        """Each security-relevant difference, one short phrase each (user names, never hashes)."""
        out = []
        if self.tls != new.tls:
            out.append(f"TLS {'on' if new.tls else 'off'}")
        elif new.tls and self.certificate != new.certificate:
            out.append("TLS certificate replaced")
        if self.client_auth != new.client_auth:
            out.append(f"client_auth_type {self.client_auth} -> {new.client_auth}")
        if added := sorted(new.users - self.users):
            out.append("basic auth users added: " + ", ".join(added))
        if removed := sorted(self.users - new.users):
            out.append("basic auth users removed: " + ", ".join(removed))
        if self.headers != new.headers:
            out.append("response headers changed")
        return out


_CLIENT_AUTH_RANK = {"NoClientCert": 0, "RequestClientCert": 1, "VerifyClientCertIfGiven": 2,
                     "RequireAnyClientCert": 3, "RequireAndVerifyClientCert": 4}


class WebConfig:
    """What the HTTP server needs: an SSL context (or None), the auth check and extra headers."""

    def __init__(self, tls: ssl.SSLContext | None, auth: BasicAuth, headers: dict[str, str],
                 posture: Posture | None = None) -> None:
        self.tls = tls
        self.auth = auth
        self.headers = headers
        self.posture = posture or Posture(tls=tls is not None, users=frozenset(auth.users),
                                          headers=tuple(sorted(headers.items())))

    @staticmethod
    def none() -> WebConfig:
        return WebConfig(None, BasicAuth({}), {})


def load_web_config(path: str | Path) -> WebConfig:
    """Read and check the file, load the certificates; :class:`WebConfigError` names what is wrong."""
    path = Path(path)
    try:  # a regular file of at most a MiB (never /dev/zero, never a FIFO's blocking open), YAML within its budget
        data = load_yaml(read_text_file(path, str(path), "web config"), str(path))
    except (FileInputError, YamlInputError) as exc:
        raise WebConfigError(str(exc)) from None
    if data is None:  # an empty file is a file being written (`> web.yml`, a Secret mid-update), not a choice
        raise WebConfigError(f"{path}: the file is empty; write {{}} for a web config without TLS or basic auth")
    if not isinstance(data, dict):
        raise WebConfigError(f"{path}: expected a mapping of tls_server_config, http_server_config, basic_auth_users")
    try:
        parsed = WebConfigFile.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        message = first["msg"].removeprefix("Value error, ")
        if first["type"] == "extra_forbidden":
            message = "not supported by roofwatch (see docs/security.md)"
        raise WebConfigError(f"{path}: {where}: {message}") from None
    tls = _ssl_context(path, parsed.tls_server_config, path.parent) if parsed.tls_server_config else None
    headers = dict(parsed.http_server_config.headers)
    tls_config = parsed.tls_server_config
    posture = Posture(tls=tls is not None, client_auth=tls_config.client_auth_type if tls_config else "NoClientCert",
                      users=frozenset(parsed.basic_auth_users), headers=tuple(sorted(headers.items())),
                      certificate=_fingerprint(path.parent, tls_config.cert_file) if tls_config else None)
    return WebConfig(tls, BasicAuth(parsed.basic_auth_users), headers, posture)


def _fingerprint(base: Path, name: str) -> str | None:
    try:
        return hashlib.sha256((Path(name) if Path(name).is_absolute() else base / name).read_bytes()).hexdigest()
    except OSError:
        return None


def _ssl_context(source: Path, config: TlsServerConfig, base: Path) -> ssl.SSLContext:
    """A server context as configured; relative files are relative to the web config, as in
    exporter-toolkit."""
    def resolve(name: str) -> str:
        return str(Path(name) if Path(name).is_absolute() else base / name)

    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = _TLS_VERSIONS[config.min_version]
    context.maximum_version = _TLS_VERSIONS[config.max_version]
    if context.minimum_version > context.maximum_version:
        raise WebConfigError(f"{source}: tls_server_config.min_version: {config.min_version} is above max_version {config.max_version}")
    try:
        context.load_cert_chain(resolve(config.cert_file), resolve(config.key_file))
    except (OSError, ssl.SSLError) as exc:
        raise WebConfigError(f"{source}: tls_server_config.cert_file/key_file: cannot load "
                             f"{config.cert_file} and {config.key_file}: {getattr(exc, 'strerror', None) or exc}") from None
    context.verify_mode = _VERIFY[config.client_auth_type]
    if context.verify_mode != ssl.CERT_NONE:
        if not config.client_ca_file:
            raise WebConfigError(f"{source}: tls_server_config.client_ca_file: required for client_auth_type "
                                 f"{config.client_auth_type}")
        try:
            context.load_verify_locations(resolve(config.client_ca_file))
        except (OSError, ssl.SSLError) as exc:
            raise WebConfigError(f"{source}: tls_server_config.client_ca_file: cannot load {config.client_ca_file}: "
                                 f"{getattr(exc, 'strerror', None) or exc}") from None
    return context


def web_config_or_none(path: str | None) -> WebConfig:
    """The web config a ``web_config_file`` setting names, or plain HTTP without auth when unset.
    Used at start and on SIGHUP alike; :class:`WebConfigError` names what is wrong."""
    return load_web_config(path) if path else WebConfig.none()
