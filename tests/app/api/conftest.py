"""The API tests' server: the tiny MoE served as "tiny-moe" with 4-token blocks, one per test
module, and an `openai` SDK client on it. A module that needs another server defines its own
`server` fixture (test_openai_api.py, test_bad_input.py)."""
from __future__ import annotations

import pytest

from tests.service_utils import app_service, served

TINY_NAME = "tiny-moe"


@pytest.fixture(scope="module")
def server(checkpoint, tmp_path_factory):
    svc = app_service(checkpoint, "--served-model-name", TINY_NAME, "--block-size", "4")
    with served(svc, tmp_path_factory) as srv:
        yield srv


@pytest.fixture(scope="module")
def client(server):
    from openai import OpenAI
    return OpenAI(base_url=server.url + "v1", api_key="unused", max_retries=0)
