"""The ``roofwatch`` command: one parser whose subcommands come from three groups.

* agent.app.commands_agent: ``run`` and ``demo``, the agent itself;
* agent.app.commands_node: ``snapshot``, ``record``, ``doctor``, ``selftest``, ``top``, about this node's GPUs;
* agent.app.commands_offline: ``classify``, ``report``, ``specs``, ``fleet-report``, which need no GPU.

Exit statuses and the one-line error are shared (agent.app.cli_base).
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Sequence

from agent import __version__
from agent.app import commands_agent, commands_node, commands_offline
from agent.app.cli_base import EXIT_OK, CliError
from agent.model.redact import hide

GROUPS = (commands_agent, commands_node, commands_offline)


def build_parser() -> argparse.ArgumentParser:
    """The parser; each subcommand carries its handler as ``args.handler``."""
    parser = argparse.ArgumentParser(
        prog="roofwatch",
        description="GPU telemetry agent: roofline verdicts, MFU and raw counters for Prometheus.",
    )
    parser.add_argument("--version", action="version", version=f"roofwatch {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    for group in GROUPS:
        for name, handler in group.register(sub).items():
            sub.choices[name].set_defaults(handler=handler)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    # grpcio's C core writes raw lines of its own to stderr (every failed TLS handshake of an OTLP or kubelet
    # channel), outside the agent's logfmt/JSON log; it reads this once, when grpc loads. An operator's own
    # GRPC_VERBOSITY wins. Our log says a failure once (exporters/otlp/pusher.py).
    os.environ.setdefault("GRPC_VERBOSITY", "NONE")
    args = build_parser().parse_args(argv)
    try:
        return args.handler(args)
    except CliError as exc:
        print(hide(f"roofwatch {args.command}: {exc}"), file=sys.stderr)  # never a credential the settings hold
        return exc.code
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:  # `roofwatch classify TRACE | head`: the reader left, nothing is wrong
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no second error at exit
        return EXIT_OK


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
