"""Views for people on one node, without Grafana: ``roofwatch top`` in the terminal, the agent's
``/`` status page, and ``roofwatch report`` over a recorded trace. They share one palette and one
roofline chart so a colour or a position means the same thing in each."""
