"""Suite-wide settings.

Hypothesis' time-based checks are switched off for every property test: ``deadline`` and the
``too_slow`` health check fail a test when drawing or running one example takes long by the wall
clock, which on a shared 2-core CI machine says more about the neighbours than about the code (a
float draw once took 2.3 s there). Speed is measured in benchmarks/, never asserted in tests.
"""

from hypothesis import HealthCheck, settings

settings.register_profile("roofwatch", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("roofwatch")

pytest_plugins = ["tests.tiers", "pytester"]  # pytester: tests/test_tiers.py runs an inner session
