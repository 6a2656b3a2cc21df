"""The virtual node's inference servers, scraped as a real node's are.

When the node a virtual backend plays runs serving jobs, :func:`serve_virtual_endpoints` starts one
fake server per job (agent.virtual.serving.server: vLLM, SGLang or TGI ``/metrics`` over HTTP on
127.0.0.1) and the agent's own :class:`~agent.context.workload.inference.scraper.InferenceScraper`
on them, configured as a user would configure a real server (``gpus``, ``model_bytes``,
``kv_cache_bytes``, ``max_running``, ``params``, ``dtype``, ``job``). The backend then takes those
GPUs' workload reports from the scraper, so serving figures reach the classifier through HTTP,
text parsing and counter rates, exactly as on a real node. The backend's ``close`` stops both.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from agent.backends.virtual_serving_warm import WarmFetch, warm_scrapes
from agent.context.workload.inference.endpoint import InferenceEndpoint
from agent.context.workload.inference.scraper import InferenceScraper
from agent.virtual.backend import VirtualBackend
from agent.virtual.serving.job import ServingJob
from agent.virtual.serving.server import FakeInferenceServer

if TYPE_CHECKING:
    from agent.backends.options import BackendOptions


def endpoint_for(job: ServingJob, url: str) -> InferenceEndpoint:
    """The ``inference_endpoints`` entry a user would write for this server (kind detected, as with ``auto``)."""
    return InferenceEndpoint(url=url, kind="auto", gpus=list(job.gpus), model_bytes=job.weight_bytes,
                             kv_cache_bytes=job.kv_pool_bytes, max_running=job.max_running, params=job.params,
                             dtype=job.dtype, job=job.name,  # type: ignore[arg-type]
                             model=job.model if job.server == "tgi" else None)  # TGI exports no model name


def serve_virtual_endpoints(backend: VirtualBackend, settings: BackendOptions) -> list[FakeInferenceServer]:
    """Start the fake servers of ``backend``'s node and scrape them into its workload reports; [] when it serves nothing."""
    jobs = backend.engine.serving_jobs(backend.node)
    if not jobs:
        return []
    servers: list[FakeInferenceServer] = []
    try:
        for job in jobs:
            servers.append(FakeInferenceServer(job, clock=backend.clock, start_time=backend.start_time).start())
    except OSError:
        for server in servers:
            server.close()
        raise
    fetch = WarmFetch()
    scraper = InferenceScraper([endpoint_for(s.job, s.url) for s in servers], interval_s=settings.inference_interval_s,
                               timeout_s=settings.inference_timeout_s, clock=backend.clock, models=settings.models,
                               fetch=fetch)
    # Serving figures from the first scrape, as the verdicts are (agent.backends.virtual_serving_warm).
    now = backend.clock()
    warmed = warm_scrapes(scraper, fetch, servers, now=now, start_time=backend.start_time,
                          interval_s=settings.inference_interval_s)
    scraper.start()
    backend.attach_workloads(scraper, [g for job in jobs for g in job.gpus],
                             closers=[scraper.close, *(s.close for s in servers)],
                             scraped_since=now - settings.inference_interval_s if warmed else None)
    return servers
