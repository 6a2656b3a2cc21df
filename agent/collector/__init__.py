"""Background collection: sample every device on a fixed schedule and publish immutable snapshots.

Scrapes never touch a backend. They read :attr:`Collector.snapshot`, a reference swapped in
atomically once per cycle, so a slow or hung GPU call can delay only its own device's data.

Isolation per device:

* each device is sampled by one of a bounded pool of worker threads (at most ``max_workers``,
  16 by default, started as they are needed), with a deadline; a call that raises or overruns
  marks only that device down;
* a device never has two calls in flight, so a hung driver call costs one worker, not one per
  cycle; the other devices are sampled by the workers left. A device whose call has not started
  by its deadline (every worker busy) is marked down too, and its call stays queued: the queue
  holds at most one call per device however long the workers stay hung;
* a failed device is retried on an exponential back-off, and comes back up on its first good
  sample; going down and coming back are logged once per change, and as one summary line when
  many devices change in one cycle;
* at most ``max_devices`` devices are taken from a backend (the first it lists); more is a
  misdirected or hostile source, refused with one warning.

Every sample passes the physical bounds (agent/model/bounds.py) as it arrives, before the counters,
the history, the classifier and the snapshot read it: a value no GPU can produce is dropped (unknown),
counted by source and field in the snapshot, and logged once per episode.

The loop is ``cycle.py``; the worker threads and the back-off ``pool.py``; the totals since start
``counters.py``.
"""

from agent.collector.counters import accumulate_counters
from agent.collector.cycle import LOG_EACH, MAX_DEVICES, Analyzer, Collector, SnapshotListener
from agent.collector.pool import MAX_WORKERS, Backoff

__all__ = ["LOG_EACH", "MAX_DEVICES", "MAX_WORKERS", "Analyzer", "Backoff", "Collector", "SnapshotListener",
           "accumulate_counters"]
