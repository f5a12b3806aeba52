"""What a model needs to know to serve a batch: which prompt tokens are real, where each
sequence stands in a fixed-capacity cache, and whose logits are wanted.

    seq = Seq(lengths=l)                   # prefill of right-padded prompts: l[b] real tokens
    seq = Seq(lengths=l, max_context=N)    # ... into fixed-capacity caches of N rows
    seq = Seq(positions=p)                 # a decode step of sequences holding p[b] tokens

Right padding keeps every real token causal: a real query never sees a padding key, so the
attention of a ragged prefill needs no mask of its own. What padding must not reach is a
sequence's state: the delta rules get a zero gate and a zero beta there (the state passes
through unchanged, as in fla's chunk padding), the short convs keep the inputs before each
sequence's end (fla's `cu_seqlens` boundaries, per row of a padded batch), and the caches
store zero rows in its place.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Seq:
    lengths: torch.Tensor | None = None  # prefill: real tokens per sequence, int64 [B] (None: all T)
    positions: torch.Tensor | None = None  # decode with fixed caches: tokens each sequence holds, [B]
    max_context: int | None = None  # prefill: make fixed-capacity caches of this many rows
    last: bool = False  # logits of each sequence's last real token only, [B, 1, vocab]

    @property
    def fixed(self) -> bool:
        """The caches are fixed-capacity: prefill makes them at max_context rows, decode writes a row."""
        return self.max_context is not None or self.positions is not None

    def valid(self, T: int) -> torch.Tensor | None:
        """bool [B, T]: prompt token t of sequence b is real (None: every token is)."""
        if self.lengths is None:
            return None
        return torch.arange(T, device=self.lengths.device)[None, :] < self.lengths[:, None]

    def held(self, B: int, T: int, device) -> torch.Tensor:
        """int64 [B]: the tokens each sequence holds once this call is done."""
        if self.positions is not None:
            return self.positions + (T if self.lengths is None else self.lengths)
        if self.lengths is not None:
            return self.lengths.clone()
        return torch.full((B,), T, dtype=torch.long, device=device)


def zero_padding(x: torch.Tensor, seq: Seq | None) -> torch.Tensor:
    """x [B, T, ...] with the rows of padding tokens set to zero."""
    valid = seq.valid(x.shape[1]) if seq is not None else None
    if valid is None:
        return x
    return torch.where(valid.view(*valid.shape, *[1] * (x.dim() - 2)), x, torch.zeros((), dtype=x.dtype))


def into_cache(rows: torch.Tensor, max_context: int) -> torch.Tensor:
    """A fixed-capacity cache [B, N, ...] holding `rows` [B, T, ...] first, zeros after."""
    from ..kernels import ops

    B = rows.shape[0]
    empty = rows.new_zeros((B, max_context, *rows.shape[2:]))
    return ops.cache_write(empty, rows, torch.zeros(B, dtype=torch.long, device=rows.device))


def conv_tail(x: torch.Tensor, state: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    """The short conv's new state for right-padded x [B, T, C]: the W-1 inputs before each
    sequence's end in [state ++ x] (state [B, C, W-1]), not the last W-1 of the padded rows."""
    B, C, W1 = state.shape
    xs = torch.cat([state, x.transpose(1, 2).to(state.dtype)], dim=2)  # [B, C, W-1 + T]
    idx = lengths.view(B, 1, 1) + torch.arange(W1, device=x.device).view(1, 1, W1)
    return torch.gather(xs, 2, idx.expand(B, C, W1))


def last_rows(x: torch.Tensor, seq: Seq | None) -> torch.Tensor:
    """x [B, T, d] -> [B, 1, d]: the row of each sequence's last real token."""
    B, T, d = x.shape
    if seq is None or seq.lengths is None:
        return x[:, T - 1:]
    return torch.gather(x, 1, (seq.lengths - 1).view(B, 1, 1).expand(B, 1, d))
