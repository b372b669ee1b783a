"""What users deploy today, for `serve_bench.py`: a Ray Serve deployment with `@serve.batch` running transformers'
`AutoModelForCausalLM` on left-padded batches; the same prompt strings the engine builds, without its prefix
sharing. Rerank scores are P(yes) from the yes/no logits at the last position; embeddings are the final hidden state
at the last token (the end-of-text token the prompt ends with), L2-normalised."""

from __future__ import annotations

import math

import ray
import torch
from ray import serve
from transformers import AutoModelForCausalLM, AutoTokenizer

from radix_core.templates import QWEN3_EMBEDDING, QWEN3_RERANKER


@serve.deployment(max_ongoing_requests=256)
class PaddedBaseline:
    def __init__(self, model_dir: str, max_batch_requests: int):
        reserved = ray.get_runtime_context().get_assigned_resources().get("CPU", 1.0)
        torch.set_num_threads(max(1, math.ceil(reserved)))
        self.tokenizer = AutoTokenizer.from_pretrained(model_dir, padding_side="left")
        if self.tokenizer.pad_token is None:
            self.tokenizer.pad_token = "<|endoftext|>"
        self.model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
        self.yes, self.no = (self.tokenizer.convert_tokens_to_ids(t) for t in ("yes", "no"))
        self.rerank_batch.set_max_batch_size(max_batch_requests)
        self.embed_batch.set_max_batch_size(max_batch_requests)

    async def rerank(self, request: dict) -> int:
        return await self.rerank_batch(request)

    async def embed(self, request: dict) -> int:
        return await self.embed_batch(request)

    @serve.batch(max_batch_size=8, batch_wait_timeout_s=0.01)
    async def rerank_batch(self, requests: list[dict]) -> list[int]:
        """Input tokens per request; the scores are computed and dropped (the benchmark times them)."""
        prompts = [[QWEN3_RERANKER.prefix + QWEN3_RERANKER.body.format(
            instruction=QWEN3_RERANKER.default_instruction, query=r["query"], document=d) + QWEN3_RERANKER.suffix
            for d in r["documents"]] for r in requests]
        batch, tokens = self._encode(prompts)
        with torch.inference_mode():
            logits = self.model(**batch).logits[:, -1, [self.no, self.yes]]  # (n, 2)
        logits.softmax(-1)
        return tokens

    @serve.batch(max_batch_size=8, batch_wait_timeout_s=0.01)
    async def embed_batch(self, requests: list[dict]) -> list[int]:
        prompts = [[QWEN3_EMBEDDING.query.format(instruction=r["instruction"], text=t) + QWEN3_EMBEDDING.end_token
                    for t in r["texts"]] for r in requests]
        batch, tokens = self._encode(prompts)
        with torch.inference_mode():
            hidden = self.model.model(**batch).last_hidden_state[:, -1]  # (n, hidden)
        torch.nn.functional.normalize(hidden, dim=-1)
        return tokens

    def _encode(self, prompts: list[list[str]]) -> tuple[dict, list[int]]:
        """The padded batch of every request's prompts, and each request's real (unpadded) token count."""
        batch = self.tokenizer([p for ps in prompts for p in ps], padding=True, return_tensors="pt")
        lengths = batch["attention_mask"].sum(1).tolist()
        tokens, start = [], 0
        for ps in prompts:
            tokens.append(int(sum(lengths[start:start + len(ps)])))
            start += len(ps)
        return batch, tokens
