"""The engine on the embedded models: the default model, parity with transformers,
and speculative decoding with the embedded draft."""
import pytest
import torch

from engine import LLM, SamplingParams
from engine.llm_engine import DEFAULT_MODEL
from tests.engine_utils import DEVICE

DRAFT = DEFAULT_MODEL.parent / "draft"
CHAT = [{"role": "system", "content": "You are a wise old owl."},
        {"role": "user", "content": "What is the secret of a happy life?"}]
GREEDY = SamplingParams(temperature=0, max_tokens=32, ignore_eos=True)


@pytest.fixture(scope="module")
def llm():
    return LLM(device=DEVICE)  # no model argument: the embedded target


def test_default_model_is_the_embedded_target(llm):
    assert llm.engine.model_path == DEFAULT_MODEL
    cfg = llm.engine.model_config
    assert cfg.architecture == "MixtralForCausalLM" and cfg.num_experts == 8 and cfg.num_kv_heads < cfg.num_heads


def test_greedy_chat_matches_transformers(llm):
    from transformers import AutoModelForCausalLM
    out = llm.chat(CHAT, GREEDY)
    ref = AutoModelForCausalLM.from_pretrained(str(DEFAULT_MODEL), dtype=torch.float32).eval()
    ids = torch.tensor([out.prompt_token_ids])
    with torch.no_grad():
        hf = ref.generate(ids, max_new_tokens=32, do_sample=False, eos_token_id=None,
                          pad_token_id=0)[0, ids.shape[1]:].tolist()
    assert out.token_ids == hf
    words = out.text.split()
    assert len(words) >= 5


def test_chat_stops_at_end_of_turn(llm):
    out = llm.chat(CHAT, SamplingParams(temperature=0, max_tokens=200))
    assert out.finish_reason == "stop" and out.token_ids[-1] in llm.engine.model_config.eos_token_ids


@pytest.mark.parametrize("k", range(1, 7))
def test_speculation_with_the_embedded_draft_is_exact(llm, k):
    expected = llm.chat(CHAT, GREEDY).token_ids
    spec = LLM(device=DEVICE, draft=DRAFT, num_speculative_tokens=k)
    out = spec.chat(CHAT, GREEDY)
    assert out.token_ids == expected
    stats = spec.engine.stats
    assert stats.spec_accepted > 0 and stats.target_passes < 32
