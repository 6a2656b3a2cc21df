"""The agent's HTTP endpoint: an asyncio listener over the h11 parser, built for hostile clients.

``server`` is the part the agent wires (:class:`AgentHTTPServer`: routes, limits, the web
config, draining on SIGTERM); ``listener`` accepts and schedules connections on one event-loop
thread, ``connection`` drives one connection through h11 with a deadline per state, ``framing``
writes answers, ``routes`` answers GETs from the last snapshot, ``limits`` holds the caps and
``tls`` the handshake with a bounded buffer. Why our own listener and not http.server, uvicorn
or aiohttp, with the measurements: docs/architecture.md ("The HTTP listener").
"""

from exporters.http.server import AgentHTTPServer

__all__ = ["AgentHTTPServer"]
