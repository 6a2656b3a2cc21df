"""``roofwatch fleet-report``: the weekly efficiency review of a whole fleet, read from a
Prometheus-compatible store (Prometheus, VictoriaMetrics, Thanos, Mimir) as one HTML page.

Split by job: ``promapi`` talks HTTP (a deadline per query and one for the whole command),
``window`` picks the time range and step, ``queries`` writes the PromQL, ``promql`` quotes every
label value that enters it, ``collect`` runs it into the data model (``data``), ``dcgm`` and ``amd``
classify dcgm-exporter's and AMD DME's series with roofwatch's own classifier,
``render``/``render_tables`` draw the page, ``run`` turns the command's options into a report.
"""
