"""The models one server holds: one EngineService (its own engine thread, KV pool and trace
store) per model, found by its served name. The API picks one by a request's `model`; the
page by its picker; watchers (/ws, the page's Watch) get one queue fed by every engine.

Only the models given at start-up are served: a `model` that is anything else (a path, a
hub id) is refused and loads nothing.
"""
from __future__ import annotations

from typing import Iterator

from app.serving.engine_service import EngineService, Subscription
from app.serving.limits import RequestRefused


class ServedModels:
    def __init__(self, services: list[EngineService]) -> None:
        if not services:
            raise ValueError("a server needs at least one model")
        names = [s.model_name for s in services]
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice:
            raise ValueError(f"two models are served as {', '.join(map(repr, twice))}: give each its own "
                             "--served-model-name")
        self.services = list(services)
        self.by_name = {s.model_name: s for s in services}
        self.limits = services[0].limits

    @classmethod
    def of(cls, served: "ServedModels | EngineService") -> "ServedModels":
        return served if isinstance(served, ServedModels) else cls([served])

    @property
    def first(self) -> EngineService:
        return self.services[0]

    @property
    def names(self) -> list[str]:
        return [s.model_name for s in self.services]

    def __iter__(self) -> Iterator[EngineService]:
        return iter(self.services)

    def __len__(self) -> int:
        return len(self.services)

    def get(self, name: str | None) -> EngineService | None:
        return self.first if name is None else self.by_name.get(name)

    def pick(self, model) -> EngineService:
        """The engine a request's `model` names (the first when absent); a 404 otherwise."""
        if model is None:
            return self.first
        service = self.by_name.get(model) if isinstance(model, str) else None
        if service is None:
            served = ", ".join(repr(n) for n in self.names)
            raise RequestRefused(f"the model {repr(model)[:80]} does not exist; this server serves {served}",
                                 status=404, param="model", code="model_not_found")
        return service

    def owner(self, request_id: str) -> EngineService | None:
        """The engine that ran a (traced) request: trace ids are unique across engines."""
        return next((s for s in self.services if s.owns(request_id)), None)

    @property
    def error(self) -> str | None:
        return next((s.error for s in self.services if s.error is not None), None)

    # --- watching every engine ----------------------------------------------------------
    def subscribe_all(self, max_items: int | None = None) -> Subscription:
        watch = Subscription(None, max_items=max_items)
        for s in self.services:
            s.attach(watch)
        return watch

    def subscribe(self, request_id: str, max_items: int | None = None) -> Subscription:
        """Watch one request, on whichever engine runs it (or will: it may not be sent yet)."""
        watch = Subscription(request_id, max_items=max_items)
        owner = self.owner(request_id)
        for s in [owner] if owner is not None else self.services:
            s.attach(watch)
        return watch

    def unsubscribe(self, watch: Subscription) -> None:
        for s in self.services:
            s.unsubscribe(watch)

    def abort(self, request_id: str) -> bool:
        done = False
        for s in self.services:
            done = s.abort(request_id) or done
        return done

    # --- lifecycle ------------------------------------------------------------------------
    def start(self) -> "ServedModels":
        for s in self.services:
            s.start()
        return self

    def stop(self) -> None:
        for s in self.services:
            s.stop()
