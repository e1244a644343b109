"""The Fly dialect's op builders (generated)."""

from ._fly_ops_gen import *  # noqa: F401,F403
