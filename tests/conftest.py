"""Suite-wide settings.

Hypothesis' time-based checks are switched off for every property test: ``deadline`` and the
``too_slow`` health check fail a test when drawing or running one example takes long by the wall
clock, which on a shared 2-core CI machine says more about the neighbours than about the code (a
float draw once took 2.3 s there). Speed is measured in benchmarks/, never asserted in tests.
"""

from hypothesis import HealthCheck, settings

settings.register_profile("roofwatch", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("roofwatch")

# Hypothesis builds its Unicode table once per machine (about 0.5 s, then cached under .hypothesis/) on the first text
# draw: on a fresh clone that cost fell on whichever property test drew text first in each worker and pushed it past
# the quick tier's 2 s (tests/tiers.py). Built here, before any test is timed; a no-op once cached.
try:  # an internal of Hypothesis: where a release moves it, the first text draw pays the cost as before
    from hypothesis.internal.charmap import charmap as _unicode_table
except ImportError:  # pragma: no cover
    _unicode_table = None
if _unicode_table is not None:
    _unicode_table()

pytest_plugins = ["tests.tiers", "pytester"]  # pytester: tests/test_tiers.py runs an inner session
