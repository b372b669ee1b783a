"""PrefixAffinityRouter: ranking on fake replicas (no Ray cluster), then on a local Ray Serve (marked `serve`)."""

import asyncio
import time
from collections import Counter, defaultdict

import pytest
import ray
from ray import serve
from ray.serve._private.common import DeploymentHandleSource, DeploymentID, ReplicaID, RequestMetadata
from ray.serve.config import RequestRouterConfig
from ray.serve.request_router import PendingRequest

from deployments.engine_request import EngineRequest
from deployments.hash_ring import HashRing
from deployments.router import PrefixAffinityRouter
from serving import CallResult

DEPLOYMENT = DeploymentID(name="engine", app_name="radixserve")
VNODES = 64
ROUTER_KWARGS = {"load_factor": 1.25, "virtual_nodes": VNODES}


class FakeReplica:
    """The part of `RunningReplica` a router reads."""

    def __init__(self, unique_id: str, max_ongoing_requests: int = 100):
        self.replica_id = ReplicaID(unique_id, DEPLOYMENT)
        self.max_ongoing_requests = max_ongoing_requests

    async def get_queue_len(self, *, deadline_s: float) -> int:
        return 0


def make_router(replicas, **kwargs) -> PrefixAffinityRouter:
    router = PrefixAffinityRouter(deployment_id=DEPLOYMENT, handle_source=DeploymentHandleSource.UNKNOWN,
                                  use_replica_queue_len_cache=True)
    router.initialize_state(**{**ROUTER_KWARGS, **kwargs})
    router.update_replicas(replicas)
    return router


def pending(key=None, cost=None, request_id="r", prefix_cost=0) -> PendingRequest:
    """A routed call carrying an `EngineRequest` with `key`, `cost` (1 when None) and `prefix_cost`; with neither
    key nor cost, a call that carries none."""
    args = ["payload"] if key is None and cost is None else [
        EngineRequest((), key, 1 if cost is None else cost, prefix_cost=prefix_cost)]
    return PendingRequest(args=args, kwargs={},
                          metadata=RequestMetadata(request_id=request_id, internal_request_id=request_id))


async def ranked_ids(router, request) -> list[str]:
    ranks = await router.choose_replicas(list(router.curr_replicas.values()), request)
    assert all(len(rank) == 1 for rank in ranks)
    return [rank[0].replica_id.unique_id for rank in ranks]


def test_router_follows_the_ring_and_spills_when_overloaded():
    async def main():
        replicas = [FakeReplica(f"rep{i}") for i in range(3)]
        router = make_router(replicas)
        ring = HashRing([r.replica_id.unique_id for r in replicas], virtual_nodes=VNODES)
        order = await ranked_ids(router, pending("query-7", 100))
        assert order == ring.walk("query-7")
        # the owner now holds 10 outstanding requests of this key: well over its bounded share
        calls = [CallResult() for _ in range(10)]
        for i, call in enumerate(calls):
            router.on_request_routed(pending("query-7", 100, f"q{i}"), ReplicaID(order[0], DEPLOYMENT), call)
        assert router.loads == {order[0]: 1000.0}
        assert (await ranked_ids(router, pending("query-7", 100)))[0] == order[1]
        for call in calls:
            call.finish()
        router.on_request_completed(ReplicaID(order[0], DEPLOYMENT), "q0")  # Ray's hook: nothing left to release
        await asyncio.sleep(0)  # releases run on the router's loop
        assert router.loads == {} and await ranked_ids(router, pending("query-7", 100)) == order


def test_a_call_that_completes_before_it_is_counted_leaves_no_load():
    """Ray registers a call's completion callback before it awaits the replica's acceptance and calls
    `on_request_routed` after it: a fast call (an `info`, a queue-full refusal) can complete in between. Released
    by `on_request_completed`, it was released before it was counted, and stayed counted for good."""
    async def main():
        router = make_router([FakeReplica("rep0"), FakeReplica("rep1")])
        router.on_request_completed(ReplicaID("rep0", DEPLOYMENT), "fast")  # in Ray's order
        router.on_request_routed(pending(None, 50, "fast"), ReplicaID("rep0", DEPLOYMENT), CallResult(finished=True))
        await asyncio.sleep(0)
        assert router.loads == {}

    asyncio.run(main())


def test_min_load_tokens_keeps_a_burst_together():
    async def main():
        router = make_router([FakeReplica(f"rep{i}") for i in range(3)], min_load_tokens=2000)
        owner = (await ranked_ids(router, pending("k", 100)))[0]
        for i in range(10):
            router.on_request_routed(pending("k", 100, f"q{i}"), ReplicaID(owner, DEPLOYMENT), CallResult())
        assert (await ranked_ids(router, pending("k", 100)))[0] == owner

    asyncio.run(main())


def test_a_keys_owner_counts_its_requests_without_the_prefix_it_holds_cached():
    """A few-shot request of 1,200 rows of which 1,000 are its prompt: 200 on the key's owner once the key's first
    request has gone there (its prefix cache holds the prompt), 1,200 anywhere else and for that first request.
    Counted whole on the owner, 4 such requests there would spill the fifth to a replica that computes the prompt
    again; counted as the device computes them, they stay. Without a prefix cache the owner computes the prompt
    again, and every request counts whole."""
    async def main():
        plain = make_router([FakeReplica("rep0"), FakeReplica("rep1")])
        owner = (await ranked_ids(plain, pending("few-shot", 1200, prefix_cost=1000)))[0]
        for i in range(4):
            plain.on_request_routed(pending("few-shot", 1200, f"q{i}", 1000), ReplicaID(owner, DEPLOYMENT),
                                    CallResult())
        assert plain.loads == {owner: 4800.0}
        assert (await ranked_ids(plain, pending("few-shot", 1200, "q4", 1000)))[0] != owner  # it would spill

        router = make_router([FakeReplica("rep0"), FakeReplica("rep1")], prefix_cache=True)
        other = ({"rep0", "rep1"} - {owner}).pop()
        for i in range(4):
            assert (await ranked_ids(router, pending("few-shot", 1200, f"q{i}", 1000)))[0] == owner
            router.on_request_routed(pending("few-shot", 1200, f"q{i}", 1000), ReplicaID(owner, DEPLOYMENT),
                                     CallResult())
        router.on_request_routed(pending(None, 1200, "keyless"), ReplicaID(other, DEPLOYMENT), CallResult())
        assert router.loads == {owner: 1200.0 + 3 * 200.0, other: 1200.0}  # the first computes the prompt
        assert (await ranked_ids(router, pending("few-shot", 1200, "q4", 1000)))[0] == owner
        router.on_request_routed(pending("few-shot", 1200, "spilled", 1000), ReplicaID(other, DEPLOYMENT),
                                 CallResult())
        assert router.loads[other] == 2400.0  # elsewhere the prompt is computed again: counted whole
        first = CallResult()
        router.on_request_routed(pending("few-shot", 1200, "q5", 1000), ReplicaID(owner, DEPLOYMENT), first)
        first.finish()
        await asyncio.sleep(0)
        assert router.loads[owner] == 1800.0

    asyncio.run(main())


def test_with_a_prefix_cache_a_keys_owner_passes_the_bound_by_the_prefix_a_spill_would_compute_again():
    """A few-shot request of 1,200 rows, 1,000 of them its prompt, on two replicas: its key's owner holds `held`
    tokens of other work, the other replica none. The bound is 1.25 x (held + 1,200) / 2: 2,250 with 2,400 held,
    3,875 with 5,000. Without a prefix cache every replica computes the prompt, so the request spills as soon as the
    owner is over the bound; with one, a spill computes the prompt again, so the owner takes the request until it is
    over the bound by more than the prompt's 1,000 rows, once it holds the prompt (a request of the key went there
    and finished): before that, a spill costs nothing the owner has, and the plain bound holds."""
    async def main():
        for prefix_cache, sent, held, stays in ((False, True, 2400, False), (True, True, 2400, True),
                                                (True, True, 5000, False), (True, False, 2400, False)):
            router = make_router([FakeReplica("rep0"), FakeReplica("rep1")], prefix_cache=prefix_cache)
            owner = (await ranked_ids(router, pending("few-shot", 1200, prefix_cost=1000)))[0]
            if sent:  # and as much finished work on the other replica, so that the key does not move (KeyHomes)
                other = ({"rep0", "rep1"} - {owner}).pop()
                for replica, work in ((owner, pending("few-shot", 1200, "first", 1000)), (other, pending(None, held))):
                    done = CallResult()
                    router.on_request_routed(work, ReplicaID(replica, DEPLOYMENT), done)
                    done.finish()
                await asyncio.sleep(0)
            router.on_request_routed(pending(None, held, "other work"), ReplicaID(owner, DEPLOYMENT), CallResult())
            ranked = await ranked_ids(router, pending("few-shot", 1200, "next", 1000))
            assert (ranked[0] == owner) is stays, (prefix_cache, sent, router.loads, ranked)

    asyncio.run(main())


def test_with_a_prefix_cache_keys_move_off_the_replica_that_owns_more_of_them():
    """Three few-shot prompts owned by rep0 on the ring and one by rep1, asked in turn by clients that wait for each
    answer: no work piles up, so bounded loads never spill, and rep0 would do 3/4 of the work. With a prefix cache
    one prompt moves to rep1 (its requests are then counted there without their prefix) and stays; without a cache
    every replica computes the prompt anyway, and keys stay on their ring owners."""
    async def main():
        ring = HashRing(["rep0", "rep1"], virtual_nodes=VNODES)
        by_owner = {r: [f"prompt-{i}" for i in range(40) if ring.walk(f"prompt-{i}")[0] == r] for r in ring.members}
        keys = by_owner["rep0"][:3] + by_owner["rep1"][:1]
        for prefix_cache in (True, False):
            router = make_router([FakeReplica("rep0"), FakeReplica("rep1")], prefix_cache=prefix_cache)
            firsts = Counter()
            for i in range(400):
                key = keys[i % 4]
                first = (await ranked_ids(router, pending(key, 1200, f"q{i}", 1000)))[0]
                firsts[key, first] += 1
                call = CallResult()
                router.on_request_routed(pending(key, 1200, f"q{i}", 1000), ReplicaID(first, DEPLOYMENT), call)
                call.finish()
                await asyncio.sleep(0)
            homes = {key: first for (key, first), n in firsts.items() if n > 50}
            owners = {key: ring.walk(key)[0] for key in keys}
            if prefix_cache:
                assert Counter(homes.values()) == {"rep0": 2, "rep1": 2}, firsts
                assert sum(n for (key, first), n in firsts.items() if first != owners[key]) > 300 / 4, firsts
            else:
                assert homes == owners and len(firsts) == 4, firsts
            assert router.loads == {}

    asyncio.run(main())


def test_keyless_requests_go_least_loaded():
    async def main():
        router = make_router([FakeReplica(f"rep{i}") for i in range(3)])
        router.on_request_routed(pending(None, 50, "a"), ReplicaID("rep0", DEPLOYMENT), CallResult())
        router.on_request_routed(pending(None, 20, "b"), ReplicaID("rep1", DEPLOYMENT), CallResult())
        assert await ranked_ids(router, pending(request_id="c")) == ["rep2", "rep1", "rep0"]
        # a call without an EngineRequest weighs one token
        router.on_request_routed(pending(None, None, "d"), ReplicaID("rep2", DEPLOYMENT), CallResult())
        assert router.loads["rep2"] == 1.0

    asyncio.run(main())


def test_full_replicas_are_ranked_last():
    async def main():
        router = make_router([FakeReplica(f"rep{i}", max_ongoing_requests=4) for i in range(3)])
        order = await ranked_ids(router, pending("k"))
        router.replica_queue_len_cache.update(ReplicaID(order[0], DEPLOYMENT), 4)
        assert await ranked_ids(router, pending("k")) == order[1:] + order[:1]

    asyncio.run(main())


def test_removing_a_replica_moves_only_its_keys():
    async def main():
        replicas = [FakeReplica(f"rep{i}") for i in range(4)]
        router = make_router(replicas)
        keys = [f"key-{i}" for i in range(200)]
        before = {k: (await ranked_ids(router, pending(k)))[0] for k in keys}
        router.on_request_routed(pending("key-0", 10, "x"), replicas[3].replica_id, CallResult())
        router.update_replicas(replicas[:3])
        after = {k: (await ranked_ids(router, pending(k)))[0] for k in keys}
        assert all(after[k] == before[k] for k in keys if before[k] != "rep3")
        assert "rep3" not in after.values() and "rep3" not in router.loads

    asyncio.run(main())


def test_unknown_router_kwargs_are_rejected():
    with pytest.raises(ValueError, match=r"unknown request_router_kwargs \['load_factr'\]"):
        make_router([], load_factr=2)


# ---- on a local Ray Serve -------------------------------------------------------------------------------------

KEYS = [f"model|rerank|query-{i}" for i in range(8)]
PER_KEY = 20


def affinity_app(fan_out: bool = False):
    """Three replicas whose `score` answers with the replica it ran on, routed by PrefixAffinityRouter; with
    `fan_out`, behind a parent deployment that sends each call on as PER_KEY concurrent calls (as the ingress
    does for a tei.v1 call of several queries; they inherit the parent's internal request id).

    Defined in a function so cloudpickle ships it by value (replica workers cannot import the test module).
    """

    @serve.deployment(
        name="engine", num_replicas=3, max_ongoing_requests=64, ray_actor_options={"num_cpus": 0},
        request_router_config=RequestRouterConfig(
            request_router_class="deployments.router:PrefixAffinityRouter",
            # a burst of PER_KEY requests x 2 tokens stays under min_load_tokens, so it never spills
            request_router_kwargs={**ROUTER_KWARGS, "min_load_tokens": 1000}))
    class WhoAmI:
        async def score(self, request: EngineRequest):
            return serve.get_replica_context().replica_id.unique_id

        def info(self):
            return serve.get_replica_context().replica_id.unique_id

    @serve.deployment(name="parent", ray_actor_options={"num_cpus": 0})
    class FanOut:
        def __init__(self, engine):
            self.engine = engine

        async def score(self, key):
            calls = [self.engine.score.remote(EngineRequest((), key, 2)) for _ in range(PER_KEY)]
            return await asyncio.gather(*calls)

    return FanOut.bind(WhoAmI.bind()) if fan_out else WhoAmI.bind()


def replicas_per_key(handle) -> dict[str, Counter]:
    """Send PER_KEY concurrent requests per key (keys one after another); count where each key's requests ran."""
    seen = defaultdict(Counter)
    for key in KEYS:
        responses = [handle.score.remote(EngineRequest((), key, 2)) for _ in range(PER_KEY)]
        seen[key].update(r.result(timeout_s=30) for r in responses)
    return seen


@pytest.fixture
def local_serve(serve_cluster):
    serve_cluster.ensure()
    try:
        yield
    finally:
        serve_cluster.clear()


def scale_engine(num_replicas: int) -> None:
    """Set the replica count the way Serve's REST scale endpoint does (`external_scaler_enabled` apps).

    Not a redeploy: `serve.run` gives every deployment a fresh random code version, so redeploying even the same
    app with another `num_replicas` replaces all replicas; a scale request stops one and keeps the others.
    """
    from ray.serve._private.constants import SERVE_CONTROLLER_NAME, SERVE_NAMESPACE

    controller = ray.get_actor(SERVE_CONTROLLER_NAME, namespace=SERVE_NAMESPACE)
    ray.get(controller.update_deployment_replicas.remote(DeploymentID("engine", "affinity"), num_replicas),
            timeout=30)


def replica_ids() -> set[str]:
    """Unique ids of the app's live replicas, from their actor names (`SERVE_REPLICA::affinity#engine#<id>`)."""
    prefix = "SERVE_REPLICA::affinity#engine#"
    return {a["name"][len(prefix):] for a in ray.util.list_named_actors(all_namespaces=True)
            if a["name"].startswith(prefix)}


def wait_for_replicas(expected: int, timeout_s: float = 30.0) -> set[str]:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        ids = replica_ids()
        if len(ids) == expected:
            return ids
        time.sleep(0.2)
    raise AssertionError(f"expected {expected} replicas within {timeout_s}s, have {replica_ids()}")


@pytest.mark.serve
@pytest.mark.slow
@pytest.mark.timeout(120)
def test_one_prefix_one_replica_and_scale_down_keeps_survivors(local_serve):
    handle = serve.run(affinity_app(), name="affinity", route_prefix=None, external_scaler_enabled=True)
    before = replicas_per_key(handle)
    assert all(len(c) == 1 for c in before.values()), before  # every key stuck to one replica
    owner = {k: next(iter(c)) for k, c in before.items()}
    replicas = {r for c in before.values() for r in c}
    assert len(replicas) >= 2, before  # eight keys do not all hash to one replica
    # and that replica is the ring owner, as any other process would compute it
    ring_replicas = replica_ids()
    assert replicas <= ring_replicas and len(ring_replicas) == 3
    assert all(HashRing(ring_replicas, virtual_nodes=VNODES).walk(k)[0] == owner[k] for k in KEYS)

    scale_engine(2)
    survivors = wait_for_replicas(expected=2)
    assert survivors < ring_replicas, "scaling down restarted replicas instead of stopping one"
    after = replicas_per_key(handle)  # the same handle: its router's ring followed the change
    assert all(len(c) == 1 for c in after.values()), after
    new_owner = {k: next(iter(c)) for k, c in after.items()}
    assert all(new_owner[k] == owner[k] for k in KEYS if owner[k] in survivors)  # survivors keep their keys
    assert all(new_owner[k] == HashRing(survivors, virtual_nodes=VNODES).walk(k)[0] for k in KEYS)


@pytest.mark.serve
@pytest.mark.slow
@pytest.mark.timeout(120)
def test_fanned_out_sub_requests_all_route_to_the_key_owner(local_serve):
    """Sub-requests sharing their parent's internal request id are each served (Ray's base router would match
    only the first of them and leave the rest waiting) and all land on the key's replica."""
    handle = serve.run(affinity_app(fan_out=True), name="affinity", route_prefix=None)
    handle.score.remote("warm-up").result(timeout_s=30)  # fills the parent router's queue-length cache
    for key in KEYS[:3]:
        served_by = handle.score.remote(key).result(timeout_s=30)
        assert len(served_by) == PER_KEY and len(set(served_by)) == 1, served_by


@pytest.mark.serve
@pytest.mark.slow
@pytest.mark.timeout(120)
def test_fast_calls_leave_no_load_behind(local_serve):
    """600 keyless calls that finish at once (sequential, then concurrent): when they are done, the handle's router
    counts nothing outstanding. Released by Ray's `on_request_completed`, 18 of them stayed counted for good (the
    hook can run before `on_request_routed`), and keyless calls, ranked least loaded first, avoided their replica."""
    handle = serve.run(affinity_app(), name="affinity", route_prefix=None)
    served_by = Counter(handle.info.remote().result(timeout_s=30) for _ in range(300))
    calls = [handle.info.remote() for _ in range(300)]
    served_by.update(call.result(timeout_s=30) for call in calls)
    router = handle._router._asyncio_router.request_router  # the handle's own router (private Ray API)
    deadline = time.monotonic() + 10  # the last releases are scheduled on the router's loop
    while router.loads and time.monotonic() < deadline:
        time.sleep(0.1)
    assert router.loads == {}, served_by
