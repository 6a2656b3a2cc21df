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


def _cost(hashed: bytes | str) -> int:
    text = hashed.decode() if isinstance(hashed, bytes) else hashed
    return int(text.split("$")[2])


@pytest.fixture
def checked_costs(monkeypatch):
    """The bcrypt cost of every hash bcrypt.checkpw is asked to check; a check past the bound fails the
    test at once instead of running (cost 31 would run for more than a day)."""
    costs = []
    real = bcrypt.checkpw

    def recorded(password, hashed):
        costs.append(_cost(hashed))
        assert costs[-1] <= web_config.MAX_BCRYPT_COST, f"bcrypt asked to check at cost {costs[-1]}"
        return real(password, hashed)

    monkeypatch.setattr(web_config.bcrypt, "checkpw", recorded)
    return costs


@pytest.mark.parametrize("cost", [31, 15, 3, 0])
def test_a_cost_outside_4_to_14_is_refused_naming_user_and_cost_before_any_bcrypt_work(tmp_path, checked_costs, cost):
    """Issue 42, finding 10: a cost-31 hash kept the agent from starting (one check takes over a day, and
    loading checked each hash with bcrypt); below 4 bcrypt refuses to check at all."""
    path = tmp_path / "web.yml"
    path.write_text(f"basic_auth_users:\n  prometheus: '{HASH[:4]}{cost:02d}{HASH[6:]}'\n")
    with pytest.raises(web_config.WebConfigError) as info:
        web_config.load_web_config(path)
    message = str(info.value)
    assert "basic_auth_users" in message and "'prometheus'" in message and f"cost {cost} " in message, message
    assert HASH[7:] not in message, "the hash is never echoed"
    assert checked_costs == [], "refused before any bcrypt work"


def test_costs_at_the_bounds_load_and_loading_checks_each_salt_at_the_least_cost(tmp_path, checked_costs):
    path = tmp_path / "web.yml"
    users = {"cheap": HASH, "dear": HASH[:4] + "14" + HASH[6:]}
    path.write_text("basic_auth_users:\n" + "".join(f"  {user}: '{hashed}'\n" for user, hashed in users.items()))
    assert sorted(web_config.load_web_config(path).auth.users) == ["cheap", "dear"]
    assert checked_costs == [4, 4], "a salt is checked at cost 4: loading never pays a user's own cost"


def test_an_unknown_user_costs_what_the_dearest_user_costs_and_never_more_than_the_bound(checked_costs):
    """The dummy check used cost 4 beside cost-10 users: 1 ms against 70 ms told names apart."""
    ten = bcrypt.hashpw(b"pw", bcrypt.gensalt(rounds=10)).decode()
    auth = BasicAuth({"cheap": HASH, "prom": ten})
    assert not auth.allows(header("intruder", "pw"))
    assert not auth.allows(header("intruder", "x" * 100))  # past bcrypt's 72 bytes: the dummy too
    assert not auth.allows(header("prom", "wrong"))
    assert checked_costs == [10, 10, 10], "a failure costs the same whatever the name"
    checked_costs.clear()
    unchecked = BasicAuth({"prom": HASH[:4] + "31" + HASH[6:]})  # never loaded from a file: not bounded there
    assert not unchecked.allows(header("intruder", "pw"))
    assert checked_costs == [web_config.MAX_BCRYPT_COST]


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
