"""`Engine`: a transformers checkpoint run over ragged batches, with shared prefixes computed once.

    engine = Engine.from_pretrained("Qwen/Qwen3-Reranker-0.6B")
    states = engine.hidden_states([[1, 2, 3], [1, 2, 4]])  # each (L_i, hidden), final-normed
    ranked = engine.rerank("what is a radix tree", ["A trie ...", "Bread ..."]).results

The text tasks (`rerank`, `embed`, `classify`, `score`) live in `radix_core.tasks`; the methods here delegate.

Modes (`radix`): "off" (ragged baseline), "mlp" (RadixMLP: position-wise work on compact rows), "full"
(attention in compact space too), "auto" (per batch: "full" when the compression `N'/N` is at most
`radix_threshold`, else "off", so a batch without sharing pays only the index build).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from radix_core import tasks as text_tasks
from radix_core.architectures import Architecture, load_architecture
from radix_core.attention import make_backend
from radix_core.forward import MODES, BatchPlan, plan_compact, plan_ragged, run_layers
from radix_core.index import build_radix_index, flatten_sequences
from radix_core.tasks import TaskConfig
from radix_core.tokenization import PromptTokenizer, load_prompt_tokenizer

RADIX_CHOICES = ("auto", *MODES)
DEFAULT_RADIX_THRESHOLD = 0.9


@dataclass
class ForwardResult:
    """Hidden states of one batch's computed rows, and how original tokens map onto them."""

    plan: BatchPlan
    hidden: torch.Tensor  # (R, hidden) final-normed

    @property
    def num_tokens(self) -> int:
        """Tokens in the batch."""
        return self.plan.num_tokens

    @property
    def num_computed(self) -> int:
        """Rows actually computed position-wise after deduplication."""
        return self.plan.num_rows

    def rows_at(self, sequence_positions: Sequence[Sequence[int]]) -> list[torch.Tensor]:
        """Per sequence, the (int64) computed rows holding the given positions (negative counts from the end)."""
        cu = self.plan.cu_seqlens
        rows = []
        for s, positions in enumerate(sequence_positions):
            length = int(cu[s + 1] - cu[s])
            pos = torch.as_tensor(positions, dtype=torch.int64).remainder(length)  # (P,)
            rows.append(self.plan.row_of_token[pos.to(self.hidden.device) + int(cu[s])])
        return rows


class Engine:
    """Loads a Qwen3 / Qwen2 / Llama / Mistral checkpoint and scores ragged batches of token ids."""

    def __init__(self, arch: Architecture, device: torch.device, dtype: torch.dtype, radix: str,
                 radix_threshold: float, attention: str, model: str = "", prompts: PromptTokenizer | None = None,
                 task_config: TaskConfig | None = None):
        if radix not in RADIX_CHOICES:
            raise ValueError(f"unknown radix mode {radix!r}: choose one of {', '.join(RADIX_CHOICES)}")
        if not 0.0 <= radix_threshold <= 1.0:
            raise ValueError(f"radix_threshold is a compression N'/N between 0 and 1, got {radix_threshold}")
        self.arch = arch
        self.device = device
        self.dtype = dtype
        self.radix = radix
        self.radix_threshold = radix_threshold
        self.backend = make_backend(attention, device, dtype)
        self.model = model
        self.prompts = prompts  # the tokenizer, for the text tasks; None for a model without one
        self.task_config = task_config or TaskConfig()

    @classmethod
    def from_pretrained(cls, model: str, device="auto", dtype="auto", radix: str = "auto",
                        radix_threshold: float = DEFAULT_RADIX_THRESHOLD, attention: str = "auto",
                        tasks: TaskConfig | Mapping | None = None) -> Engine:
        """Load `model` (local directory or hub id) and its tokenizer. `device` "auto" picks CUDA when present;
        `dtype` "auto" is bfloat16 on CUDA and float32 on the CPU (a torch dtype or its name, e.g. "float32",
        also works). `tasks`: limits and template overrides for the text tasks, a `TaskConfig` or its dict."""
        device = resolve_device(device)
        dtype = resolve_dtype(dtype, device)
        arch = load_architecture(model, device, dtype)
        task_config = TaskConfig.from_dict(tasks) if isinstance(tasks, Mapping) else tasks
        return cls(arch, device, dtype, radix, radix_threshold, attention, model=model,
                   prompts=load_prompt_tokenizer(model), task_config=task_config)

    @property
    def info(self) -> dict:
        return {
            "model": self.model,
            "family": self.arch.family,
            "head": self.arch.head,
            "device": str(self.device),
            "dtype": str(self.dtype).removeprefix("torch."),
            "attention": self.backend.name,
            "radix": self.radix,
            "radix_threshold": self.radix_threshold,
            "max_seq_len": self.arch.max_seq_len,
        }

    @torch.inference_mode()
    def forward(self, sequences: Sequence[Sequence[int]], mode: str | None = None) -> ForwardResult:
        """Run a batch of token-id lists; `mode` overrides the engine's radix mode for this call."""
        mode = self.radix if mode is None else mode
        if mode not in RADIX_CHOICES:
            raise ValueError(f"unknown radix mode {mode!r}: choose one of {', '.join(RADIX_CHOICES)}")
        input_ids, cu_seqlens = flatten_sequences(sequences)
        self._check_batch(input_ids, cu_seqlens)
        plan = self._plan(input_ids, cu_seqlens, mode)
        return ForwardResult(plan, run_layers(self.arch, plan, self.backend))

    def hidden_states(self, sequences, mode: str | None = None) -> list[torch.Tensor]:
        """Per sequence its final-normed hidden states `(L_i, hidden)`."""
        result = self.forward(sequences, mode)
        per_token = result.hidden.index_select(0, result.plan.row_of_token)  # (N, hidden)
        return list(per_token.split(np.diff(result.plan.cu_seqlens).tolist()))

    def last_hidden_states(self, sequences, mode: str | None = None) -> torch.Tensor:
        """(B, hidden) final-normed hidden state of each sequence's last token."""
        result = self.forward(sequences, mode)
        return result.hidden.index_select(0, torch.cat(result.rows_at([[-1]] * len(sequences))))

    def lm_logits(self, sequences, positions: Sequence[Sequence[int]] | None = None,
                  mode: str | None = None) -> list[torch.Tensor]:
        """Per sequence `(P_i, vocab)` LM logits at `positions[i]` (default: the last token), computed once per
        distinct compact row."""
        result = self.forward(sequences, mode)
        return self.head_at(result, positions if positions is not None else [[-1]] * len(sequences))

    def classification_scores(self, sequences, mode: str | None = None) -> torch.Tensor:
        """(B, num_labels) sequence-classification logits at each sequence's last token."""
        result = self.forward(sequences, mode)
        return torch.cat(self.head_at(result, [[-1]] * len(sequences)))

    @torch.inference_mode()
    def head_at(self, result: ForwardResult, positions: Sequence[Sequence[int]]) -> list[torch.Tensor]:
        """Per sequence `(P_i, out)` head outputs at `positions[i]`; the head runs on distinct rows only."""
        if self.arch.head_module is None:
            raise ValueError(f"model {self.model!r} is a base model without an LM or score head")
        rows = result.rows_at(positions)
        unique, inverse = torch.cat(rows).unique(return_inverse=True)  # (U,), (sum P_i,)
        out = self.arch.head_module(result.hidden.index_select(0, unique)).float()  # (U, out)
        return list(out.index_select(0, inverse).split([len(r) for r in rows]))

    def rerank(self, query: str, documents: Sequence[str], instruction: str | None = None, top_n: int | None = None,
               return_documents: bool = False, raw_scores: bool = False,
               truncate: bool = True) -> text_tasks.RerankResult:
        """`documents` by relevance to `query`, best first (`radix_core.tasks.rerank`)."""
        return text_tasks.rerank(self, query, documents, instruction, top_n, return_documents, raw_scores, truncate)

    def embed(self, texts: Sequence[str], instruction: str | None = None, normalize: bool = True,
              dimensions: int | None = None, truncate: bool = True,
              pooling: str = "last") -> text_tasks.EmbedResult:
        """(n, d) embeddings of `texts` (`radix_core.tasks.embed`)."""
        return text_tasks.embed(self, texts, instruction, normalize, dimensions, truncate, pooling)

    def classify(self, inputs: Sequence[str], labels: Sequence[str], prefix: str = "",
                 template: str | Callable[[str], str] | None = None) -> text_tasks.ClassifyResult:
        """Per input a probability over `labels` after `prefix + template(input)` (`radix_core.tasks.scoring`)."""
        return text_tasks.classify(self, inputs, labels, prefix, template)

    def score(self, context: str, continuations: Sequence[str]) -> text_tasks.ScoreResult:
        """Log-probabilities of each continuation after `context` (`radix_core.tasks.scoring`)."""
        return text_tasks.score(self, context, continuations)

    def _plan(self, input_ids: np.ndarray, cu_seqlens: np.ndarray, mode: str) -> BatchPlan:
        if mode == "off":
            return plan_ragged(input_ids, cu_seqlens, self.device)
        index = build_radix_index(input_ids, cu_seqlens)
        if mode == "auto":
            if index.compression > self.radix_threshold:
                return plan_ragged(input_ids, cu_seqlens, self.device)
            mode = "full"
        return plan_compact(index, mode, self.device)

    def _check_batch(self, input_ids: np.ndarray, cu_seqlens: np.ndarray) -> None:
        """Token ids inside the vocabulary and lengths within the model's limit, else a ValueError saying which."""
        bad = np.flatnonzero((input_ids < 0) | (input_ids >= self.arch.vocab_size))
        if bad.size:
            seq = int(np.searchsorted(cu_seqlens, bad[0], side="right") - 1)
            raise ValueError(f"sequence {seq} has token id {int(input_ids[bad[0]])} outside the vocabulary "
                             f"[0, {self.arch.vocab_size})")
        lengths = np.diff(cu_seqlens)
        too_long = np.flatnonzero(lengths > self.arch.max_seq_len)
        if too_long.size:
            s = int(too_long[0])
            raise ValueError(f"sequence {s} has {int(lengths[s])} tokens; the limit is {self.arch.max_seq_len}")


def resolve_device(device) -> torch.device:
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(device)


def resolve_dtype(dtype, device: torch.device) -> torch.dtype:
    if dtype == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    if isinstance(dtype, torch.dtype):
        return dtype
    resolved = getattr(torch, str(dtype), None)
    if not isinstance(resolved, torch.dtype) or not resolved.is_floating_point:
        raise ValueError(f"unknown dtype {dtype!r}: use float32, bfloat16, float16 or a torch dtype")
    return resolved
