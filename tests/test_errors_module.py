"""One error class per kind, all reachable from k3c.errors, each the same class wherever it is
imported from; and a backend's failure shows its reason in the diff table (a tied-weight crash
used to show only "RuntimeError:", its message starting on the next line)."""

from __future__ import annotations

import pytest
import torch

import k3c
from k3c import backends, errors
from k3c.backends.reference import ReferenceBackend
from k3c.diff import diff


def test_every_kind_is_reachable_and_one_class():
    import k3c.backends.base
    import k3c.frontend
    import k3c.ir
    import k3c.models.checkpoint

    assert errors.InputError is k3c.ir.InputError
    assert errors.VerifyError is k3c.ir.VerifyError and errors.ParseError is k3c.ir.ParseError
    assert errors.CheckpointError is k3c.models.checkpoint.CheckpointError
    assert errors.CaptureError is k3c.frontend.CaptureError
    assert errors.UnsupportedNodeError is k3c.backends.base.UnsupportedNodeError
    assert errors.user_errors() == (errors.K3cError,)
    for cls in (errors.UsageError, errors.ArtifactError, errors.CaptureError, errors.UnsupportedNodeError,
                errors.InputError, errors.VerifyError, errors.ParseError, errors.ShapeError, errors.CheckpointError):
        assert issubclass(cls, errors.K3cError)
    assert issubclass(errors.UsageError, ValueError)  # code that caught ValueError still does


class MultiLineFailure(ReferenceBackend):
    name = "multi-line"

    def lower(self, graphs, out_dir, **options):
        raise RuntimeError("\n  Some tensors share memory, this will lead to duplicate memory on disk: [{'a', 'b'}]")


def test_a_backend_failure_shows_its_reason_in_the_table():
    backends.register("multi-line", MultiLineFailure)
    report = diff(k3c.models.build("gpt2-tiny"), ["multi-line"], seq_len=8, decode_steps=1, timing=False)
    row = [ln for ln in report.table().splitlines() if ln.startswith("multi-line")][0]
    assert "RuntimeError: Some tensors share memory" in row


def test_a_user_error_inside_diff_is_raised_not_buried(tmp_path):
    out = tmp_path / "art"
    k3c.compile(k3c.models.build("linear-attn-tiny"), "reference", (torch.zeros(1, 4, dtype=torch.long),),
                out_dir=out / "reference")
    with pytest.raises(errors.UsageError, match="linear-attn-tiny"):
        diff(k3c.models.build("gpt2-tiny"), ["reference"], seq_len=8, decode_steps=1, out_root=out)
