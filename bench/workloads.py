"""Every benchmark's workloads, in one place so their tables can be compared.

**MS MARCO-shaped rerank** (`MsMarco`): search queries, each with candidate passages, behind one prompt template,
as a reranker in a retrieval pipeline sees MS MARCO passage ranking. The parameters, written once:

| parameter | default | meaning |
|---|---|---|
| `queries` | 8 | distinct queries |
| `passages_per_query` | 8 | passages per query (the engine batch: 8 x 8 = 64 sequences) |
| `passage_tokens` | 40-120 | tokens per passage, uniform, bounds included |
| `query_tokens` | 8-19 | tokens per query (ids; the texts take the corpus's search queries) |
| `template_tokens` | 50 | template before the query (ids; texts: the Qwen3-Reranker prompt, 57 tiny-tokenizer tokens) |
| `suffix_tokens` | 10 | template after the passage (ids; texts: the Qwen3-Reranker suffix, 16 tokens) |

`LONG_DOCUMENTS` is the same workload with long passages: 12 queries x 32 web pages of 2,000-6,000 tokens, reranked
by chunks of 512 tokens (`bench/task_compression.py --long-documents`).

The same parameters give two forms: `msmarco_ids` draws random token ids (the engine benchmark: no tokenizer, a
batch of 64 sequences), `msmarco_texts` draws text from `radix_core/data/tiny_corpus.txt` (the served benchmarks
and `task_compression.py`: its search queries, and passages of its sentences joined to the drawn token length,
counted with the tokenizer the model serves). `rerank_stream` cuts the texts into rerank requests of a few
passages each, and `embed_requests` makes embedding requests of passages behind an instruction.

The engine benchmark's other named batches (docs/ARCHITECTURE.md section 7, the paper's long shared prefix, the
scaling part) are here too: every process (the benchmark, its memory cells, engine_profile.py) rebuilds a batch
from its name with the same seed (`make_batch`). `mixed_reranks` is the load benchmark's realistic mix of request
sizes.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

import numpy as np

from radix_core.tiny_models import CORPUS_PATH

VOCAB = 2000  # the id range of `msmarco_ids` and the synthetic batches
SCALING_PREFIX, SCALING_SUFFIX, SCALING_COUNTS = 1024, 64, (8, 32, 128)
EMBED_INSTRUCTION = "Given a web search query, retrieve relevant passages that answer the query"

Builder = Callable[[np.random.Generator], list[list[int]]]


@dataclass(frozen=True)
class MsMarco:
    """The MS MARCO-shaped rerank workload; the module docstring says what each parameter is."""

    queries: int = 8
    passages_per_query: int = 8
    passage_tokens: tuple[int, int] = (40, 120)
    query_tokens: tuple[int, int] = (8, 19)
    template_tokens: int = 50
    suffix_tokens: int = 10


LONG_DOCUMENTS = MsMarco(queries=12, passages_per_query=32, passage_tokens=(2000, 6000))


@dataclass(frozen=True)
class QueryPassages:
    query: str
    passages: list[str]


def tokens(rng: np.random.Generator, n: int) -> list[int]:
    return rng.integers(0, VOCAB, n).tolist()


def msmarco_ids(rng: np.random.Generator, shape: MsMarco = MsMarco()) -> list[list[int]]:
    """`queries x passages_per_query` sequences, query-major: template + query + passage + suffix."""
    template, suffix = tokens(rng, shape.template_tokens), tokens(rng, shape.suffix_tokens)
    batch = []
    for _ in range(shape.queries):
        query = tokens(rng, _draw(rng, shape.query_tokens))
        batch += [template + query + tokens(rng, _draw(rng, shape.passage_tokens)) + suffix
                  for _ in range(shape.passages_per_query)]
    return batch


def msmarco_texts(rng: np.random.Generator, count_tokens: Callable[[str], int],
                  shape: MsMarco = MsMarco()) -> list[QueryPassages]:
    """`queries` distinct corpus search queries, each with `passages_per_query` passages whose length in tokens
    (`count_tokens`, without the tokenizer's affixes) is drawn from `passage_tokens`."""
    queries, sentences = corpus_text()
    picked = rng.choice(len(queries), shape.queries, replace=False)
    return [QueryPassages(queries[q], [passage(sentences, count_tokens, _draw(rng, shape.passage_tokens), rng)
                                       for _ in range(shape.passages_per_query)]) for q in picked]


def token_counter(tokenizer) -> Callable[[str], int]:
    """Tokens of a text for a transformers tokenizer, without its affixes (as the prompt holds it)."""
    return lambda text: len(tokenizer(text, add_special_tokens=False)["input_ids"])


def corpus_text() -> tuple[list[str], list[str]]:
    """(search queries, sentences): the corpus's first block of short query lines, and its prose split into
    sentences."""
    blocks = [b for b in CORPUS_PATH.read_text(encoding="utf-8").split("\n\n") if not b.startswith("#")]
    queries = blocks[0].splitlines()
    prose = [line for b in blocks[1:] for line in b.splitlines() if len(line.split()) >= 12]
    sentences = [s for line in prose for s in re.split(r"(?<=[.!?])\s+", line) if len(s.split()) >= 4]
    return queries, sentences


def passage(sentences: list[str], count_tokens: Callable[[str], int], target: int,
            rng: np.random.Generator) -> str:
    """Random sentences joined until `target` tokens are reached, cut back to it word by word.

    Tokens are counted sentence by sentence, each after its joining space (a byte-level BPE pre-tokenizer never
    merges across the space before a word, so the counts add up to the joined text's), and the cut re-counts only
    the last sentence: a 6,000-token passage costs one pass over its text rather than one per sentence added (the
    texts are those of counting the whole text each time)."""
    words: list[str] = []
    counted = piece = 0  # tokens of " ".join(words); of its last sentence with its joining space
    sentence: list[str] = []
    while counted < target:
        sentence = sentences[int(rng.integers(len(sentences)))].split()
        piece = count_tokens(" ".join(sentence) if not words else " " + " ".join(sentence))
        words, counted = words + sentence, counted + piece
    head, before, keep = len(words) - len(sentence), counted - piece, len(words)
    while keep > head and before + count_tokens((" " if head else "") + " ".join(words[head:keep])) > target:
        keep -= 1
    return " ".join(words[:keep])


def rerank_stream(groups: list[QueryPassages], per_request: int, rng: np.random.Generator) -> list[dict]:
    """Each query's passages as rerank requests of `per_request`, shuffled: a query's requests spread over the
    stream, as independent clients send them."""
    requests = [{"query": g.query, "documents": g.passages[i:i + per_request]}
                for g in groups for i in range(0, len(g.passages), per_request)]
    rng.shuffle(requests)
    return requests


def embed_requests(texts: list[str], per_request: int, instruction: str = EMBED_INSTRUCTION) -> list[dict]:
    """`texts` as embedding requests of `per_request` behind one instruction."""
    return [{"texts": texts[i:i + per_request], "instruction": instruction}
            for i in range(0, len(texts), per_request)]


def mixed_reranks(rng: np.random.Generator, count: int = 64) -> list[dict]:
    """`count` reranks of 8 to 1000 documents (log-uniform; Cohere's clients send up to 1000), 50 corpus words
    (about 100 tokens) each."""
    words = np.array(CORPUS_PATH.read_text().split())
    sizes = np.exp(rng.uniform(np.log(8), np.log(1000), count)).round().astype(int)
    return [{"query": " ".join(rng.choice(words, 8)),
             "documents": [" ".join(rng.choice(words, 50)) for _ in range(size)]} for size in sizes]


def synthetic_prefix(rng, prefix: int = 512, suffix: int = 64, batch: int = 32) -> list[list[int]]:
    shared = tokens(rng, prefix)
    return [shared + tokens(rng, suffix) for _ in range(batch)]


def embedding_instruction(rng) -> list[list[int]]:
    """64 texts of 50-200 tokens behind one 20-token instruction."""
    instruction = tokens(rng, 20)
    return [instruction + tokens(rng, int(rng.integers(50, 201))) for _ in range(64)]


def no_sharing(rng) -> list[list[int]]:
    return [tokens(rng, int(rng.integers(128, 385))) for _ in range(32)]


def _draw(rng: np.random.Generator, bounds: tuple[int, int]) -> int:
    """A uniform integer in `bounds`, both included."""
    return int(rng.integers(bounds[0], bounds[1] + 1))


@dataclass(frozen=True)
class Shape:
    """One row group of the engine benchmark's shapes table."""

    make: Builder
    # Over a minute per `off` forward on 2 cores: timed over --long-repeats rounds, and without the padded
    # transformers reference (about 4 GB peak and off's time per forward at 32 x 2304 tokens).
    long: bool = False


SHAPES = {
    "msmarco-rerank 64 seqs": Shape(msmarco_ids),
    "synthetic 32x(512+64)": Shape(synthetic_prefix),
    "synthetic 32x(2048+256)": Shape(partial(synthetic_prefix, prefix=2048, suffix=256), long=True),
    "embed 64x(20+50..200)": Shape(embedding_instruction),
    "no sharing 32x(128..384)": Shape(no_sharing),
}


def scaling_name(count: int) -> str:
    return f"shared {count}x({SCALING_PREFIX}+{SCALING_SUFFIX})"


def suffixes_name(count: int) -> str:
    return f"suffixes {count}x{SCALING_SUFFIX}"


# Every named batch: the shapes, and the scaling part's batches; the memory cells and engine_profile.py rebuild a
# batch by its name.
BATCHES: dict[str, Builder] = {
    **{name: shape.make for name, shape in SHAPES.items()},
    **{scaling_name(n): partial(synthetic_prefix, prefix=SCALING_PREFIX, suffix=SCALING_SUFFIX, batch=n)
       for n in SCALING_COUNTS},
    **{suffixes_name(n): partial(synthetic_prefix, prefix=0, suffix=SCALING_SUFFIX, batch=n) for n in SCALING_COUNTS},
}


def make_batch(name: str) -> list[list[int]]:
    """The batch `name` of `BATCHES`, the same in every process."""
    return BATCHES[name](np.random.default_rng(0))
