"""The credentials the settings hold, remembered as they load so that no message of the process shows them.

Why here and not at each message: a credential reaches the agent from many places (an OTLP header value in
the settings file, ``ROOFWATCH_OTLP_HEADERS`` or ``OTEL_EXPORTER_OTLP_HEADERS``, the report token or its
file, a ``user:password@`` or a ``?token=`` in any URL setting), and a message can quote it from places no
one thought of (a server echoing a header back, an exception naming a URL). So the settings name every
credential once, here; :mod:`agent.model.redact` remembers them, and the log formatter, the errors on
stderr and ``roofwatch doctor`` hide them wherever they appear.
"""

from __future__ import annotations

import os
from typing import Any, Iterable, Mapping
from urllib.parse import unquote

from agent.model.redact import remember, url_secrets

_HEADER_VARIABLES = ("OTEL_EXPORTER_OTLP_HEADERS", "OTEL_EXPORTER_OTLP_METRICS_HEADERS")
_ENDPOINT_VARIABLES = ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT")


def _header_values(text: str) -> Iterable[str]:
    """Every value of a ``name=value,name2=value2`` list, raw and URL-decoded, whatever else is wrong with it
    (a list the settings refuse is still someone's credential, and its error must not show it)."""
    for entry in text.split(","):
        _, sep, value = entry.partition("=")
        if sep and value.strip():
            yield value.strip()
            yield unquote(value).strip()


def secrets_of(settings: Any, environ: Mapping[str, str] | None = None) -> set[str]:
    """Every credential ``settings`` (and the OTLP variables of ``environ``) hold."""
    environ = os.environ if environ is None else environ
    found: set[str] = set()
    for value in (getattr(settings, "otlp_headers", None) or {}).values():
        found.add(str(value).strip())
    for name in _HEADER_VARIABLES:
        found.update(_header_values(environ.get(name, "")))
    token = getattr(settings, "report_token", None)
    if token:
        found.add(token)
    try:
        token = settings.read_report_token() if getattr(settings, "report_token_file", None) else None
    except Exception:  # noqa: BLE001 - an unreadable token file is reported where it is read, not here
        token = None
    if token:
        found.add(token)
    urls = [getattr(settings, name, None) for name in ("dcgm_exporter_url", "amd_exporter_url", "otlp_endpoint")]
    urls += [environ.get(name) for name in _ENDPOINT_VARIABLES]
    urls += [getattr(endpoint, "url", None) for endpoint in getattr(settings, "inference_endpoints", None) or ()]
    for url in urls:
        if url:
            found.update(url_secrets(url))
    return {s for s in found if s}


def remember_secrets(settings: Any, environ: Mapping[str, str] | None = None) -> None:
    """Hide every credential of ``settings`` in this process's messages from now on."""
    remember(secrets_of(settings, environ))
