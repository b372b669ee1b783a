"""`ForwardResult`: one batch's computed rows after the forward, and the model's head read off them.

Everything a caller asks of a result is answered with one upload and one download per call, never one per
sequence: which row holds a token is known on the host (the plan's `token_rows`: the prepared batch's `scatter`,
the identity in `off` mode, a cached row for a token read from the prefix cache), so rows are computed in numpy
and sent to the device as one index array. The head runs in float32 on the distinct rows only:

* `head_outputs(rows, columns)`: the head's outputs at `rows`, only `columns` of them when given (a reranker's
  yes/no logits are two rows of a 151,936-row LM head: two dot products per row instead of the vocabulary);
* `token_logprobs(rows, targets)`: log-softmax at each row read at one target token, computed over vocabulary
  chunks with a running logsumexp, so no `(rows, vocab)` tensor of log-probabilities is ever materialized
  (16k rows x 151,936 float32 would be 10 GB).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from radix_core.batch import PreparedBatch
from radix_core.forward import BatchPlan

LOGPROB_CHUNK = 16384  # vocabulary rows per step of token_logprobs: 256 MiB of float32 weights at hidden 4096


def token_index(cu_seqlens: np.ndarray, sequences: np.ndarray, positions: np.ndarray) -> np.ndarray:
    """(P,) int64 index among a batch's tokens (sequence boundaries `cu_seqlens`) of position `positions[i]`
    (negative counts from the end) of sequence `sequences[i]`."""
    sequences = np.asarray(sequences, dtype=np.int64)
    lengths = cu_seqlens[sequences + 1] - cu_seqlens[sequences]  # (P,)
    return cu_seqlens[sequences] + np.mod(positions, lengths)


@dataclass
class ForwardResult:
    """Hidden states of one batch's computed rows, how original tokens map onto them, and the model's head."""

    prepared: PreparedBatch
    plan: BatchPlan
    hidden: torch.Tensor  # (F + C, hidden) final-normed: the computed rows finished (`BatchPlan.final_rows`, all R
    # when it names none), then the cached rows read; `hidden_at` reads it by row
    head: nn.Module | None  # lm_head (vocab) or score (num_labels); None for a base model

    @property
    def num_tokens(self) -> int:
        """Tokens in the batch."""
        return self.plan.num_tokens

    @property
    def num_computed(self) -> int:
        """Rows actually computed position-wise after deduplication and prefix cache hits."""
        return self.plan.num_rows

    @property
    def row_of_token(self) -> np.ndarray:
        """(N,) int64 row of each original token in `hidden`, on the host."""
        return self.plan.token_rows

    @property
    def cached_lengths(self) -> np.ndarray:
        """(B,) int64 leading tokens of each sequence read from the prefix cache instead of computed."""
        lengths = self.plan.cached_lengths
        return np.zeros(self.prepared.num_sequences, dtype=np.int64) if lengths is None else lengths

    def rows(self, sequences: np.ndarray, positions: np.ndarray) -> np.ndarray:
        """(P,) int64 computed row of position `positions[i]` (negative counts from the end) of sequence
        `sequences[i]`."""
        return self.row_of_token[token_index(self.prepared.cu_seqlens, sequences, positions)]

    def hidden_at(self, rows: np.ndarray) -> torch.Tensor:
        """(P, hidden) float32 final hidden states of computed or cached `rows`, on the device."""
        return self.hidden.index_select(0, self._upload(self.plan.state_index(rows))).float()

    def head_outputs(self, rows: np.ndarray, columns: tuple[int, ...] | None = None) -> np.ndarray:
        """(P, C) float32 head outputs at `rows`: every output, or only `columns`; computed once per distinct row."""
        weight, bias = self._head_params()
        if columns is not None:
            weight, bias = weight[list(columns)], None if bias is None else bias[list(columns)]
        unique, inverse = np.unique(rows, return_inverse=True)  # (U,), (P,)
        out = F.linear(self.hidden_at(unique), weight.float(), None if bias is None else bias.float())  # (U, C)
        return out.cpu().numpy()[inverse]

    def token_logprobs(self, rows: np.ndarray, targets: np.ndarray, chunk: int = LOGPROB_CHUNK) -> np.ndarray:
        """(P,) float32 `log_softmax(head(row_i))[targets_i]`, by vocabulary chunks of `chunk` rows."""
        weight, bias = self._head_params()
        unique, inverse = np.unique(rows, return_inverse=True)  # (U,), (P,)
        h = self.hidden_at(unique)  # (U, hidden)
        lse = torch.full((h.shape[0],), -torch.inf, device=h.device)  # (U,)
        for start in range(0, weight.shape[0], chunk):
            b = None if bias is None else bias[start:start + chunk].float()
            lse = torch.logaddexp(lse, F.linear(h, weight[start:start + chunk].float(), b).logsumexp(-1))
        picked = self._upload(targets)  # (P,)
        inv = self._upload(inverse)  # (P,)
        logit = (h.index_select(0, inv) * weight.index_select(0, picked).float()).sum(-1)  # (P,)
        if bias is not None:
            logit = logit + bias.index_select(0, picked).float()
        return (logit - lse.index_select(0, inv)).cpu().numpy()

    def _head_params(self) -> tuple[torch.Tensor, torch.Tensor | None]:
        if self.head is None:
            raise ValueError("this model is a base model without an LM or score head")
        return self.head.weight, self.head.bias

    def _upload(self, array: np.ndarray) -> torch.Tensor:
        """One host->device copy of an index array."""
        return torch.from_numpy(np.ascontiguousarray(array, dtype=np.int64)).to(self.hidden.device)
