"""The roofline classifier: pure functions from a window of vendor-neutral samples to a verdict.

No I/O and no vendor knowledge: the same code classifies a live GPU, the virtual fleet and a
replayed trace (docs/classification.md).
"""
