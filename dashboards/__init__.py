"""Grafana dashboards as code (grafana-foundation-sdk, Grafana 11 build).

``python -m dashboards.generate`` writes the committed JSON next to this file; ``--check`` fails
when the JSON differs from what the code generates.
"""
