"""One function per stage of a request's journey (visualizers/journey.py puts them in order).

Each takes the request's Facts (its events read once) and returns a Part: the stage's words
with this request's numbers, the page's panels drawn under them, the map's chip, whether the
request skips the stage and whether it has got there. The page's sections and the classroom
both read these words, so they never disagree."""
from visualizers.stages.beyond import beyond
from visualizers.stages.facts import Facts, Part, Trail
from visualizers.stages.model import kv, layers, lens, prefill_decode
from visualizers.stages.speculation import speculation
from visualizers.stages.way_in import embed, prefix, request, tokenize
from visualizers.stages.way_out import batching, sampling, stream

__all__ = ["Facts", "Part", "Trail", "request", "tokenize", "prefix", "embed", "layers", "prefill_decode", "kv", "lens",
           "sampling", "stream", "batching", "speculation", "beyond"]
