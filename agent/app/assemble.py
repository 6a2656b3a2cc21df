"""Wiring the pipeline from settings: open the backend, build the collector with its classifier, attach a recorder.

Shared by the daemon (run, demo) and the one-shot commands that collect (snapshot, record), so
they all read the GPUs exactly as the agent does. The lower layers never read the settings
themselves (docs/architecture.md, layers): the backends get their part as a
:class:`~agent.backends.options.BackendOptions`, the HTTP server its ``/`` page from :func:`status_page`.
"""

from __future__ import annotations

import time

from agent.app.cli_base import DEMO_BACKENDS, CliError
from agent.app.config import Settings


def open_backend_or_fail(settings: Settings, reports=None, *, without_gpu: str | None = None):
    """The configured backend, or a one-line CliError saying what was looked for; ``without_gpu`` replaces
    the closing hint when no GPU is found (``record`` suggests a simulated recording, not ``demo``)."""
    from agent.backends.base import BackendUnavailable
    from agent.backends.options import BackendOptions
    from agent.backends.registry import DEMO_HINT, open_backend

    try:
        return open_backend(BackendOptions.of(settings), reports)
    except BackendUnavailable as exc:
        message = str(exc)
        raise CliError(message.replace(DEMO_HINT, without_gpu) if without_gpu else message) from None


def open_collector(settings: Settings, reports=None):
    """The backend opened and its GPUs discovered; BackendUnavailable when the driver does not answer."""
    from agent.backends.base import BackendUnavailable
    from agent.backends.options import BackendOptions
    from agent.backends.registry import open_backend

    backend = open_backend(BackendOptions.of(settings), reports)
    try:
        return make_collector(settings, backend)
    except CliError as exc:
        raise BackendUnavailable(str(exc)) from None


def make_collector(settings: Settings, backend):
    """A collector over ``backend`` with the live classifier when classification is on (primed on the demo)."""
    from agent.backends.base import BackendUnavailable
    from agent.collector import Backoff, Collector

    analyzer = None
    if settings.classify:
        from agent.classifier.live import LiveClassifier

        # The configured dtype counts as "said"; only the built-in default is flagged as assumed.
        analyzer = LiveClassifier(settings.classifier, dtype=settings.dtype if "dtype" in settings.model_fields_set else None)
    # A virtual agent plays one scenario node; naming it after that node (not this host) keeps
    # several demo agents on one machine apart, as real nodes would be.
    node = settings.node_name
    if "node_name" not in settings.model_fields_set and getattr(backend, "name", "") in (*DEMO_BACKENDS, "dcgm-exporter"):
        node = getattr(backend, "node", None) or node  # dcgm-exporter: its Hostname label, when it has one
    limit = getattr(backend, "limit_devices", None)  # dcgm-exporter: bounds what discovery takes from the exposition
    if limit is not None:
        limit(settings.max_devices)
    # A backend that samples from memory (an exporter's latest exposition) costs nothing to retry: a device is
    # retried every interval, so it is back one interval after its exporter, not after a grown back-off.
    retry_max_s = settings.interval_s if getattr(backend, "reads_from_memory", False) is True else Backoff.max_s
    try:
        collector = Collector(
            backend,
            node=node,
            interval_s=settings.interval_s,
            sample_timeout_s=settings.sample_timeout_s,
            history_len=settings.history_len,
            expected_devices=settings.expected_gpus,
            backoff=Backoff(initial_s=settings.interval_s, max_s=retry_max_s),
            analyzer=analyzer,
            max_holders=settings.max_holders_per_gpu,
            max_devices=settings.max_devices,
        )
    except BackendUnavailable as exc:
        backend.close()
        raise CliError(str(exc)) from None
    warm = getattr(backend, "warm_samples", None)
    if analyzer is not None and warm is not None:  # the virtual demo: verdicts from the first scrape
        head_start = warm(time.time(), analyzer.thresholds.long_window_s / 2, settings.interval_s)
        analyzer.prime(head_start, {d.gpu: d.spec for d in collector.devices})
        collector.prime_holders(head_start)
    return collector


def attach_recorder(collector, path: str, settings: Settings):
    """Append every sample the collector takes to the trace at ``path``; a path that cannot be written is one line."""
    from agent.trace import TraceWriteError
    from agent.trace.recorder import SnapshotRecorder

    try:
        recorder = SnapshotRecorder(path, node=collector.node)
    except TraceWriteError as exc:  # its message already names the trace and the reason
        raise CliError(str(exc)) from None
    except OSError as exc:
        raise CliError(f"cannot write trace {path}: {exc.strerror or exc}") from None
    collector.add_listener(recorder)
    return recorder


def status_page():
    """The ``/`` page for the HTTP server: the view (agent.views.status_page) registered with the server at
    assembly, since the exporters, a layer below the views, do not import it (docs/architecture.md, layers)."""
    from agent.views.status_page import CONTENT_SECURITY_POLICY, DEFAULT_REFRESH_S
    from agent.views.status_page import status_page as render
    from exporters.http.page import HtmlPage

    return HtmlPage(render, CONTENT_SECURITY_POLICY, DEFAULT_REFRESH_S)


def open_otlp(settings: Settings, get_snapshot):
    """The OTLP pusher the settings and ``OTEL_EXPORTER_OTLP_*`` ask for (docs/otlp.md), not started; None when
    OTLP is off. Its families are those ``/metrics`` renders, with the same options; a value it cannot use
    is a usage error naming the setting or variable."""
    from agent.app.cli_base import EXIT_USAGE
    from exporters.otlp import open_pusher
    from exporters.otlp.endpoint import OtlpConfigError, resolve

    try:
        config = resolve(settings)
    except OtlpConfigError as exc:
        raise CliError(str(exc), EXIT_USAGE) from None
    if config is None:
        return None
    options = {"max_processes_per_gpu": settings.max_processes_per_gpu, "gpu_labels": settings.gpu_labels,
               "optional_metrics": settings.optional_metrics}  # the same families /metrics serves
    return open_pusher(config, get_snapshot, family_options=options)
