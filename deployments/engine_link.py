"""How an ingress replica reaches its engine (`placement.topology`): the two calls it makes of it, `submit` and
`info`, over one of two links.

    engine = RemoteEngine(handle)                      # split: the engine deployment, through Ray
    engine = LocalEngine(args, engine_config)          # combined: an EngineReplica in the ingress's own process
    reply = await engine.submit(EngineRequest.of(parts, key, priority, scope))

**split** (the default): the ingress calls the `EngineReplica` deployment through its DeploymentHandle, and
`PrefixAffinityRouter` sends each prefix key to one of the engine replicas (where its cached K/V live). Each request
crosses Ray twice more (ingress -> engine replica and back), and each replica is a process of its own.

**combined**: the ingress replica builds its `EngineReplica` itself and calls it in the same process and event
loop: a request takes one Ray hop fewer, and the node runs one replica process fewer beside the forward (what
that saves: README, "Serving: what runs where"). Ray Serve's proxy then picks the replica by load, knowing no prefix key: with
several replicas, requests of one prefix no longer meet in one replica's batches and prefix cache. For one engine
replica (a one-GPU node, a CPU machine) that costs nothing.

Cancellation is the same over both: cancelling the ingress's call cancels the awaited `submit`, whose parts leave
the batcher's queue (`deployments.batcher`).
"""

from __future__ import annotations

from typing import Any, Protocol

from ray.serve.handle import DeploymentHandle

from deployments.batcher import QueueFullError
from deployments.config import AppArgs
from deployments.engine_replica import EngineReplica
from deployments.engine_request import EngineRequest
from radix_core import EngineConfig


class EngineLink(Protocol):
    async def submit(self, request: EngineRequest) -> list[Any] | QueueFullError:
        """The partial results of the request's parts, in order, or its refusal (`EngineReplica.submit`)."""

    async def info(self) -> dict[str, Any]:
        """The engine replica's facts and counters (`EngineReplica.info`)."""

    async def check_health(self) -> None:
        """Raises when the engine this link holds can no longer compute (nothing to check through a handle: Serve
        probes the engine deployment's replicas itself)."""


class RemoteEngine:
    """The engine deployment through its DeploymentHandle (`placement.topology: split`)."""

    def __init__(self, handle: DeploymentHandle):
        self.handle = handle

    async def submit(self, request: EngineRequest) -> list[Any] | QueueFullError:
        return await self.handle.submit.remote(request)

    async def info(self) -> dict[str, Any]:
        return await self.handle.info.remote()

    async def check_health(self) -> None:
        return None


class LocalEngine:
    """An `EngineReplica` made in this process (`placement.topology: combined`): the model loaded and warmed up
    here, its batcher on this event loop, its IndexBuilder actor beside it."""

    def __init__(self, args: AppArgs, engine: EngineConfig):
        self.replica = EngineReplica.func_or_class(args, engine)

    async def submit(self, request: EngineRequest) -> list[Any] | QueueFullError:
        return await self.replica.submit(request)

    async def info(self) -> dict[str, Any]:
        return self.replica.info()

    async def check_health(self) -> None:
        await self.replica.check_health()
