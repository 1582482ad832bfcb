"""Our engine against Hugging Face transformers (eager attention, float32) on tiny
random-weight checkpoints of every supported architecture."""
import pytest
import torch

from engine import LLM, SamplingParams
from engine.forward import prompt_logits
from tests.engine_utils import DEVICE
from tests.tiny import ARCH_CONFIGS, load_reference

ARCHS = list(ARCH_CONFIGS)
PROMPT = torch.randint(4, 300, (21,), generator=torch.Generator().manual_seed(7)).tolist()


@pytest.fixture(scope="module")
def pair(checkpoint):
    cache = {}

    def get(arch):
        if arch not in cache:
            path = checkpoint(arch)
            cache[arch] = (LLM(path, device=DEVICE, dtype="float32", block_size=4), load_reference(path))
        return cache[arch]
    return get


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("chunk", [len(PROMPT), 1, 6], ids=["prefill", "decode", "chunked"])
def test_logits_match_transformers(pair, arch, chunk):
    llm, ref = pair(arch)
    with torch.no_grad():
        expected = ref(torch.tensor([PROMPT])).logits[0]
    got = prompt_logits(llm.engine, PROMPT, chunk)
    assert got.shape == expected.shape
    torch.testing.assert_close(got, expected, atol=2e-4, rtol=1e-4)


@pytest.mark.parametrize("arch", ARCHS)
def test_greedy_generation_matches_transformers(pair, arch):
    llm, ref = pair(arch)
    n_new = 40
    with torch.no_grad():
        hf = ref.generate(torch.tensor([PROMPT]), max_new_tokens=n_new, do_sample=False,
                          eos_token_id=None, pad_token_id=0)[0, len(PROMPT):].tolist()
    out = llm.generate(PROMPT, SamplingParams(temperature=0, max_tokens=n_new, ignore_eos=True))[0]
    assert len(hf) == n_new
    assert out.token_ids == hf
    assert out.finish_reason == "length"


def test_sliding_window_matters(pair):
    """The Mistral window (8) is much shorter than prompt + output: a model that
    ignored it would produce different logits from position 8 on."""
    llm, ref = pair("mistral")
    assert llm.engine.model_config.sliding_windows == [8, 8, 8]
    attn = llm.engine.runner.model.model.layers[0].self_attn
    attn.window = None
    try:
        full = prompt_logits(llm.engine, PROMPT, len(PROMPT))
    finally:
        attn.window = 8
    windowed = prompt_logits(llm.engine, PROMPT, len(PROMPT))
    assert torch.allclose(full[:8], windowed[:8], atol=1e-5)
    assert not torch.allclose(full[8:], windowed[8:], atol=1e-3)


def test_config_features_are_read(pair):
    cfgs = {a: pair(a)[0].engine.model_config for a in ("llama", "qwen2", "qwen2_moe", "qwen3_moe", "qwen3_moe_nonorm", "olmoe")}
    assert cfgs["llama"].tie_word_embeddings and cfgs["llama"].rope_scaling["rope_type"] == "llama3"
    assert cfgs["qwen2"].qkv_bias and not cfgs["qwen2"].o_bias and cfgs["qwen2"].sliding_windows == [None, 8, 8]
    assert cfgs["qwen2_moe"].moe_layers == [True, False, True] and cfgs["qwen2_moe"].shared_expert_intermediate_size == 48
    assert cfgs["qwen3_moe"].moe_layers == [False, True, False] and cfgs["qwen3_moe"].norm_topk_prob
    assert cfgs["qwen3_moe_nonorm"].moe_layers == [False, True, True] and not cfgs["qwen3_moe_nonorm"].norm_topk_prob
    assert cfgs["olmoe"].qk_norm == "full" and cfgs["olmoe"].clip_qkv == 4.0


@pytest.mark.slow  # Triton interpreted on the CPU: seconds per model
@pytest.mark.parametrize("arch", ["mistral", "qwen3_moe"])
def test_triton_kernels_in_the_engine(checkpoint, arch):
    """The engine with its Triton kernels (run by the interpreter on CPU) gives the
    same greedy tokens as transformers; on CUDA the same path runs compiled."""
    path = checkpoint(arch)
    llm = LLM(path, device=DEVICE, block_size=4, use_triton=True)
    assert llm.engine.runner.use_triton
    prompt = PROMPT[:12]
    with torch.no_grad():
        hf = load_reference(path).generate(torch.tensor([prompt]), max_new_tokens=12, do_sample=False,
                                           eos_token_id=None, pad_token_id=0)[0, len(prompt):].tolist()
    assert llm.generate(prompt, SamplingParams(temperature=0, max_tokens=12, ignore_eos=True))[0].token_ids == hf


@pytest.mark.skipif(DEVICE != "cpu" or not torch.backends.mkldnn.is_available(), reason="oneDNN: CPU only")
@pytest.mark.parametrize("kernel", ["c", "onednn"])
@pytest.mark.parametrize("arch", ["llama", "qwen2", "mixtral", "qwen2_moe"])
def test_cpu_linears_match_transformers(checkpoint, monkeypatch, cpu_kernels_switch, arch, kernel):
    """Every linear layer through a CPU fast path with its weight reordered
    (engine/layers/linear.py): the C kernel (engine/kernels/cpu_linear.c) where it builds,
    else oneDNN (the tiny checkpoints' weights are below the size oneDNN packs by default):
    the same logits and greedy tokens as transformers, including a decode batch of several
    sequences."""
    from engine.layers import linear
    assert cpu_kernels_switch(kernel == "c") == (kernel == "c")
    monkeypatch.setattr(linear, "PACK_MIN_BYTES", 0)
    path = checkpoint(arch)
    llm = LLM(path, device="cpu", dtype="float32", block_size=4)
    model = llm.engine.runner.model
    layers = [m for m in model.modules() if isinstance(m, linear.Linear)]
    if kernel == "c":
        assert layers and all(m.blocked is not None and m.packed is None for m in layers)
    else:
        assert layers and all(m.packed is not None and m.blocked is None for m in layers)
    moe = [m for m in model.modules() if hasattr(m, "packed_down")]
    if kernel == "c":  # every expert blocked, one after another: the only copy, run by cpu_moe.c
        assert all(m.c_experts is not None and m.experts_gate_up is None and m.packed_gate_up is None
                   and len(m.c_experts.gate_up) == m.num_experts for m in moe)
    else:
        assert all(m.packed_gate_up is not None and m.packed_down is not None for m in moe)
    assert bool(moe) == (arch in ("mixtral", "qwen2_moe"))
    ref = load_reference(path)
    with torch.no_grad():
        expected = ref(torch.tensor([PROMPT])).logits[0]
    for chunk in (len(PROMPT), 1):
        torch.testing.assert_close(prompt_logits(llm.engine, PROMPT, chunk), expected, atol=2e-4, rtol=1e-4)
    prompts = [PROMPT, PROMPT[3:], PROMPT[:9]]
    greedy = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True)
    outs = llm.generate(prompts, greedy)
    for prompt, out in zip(prompts, outs):
        with torch.no_grad():
            hf = ref.generate(torch.tensor([prompt]), max_new_tokens=16, do_sample=False, eos_token_id=None,
                              pad_token_id=0)[0, len(prompt):].tolist()
        assert out.token_ids == hf
