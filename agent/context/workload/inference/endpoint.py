"""What the agent is told about an inference server and its model: the endpoint and ``models:`` settings.

Kept apart from the scraper because the configuration loads them (agent.app.config) without
starting anything, and because the model facts (weight bytes, KV-cache size, the batch cap) are
what the serving floor needs and no server exports (docs/serving.md).
"""

from __future__ import annotations

from typing import Literal
from urllib.parse import urlsplit, urlunsplit

from pydantic import BaseModel, ConfigDict, Field, field_validator

from agent.context.workload.inference.parse import Kind
from agent.model import Dtype

DEFAULT_PATH = "/metrics"
"""The path a URL without one gets, and the one a server's name leaves out."""


def _got(value: object) -> str:
    """The rejected value as an error quotes it: ``repr`` clipped to 60 characters, so a kilobytes-long
    value still makes one short line naming the field."""
    text = repr(value)
    return text if len(text) <= 60 else text[:56] + "...'"

class ModelFacts(BaseModel):
    """Facts about one served model, by the name the server reports it under (``model_name``)."""

    model_config = ConfigDict(extra="forbid")

    model_bytes: float | None = Field(None, gt=0.0, le=1e15, description="Bytes of weights the whole model "
                                      "reads per decode step (parameters x bytes per parameter).")
    params: float | None = Field(None, gt=0.0, le=1e15, description="Parameter count; 2 x params FLOPs per token.")
    flops_per_token: float | None = Field(None, gt=0.0, le=1e16, description="Forward FLOPs per token.")
    dtype: Dtype | None = Field(None, description="Math precision, picks the peak MFU is measured against.")
    kv_cache_bytes: float | None = Field(None, gt=0.0, le=1e15, description="KV-cache pool of one replica, all "
                                         "its GPUs; default: the pool in tokens x kv_bytes_per_token, else "
                                         "estimated from the memory the server holds.")
    kv_bytes_per_token: float | None = Field(None, gt=0.0, le=1e10, description="KV-cache bytes per token: 2 x "
                                             "layers x KV heads x head dimension x bytes per element.")
    max_running: int | None = Field(None, ge=1, le=1_000_000, description="The server's cap on the running batch "
                                    "(vLLM max_num_seqs, SGLang max_running_requests); wins over the cap SGLang "
                                    "<= 0.3 exports.")


class InferenceEndpoint(BaseModel):
    """One inference server's metrics endpoint and what the agent must know about its model."""

    model_config = ConfigDict(extra="forbid")

    url: str = Field(..., max_length=2048, description="http(s) URL of the server's Prometheus metrics; "
                     "a URL without a path gets /metrics.")
    kind: Literal["auto", Kind] = Field("auto", description="Server kind (vllm, sglang, tgi, llamacpp, triton); "
                                        "auto detects it from the metric names.")
    gpus: list[str] | None = Field(None, min_length=1, max_length=1024, description="GPU indices or UUIDs the "
                                   "server runs on; default: found from the PID listening on the URL's port.")
    flops_per_token: float | None = Field(None, gt=0.0, le=1e16, description="Forward FLOPs per token.")
    params: float | None = Field(None, gt=0.0, le=1e15, description="Parameter count; gives 2 x params FLOPs "
                                 "per token when flops_per_token is not set.")
    model_bytes: float | None = Field(None, gt=0.0, le=1e15, description="Bytes of weights read per step (MBU, "
                                      "the serving floor); default: the models: entry of the server's model.")
    kv_cache_bytes: float | None = Field(None, gt=0.0, le=1e15, description="KV-cache pool of the server, all its "
                                         "GPUs; default: the server's own figure, else estimated from memory held.")
    kv_bytes_per_token: float | None = Field(None, gt=0.0, le=1e10, description="KV-cache bytes per token; with "
                                             "the pool size in tokens the server exports, gives the pool in bytes.")
    max_running: int | None = Field(None, ge=1, le=1_000_000, description="The server's cap on the running batch "
                                    "(vLLM max_num_seqs, SGLang max_running_requests).")
    dtype: Dtype | None = Field(None, description="Math precision, picks the peak MFU is measured against.")
    world_size: int | None = Field(None, ge=1, le=65536, description="GPUs of the whole server (all nodes); "
                                   "default: the GPUs this endpoint maps to on this node.")
    job: str | None = Field(None, min_length=1, max_length=256, description="Job name put on the reports.")
    model: str | None = Field(None, min_length=1, max_length=256, description="The served model's name, for "
                              "servers that do not export one (TGI): shown on the serving view, and the key "
                              "into models:. Default: the server's model_name label.")

    @field_validator("url")
    @classmethod
    def _check_url(cls, value: str) -> str:
        parts = urlsplit(value.strip())
        if parts.scheme not in ("http", "https"):
            raise ValueError(f"url must start with http:// or https:// (got {_got(value)})")
        if not parts.hostname:
            raise ValueError(f"url has no host (got {_got(value)})")
        if parts.username or parts.password:
            raise ValueError("url must not carry credentials")
        try:
            port = parts.port
        except ValueError:
            raise ValueError(f"url port must be a number from 1 to 65535 (got {_got(value)})") from None
        if port == 0:
            raise ValueError(f"url port must be a number from 1 to 65535 (got {_got(value)})")
        path = parts.path if parts.path not in ("", "/") else DEFAULT_PATH
        return urlunsplit((parts.scheme, parts.netloc, path, parts.query, ""))

    @field_validator("gpus", mode="before")
    @classmethod
    def _check_gpus(cls, value: object) -> object:
        if not isinstance(value, list):
            return value  # pydantic reports the type error
        out: list[str] = []
        for item in value:
            if isinstance(item, bool) or not isinstance(item, (int, str)):
                raise ValueError(f"gpus entries must be GPU indices or UUIDs (got {_got(item)})")
            text = str(item).strip()
            if not text or any(c.isspace() for c in text) or (isinstance(item, int) and item < 0):
                raise ValueError(f"gpus entries must be GPU indices or UUIDs (got {_got(item)})")
            if text not in out:
                out.append(text)
        return out

    @property
    def effective_flops_per_token(self) -> float | None:
        """FLOPs per token as configured, else the 2 x parameters of a forward pass."""
        if self.flops_per_token is not None:
            return self.flops_per_token
        return 2.0 * self.params if self.params is not None else None

    def server_name(self, kind: str | None) -> str:
        """How views and labels name this server: ``vllm 10.0.0.7:8000``, with the path when it is not the
        default ``/metrics`` (``vllm 10.0.0.7:8000/engine-b/metrics``), so endpoints that share a host and
        port are told apart, and a name never changes with the other endpoints configured. The query is never
        shown: it may carry a token. ``job:`` names the server instead, when set (agent.context.workload.inference.scraper)."""
        parts = urlsplit(self.url)
        path = "" if parts.path == DEFAULT_PATH else parts.path
        return f"{kind} {parts.netloc}{path}"

    @property
    def port(self) -> int:
        parts = urlsplit(self.url)
        return parts.port or (443 if parts.scheme == "https" else 80)
