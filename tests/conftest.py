"""Shared fixtures: the embedded model (converted once, cached) and engine helpers."""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("VLLM_ALLOW_INSECURE_SERIALIZATION", "1")  # control RPCs to local workers


@pytest.fixture(scope="session")
def model_path() -> str:
    from vllm_selfspec.assets import resolve_model

    return resolve_model("smollm2-135m")
