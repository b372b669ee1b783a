"""`deployments.lost_calls`: the proxy's INTERNAL for a lost call becomes UNAVAILABLE; the ingress's own statuses,
INTERNAL for a server fault included, pass unchanged. (The served case, a killed ingress replica, is in
`test_chaos.py`.)"""

from __future__ import annotations

import asyncio

import grpc
import pytest

from deployments.lost_calls import LOST, answer_lost, install
from deployments.request_ids import REQUEST_ID_KEY


class Context:
    """The part of grpc's aio servicer context the proxy's handlers set and `answer_lost` reads."""

    def __init__(self, code, details: str, trailing: tuple = ()):
        self._code, self._details, self._trailing = code, details, trailing

    def code(self):
        return self._code

    def details(self):
        return self._details

    def trailing_metadata(self):
        return self._trailing

    def set_code(self, code):
        self._code = code

    def set_details(self, details: str):
        self._details = details


@pytest.mark.parametrize("code", [grpc.StatusCode.INTERNAL, grpc.StatusCode.INTERNAL.value[0]])
def test_an_internal_status_the_ingress_did_not_set_becomes_unavailable(code):
    context = Context(code, "ActorDiedError: the actor died unexpectedly", (("request_id", "ray-id"),))
    answer_lost(context)
    assert (context.code(), context.details()) == (grpc.StatusCode.UNAVAILABLE, LOST)


@pytest.mark.parametrize("code", [grpc.StatusCode.INTERNAL, grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.OK])
def test_the_ingress_answers_pass_unchanged(code):
    context = Context(code, "internal error (KeyError); the server logged the details", ((REQUEST_ID_KEY, "id"),))
    answer_lost(context)
    assert context.code() == code


def test_other_proxy_statuses_pass_unchanged():
    context = Context(grpc.StatusCode.NOT_FOUND, "Application metadata not set.")
    answer_lost(context)
    assert context.code() == grpc.StatusCode.NOT_FOUND


class Server:
    """Ray's gRPC proxy server as `install` sees it: a factory of handlers by method and streaming type."""

    def __init__(self):
        self.service_handler_factory = self.handlers

    @staticmethod
    def handlers(service_method: str, streaming_type: str):
        async def unary(request, context):
            context.set_code(grpc.StatusCode.INTERNAL)
            return b"unary"

        async def streamed(request, context):
            yield b"one"
            context.set_code(grpc.StatusCode.INTERNAL)
        return streamed if streaming_type == "stream" else unary


def test_install_wraps_unary_and_streamed_handlers_once():
    server = Server()
    install(None, server)
    wrapped = server.service_handler_factory
    install(None, server)
    assert server.service_handler_factory is wrapped

    async def run():
        unary_context, stream_context = Context(None, ""), Context(None, "")
        reply = await wrapped("/radixserve.v1.Scoring/Rerank", "unary")(b"", unary_context)
        messages = [m async for m in wrapped("/radixserve.v1.Scoring/Rerank", "stream")(b"", stream_context)]
        return reply, messages, unary_context.code(), stream_context.code()

    assert asyncio.run(run()) == (b"unary", [b"one"], grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.UNAVAILABLE)
