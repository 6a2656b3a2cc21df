"""TLS, mTLS and basic auth on the agent's HTTP port (exporter-toolkit web config), end to end.

A real agent process, real certificates made with openssl, real TLS clients and a real
Prometheus scraping through TLS and basic auth.
"""

from __future__ import annotations

import base64
import json
import ssl
import subprocess
import urllib.error
import urllib.request
from pathlib import Path

import bcrypt
import pytest

from tests.agent_process import AgentProcess, clean_env, poll, roofwatch_cmd
from tests.prometheus_server import PrometheusServer

pytestmark = pytest.mark.slow

PASSWORD = "s3cret:with:colons ü"


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


@pytest.fixture(scope="module")
def pki(tmp_path_factory) -> Path:
    """A CA, a server certificate for 127.0.0.1 and a client certificate, all signed by the CA."""
    d = tmp_path_factory.mktemp("pki")
    ec = ("-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes")
    _openssl("req", "-x509", *ec, "-keyout", "ca.key", "-out", "ca.crt", "-subj", "/CN=roofwatch test CA", "-days", "2", cwd=d)
    (d / "server.ext").write_text("subjectAltName=IP:127.0.0.1\nextendedKeyUsage=serverAuth\n")
    (d / "client.ext").write_text("extendedKeyUsage=clientAuth\n")
    for name in ("server", "client"):
        _openssl("req", *ec, "-keyout", f"{name}.key", "-out", f"{name}.csr", "-subj", f"/CN={name}", cwd=d)
        _openssl("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.crt", "-CAkey", "ca.key", "-CAcreateserial",
                 "-out", f"{name}.crt", "-days", "2", "-extfile", f"{name}.ext", cwd=d)
    return d


def _web_config(pki: Path, name: str, **tls: str) -> Path:
    hashed = bcrypt.hashpw(PASSWORD.encode(), bcrypt.gensalt(rounds=4)).decode().replace("$2b$", "$2y$", 1)
    config = {"tls_server_config": {"cert_file": "server.crt", "key_file": "server.key", **tls},
              "http_server_config": {"headers": {"X-Frame-Options": "deny"}},
              "basic_auth_users": {"prometheus": hashed}}
    path = pki / name
    path.write_text(json.dumps(config))  # JSON is YAML
    return path


def _client(pki: Path, *, cert: bool = False) -> ssl.SSLContext:
    context = ssl.create_default_context(cafile=str(pki / "ca.crt"))
    if cert:
        context.load_cert_chain(str(pki / "client.crt"), str(pki / "client.key"))
    return context


def _get(url: str, context: ssl.SSLContext, user: str | None = None, password: str | None = None):
    request = urllib.request.Request(url)
    if user is not None:
        token = base64.b64encode(f"{user}:{password}".encode()).decode()
        request.add_header("Authorization", f"Basic {token}")
    try:
        with urllib.request.urlopen(request, timeout=10, context=context) as response:
            return response.status, dict(response.headers), response.read()
    except urllib.error.HTTPError as err:
        return err.code, dict(err.headers), err.read()


@pytest.fixture(scope="module")
def tls_agent(pki):
    agent = AgentProcess("demo", "--listen", "127.0.0.1:0", "--web-config-file", str(_web_config(pki, "web.yml")))
    try:
        yield agent
    finally:
        agent.kill()


def test_metrics_need_the_right_password_over_tls(tls_agent, pki):
    assert tls_agent.url.startswith("https://127.0.0.1:")
    context = _client(pki)
    url = tls_agent.url + "metrics"
    poll(lambda: _get(tls_agent.url + "healthz", context)[0] == 200, 20, what="/healthz over TLS, no password")
    status, headers, _ = _get(url, context)
    assert status == 401 and headers["WWW-Authenticate"].startswith('Basic realm="roofwatch"')
    assert _get(url, context, "prometheus", "wrong")[0] == 401
    assert _get(url, context, "nobody", PASSWORD)[0] == 401
    status, headers, body = _get(url, context, "prometheus", PASSWORD)
    assert status == 200 and b"roofwatch_gpu_up{" in body and headers["X-Frame-Options"] == "deny"
    for path in ("", "api/v1/snapshot"):  # every page but the probe needs the password
        assert _get(tls_agent.url + path, context)[0] == 401
        assert _get(tls_agent.url + path, context, "prometheus", PASSWORD)[0] == 200


def test_plain_http_to_the_tls_port_is_refused_and_serving_goes_on(tls_agent, pki):
    plain = tls_agent.url.replace("https://", "http://") + "metrics"
    with pytest.raises((urllib.error.URLError, ConnectionError, OSError)):
        urllib.request.urlopen(plain, timeout=5).read()
    untrusted = ssl.create_default_context()  # the system CAs do not know ours
    with pytest.raises(urllib.error.URLError):
        urllib.request.urlopen(tls_agent.url + "healthz", timeout=5, context=untrusted)
    assert _get(tls_agent.url + "metrics", _client(pki), "prometheus", PASSWORD)[0] == 200


def test_mutual_tls_requires_a_client_certificate_from_the_ca(pki):
    config = _web_config(pki, "mtls.yml", client_auth_type="RequireAndVerifyClientCert", client_ca_file="ca.crt")
    agent = AgentProcess("demo", "--listen", "127.0.0.1:0", "--web-config-file", str(config))
    try:
        with_cert = _client(pki, cert=True)
        poll(lambda: _get(agent.url + "healthz", with_cert)[0] == 200, 20, what="/healthz with a client certificate")
        with pytest.raises((urllib.error.URLError, ssl.SSLError, ConnectionError)):
            _get(agent.url + "healthz", _client(pki))  # no certificate: the handshake fails
        assert _get(agent.url + "metrics", with_cert, "prometheus", PASSWORD)[0] == 200
    finally:
        agent.kill()


def test_prometheus_scrapes_through_tls_and_basic_auth(tls_agent, pki, tmp_path):
    target = tls_agent.url.removeprefix("https://").rstrip("/")
    tls = {"ca_file": str(pki / "ca.crt")}
    (tmp_path / "good").mkdir()
    (tmp_path / "bad").mkdir()
    good = PrometheusServer(tmp_path / "good", [target], job_options={
        "scheme": "https", "tls_config": tls, "basic_auth": {"username": "prometheus", "password": PASSWORD}})
    try:
        poll(lambda: good.query('count(roofwatch_gpu_up{job="roofwatch"})'), 30, what="GPU series scraped over TLS")
        assert good.query('up{job="roofwatch"}')[0]["value"][1] == "1"
    finally:
        good.stop()
    bad = PrometheusServer(tmp_path / "bad", [target], job_options={
        "scheme": "https", "tls_config": tls, "basic_auth": {"username": "prometheus", "password": "wrong"}})
    try:
        poll(lambda: bad.query('up{job="roofwatch"} == 0'), 30, what="the scrape with a wrong password failing")
        assert not bad.query("roofwatch_gpu_up")
    finally:
        bad.stop()


@pytest.mark.parametrize(("config", "message"), [
    ({"basic_auth_users": {"prometheus": "plaintext"}}, "basic_auth_users: user 'prometheus'"),
    ({"basic_auth_users": {"prometheus": "plaintext"}}, "expected a bcrypt hash"),
    ({"tls_server_config": {"cert_file": "server.crt", "key_file": "server.key", "cipher_suites": ["X"]}},
     "tls_server_config.cipher_suites: not supported by roofwatch"),
    ({"tls_server_config": {"cert_file": "missing.crt", "key_file": "server.key"}}, "tls_server_config.cert_file/key_file"),
    ({"tls_server_config": {"cert_file": "server.crt", "key_file": "server.key",
                            "client_auth_type": "RequireAndVerifyClientCert"}}, "client_ca_file: required"),
    ({"tls_server_config": {"cert_file": "server.crt", "key_file": "server.key", "min_version": "TLS13",
                            "max_version": "TLS12"}}, "min_version: TLS13 is above max_version TLS12"),
    ({"http_server_config": {"headers": {"X-Evil": "a\r\nSet-Cookie: x"}}}, "one line"),
    ({"tls_server_config": {"key_file": "server.key"}}, "tls_server_config.cert_file: Field required"),
    ({"basic_auth_users": {"prometheus": "$2y$10$" + "!" * 53}}, "user 'prometheus': not a valid bcrypt hash"),
    ({"http_server_config": {"headers": {"Content-Length": "0"}}}, "header 'Content-Length': set by the agent itself"),
    ({"http_server_config": {"headers": {"transfer-encoding": "chunked"}}}, "header 'transfer-encoding': set by the agent"),
    ({"http_server_config": {"headers": {"Connection": "close"}}}, "header 'Connection': set by the agent itself"),
    ({"http_server_config": {"headers": {"X Frame": "deny"}}}, "header 'X Frame': not a valid header name"),
])
def test_a_bad_web_config_is_a_usage_error_naming_the_field(pki, config, message):
    path = pki / "bad.yml"
    path.write_text(json.dumps(config))
    result = subprocess.run(roofwatch_cmd("demo", "--listen", "127.0.0.1:0", "--web-config-file", str(path)),
                            capture_output=True, text=True, timeout=60, env=clean_env())
    assert result.returncode == 2 and "web_config_file:" in result.stderr and message in result.stderr, result.stderr
    assert "Traceback" not in result.stderr
