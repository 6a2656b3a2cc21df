"""vLLM V1 ``/metrics`` bodies made for a scrape, honest and hostile: label bombs, overflowing latencies,
counters that go backwards. Served over real HTTP by tests/inference_server.py (``Server.gen(recipe)``),
and parsed in process by the quick tests, so both read the same bytes.

Family by family, as vLLM prints them. Scrape ``n`` (from 1) has run ``n`` scrapes' worth of work: every
engine has 4 requests running and 1 waiting, and each scrape adds 1000 prompt and 400 generated tokens and
400 inter-token latencies of 20 ms, so each honest engine's time per output token is 0.02 s.

Recipes (``recipe`` argument):

- ``honest-<engines>``: ``<engines>`` engines of one model, ``llama``;
- ``bomb-<label>-<n>``: a label bomb, ``<n>`` distinct values of ``model_name`` or ``engine`` over the
  gauges and token counters: 10,000 values make 3.95 MB, under the scraper's 4 MiB body cap;
- ``overflow-<bad>-<engines>``: engines 1..``<bad>`` report a latency sum of 1e308 and 1e308 running requests;
- ``padded-<n>``: one honest engine and ``<n>`` bucket lines of a family the agent does not keep, for a body
  as large as a bomb without one (52,000 lines: 3.9 MB);
- ``longnames-<chars>-<count>``: ``<count>`` models, each named by ``<chars>`` characters (:func:`long_names`);
- ``backwards``: one engine whose counters are lower at every scrape than at the one before;
- ``advance-<stem>``: the fixture pair ``tests/fixtures/inference/<stem>-{1,2}.prom`` carried on, scrape ``n``
  holding every sample at its value in ``-1`` plus ``n - 1`` times its step to ``-2`` (:func:`advance`), so a
  real agent reading a server for as long as it likes sees its counters move at the fixtures' rates.
"""

from __future__ import annotations

TPOT_S = 0.02
"""Each honest engine's time per output token: 8 s of latency over 400 tokens per scrape."""
RUNNING = 4.0
"""Requests each engine has running."""
MODEL = "llama"

_FAMILIES = (  # name, value at scrape n, value of a broken engine (None: as an honest one)
    ("vllm:num_requests_running", lambda n: RUNNING, 1e308),
    ("vllm:num_requests_waiting", lambda n: 1.0, None),
    ("vllm:kv_cache_usage_perc", lambda n: 0.25, None),
    ("vllm:prompt_tokens_total", lambda n: 1000.0 * n, None),
    ("vllm:generation_tokens_total", lambda n: 400.0 * n, None),
    ("vllm:inter_token_latency_seconds_sum", lambda n: 400 * TPOT_S * n, 1e308),
    ("vllm:inter_token_latency_seconds_count", lambda n: 400.0 * n, None),
)


def replica(engine: object, model: str = MODEL) -> str:
    """The labels of one engine's series."""
    return f'engine="{engine}",model_name="{model}"'


def body(n: int, replicas: list[str], bad: tuple[str, ...] = (), families: int = len(_FAMILIES)) -> str:
    """Scrape ``n`` of the engines ``replicas`` (label texts), the first ``families`` families; ``bad`` engines
    report the broken values."""
    lines = []
    for name, value, broken in _FAMILIES[:families]:
        for labels in replicas:
            shown = broken if broken is not None and labels in bad else value(n)
            lines.append(f"{name}{{{labels}}} {shown!r}")
    return "\n".join(lines) + "\n"


def bomb_values(label: str, count: int) -> list[str]:
    """The distinct values a ``bomb-<label>-<count>`` body gives ``label``, in the order it prints them."""
    return [f"m{v:05d}-{'x' * (16 if label == 'model_name' else 12)}" for v in range(count)]


def long_names(chars: int, count: int) -> list[str]:
    """The model names of a ``longnames-<chars>-<count>`` body: distinct from their first character on."""
    return [f"{i:02d}-" + "Qwen-通义千问-" * (chars // 12) for i in range(count)]


def generated(recipe: str, n: int) -> str:
    """The body ``recipe`` serves at scrape ``n`` (from 1)."""
    kind, _, rest = recipe.partition("-")
    if kind == "honest":
        return body(n, [replica(e) for e in range(int(rest))])
    if kind == "bomb":
        label, count = rest.rsplit("-", 1)
        values = bomb_values(label, int(count))
        replicas = [replica(0, v) for v in values] if label == "model_name" else [replica(v) for v in values]
        return body(n, replicas, families=5)
    if kind == "overflow":
        bad, engines = map(int, rest.split("-"))
        replicas = [replica(e) for e in range(engines)]
        return body(n, replicas, bad=tuple(replicas[1:bad + 1]))
    if kind == "padded":
        buckets = "".join(f'vllm:request_params_n_bucket{{{replica(0)},le="{b}.0"}} {n}\n' for b in range(int(rest)))
        return body(n, [replica(0)]) + buckets
    if kind == "longnames":
        chars, count = map(int, rest.split("-"))
        return body(n, [replica(0, name) for name in long_names(chars, count)], families=1)
    if kind == "backwards":
        return body(1_000_000 - n, [replica(0)])
    if kind == "advance":
        return advance(rest, n)
    raise ValueError(f"unknown recipe {recipe!r}")


def advance(stem: str, n: int) -> str:
    """Scrape ``n`` (from 1) of the fixture pair ``<stem>-{1,2}.prom``: each sample line of ``-1`` with its
    value moved ``n - 1`` steps of its change to ``-2`` (the pair's gauges hold, so they stay put); every
    other line as it is. The two files have the same lines in the same order."""
    from pathlib import Path

    fixtures = Path(__file__).parent / "fixtures" / "inference"
    first = (fixtures / f"{stem}-1.prom").read_text().splitlines()
    second = (fixtures / f"{stem}-2.prom").read_text().splitlines()
    assert len(first) == len(second), f"{stem}: the pair must have the same lines"
    out = []
    for a, b in zip(first, second):
        head, _, value = a.rpartition(" ")
        if a.startswith("#") or not head or b.rpartition(" ")[0] != head:
            out.append(a)
            continue
        v1, v2 = float(value), float(b.rpartition(" ")[2])
        out.append(f"{head} {v1 + (n - 1) * (v2 - v1)!r}")
    return "\n".join(out) + "\n"
