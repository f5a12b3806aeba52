"""The serving forms of a compiled model: fixed-capacity caches, ragged prompts, last-token logits.

`k3c.compile(..., max_context=N)` captures prefill as `(input_ids, lengths)` and decode over
caches of N rows (models/serving.py); this module checks the compile options, records the
capacity in the manifest (`"serving": {"cache": "fixed", "max_context": N}`) and turns a
CompiledModel's `prefill(ids, lengths, logits)` call into the inputs of the entry that runs it.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch

from .backends.artifact import MANIFEST, read
from .errors import InputError, UsageError

CACHES = ("fixed", "grow")


def check_cache_mode(max_context: int | None, cache: str | None) -> int | None:
    """The capacity the graphs are captured with (None: growing caches), or a UsageError."""
    if cache is not None and cache not in CACHES:
        raise UsageError(f"cache must be one of {', '.join(CACHES)}, got {cache!r}")
    if max_context is not None and (isinstance(max_context, bool) or not isinstance(max_context, int)
                                    or max_context < 2):
        raise UsageError(f"max_context must be an int of at least 2 (the cache capacity), got {max_context!r}")
    if cache == "fixed" and max_context is None:
        raise UsageError("cache='fixed' needs max_context=N (the capacity of every cache)")
    return None if cache == "grow" else max_context


def with_last_entry(graphs: dict) -> dict:
    """`graphs` and, beside a prefill, `prefill_last`: the same graph through the
    last-token-logits pass (logits [B, 1, vocab], the lm_head on one row a sequence)."""
    if "prefill" not in graphs:
        return graphs
    from . import passes

    return {**graphs, "prefill_last": passes.run(graphs["prefill"], ["last-token-logits"])}


def record_serving(out_dir: Path, graphs: dict) -> None:
    """Write the caches' form into the artifact's manifest (it is not among the sealed files)."""
    manifest = read(out_dir)
    if manifest is None:
        return
    n = next(iter(graphs.values())).meta.get("max_context")
    manifest["serving"] = {"cache": "grow" if n is None else "fixed", "max_context": n,
                           "entries": sorted(graphs)}
    write(out_dir, manifest)


def write(out_dir: Path, manifest: dict) -> None:
    """Replace the manifest whole (a temporary file renamed over it): an interrupted write
    leaves the previous manifest, never half of one."""
    path = Path(out_dir) / MANIFEST
    tmp = path.with_name(f".{MANIFEST}.{os.getpid()}.tmp")
    try:
        tmp.write_text(json.dumps(manifest, indent=1) + "\n")
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def record_compute(out_dir: Path, graphs: dict) -> None:
    """Write the compute policy the artifact was built with into its manifest: `policy` (None:
    the model's own dtypes; "f32"; "bf16": BF16 GEMM operands) and the dtypes its weights are
    held in (passes/compute_dtype.py); and `recurrent_state`: the dtype the recurrent states are
    held in between calls and their names (passes/state_dtype.py), what an engine allocates per
    slot (ONNX's own `state` lists every state input in order)."""
    from .passes.state_dtype import recurrent_names

    manifest = read(out_dir)
    if manifest is None:
        return
    g = next(iter(graphs.values()))
    held = sorted({t.dtype for v, t in g.types.items() if v in g.weights})
    manifest["compute"] = {"policy": g.meta.get("compute"), "weights": held}
    names = list(dict.fromkeys(n for graph in graphs.values() for n in recurrent_names(graph)))
    manifest["recurrent_state"] = {"dtype": g.meta.get("state_dtype", "f32"), "names": names}
    write(out_dir, manifest)


def last_logits(logits: torch.Tensor, lengths) -> torch.Tensor:
    """[B, T, vocab] -> [B, 1, vocab]: each sequence's last real row (an artifact without a
    prefill_last entry computes every row and returns this one)."""
    B, T, V = logits.shape
    if lengths is None:
        return logits[:, T - 1:]
    return torch.gather(logits, 1, (torch.as_tensor(lengths).long() - 1).view(B, 1, 1).expand(B, 1, V))


def prefill_inputs(compiled, input_ids: torch.Tensor, lengths, logits: str) -> tuple[str, list[torch.Tensor]]:
    """The entry and inputs of a prefill call of `compiled` (a CompiledModel): prefill_last for
    last-token logits where the artifact has it (else prefill, whose logits `last_logits` cuts)."""
    from .models.validate import check_input_ids, check_lengths

    if logits not in ("all", "last"):
        raise InputError(f"prefill: logits must be 'all' or 'last', got {logits!r}")
    check_input_ids(input_ids, "prefill")
    B, T = input_ids.shape
    entry = "prefill_last" if logits == "last" and "prefill_last" in compiled.graphs else "prefill"
    takes_lengths = "lengths" in compiled.graphs[entry].inputs
    if lengths is None:
        return entry, [input_ids] + ([torch.full((B,), T, dtype=torch.long)] if takes_lengths else [])
    lengths = check_lengths(lengths, B, T, "prefill")
    if not takes_lengths:
        if bool((lengths != T).any()):
            raise InputError("prefill: prompts of different lengths need an artifact with fixed-capacity "
                             "caches (compile with max_context=N)")
        return entry, [input_ids]
    return entry, [input_ids, lengths]


def extend_inputs(compiled, input_ids: torch.Tensor, state: dict, lengths,
                  logits: str) -> tuple[list[torch.Tensor], torch.Tensor | None]:
    """The inputs of an extend call of `compiled` (a CompiledModel), and `lengths` checked:
    ids [B, T >= 1], the state the extend graph takes, each row's real tokens (fixed caches)."""
    from .compiler import check_state_names
    from .models.extend import _check_counts
    from .models.validate import check_input_ids, check_positions

    if logits not in ("all", "last"):
        raise InputError(f"extend: logits must be 'all' or 'last', got {logits!r}")
    check_input_ids(input_ids, "extend")
    B, T = input_ids.shape
    if T == 0:
        raise InputError("extend: input_ids holds no token (T = 0)")
    g = compiled.graphs["extend"]
    takes_lengths = "lengths" in g.inputs
    names = [n for n in g.inputs[1:] if n != "lengths"]
    check_state_names(names, state, compiled.model_name)
    if lengths is not None and not takes_lengths:
        raise InputError("extend: lengths= needs an artifact with fixed-capacity caches (compile with "
                         "max_context=N): a growing cache holds one length for the whole batch")
    if takes_lengths:
        lengths = torch.full((B,), T, dtype=torch.long) if lengths is None else _check_counts(lengths, B, T)
        end = check_positions(state, B, 0, "extend") + T  # every row of the call is written
        if bool((end > compiled.max_context).any()):
            b = int((end > compiled.max_context).nonzero()[0])
            raise InputError(f"extend: sequence {b} holds {int(end[b]) - T} tokens; {T} more rows do not fit "
                             f"the {compiled.max_context} rows of its caches")
    inputs = [input_ids] + [state[n] for n in names] + ([lengths] if takes_lengths else [])
    return inputs, lengths


def check_decode_positions(compiled, state: dict, B: int) -> None:
    """A fixed-capacity state's positions: int64 [B], each with room for one more row."""
    if "positions" not in state or compiled.max_context is None:
        return
    from .models.validate import check_positions

    check_positions(state, B, compiled.max_context)
