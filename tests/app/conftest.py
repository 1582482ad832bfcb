"""Fixtures the app's tests share: the service a module's requests run on, unless the module
defines its own `service`, and one real engine run's recording."""
import pytest

from app.serving.recording import Recording, record_request
from tests.service_utils import app_service, started, traced_run


@pytest.fixture(scope="module")
def service(checkpoint):
    """The tiny MoE with its tiny draft (3 speculative tokens), 64 KV blocks of 4, running."""
    with started(app_service(checkpoint, "--num-speculative-tokens", "3", "--num-kv-blocks", "64", "--block-size", "4",
                             draft="mistral")) as svc:
        yield svc


@pytest.fixture(scope="module")
def recording(service) -> Recording:
    """A full-trace speculative request on the module's service, recorded as a trace file holds it."""
    rid = traced_run(service, "Tell me about <script>alert(1)</script> foxes.")
    return record_request(service.store, rid, service.model_info(), service.piece, service.is_special)
