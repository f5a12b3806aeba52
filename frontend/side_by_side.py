"""Several entries of one model captured side by side.

torch.export runs in Python and keeps one core busy for seconds an entry (k3-tiny: about 4 s
each for prefill, decode and extend). Where k3c.forked allows, `capture_all` captures the
first entry here and the others in forked children at the same time. A child sends its Graph
back with each weight that is one of the model's own tensors named rather than copied (this
process rebinds it to that tensor, detached as a capture here detaches it), and the warnings
its capture raised, which are raised again here. The entries of a child that failed are
captured here after the others, so an error (an unsupported op and its source line) is raised
exactly as a capture here raises it; so are those of a child that has not ended long after
this process captured its own (killed: a hang costs time, never the run).
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Callable

import torch

from ..forked import Child, cores, usable
from ..ir import Graph

_OWN = "k3c:model-tensor"  # what a child sends for a weight that is the model's own tensor

children_used = 0  # how many entries were captured in children (read by the tests)
PATIENCE = 120.0  # seconds at least that a child may take after this process's own captures


def capture_all(capture_one: Callable[[str], Graph], entries: tuple[str, ...],
                model: torch.nn.Module) -> dict[str, Graph]:
    """{entry: capture_one(entry)} for every entry, in the order given; side by side in forked
    children where k3c.forked allows, else one after another."""
    if len(entries) < 2 or not usable():
        return {e: capture_one(e) for e in entries}
    n = min(len(entries), cores())
    mine, theirs = list(entries[::n]), [list(entries[i::n]) for i in range(1, n)]
    children: list[Child] = []
    got: dict[str, Graph] = {}
    try:
        for share in theirs:
            children.append(Child(lambda share=share: _captured(capture_one, share, model)))
        t0 = time.monotonic()
        got.update((e, capture_one(e)) for e in mine)
        # a child's entries take about as long as these: one far longer hangs, and is done here
        patience = max(PATIENCE, 4 * (time.monotonic() - t0))
        own = _own_tensors(model)
        while children:
            ok, sent = children.pop(0).result(timeout=patience)
            if ok:
                got.update(_received(sent, own))
    finally:  # this process failed (or was interrupted) first: end the children, leave no file
        for child in children:
            child.kill()
    global children_used
    children_used += sum(e in got for s in theirs for e in s)
    for e in entries:  # a child's failure: captured here, where its error is raised as it would be
        if e not in got:
            got[e] = capture_one(e)
    return {e: got[e] for e in entries}


def _own_tensors(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return dict(model.named_parameters(remove_duplicate=False)) | dict(model.named_buffers(remove_duplicate=False))


def _key(t: torch.Tensor) -> tuple:
    """What makes a weight the same tensor as one of the model's: the same memory, read alike."""
    return t.untyped_storage().data_ptr(), t.storage_offset(), tuple(t.shape), t.stride(), t.dtype


def _captured(capture_one, share: list[str], model) -> dict:
    """In the child: its entries' graphs, the model's own weights named, and its warnings."""
    own = {_key(t): name for name, t in _own_tensors(model).items() if not t.is_meta}
    with warnings.catch_warnings(record=True) as said:
        graphs = {e: capture_one(e) for e in share}
    sent = {}
    for e, g in graphs.items():
        g = g.copy()
        g.weights = {w: (_OWN, own[_key(t)]) if not t.is_meta and _key(t) in own else t
                     for w, t in g.weights.items()}
        sent[e] = g
    return {"graphs": sent, "warnings": [(str(w.message), w.category, w.filename, w.lineno) for w in said]}


def _received(sent: dict, own: dict[str, torch.Tensor]) -> dict[str, Graph]:
    """The child's graphs with their weights rebound to the model's own tensors; its warnings raised here."""
    out = {}
    for e, g in sent["graphs"].items():
        g.weights = {w: own[t[1]].detach() if isinstance(t, tuple) and t[0] == _OWN else t
                     for w, t in g.weights.items()}
        out[e] = g
    for message, category, filename, lineno in sent["warnings"]:
        warnings.warn_explicit(message, category, filename, lineno)
    return out
