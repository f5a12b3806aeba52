"""Greedy generation through a compiled artifact (or the eager model): `k3c generate`.

    tokens, stats = generate(run, [[1, 2, 3], [4, 5]], max_new_tokens=32)

The prompts of a batch may differ in length: they are right-padded and prefilled together
with their `lengths` into fixed-capacity caches, only each sequence's last logits are
computed (`logits="last"`), and every decode step writes one row a sequence at its own
position. A progress line (tokens so far, tokens per second) goes to `progress`.
"""

from __future__ import annotations

import shutil
import sys
import time
from pathlib import Path

import torch

from .errors import InputError, UsageError


def read_prompts(prompt_ids: str | None, prompt_file: str | None, batch_file: str | None) -> list[list[int]]:
    """The prompts the CLI was given: one from --prompt-ids or --prompt-file, or one a line of --batch-file."""
    given = [x for x in (prompt_ids, prompt_file, batch_file) if x is not None]
    if len(given) != 1:
        raise UsageError("give exactly one of --prompt-ids, --prompt-file and --batch-file")

    def ids_of(text: str, where: str) -> list[int]:
        try:
            ids = [int(t) for t in text.replace(",", " ").split()]
        except ValueError:
            raise UsageError(f"{where}: token ids must be integers separated by spaces") from None
        if not ids:
            raise UsageError(f"{where}: no token ids")
        return ids

    def text_of(path: str) -> str:
        try:
            return Path(path).read_text()
        except OSError as err:
            raise UsageError(f"{path}: cannot read ({err.strerror})") from None

    if prompt_ids is not None:
        return [ids_of(prompt_ids, "--prompt-ids")]
    if prompt_file is not None:
        return [ids_of(text_of(prompt_file), prompt_file)]
    lines = [ln for ln in text_of(batch_file).splitlines() if ln.strip()]
    if not lines:
        raise UsageError(f"{batch_file}: no prompts (one a line)")
    return [ids_of(ln, f"{batch_file} line {i + 1}") for i, ln in enumerate(lines)]


def pad(prompts: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-padded ids [B, max length] (padding id 0) and lengths [B]."""
    T = max(len(p) for p in prompts)
    ids = torch.zeros(len(prompts), T, dtype=torch.long)
    for b, p in enumerate(prompts):
        ids[b, :len(p)] = torch.tensor(p)
    return ids, torch.tensor([len(p) for p in prompts])


class EagerRunner:
    """The eager model called as an artifact: fixed caches of `max_context` rows."""

    def __init__(self, model, max_context: int):
        self.model, self.max_context = model, max_context

    def prefill(self, ids, lengths=None, logits="all"):
        return self.model.prefill(ids, lengths=lengths, logits=logits, max_context=self.max_context)

    def decode(self, ids, state):
        return self.model.decode(ids, state)

    def extend(self, ids, state, lengths=None, logits="all"):
        return self.model.extend(ids, state, lengths=lengths, logits=logits)


def generate(run, prompts: list[list[int]], max_new_tokens: int, progress=None) -> tuple[list[list[int]], dict]:
    """Greedy continuation of each prompt by `max_new_tokens` tokens through `run` (a
    CompiledModel with fixed caches, or EagerRunner). Returns the new tokens per prompt and
    {"prefill_s", "decode_s", "tokens", "tokens_per_s"} (decode tokens over decode time)."""
    if max_new_tokens < 1:
        raise InputError(f"max_new_tokens must be at least 1, got {max_new_tokens}")
    capacity = getattr(run, "max_context", None)
    longest = max(len(p) for p in prompts)
    if capacity is not None and longest + max_new_tokens - 1 > capacity:
        raise InputError(f"a prompt of {longest} tokens and {max_new_tokens} new ones exceed the caches' "
                         f"capacity max_context = {capacity}")
    ids, lengths = pad(prompts)
    out = []
    with torch.no_grad():
        t0 = time.perf_counter()
        logits, state = run.prefill(ids, lengths=lengths, logits="last")
        nxt = logits[:, -1].argmax(-1, keepdim=True)
        prefill_s = time.perf_counter() - t0
        out.append(nxt)
        t0 = time.perf_counter()
        for i in range(1, max_new_tokens):
            logits, state = run.decode(nxt, state)
            nxt = logits[:, -1].argmax(-1, keepdim=True)
            out.append(nxt)
            if progress is not None:
                dt = time.perf_counter() - t0
                progress.write(f"\rgenerated {i + 1}/{max_new_tokens} tokens a sequence, "
                               f"{i * len(prompts) / dt:.1f} tokens/s")
                progress.flush()
        decode_s = time.perf_counter() - t0
    if progress is not None and max_new_tokens > 1:
        progress.write("\n")
    new = torch.cat(out, dim=1).tolist()
    steps = (max_new_tokens - 1) * len(prompts)
    return new, {"prefill_s": prefill_s, "decode_s": decode_s, "tokens": max_new_tokens * len(prompts),
                 "tokens_per_s": steps / decode_s if decode_s > 0 else float("nan")}


def check_cache_fits(model, batch: int, capacity: int) -> None:
    """Fixed caches of `capacity` rows for `batch` sequences, refused (UsageError, with the
    numbers) when they cannot fit the memory available, or past the model's position table."""
    from .resources import check_fits, state_bytes

    limit = getattr(model.config, "n_positions", None)
    if limit is not None and capacity > limit:
        raise UsageError(f"caches of {capacity} rows (prompt + --max-new-tokens) exceed {model.name}'s position "
                         f"table (n_positions = {limit})")
    need, row = state_bytes(model, batch, capacity)
    # the tokens generated are kept too (int64 each): a model without caches is bounded by them
    check_fits(f"caches of {capacity} rows for {batch} sequence(s) ({row} bytes a row) and their tokens",
               need + batch * capacity * 8, UsageError)


def _draft_runner(args, model, capacity: int, batch: int):
    """The eager draft model of --draft (None without one): a zoo model of the target's vocabulary."""
    if getattr(args, "draft", None) is None:
        return None
    from . import models

    if args.draft_tokens < 1:
        raise UsageError(f"--draft-tokens must be at least 1, got {args.draft_tokens}")
    draft = models.build(args.draft).eval()
    if draft.config.vocab_size != model.config.vocab_size:
        raise UsageError(f"--draft {args.draft}: its vocabulary ({draft.config.vocab_size} ids) is not "
                         f"{args.model}'s ({model.config.vocab_size})")
    check_cache_fits(draft, batch, capacity)
    return EagerRunner(draft, capacity)


def run_cli(args) -> int:
    """`k3c generate`: build the model, compile it with fixed caches (or run eager), generate."""
    from . import compile as k3c_compile
    from . import models

    prompts = read_prompts(args.prompt_ids, args.prompt_file, args.batch_file)
    spec = None
    if args.backend != "eager":  # any name diff takes: NAME or NAME:FLAVOUR (backend_spec.py)
        from .backend_spec import parse_backend

        spec = parse_backend(args.backend, "--backend")
    model = models.build(args.model).eval()
    longest = max(len(p) for p in prompts)
    capacity = args.max_context or longest + args.max_new_tokens + (args.draft_tokens if args.draft else 0)
    if longest + args.max_new_tokens - 1 > capacity:
        raise InputError(f"a prompt of {longest} tokens and {args.max_new_tokens} new ones exceed --max-context "
                         f"{capacity}")
    check_cache_fits(model, len(prompts), capacity)
    if spec is None:
        run = EagerRunner(model, capacity)
    else:
        ids, _ = pad(prompts)
        t0 = time.perf_counter()
        run = k3c_compile(model, spec.name, (ids[:, :min(ids.shape[1], 16)].clamp(0, None),),
                          out_dir=args.out, max_context=capacity, force=args.force, **spec.options())
        kept = "" if args.out is None else f": {run.out_dir}"  # without --out it is removed at the end
        print(f"compiled {args.model} for {args.backend} (max_context {capacity}) in "
              f"{time.perf_counter() - t0:.1f}s{kept}", file=sys.stderr)
    try:  # from here on the temporary artifact is removed however the run ends (an error, Ctrl-C, SIGTERM)
        draft = _draft_runner(args, model, capacity, len(prompts))
        if draft is None:
            new, stats = generate(run, prompts, args.max_new_tokens, progress=sys.stderr)
        else:
            from .speculative import speculative

            new, stats = speculative(run, draft, prompts, args.max_new_tokens, args.draft_tokens, progress=sys.stderr)
            print(f"speculative: {stats['rounds']} rounds, {stats['accepted']}/{stats['drafted']} drafts accepted "
                  f"({stats['acceptance']:.2f})", file=sys.stderr)
    finally:
        if spec is not None and args.out is None:
            shutil.rmtree(run.out_dir, ignore_errors=True)
    for row in new:
        print(" ".join(map(str, row)))
    print(f"{stats['tokens']} tokens ({len(prompts)} sequences), prefill {stats['prefill_s'] * 1e3:.1f} ms, "
          f"decode {stats['tokens_per_s']:.1f} tokens/s", file=sys.stderr)
    return 0
