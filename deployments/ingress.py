"""`Ingress`: the CPU front door. Validates a request, derives its prefix key, splits it into token-bounded
sub-requests that keep that key, sends them to the engine deployment and merges the answers.

The prefix key is a hash of (model, task, the text every sequence of the request starts with): the template's
system prompt, instruction and query for rerank, the instruction for embed, the few-shot prefix for classify,
the context for score. `PrefixAffinityRouter` sends one key to one engine replica, where the batcher puts the
sub-requests of one prefix into one batch, so the prefix is computed once there.
"""

from __future__ import annotations

import asyncio
import hashlib
from dataclasses import dataclass
from typing import Any

from ray import serve
from ray.serve.handle import DeploymentHandle

from radix_core.tasks import TASKS, TaskConfig, load_task_context, merge_results, routing_prefix, split_request


@dataclass(frozen=True)
class IngressSettings:
    model: str
    max_items: int  # items (documents, texts, inputs, continuations) per request
    max_tokens_per_item: int | None
    max_request_tokens: int  # larger requests become several sub-requests with the same prefix key


def prefix_key(model: str, task: str, shared_prefix: str) -> str:
    """Stable across processes and restarts (unlike Python's `hash`)."""
    return hashlib.blake2b(f"{model}\0{task}\0{shared_prefix}".encode(), digest_size=16).hexdigest()


@serve.deployment
class Ingress:
    """Library-shaped calls (`rerank(request)` with the `Engine.rerank` keyword arguments as a dict, ...)."""

    def __init__(self, engine: DeploymentHandle, settings: IngressSettings):
        self.engine = engine
        self.settings = settings
        self.context = load_task_context(settings.model, TaskConfig(max_items=settings.max_items,
                                                                    max_tokens=settings.max_tokens_per_item))

    async def rerank(self, request: dict[str, Any]):
        return await self._call("rerank", request)

    async def embed(self, request: dict[str, Any]):
        return await self._call("embed", request)

    async def classify(self, request: dict[str, Any]):
        return await self._call("classify", request)

    async def score(self, request: dict[str, Any]):
        return await self._call("score", request)

    async def info(self) -> dict[str, Any]:
        engine = await self.engine.info.remote()
        return {**engine, "tasks": list(TASKS), "max_items": self.settings.max_items,
                "max_request_tokens": self.settings.max_request_tokens}

    async def _call(self, task: str, request: dict[str, Any]):
        key = prefix_key(self.settings.model, task, routing_prefix(self.context, task, request))
        parts = split_request(self.context, task, request, self.settings.max_request_tokens)
        results = await asyncio.gather(*(self.engine.submit.remote(task, sub, prefix_key=key, num_tokens=tokens)
                                         for sub, tokens in parts))
        return merge_results(task, request, results)
