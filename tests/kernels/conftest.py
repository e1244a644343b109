"""Fixtures of the launch-plan tests without a GPU (test_plans_cpu.py, test_plan_cache_cpu.py): a stream getter and
a recording that stand in for torch's current stream and the driver."""

from __future__ import annotations

import importlib

import pytest


@pytest.fixture
def stream_getter():
    """A stream getter that says stream 7 (none is registered before a torch launch); the real one after."""
    from flydsl.compiler._native import launcher

    launcher._register_stream_getter(lambda device: 7)
    yield
    launcher._register_stream_getter(importlib.import_module("flydsl.compiler.frameworks")._current_torch_stream)


@pytest.fixture
def fake_recording(monkeypatch, stream_getter):
    """plans' recordings replaced by one the test's plans add their launches to (the driver's stand-in)."""
    from flydsl.compiler._native import launcher

    recording = launcher.LaunchRecording()
    monkeypatch.setattr(launcher, "LaunchRecording", lambda: recording)
    return recording
