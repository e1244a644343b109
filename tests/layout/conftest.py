"""Hypothesis profile for the layout suite: the whole suite runs in well under two minutes on two cores."""

import os

from hypothesis import HealthCheck, settings

settings.register_profile(
    "layout",
    max_examples=int(os.environ.get("LAYOUT_EXAMPLES", "150")),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
settings.register_profile("layout-thorough", max_examples=2000, deadline=None)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "layout"))
