"""roofwatch's cost on a GPU node, measured: ``python -m benchmarks`` (or ``./dev.sh bench``).

Not part of the test suite: timings are machine-dependent, so they are printed with the ratio to
a baseline measured in the same run, and checked against the budgets in docs/performance.md only
here, where a budget missed by a wide margin makes the exit status non-zero.
"""
