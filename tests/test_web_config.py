"""Basic-auth checks of the web config: right answers, cached successes, no cached failures."""

from __future__ import annotations

import base64

import bcrypt
import pytest

from exporters import web_config
from exporters.web_config import BasicAuth

HASH = bcrypt.hashpw(b"pw", bcrypt.gensalt(rounds=4)).decode()


def header(user: str, password: str) -> str:
    return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()


@pytest.fixture
def checks(monkeypatch):
    calls = []
    real = bcrypt.checkpw

    def counted(password, hashed):
        calls.append(password)
        return real(password, hashed)

    monkeypatch.setattr(web_config.bcrypt, "checkpw", counted)
    return calls


def test_right_and_wrong_credentials(checks):
    auth = BasicAuth({"prom": HASH})
    assert auth.enabled and auth.allows(header("prom", "pw"))
    for bad in (None, "", "Bearer x", "Basic !!!", "Basic " + base64.b64encode(b"no-colon").decode(),
                header("prom", "wrong"), header("other", "pw"), "Basic " + base64.b64encode(b"\xff:\xfe").decode()):
        assert not auth.allows(bad), bad
    assert BasicAuth({}).allows(None) and not BasicAuth({}).enabled


def test_success_is_remembered_failure_is_not(checks):
    auth = BasicAuth({"prom": HASH})
    assert auth.allows(header("prom", "pw")) and auth.allows(header("prom", "pw"))
    assert len(checks) == 1, "the second scrape costs a SHA-256, not a bcrypt"
    assert not auth.allows(header("prom", "nope")) and not auth.allows(header("prom", "nope"))
    assert len(checks) == 3, "every failed attempt pays the full bcrypt"


def test_unknown_users_cost_a_bcrypt_too(checks):
    auth = BasicAuth({"prom": HASH})
    assert not auth.allows(header("intruder", "pw"))
    assert len(checks) == 1, "an unknown name is checked against a dummy hash: timing does not tell names apart"


def test_an_empty_web_config_is_an_error_and_an_empty_mapping_is_plain_http(tmp_path):
    path = tmp_path / "web.yml"
    for text in ("", "\n", "# only a comment\n"):
        path.write_text(text)
        with pytest.raises(web_config.WebConfigError, match="empty"):
            web_config.load_web_config(path)
    path.write_text("{}\n")
    plain = web_config.load_web_config(path)
    assert plain.tls is None and not plain.auth.enabled


def test_a_posture_names_what_a_new_one_gives_up_and_what_changed():
    Posture = web_config.Posture
    strict = Posture(tls=True, client_auth="RequireAndVerifyClientCert", users=frozenset({"prom"}), certificate="a")
    assert strict.weakened_by(Posture()) == ["basic auth", "TLS"]
    assert strict.weakened_by(Posture(tls=True, users=frozenset({"prom"}))) == [
        "client certificates (RequireAndVerifyClientCert -> NoClientCert)"]
    assert strict.weakened_by(Posture(tls=True, client_auth="RequireAndVerifyClientCert", users=frozenset({"x"}))) == []
    rotated = Posture(tls=True, client_auth="RequireAndVerifyClientCert", users=frozenset({"prom", "graf"}),
                      certificate="b")
    assert strict.changes_to(rotated) == ["TLS certificate replaced", "basic auth users added: graf"]
    assert Posture().weakened_by(strict) == [] and strict.changes_to(strict) == []
