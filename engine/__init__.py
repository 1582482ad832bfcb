"""TokenTrace's serving engine: paged KV cache, prefix caching, continuous batching,
and a trace event for every stage of a request."""
from engine.config import EngineConfig, ModelConfig, UnsupportedModelError
from engine.llm import LLM
from engine.info import EngineInfo, EngineLoad
from engine.engine_api import Engine
from engine.llm_engine import ContextLengthError, LLMEngine
from engine.load_thread import on_own_thread
from engine.disagg import DisaggEngine, DisaggFailedError
from engine.checkpoint.errors import ModelLoadError
from engine.code_map import Code
from engine.code_source import CodeMapError, checkout_commit, resolve, resolve_or_error, stage_code
from engine.outputs import RequestOutput, TokenOutput, Usage
from engine.sampling_params import MAX_LOGPROBS, SamplingParams
from engine.structured import Constraint
from engine.trace import CaptureConfig, EventList, TraceEvent, Tracer

__all__ = ["LLM", "Engine", "LLMEngine", "DisaggEngine", "DisaggFailedError", "SamplingParams", "EngineConfig", "ModelConfig", "CaptureConfig",
           "RequestOutput", "TokenOutput", "Usage", "TraceEvent", "Tracer", "EventList",
           "ModelLoadError", "UnsupportedModelError", "ContextLengthError", "EngineInfo", "EngineLoad",
           "Constraint", "MAX_LOGPROBS", "stage_code", "checkout_commit",
           "Code", "CodeMapError", "resolve", "resolve_or_error", "on_own_thread"]
