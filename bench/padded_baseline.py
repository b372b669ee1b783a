"""The padded baseline, what users run today: transformers on one padded batch, without prefix sharing.

`padded_last_hidden` is the one padded forward every benchmark compares against: the sequences right-padded into
one batch (pads after each sequence, so causal attention never lets a real token see one and positions are
exact) through the base model, the final hidden state read at each sequence's last real token. `engine_bench.py`
times it on token ids; `PaddedBaseline` serves it for `serve_bench.py`: a Ray Serve deployment with
`@serve.batch` running `AutoModelForCausalLM` on the same prompt strings the engine builds, and `padded_rerank` runs
it in-process, in padded batches of a fixed size, for `host_path.py`. Rerank scores are
P(yes) from the yes/no logits of the LM head, run at the last token only (as the engine does; the Qwen3-Reranker
model card's `logits[:, -1]` would compute every position's); embeddings are the last token's final hidden state
(the end-of-text token the prompt ends with), L2-normalised.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import ray
import torch
from ray import serve
from transformers import AutoModelForCausalLM, AutoTokenizer

from radix_core.templates import QWEN3_EMBEDDING, QWEN3_RERANKER


def padded_last_hidden(model, sequences: Sequence[Sequence[int]]) -> torch.Tensor:
    """(B, hidden) final hidden state of transformers' base `model` at each sequence's last token, from one
    right-padded batch."""
    longest = max(map(len, sequences))
    ids = torch.zeros(len(sequences), longest, dtype=torch.long)  # (B, L_max)
    mask = torch.zeros_like(ids)  # (B, L_max)
    for i, s in enumerate(sequences):
        ids[i, : len(s)], mask[i, : len(s)] = torch.tensor(s), 1
    ids, mask = ids.to(model.device), mask.to(model.device)
    with torch.inference_mode():
        hidden = model(input_ids=ids, attention_mask=mask).last_hidden_state  # (B, L_max, hidden)
    return hidden[torch.arange(len(sequences), device=model.device), mask.sum(1) - 1]  # (B, hidden)


def rerank_prompts(query: str, documents: Sequence[str]) -> list[str]:
    """The Qwen3-Reranker prompt of each document, the strings the engine's template renders."""
    return [QWEN3_RERANKER.prefix + QWEN3_RERANKER.body.format(
        instruction=QWEN3_RERANKER.default_instruction, query=query, document=d) + QWEN3_RERANKER.suffix
        for d in documents]


def yes_no_ids(tokenizer) -> list[int]:
    """The (no, yes) token ids whose LM logits give P(yes)."""
    return [tokenizer.convert_tokens_to_ids(t) for t in ("no", "yes")]


def padded_rerank(model, tokenizer, query: str, documents: Sequence[str], batch_size: int) -> torch.Tensor:
    """(n,) P(yes) of each document from transformers' `AutoModelForCausalLM` `model`, the documents' prompts
    tokenized at once and run in right-padded batches of `batch_size`."""
    ids = tokenizer(rerank_prompts(query, documents))["input_ids"]
    columns = yes_no_ids(tokenizer)
    scores = []
    for start in range(0, len(ids), batch_size):
        hidden = padded_last_hidden(model.model, ids[start:start + batch_size])  # (b, hidden)
        with torch.inference_mode():
            scores.append(model.lm_head(hidden)[:, columns].softmax(-1)[:, 1])  # (b,)
    return torch.cat(scores)


@serve.deployment(max_ongoing_requests=256)
class PaddedBaseline:
    def __init__(self, model_dir: str, max_batch_requests: int):
        reserved = ray.get_runtime_context().get_assigned_resources().get("CPU", 1.0)
        torch.set_num_threads(max(1, math.ceil(reserved)))
        self.tokenizer = AutoTokenizer.from_pretrained(model_dir)
        self.model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
        self.columns = yes_no_ids(self.tokenizer)
        self.rerank_batch.set_max_batch_size(max_batch_requests)
        self.embed_batch.set_max_batch_size(max_batch_requests)

    async def rerank(self, request: dict) -> int:
        return await self.rerank_batch(request)

    async def embed(self, request: dict) -> int:
        return await self.embed_batch(request)

    @serve.batch(max_batch_size=8, batch_wait_timeout_s=0.01)
    async def rerank_batch(self, requests: list[dict]) -> list[int]:
        """Input tokens per request; the scores are computed and dropped (the benchmark times them)."""
        prompts = [rerank_prompts(r["query"], r["documents"]) for r in requests]
        hidden, tokens = self._last_hidden(prompts)
        with torch.inference_mode():
            self.model.lm_head(hidden)[:, self.columns].softmax(-1)  # (n, 2)
        return tokens

    @serve.batch(max_batch_size=8, batch_wait_timeout_s=0.01)
    async def embed_batch(self, requests: list[dict]) -> list[int]:
        prompts = [[QWEN3_EMBEDDING.query.format(instruction=r["instruction"], text=t) + QWEN3_EMBEDDING.end_token
                    for t in r["texts"]] for r in requests]
        hidden, tokens = self._last_hidden(prompts)
        torch.nn.functional.normalize(hidden, dim=-1)
        return tokens

    def _last_hidden(self, prompts: list[list[str]]) -> tuple[torch.Tensor, list[int]]:
        """The last hidden state of every request's prompts, in one padded batch, and each request's tokens."""
        ids = self.tokenizer([p for ps in prompts for p in ps])["input_ids"]
        tokens, start = [], 0
        for ps in prompts:
            tokens.append(sum(map(len, ids[start:start + len(ps)])))
            start += len(ps)
        return padded_last_hidden(self.model.model, ids), tokens
