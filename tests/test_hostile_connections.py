"""Hostile connections against the served application on a local Ray (Ray Serve's HTTP and gRPC proxies, one
keyed ingress replica with the default `placement.ingress.max_ongoing_requests` of 1,024): a flood of peers without a
key that send headers and then nothing (HTTP bodies, tei.v1 client streams) is refused from the headers at once, so an
authenticated call still answers; a client stream over the item limit is refused whole through the proxy; input
that never comes is dropped after the server's bound. And the engine replica's IndexBuilder: its health ping is
answered while a build runs, and a build on a builder the health probe already replaced keeps the replacement.
"""

from __future__ import annotations

import asyncio
import collections
import signal
import time
from pathlib import Path

import grpc
import httpx
import pytest
import ray
from ray.exceptions import RayActorError
from serving import GrpcDeployment, Launched, free_port, wait_until_serving, write_config

from deployments.engine_replica import EngineReplica
from deployments.launcher import raise_open_files_limit
from deployments.index_builder import IndexBuilder
from radix_core.batch import BatchLimits
from radixserve.client import ScoringClient
from radixserve.tei.v1 import tei_pb2 as tei
from radixserve.tei.v1 import tei_pb2_grpc

KEY = "hostile-key"
AUTH = [("authorization", f"Bearer {KEY}")]
FLOOD = 1030  # over the ingress replica's 1,024 request slots
MAX_ITEMS = 16
DOCS = ["A trie is a prefix tree.", "Bread rises in a warm oven."]
ANSWER_S = 20  # what an authenticated call may take while the flood is refused (2 busy CPUs)
INPUT_TIMEOUT_S = 5.0  # client_input_timeout_s here (30 s by default): how long the server waits for input


class Deployment(GrpcDeployment):
    """The keyed application on both proxies: gRPC at `address`, HTTP at `http_url`."""

    def __init__(self, model_dir: str, keys_file: Path):
        super().__init__(
            base={"model": model_dir, "tasks": {"max_items": MAX_ITEMS},
                  "limits": {"client_input_timeout_s": INPUT_TIMEOUT_S},
                  "placement": {"engine": {"cpus": 0.5}, "ingress": {"cpus": 0.5}}},
            configs={"keyed": {"auth": {"api_keys_file": str(keys_file)}}},
            probe=lambda channel: tei_pb2_grpc.InfoStub(channel).Info(tei.InfoRequest(), timeout=10),
            keyed=frozenset({"keyed"}))

    @property
    def http_url(self) -> str:
        return f"http://127.0.0.1:{self.http_port}"


@pytest.fixture(scope="module")
def deployment(tiny_model_dir, tmp_path_factory, serve_cluster):
    keys_file = tmp_path_factory.mktemp("keys") / "api-keys"
    keys_file.write_text(KEY + "\n")
    served = Deployment(str(tiny_model_dir("qwen3", "causal_lm")), keys_file)
    try:
        served.start(serve_cluster)
        yield served.use("keyed")
    finally:
        served.stop()


def authenticated_calls_answer(deployment: Deployment) -> None:
    """A small authenticated rerank answers on HTTP and on gRPC, each within ANSWER_S."""
    reply = httpx.post(f"{deployment.http_url}/rerank", json={"query": "what is a trie", "texts": DOCS},
                       headers={"Authorization": f"Bearer {KEY}"}, timeout=ANSWER_S)
    assert reply.status_code == 200 and len(reply.json()) == len(DOCS), reply.text
    ranks = tei_pb2_grpc.RerankStub(deployment.channel).Rerank(
        tei.RerankRequest(query="what is a trie", texts=DOCS), metadata=AUTH, timeout=ANSWER_S).ranks
    assert len(ranks) == len(DOCS)


async def stalled_posts(port: int, count: int, headers: str = "",
                        body_start: str = "") -> list[tuple[asyncio.StreamReader, asyncio.StreamWriter]]:
    """`count` connections that each send a POST's headers, declaring a 99,999-byte body, and `body_start` of it,
    and then nothing."""
    request = (f"POST /rerank HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n{headers}"
               f"Content-Length: 99999\r\n\r\n{body_start}").encode()
    connections = []
    for _ in range(count):
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(request)
        connections.append((reader, writer))
    await asyncio.gather(*(writer.drain() for _, writer in connections))
    return connections


async def status_lines(connections, timeout_s: float) -> list[bytes]:
    """The status line each connection got, all within `timeout_s`."""
    return await asyncio.wait_for(asyncio.gather(*(reader.readline() for reader, _ in connections)), timeout_s)


def close(connections) -> None:
    for _, writer in connections:
        writer.close()


@pytest.mark.serve
@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_flood_of_stalled_bodies_without_a_key_leaves_room_for_authenticated_calls(deployment):
    async def flood() -> list[bytes]:
        connections = await stalled_posts(deployment.http_port, FLOOD)
        try:
            lines = await status_lines(connections, 60)
            await asyncio.to_thread(authenticated_calls_answer, deployment)  # while every stalled socket is open
            return lines
        finally:
            close(connections)

    lines = asyncio.run(flood())
    assert lines == [b"HTTP/1.1 401 Unauthorized\r\n"] * FLOOD


@pytest.mark.serve
@pytest.mark.slow
@pytest.mark.timeout(300)
def test_idle_client_streams_without_a_key_are_refused_at_once(deployment):
    async def flood() -> list[grpc.StatusCode]:
        channels = [grpc.aio.insecure_channel(deployment.address) for _ in range(FLOOD // 100 + 1)]
        try:
            stubs = [tei_pb2_grpc.RerankStub(channel) for channel in channels]
            calls = [stubs[i % len(stubs)].RerankStream() for i in range(FLOOD)]  # opened, never written to
            codes = await asyncio.wait_for(asyncio.gather(*(code_of(call) for call in calls)), 60)
            await asyncio.to_thread(authenticated_calls_answer, deployment)
            return codes
        finally:
            await asyncio.gather(*(channel.close() for channel in channels))

    codes = asyncio.run(flood())
    # Each ends at once, before a message is read. Ray's proxy answers a stream its replica ended early with the
    # replica's status, or, racing with the client's open stream under load, with CANCELLED: both are a refusal.
    assert set(codes) <= {grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.CANCELLED}, set(codes)
    assert codes.count(grpc.StatusCode.UNAUTHENTICATED) > len(codes) // 2


async def code_of(call) -> grpc.StatusCode:
    """The status a gRPC aio call ends with."""
    try:
        await call
    except grpc.aio.AioRpcError as err:
        return err.code()
    return grpc.StatusCode.OK


@pytest.mark.serve
@pytest.mark.timeout(180)
def test_a_client_stream_is_answered_whole_or_refused_whole(deployment):
    stub = tei_pb2_grpc.RerankStub(deployment.channel)

    def messages(count: int) -> list[tei.RerankStreamRequest]:  # over two queries
        return [tei.RerankStreamRequest(query=f"query {i % 2}", text=f"text {i}") for i in range(count)]

    reply = stub.RerankStream(iter(messages(MAX_ITEMS)), metadata=AUTH, timeout=60)
    assert sorted(rank.index for rank in reply.ranks) == list(range(MAX_ITEMS))
    for count in (MAX_ITEMS + 100, 2048):
        with pytest.raises(grpc.RpcError) as caught:
            stub.RerankStream(iter(messages(count)), metadata=AUTH, timeout=60)
        assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert caught.value.details().startswith(f"the stream has more than {MAX_ITEMS} messages, the limit of one "
                                                 "call (tasks.max_items)")


@pytest.mark.serve
@pytest.mark.slow
@pytest.mark.timeout(240)
def test_input_that_never_comes_is_dropped_after_the_servers_bound(deployment):
    """With a valid key: a body that never comes gets 408, a client stream that never ends and a bidirectional
    stream that goes quiet end with DEADLINE_EXCEEDED, each after its bound (`client_input_timeout_s`), through
    the proxies."""
    async def stalled() -> tuple[bytes, grpc.aio.AioRpcError, grpc.aio.AioRpcError]:
        connections = await stalled_posts(deployment.http_port, 1, f"Authorization: Bearer {KEY}\r\n")
        async with grpc.aio.insecure_channel(deployment.address) as channel:
            client_stream = tei_pb2_grpc.RerankStub(channel).RerankStream(metadata=AUTH)
            await client_stream.write(tei.RerankStreamRequest(query="q", text="t"))
            bidirectional = tei_pb2_grpc.EmbedStub(channel).EmbedStream(metadata=AUTH)
            try:
                (line,) = await status_lines(connections, INPUT_TIMEOUT_S + 30)
                errors = [await asyncio.wait_for(ended(call), INPUT_TIMEOUT_S + 30)
                          for call in (client_stream, bidirectional)]
            finally:
                close(connections)
        return line, *errors

    started = time.monotonic()
    line, client_stream, bidirectional = asyncio.run(stalled())
    assert line == b"HTTP/1.1 408 Request Timeout\r\n"
    assert client_stream.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    assert client_stream.details().startswith(f"the stream did not end within {INPUT_TIMEOUT_S:g} s")
    assert bidirectional.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    assert bidirectional.details().startswith(f"no message came on the stream for {INPUT_TIMEOUT_S:g} s")
    assert time.monotonic() - started < INPUT_TIMEOUT_S + 30


STALLED = 2000  # HTTP bodies that stop after their first bytes, and as many gRPC client streams that send nothing
ANSWER_WHILE_STALLED_S = 5.0  # what a normal request on either port may take while they hang (before the fix: never)
# Ray's proxies hand 4,000 new calls to the ingress one by one (a route and a replica probe each): on 2 busy CPUs
# that takes several seconds, during which a new call waits behind them; measured from the calls' start, not the slots.
# After SETTLE_S the normal calls took 0.07-0.15 s over HTTP and 0.02-0.05 s over gRPC, but 2.2 s over HTTP in one run
# of four (the proxy still handing the stalled calls over): with a 1 s bound the test failed 2 runs in 4 on this VM.
SETTLE_S = 15
ONE_ENGINE = {"engine": {"num_replicas": 1, "autoscaling": None, "cpus": 0.5}, "ingress": {"cpus": 0.5}}


@pytest.mark.serve
@pytest.mark.slow
@pytest.mark.timeout(300)
def test_stalled_input_on_an_open_server_holds_no_slot_a_complete_request_needs(tiny_model_dir, workdir):
    """The README's serve command without API keys (one engine replica, for 2 CPUs): while 2,000 HTTP bodies stop
    after their first bytes and 2,000 tei.v1 client streams send nothing, a normal rerank on each port answers
    within ANSWER_WHILE_STALLED_S. (Before, they took the ingress's 1,024 request slots and both ports stopped.)"""
    raise_open_files_limit()  # this process holds the client ends of the stalled connections
    http_port, grpc_port = free_port(), free_port()
    config = write_config(workdir / "c.yaml", http_port, grpc_port, placement=ONE_ENGINE)
    launched = Launched(config, tiny_model_dir(), workdir)
    http_url, grpc_address = f"http://127.0.0.1:{http_port}", f"127.0.0.1:{grpc_port}"

    def rerank_on_both_ports(timeout_s: float) -> None:
        reply = httpx.post(f"{http_url}/rerank", json={"query": "what is a trie", "texts": DOCS}, timeout=timeout_s)
        assert reply.status_code == 200 and len(reply.json()) == len(DOCS), reply.text
        with grpc.insecure_channel(grpc_address) as channel:
            ranks = tei_pb2_grpc.RerankStub(channel).Rerank(tei.RerankRequest(query="what is a trie", texts=DOCS),
                                                            timeout=timeout_s).ranks
        assert len(ranks) == len(DOCS)

    async def stall_and_call() -> None:
        connections = await stalled_posts(http_port, STALLED, body_start='{"query": "what is')
        channels = [grpc.aio.insecure_channel(grpc_address) for _ in range(STALLED // 100)]
        try:
            stubs = [tei_pb2_grpc.RerankStub(channel) for channel in channels]
            streams = [stubs[i % len(stubs)].RerankStream() for i in range(STALLED)]  # opened, never written to
            await asyncio.sleep(SETTLE_S)
            await asyncio.to_thread(rerank_on_both_ports, ANSWER_WHILE_STALLED_S)
            ended = [stream for stream in streams if stream.done()]
            codes = await asyncio.gather(*(code_of(stream) for stream in ended))
            # the flood still hangs: most streams are open (some, ~10% here, end CANCELLED early: not understood)
            assert len(ended) < STALLED // 2, collections.Counter(codes)
        finally:
            close(connections)
            await asyncio.gather(*(channel.close() for channel in channels))

    try:
        with ScoringClient(grpc_address, timeout_s=60, retries=0) as client:
            wait_until_serving(client, launched)
        rerank_on_both_ports(60)  # warm: the first calls load what the later ones reuse
        asyncio.run(stall_and_call())
        launched.proc.send_signal(signal.SIGTERM)
        assert launched.wait(90) == 0, launched.log[-3000:]
    finally:
        launched.kill()


async def ended(call) -> grpc.aio.AioRpcError:
    """The error a call that is expected to fail ends with (its replies, if any, are read and dropped)."""
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        if isinstance(call, grpc.aio.StreamStreamCall):
            async for _ in call:
                pass
        else:
            await call
    return caught.value


@pytest.mark.serve
@pytest.mark.timeout(120)
def test_the_index_builder_answers_its_ping_while_a_build_runs(deployment):
    class SlowJob:
        """A job whose sequences take 3 s to come (a long build), without holding the GIL."""

        @property
        def sequences(self):
            from radix_core.tokens import TokenSequences

            time.sleep(3)
            return TokenSequences.from_lists([[1, 2, 3], [1, 2, 4]])

    builder = ray.remote(num_cpus=0)(IndexBuilder).remote(BatchLimits(1000, 64, 0.9), "auto")
    try:
        assert ray.get(builder.ping.remote(), timeout=60)
        build = builder.build.remote([SlowJob()])
        time.sleep(1)  # the build is running
        started = time.monotonic()
        assert ray.get(builder.ping.remote(), timeout=10)
        assert time.monotonic() - started < 1.0
        assert ray.get(build, timeout=30).num_tokens == 6
    finally:
        ray.kill(builder)


class Builder:
    """An IndexBuilder actor handle's stand-in: `ping` answers or (dead) fails; `build` returns `batch`, or fails
    once `fail` is set (the actor died meanwhile)."""

    def __init__(self, name: str):
        self.name, self.dead, self.fail = name, False, asyncio.Event()
        self.ping = self.Method(self._ping)
        self.build = self.Method(self._build)

    class Method:
        def __init__(self, function):
            self.remote = function

    async def _ping(self) -> bool:
        if self.dead:
            raise RayActorError()
        return True

    async def _build(self, jobs):
        await self.fail.wait()
        raise RayActorError()


class Engine:
    def check_device(self):
        pass


class Metrics:
    def __init__(self):
        self.restarts = []

    def restarted(self, reason: str) -> None:
        self.restarts.append(reason)


def replica_with(builder: Builder, replacements: list[Builder], monkeypatch) -> tuple[object, list[str]]:
    """An EngineReplica's builder handling alone: `builder` (not yet answered), then `replacements` as it starts
    new ones, a batch running (the next one goes to the IndexBuilder), the compute thread's build a stand-in; and
    the names of the builders it kills."""
    replica = object.__new__(EngineReplica.func_or_class)
    replica.engine, replica.metrics, replica.builder, replica._builder_up = Engine(), Metrics(), builder, False
    replica._forwards = 1
    replica._new_builder = iter(replacements).__next__

    async def build_here(jobs):
        return "built here"
    replica._build_here = build_here
    killed = []
    monkeypatch.setattr("deployments.engine_replica.ray.kill", lambda actor, no_restart: killed.append(actor.name))
    return replica, killed


def test_a_failed_build_keeps_the_builder_the_health_probe_started(monkeypatch):
    """Builder A dies during a build; the health probe finds it dead first and starts B; the build then fails: the
    batch is built on the compute thread (B may not have started, and may die too) and B is kept, not killed."""
    first, second = Builder("A"), Builder("B")
    replica, killed = replica_with(first, [second, Builder("C")], monkeypatch)

    async def main():
        build = asyncio.create_task(replica._build([("job", None)]))  # (job, prefix cache scope)
        await asyncio.sleep(0.01)  # the build waits on A
        first.dead = True
        await replica.check_health()  # A is dead: replaced by B
        first.fail.set()  # and the build on A fails
        return await asyncio.wait_for(build, 5)

    assert asyncio.run(main()) == ([("job", None)], "built here")
    assert (killed, replica.builder.name, replica.metrics.restarts) == (["A"], "B", ["health"])


def test_the_health_probe_leaves_a_starting_builder_to_start(monkeypatch):
    """A builder that has not answered yet (its worker process still starting: over 10 s with four replicas on a
    loaded 2-CPU node) is not replaced when its ping times out; replaced on every probe, it never started, and the
    builds waiting on it failed (routing_bench: every replica's builder killed every 10 s). One that answered
    before and then stops answering is replaced."""
    class Silent(Builder):
        """Answers its ping only once `awake`."""

        def __init__(self, name: str):
            super().__init__(name)
            self.awake = False

        async def _ping(self) -> bool:
            while not self.awake:
                await asyncio.sleep(0.01)
            return True

    builder = Silent("A")
    replica, killed = replica_with(builder, [Builder("B")], monkeypatch)
    monkeypatch.setattr("deployments.engine_replica.BUILDER_PING_TIMEOUT_S", 0.05)

    async def main():
        await replica.check_health()  # starting: left alone
        assert (killed, replica.builder.name) == ([], "A")
        builder.awake = True
        await replica.check_health()  # it answers: it started
        builder.awake = False
        await replica.check_health()  # it answered before and no longer does: replaced

    asyncio.run(main())
    assert (killed, replica.builder.name, replica.metrics.restarts) == (["A"], "B", ["health"])
