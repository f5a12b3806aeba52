"""Greedy speculative generation: a draft proposes, the target verifies with one extend.

    tokens, stats = speculative(run, draft, prompts, max_new_tokens=64, k=4)

Each round the draft decodes `k` tokens greedily from the last accepted one; the target
extends every sequence by that token and the k drafts in one call (`extend`, k + 1 logits a
sequence) and keeps the longest prefix of drafts equal to its own greedy choice, plus its own
next token. The tokens are exactly plain greedy generation's: every token emitted is the
target's argmax after the tokens before it.

Rolling back a sequence that accepted j < k drafts is a recompute from a checkpoint: before
the verify, the fixed-size parts of the state (recurrent states, conv tails, positions) are
copied; the target then extends from that copy by the j + 1 accepted tokens (`lengths`, per
sequence). The caches need no copy: their rows past a sequence's position are never read
and the recompute writes the accepted rows again. A round in which every sequence accepts
every draft needs no recompute. The draft rolls back the same way.
"""

from __future__ import annotations

import time

import torch

from .errors import InputError
from .generate import pad

CACHE_NAMES = ("ckv", "krope", "k", "v")  # state entries that are caches [B, N, ...] (written in place)


def checkpoint(state: dict) -> dict:
    """A copy of `state`'s fixed-size parts; the caches are shared (see the module docstring)."""
    return {n: t if n.rsplit(".", 1)[-1] in CACHE_NAMES else t.clone() for n, t in state.items()}


def _advance(run, state: dict, before: dict, tokens: torch.Tensor, keep: torch.Tensor, n: int) -> dict:
    """`state` has fed the first `n` of `tokens` since `before`; each sequence b must have fed
    keep[b] of them: unless every keep is n, extend `before` by them (per-sequence lengths)."""
    if bool((keep == n).all()):
        return state
    return run.extend(tokens[:, :int(keep.max())], before, lengths=keep)[1]


def speculative(run, draft, prompts: list[list[int]], max_new_tokens: int, k: int = 4,
                progress=None) -> tuple[list[list[int]], dict]:
    """Greedy continuation of each prompt by `max_new_tokens` tokens through `run` (fixed
    caches, with extend), `draft` proposing `k` tokens a round. Returns the new tokens and
    {"rounds", "drafted", "accepted", "acceptance", "tokens_per_s", ...}."""
    if max_new_tokens < 1 or k < 1:
        raise InputError(f"max_new_tokens and k must be at least 1, got {max_new_tokens} and {k}")
    capacity = getattr(run, "max_context", None)
    longest = max(len(p) for p in prompts)
    if capacity is not None and longest + max_new_tokens + k > capacity:
        raise InputError(f"a prompt of {longest} tokens, {max_new_tokens} new ones and {k} drafts exceed the "
                         f"caches' capacity max_context = {capacity}")
    ids, lengths = pad(prompts)
    B = len(prompts)
    out: list[list[int]] = [[] for _ in range(B)]
    stats = {"rounds": 0, "drafted": 0, "accepted": 0}
    with torch.no_grad():
        t0 = time.perf_counter()
        logits, state = run.prefill(ids, lengths=lengths, logits="last")
        _, dstate = draft.prefill(ids, lengths=lengths, logits="last")
        cur = logits[:, -1].argmax(-1, keepdim=True)  # [B, 1]: emitted, not yet fed to either model
        for b in range(B):
            out[b].append(int(cur[b]))
        t1 = time.perf_counter()
        while min(len(o) for o in out) < max_new_tokens:
            dbefore, tbefore = checkpoint(dstate), checkpoint(state)
            proposal, x = [], cur
            for _ in range(k):
                dl, dstate = draft.decode(x, dstate)
                x = dl[:, -1].argmax(-1, keepdim=True)
                proposal.append(x)
            fed = torch.cat([cur] + proposal, dim=1)  # [B, k + 1]
            tl, state = run.extend(fed, state)
            choice = tl.argmax(-1)  # [B, k + 1]: the target's greedy token after each fed token
            agree = (choice[:, :k] == fed[:, 1:]).long().cumprod(1).sum(1)  # drafts accepted, [B]
            state = _advance(run, state, tbefore, fed, agree + 1, k + 1)
            dstate = _advance(draft, dstate, dbefore, fed, agree + 1, k)
            nxt = choice.gather(1, agree.view(B, 1))  # the target's own token after the accepted ones
            for b in range(B):
                out[b].extend(fed[b, 1:1 + int(agree[b])].tolist() + [int(nxt[b])])
            cur = nxt
            stats["rounds"] += 1
            stats["drafted"] += k * B
            stats["accepted"] += int(agree.sum())
            if progress is not None:
                progress.write(f"\rgenerated {min(len(o) for o in out)}/{max_new_tokens} tokens a sequence, "
                               f"acceptance {stats['accepted'] / stats['drafted']:.2f}")
                progress.flush()
        t2 = time.perf_counter()
    if progress is not None:
        progress.write("\n")
    new = [o[:max_new_tokens] for o in out]
    stats.update(prefill_s=t1 - t0, decode_s=t2 - t1, tokens=max_new_tokens * B,
                 acceptance=stats["accepted"] / max(stats["drafted"], 1),
                 tokens_per_s=(max_new_tokens - 1) * B / (t2 - t1) if t2 > t1 else float("nan"))
    return new, stats
