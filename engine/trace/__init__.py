"""What the engine tells the outside world: the tracer and its events (tracer.py), the
builders of every event type (events.py), the captures a `full` trace takes during a
forward pass (capture.py, logit_lens.py, softmax_stats.py) and the compact form its big
tensors are stored in (compact.py; visualizers/compact.py reads it back)."""
from engine.trace.tracer import (SCHEMA_VERSION, STAGES, TRACE_LEVELS, CaptureConfig, EventList, TraceEvent,
                                 Tracer, jsonable)

__all__ = ["SCHEMA_VERSION", "STAGES", "TRACE_LEVELS", "CaptureConfig", "EventList", "TraceEvent", "Tracer",
           "jsonable"]
