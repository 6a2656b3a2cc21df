"""Inference serving in the virtual fleet: the serving workload kind and fake vLLM, SGLang and TGI servers.

A ``serving`` phase (agent.virtual.workloads.ServingPhase) is one model replica decoding a steady
batch. :mod:`figures` derives every number from the phase and the GPU's published figures (the
decode floor, step time, latencies, request rate, KV-cache usage); :mod:`plan` turns them into GPU
counters; :mod:`job` into the cumulative counters a server exports at any virtual time and the
workload report it implies; :mod:`exposition` renders what each real server's ``/metrics`` looks
like, and :mod:`server` serves it over HTTP. docs/virtual-fleet.md has the formulas.
"""
