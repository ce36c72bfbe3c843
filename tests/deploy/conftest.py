"""Fixtures for the deploy tests: docker-compose.yml's core services running on this host, shared by the tests that
need them (``tests/deploy/compose_stack.py``)."""
from __future__ import annotations

import pytest

from tests.deploy.compose_stack import running_compose_stack


@pytest.fixture(scope="package")
def compose_stack(tmp_path_factory):
    with running_compose_stack(tmp_path_factory.mktemp("compose-stack")) as stack:
        yield stack
