"""``roofwatch fleet-report``: the weekly efficiency review of a whole fleet, read from a
Prometheus-compatible store (Prometheus, VictoriaMetrics, Thanos, Mimir) as one HTML page.

Split by job: ``promapi`` talks HTTP, ``window`` picks the time range and step, ``queries``
writes the PromQL, ``collect`` runs it into the data model (``data``), ``dcgm`` classifies
dcgm-exporter series with roofwatch's own classifier, ``render``/``render_tables`` draw the page.
"""
