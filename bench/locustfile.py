"""A Locust load test of the HTTP APIs at the sizes their clients send: Cohere v2 reranks of 1,000 documents (the
most Cohere's API takes), OpenAI embedding requests of 256 texts and TEI reranks of 64 texts, each user sending
its next request when the last is answered (a closed loop, as an SDK in a worker does). Users are shared evenly
by the three APIs (`--users 3`: one each).

    locust -f bench/locustfile.py --host http://127.0.0.1:8000 --headless --users 3 --run-time 60s \
        [--documents 1000] [--texts 256] [--tei-texts 64] [--api-key KEY]

Texts are MS MARCO-shaped (`bench/workloads.py`): a search query of the corpus, and passages of its sentences of
30-90 words (about 40-120 tokens), every query and passage numbered so that requests share only the prompt
template (and a request's documents its query), as real traffic does. Any answer but 200 is a failure, 429
(overload) included: a closed loop of a few users is work the server must queue, not refuse. Locust's own table
gives requests/s and latency percentiles per route; `--csv PREFIX` writes them. Needs `pip install locust` and
this repository installed (`make install`: the corpus ships with `radix_core`), not the model.
"""

from __future__ import annotations

import itertools

import numpy as np
from locust import FastHttpUser, events, task
from workloads import corpus_text, passage

WORDS = (30, 90)  # words per passage: MS MARCO's 40-120 tokens at about 1.3 tokens a word
_numbers = itertools.count()


@events.init_command_line_parser.add_listener
def _arguments(parser) -> None:
    parser.add_argument("--documents", type=int, default=1000, help="documents per Cohere rerank (at most 1,000)")
    parser.add_argument("--texts", type=int, default=256, help="texts per OpenAI embeddings request")
    parser.add_argument("--tei-texts", type=int, default=64, help="texts per TEI rerank")
    parser.add_argument("--api-key", default="", help="the server's API key, when it has keys")


class Texts:
    """Numbered search queries and passages drawn from the corpus."""

    def __init__(self, seed: int):
        self.rng = np.random.default_rng(seed)
        self.queries, self.sentences = corpus_text()

    def query(self) -> str:
        return f"{next(_numbers)} {self.queries[int(self.rng.integers(len(self.queries)))]}"

    def passages(self, count: int) -> list[str]:
        lengths = self.rng.integers(WORDS[0], WORDS[1] + 1, size=count)
        return [f"{next(_numbers)} {passage(self.sentences, count_words, int(n), self.rng)}" for n in lengths]


def count_words(text: str) -> int:
    return len(text.split())


class ApiUser(FastHttpUser):
    """One client of the server, sending its next request when the last is answered."""

    abstract = True
    network_timeout = connection_timeout = 600.0  # a 1,000-document rerank queued behind others takes a while

    def on_start(self) -> None:
        self.texts = Texts(seed=next(_numbers))
        key = self.environment.parsed_options.api_key
        self.headers = {"Authorization": f"Bearer {key}"} if key else {}

    def post(self, path: str, body: dict, name: str, answers: int) -> None:
        with self.client.post(path, json=body, headers=self.headers, name=name, catch_response=True) as reply:
            if reply.status_code != 200:
                reply.failure(f"{reply.status_code}: {reply.text[:300]}")
            elif len(answers_of(reply.json())) != answers:
                reply.failure(f"{len(answers_of(reply.json()))} answers for {answers} items")


class CohereUser(ApiUser):
    @task
    def rerank(self) -> None:
        documents = self.environment.parsed_options.documents
        self.post("/v2/rerank", {"query": self.texts.query(), "documents": self.texts.passages(documents)},
                  f"cohere /v2/rerank x{documents}", documents)


class OpenAIUser(ApiUser):
    @task
    def embeddings(self) -> None:
        texts = self.environment.parsed_options.texts
        self.post("/v1/embeddings", {"input": self.texts.passages(texts)}, f"openai /v1/embeddings x{texts}", texts)


class TeiUser(ApiUser):
    @task
    def rerank(self) -> None:
        texts = self.environment.parsed_options.tei_texts
        self.post("/rerank", {"query": self.texts.query(), "texts": self.texts.passages(texts)},
                  f"tei /rerank x{texts}", texts)


def answers_of(body: dict | list) -> list:
    """The per-item answers of a reply: Cohere's results, OpenAI's data, TEI's list."""
    if isinstance(body, list):
        return body
    return body.get("results", body.get("data", []))
