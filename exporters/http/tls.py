"""TLS on an accepted connection, with a buffer sized for a scrape rather than for bulk transfer.

asyncio's ``loop.start_tls`` gives every TLS connection a 256 KiB read buffer (``SSLProtocol.max_size``,
Python 3.11+), filled with zeros at once: 500 idle TLS connections then held 128 MiB, half the
systemd unit's MemoryMax. This is ``start_tls`` as the standard library writes it, over a protocol
whose buffer is one TLS record (16 KiB).
"""

from __future__ import annotations

import asyncio
import ssl
import sys
from asyncio import sslproto
from typing import Any

TLS_READ_CHUNK = 16 * 1024 + 512
"""One TLS record and its overhead: a read never needs more."""


class _SmallBufferTLS(sslproto.SSLProtocol):
    max_size = TLS_READ_CHUNK


async def start_tls(loop: asyncio.AbstractEventLoop, transport: asyncio.Transport, protocol: Any,
                    context: ssl.SSLContext, *, handshake_timeout_s: float) -> asyncio.Transport:
    """Wrap ``transport`` (reading paused) in TLS as the server; the new transport once the handshake
    is done. Raises what the handshake raised (the transport is then closed)."""
    waiter = loop.create_future()
    extra = {"ssl_shutdown_timeout": 5.0} if sys.version_info >= (3, 11) else {}
    tls = _SmallBufferTLS(loop, protocol, context, waiter, True, None, ssl_handshake_timeout=handshake_timeout_s,
                          call_connection_made=False, **extra)
    transport.pause_reading()
    transport.set_protocol(tls)
    made = loop.call_soon(tls.connection_made, transport)
    resumed = loop.call_soon(transport.resume_reading)
    try:
        await waiter
    except BaseException:
        transport.close()
        made.cancel()
        resumed.cancel()
        raise
    return tls._app_transport
