"""Prediction: a sequence-classification model's own labels for each input, as TEI's `/predict` answers.

Each input is one sequence, its plain text with the tokenizer's own special tokens (as `tokenizer(text)` gives
them, and as `AutoModelForSequenceClassification` is fed); the score head's outputs at the last token are the
logits of the labels in `config.id2label`. Scores are a softmax over the labels, or a sigmoid for a one-label head
(a cross-encoder's relevance), or the raw logits with `raw_scores`; each input's labels come best first.
Few-shot classification over labels the caller gives is `classify` (`radix_core.tasks.scoring`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from radix_core.errors import Items, RequestError
from radix_core.tasks.base import HeadQuery, Task, TaskJob
from radix_core.tasks.context import TaskContext
from radix_core.tasks.request import TRUNCATION_DIRECTIONS, TaskRequest, choice, flag, items
from radix_core.tasks.usage import Usage
from radix_core.tasks.view import BatchView
from radix_core.templates import PromptParts

INPUTS = Items("inputs", "input")  # input 2 of a message is inputs[2]


@dataclass(frozen=True)
class PredictRequest(TaskRequest):
    """Score each of `inputs` with the model's labels; see the module docstring.

    `raw_scores`: the logits instead of probabilities. `truncate`: cut an input over the per-sequence token limit
    (False: refuse it). `truncation_direction`: "right" cuts its end, "left" its start, at a token boundary,
    re-tokenized as the tokenizer would encode it.
    """

    inputs: Sequence[str] = items()
    raw_scores: bool = flag(False)
    truncate: bool = flag(True)
    truncation_direction: str = choice(TRUNCATION_DIRECTIONS, "right", " (the side of a text that is cut)")


@dataclass(frozen=True)
class LabelScore:
    label: str
    score: float


@dataclass(frozen=True)
class PredictResult:
    """Per input (in request order) every label of the model with its score, best first; the call's usage."""

    results: list[list[LabelScore]]
    usage: Usage


@dataclass(frozen=True)
class PredictScores:
    """A sub-job's partial result: each input's scores in label-id order."""

    scores: np.ndarray  # (n, num_labels) float32
    usage: Usage


@dataclass(frozen=True)
class PredictJob(TaskJob):
    """One sequence per input, scored by the whole score head at its last token."""

    labels: tuple[str, ...]  # by label id
    raw_scores: bool


class PredictTask(Task):
    name = "predict"
    rpc = "Predict"
    request_type = PredictRequest
    job_type = PredictJob

    def job(self, context: TaskContext, request: PredictRequest) -> PredictJob:
        if context.head != "seq_cls":
            raise RequestError(f"model {context.model!r} has no sequence-classification head, so it has no labels "
                               f"of its own to predict", "use a ForSequenceClassification model, or classify with "
                               "labels you give (the classify task)")
        prompts = context.prompt_tokenizer()
        batch = prompts.encode_prompts(PromptParts((), list(request.inputs), ()), context.token_limit,
                                       request.truncate, end_ids=prompts.trailing_ids, items=INPUTS,
                                       special_tokens_in_user_text=context.config.special_tokens_in_user_text,
                                       truncation_direction=request.truncation_direction)
        empty = np.flatnonzero(batch.sequences.lengths == 0)  # (E,) sequences without a token
        if empty.size:
            raise RequestError.about("inputs", "gives no tokens: this tokenizer drops all of its characters and adds "
                                     "none of its own", "give it a visible character", index=int(empty[0]))
        return PredictJob(batch.sequences, len(batch.shared_ids), context.labels,
                          request.raw_scores)

    def head_query(self, job: PredictJob) -> HeadQuery:
        n = len(job.sequences)
        return HeadQuery(np.arange(n), np.full(n, -1))

    def finish(self, job: PredictJob, view: BatchView) -> PredictScores:
        logits = torch.from_numpy(view.head)  # (n, num_labels) float32
        if job.raw_scores:
            scores = logits
        else:
            scores = logits.sigmoid() if logits.shape[1] == 1 else logits.softmax(-1)
        return PredictScores(scores.numpy(), view.usage)

    def merge(self, job: PredictJob, partials: Sequence[PredictScores]) -> PredictResult:
        scores = np.concatenate([p.scores for p in partials]).tolist()  # (n, num_labels)
        results = [sorted((LabelScore(label, score) for label, score in zip(job.labels, row)),
                          key=lambda hit: -hit.score) for row in scores]
        return PredictResult(results, Usage.total([p.usage for p in partials]))

    def to_dict(self, result: PredictResult) -> dict[str, Any]:
        return {"results": [{"scores": [{"label": hit.label, "score": hit.score} for hit in row]}
                            for row in result.results], "usage": result.usage.to_dict()}
