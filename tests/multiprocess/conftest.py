from __future__ import annotations

import pytest

START_METHODS = ["fork", "forkserver", "spawn"]


@pytest.fixture(params=START_METHODS)
def method(request: pytest.FixtureRequest) -> str:
    return request.param
