"""``roofwatch selftest``: play calibrated workloads on one GPU and check what roofwatch makes of them.

Like ``dcgmproftester`` with ``dcgmi diag``, but the questions are roofwatch's own: does a large
GEMM read as tensor-bound, a device-to-device copy as DRAM-bound, a starved loop as starved, and
does MFU from the counters match the FLOP/s the workload timed itself? The pieces, one job each:

* :mod:`.phases`: the phases and the timing constants both kinds of runner share;
* :mod:`.expectations`: the one table of what each phase should show, with its reason and source;
* :mod:`.runner`: the phase-runner interface and the choice of runner (torch, cupy, virtual);
* :mod:`.cuda_phases` with :mod:`.torch_ops` and :mod:`.cupy_ops`: the phases on a real GPU;
* :mod:`.virtual_runner`: the simulated GPU playing each phase, behind the real NVML code;
* :mod:`.sampler`: reading the GPU through the agent's backend while a phase runs;
* :mod:`.judge`: counters, verdicts and throughput of one phase, checked against the table;
* :mod:`.report`: the printed report, ``summary.json``, the labelled traces, the exit status;
* :mod:`.selftest`: the run itself.
"""
