"""Fixtures for the deployment checks: rendered charts (default values and
the GPU production profile) and the tools, failing with a clear message when
the `deploy` extra is not installed."""

from __future__ import annotations

import pytest

from tests.deploy.tools import GPU_PROFILE, ToolMissing, compose_binary, helm_binary, render


def _require(find):
    try:
        return find()
    except ToolMissing as e:
        pytest.fail(str(e))


@pytest.fixture(scope="session")
def helm_bin():
    return _require(helm_binary)


@pytest.fixture(scope="session")
def compose_bin():
    return _require(compose_binary)


@pytest.fixture(scope="session")
def default_objects(helm_bin) -> list[dict]:
    return render()


@pytest.fixture(scope="session")
def gpu_objects(helm_bin) -> list[dict]:
    return render(GPU_PROFILE)


@pytest.fixture(scope="session", params=["default", "gpu-production"])
def profile_objects(request, default_objects, gpu_objects) -> tuple[str, list[dict]]:
    """Each profile's rendered objects, for checks that hold for both."""
    return request.param, default_objects if request.param == "default" else gpu_objects
