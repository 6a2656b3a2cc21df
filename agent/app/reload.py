"""SIGHUP: re-read the configuration and apply what can change while the agent runs.

A bad file never takes the agent down or half-applies: the new settings (and the web config
they name) are checked in full first; on any error the running configuration stays and the log
says which field was wrong. An empty web config is an error (a file being rewritten), and a reload
that would turn basic auth or TLS off, or lower the client-certificate check, is refused unless the
new settings say ``allow_security_downgrade: true``: a Secret caught mid-update or a settings file
cut off before its ``web_config_file:`` line must not open the port. Every security-relevant change
that does apply is logged at warning, naming it. What can change live is the logging and the web config (certificate
rotation, new passwords, headers); everything else is compared and, when it changed, the log
names it as needing a restart instead of pretending it took effect.

The reload runs on the main thread, never on the HTTP listener's event loop, and everything it reads
is bounded before it is built (agent.context.yaml_input, agent.context.file_input): a 1 KB alias bomb used to
hold the GIL in validation for seconds, and every scrape waited with it.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Callable

from agent.app.config import Settings
from agent.app.logs import configure_logging

log = logging.getLogger("roofwatch.reload")

LIVE_FIELDS = frozenset({"log_level", "log_format", "web_config_file", "allow_security_downgrade"})


@dataclass
class Reloader:
    """Holds the running settings; :meth:`reload` swaps in what it can from a fresh read."""

    settings: Settings
    read_settings: Callable[[], Settings]
    """Reads the file and the environment again, with the command line's flags applied on top."""
    server: Any = None
    """The HTTP server, whose ``web`` (an :class:`exporters.web_config.WebConfig`) is replaced."""

    def reload(self) -> bool:
        """True when the new configuration was applied (even if parts of it need a restart)."""
        try:
            fresh = self.read_settings()
            web = _load_web(fresh)
        except Exception as exc:  # noqa: BLE001 - any failure keeps the running configuration
            log.error("reload failed; keeping the running configuration", extra={"error": _one_line(exc)})
            return False
        current = self.settings
        running = self.server.web.posture if self.server is not None else None
        if running is not None and (lost := running.weakened_by(web.posture)) and not fresh.allow_security_downgrade:
            # An emptied or cut-off file looks the same as an intended change: only an explicit setting says which.
            log.error("reload refused: it would turn off " + " and ".join(lost) + "; keeping the running configuration "
                      "(set allow_security_downgrade: true in the new settings if this is meant)",
                      extra={"web_config_file": fresh.web_config_file or "unset"})
            return False
        changed = [name for name in Settings.model_fields if getattr(fresh, name) != getattr(current, name)]
        restart = [name for name in changed if name not in LIVE_FIELDS]
        if self.server is not None:
            if (self.server.web.tls is None) != (web.tls is None):
                restart.append("web_config_file")  # TLS on or off: how the port is spoken cannot flip live
            else:
                if running is not None and (changes := running.changes_to(web.posture)):
                    log.warning("web config changed: " + "; ".join(changes),
                                extra={"web_config_file": fresh.web_config_file or "unset"})
                self.server.web = web  # new certificates, passwords and headers for the next connection
        if fresh.log_level != current.log_level or fresh.log_format != current.log_format:
            configure_logging(fresh.log_level, fresh.log_format)
        kept = {name: getattr(current, name) for name in restart}
        self.settings = fresh.model_copy(update=kept)
        log.info("reloaded", extra={"changed": ",".join(changed) or "nothing"})
        if restart:
            log.warning("changed settings need a restart to take effect", extra={"fields": ",".join(sorted(set(restart)))})
        return True


def _load_web(settings: Settings) -> Any:
    from exporters.web_config import WebConfigError, web_config_or_none

    try:
        return web_config_or_none(settings.web_config_file)
    except WebConfigError as exc:
        raise ValueError(f"web_config_file: {exc}") from None


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split()) or type(exc).__name__
