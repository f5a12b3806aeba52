"""state_dtype="bf16": the recurrent states (KDA and delta-rule states, short-conv tails) cross
every entry's boundary in BF16 and are updated in float32 inside (passes/state_dtype.py).

The reference is the eager model under the same policy, written from the model's own state
spec (models.precision.BF16State: each recurrent state rounded to BF16 when a call returns it),
compared at the BF16_STATE row of k3c/numerics.py over a ragged prefill, an extend and decode
steps. The default ("f32") leaves the graphs as they were.
"""

from __future__ import annotations

import copy
import json
import textwrap

import pytest
import torch
from serving_testlib import CAPACITY

import k3c
from k3c import ir, passes
from k3c.backends import artifact
from k3c.compiler import CompiledModel, prepare
from k3c.diff import backend_for
from k3c.errors import InputError, UsageError
from k3c.models.precision import BF16State
from k3c.models.validate import state_spec
from k3c.numerics import BF16_STATE, compare, model_tolerance
from k3c.passes.state_dtype import is_recurrent
from k3c.serving import record_compute

BATCH, PROMPT, LENGTHS, MORE, STEPS = 2, 13, [13, 9], 7, 3
# the portable ONNX flavour and TVM take minutes on two cores: in the slow tier (pytest -m slow)
BACKENDS = ["reference", "onnx:ort", *(pytest.param(b, marks=pytest.mark.slow) for b in ("onnx", "tvm", "triton"))]

GRAPH = """graph decode {
  dim B in [1, inf]
  input %x: f32[B, 4]
  input %layers.0.S: f32[B, 4]
  input %layers.0.ckv: f32[B, 4]
  %s: f32[B, 4] = add(%layers.0.S, %x)
  %c: f32[B, 4] = tanh(%layers.0.ckv)
  %y: f32[B, 4] = mul(%s, %c)
  output y = %y
  output layers.0.S = %s
  output layers.0.ckv = %c
}"""


def build(spec: str, graphs: dict, out, state_dtype: str | None = None) -> CompiledModel:
    """Lower `graphs` (as captured) for backend `spec` (onnx:ort) into `out`, as k3c.compile does."""
    be = backend_for(spec)
    graphs = prepare(graphs, be, state_dtype=state_dtype)
    artifact.write(be, graphs, out, force=True)
    record_compute(out, graphs)
    return CompiledModel(be.load(out), graphs, out, spec)


def _text(t: str) -> str:
    return textwrap.dedent(t).strip() + "\n"


def test_the_pass_narrows_only_the_recurrent_boundary():
    g = ir.verify(ir.parse(GRAPH))
    out = passes.run(g, ['state-dtype{dtype="bf16"}'])
    assert str(out) == _text("""graph decode {
  dim B in [1, inf]
  meta {"state_dtype": "bf16"}
  input %x: f32[B, 4]
  input %layers.0.S: bf16[B, 4]
  input %layers.0.ckv: f32[B, 4]
  %layers.0.S.f32: f32[B, 4] = cast(%layers.0.S) {dtype="f32"}
  %s: f32[B, 4] = add(%layers.0.S.f32, %x)
  %c: f32[B, 4] = tanh(%layers.0.ckv)
  %y: f32[B, 4] = mul(%s, %c)
  %layers.0.S.bf16: bf16[B, 4] = cast(%s) {dtype="bf16"}
  output y = %y
  output layers.0.S = %layers.0.S.bf16
  output layers.0.ckv = %c
}""")
    # numerically: the update in float32 from the widened state, the state rounded once when returned
    gen = torch.Generator().manual_seed(0)
    x, S, ckv = (torch.randn(3, 4, generator=gen) for _ in range(3))
    S16 = S.to(torch.bfloat16)
    y, S_new, c = ir.interpret(out, x, S16, ckv)
    want = S16.float() + x
    assert torch.equal(y, want * torch.tanh(ckv)) and torch.equal(c, torch.tanh(ckv))
    assert S_new.dtype == torch.bfloat16 and torch.equal(S_new, want.to(torch.bfloat16))
    assert str(passes.run(g, ['state-dtype{dtype="f32"}'])) == str(g)


def test_the_default_pipeline_has_no_state_step():
    steps = passes.steps_of("default")
    assert passes.for_backend(steps, state_dtype=None) == steps == passes.for_backend(steps, state_dtype="f32")
    bf16 = passes.for_backend(steps, compute="f32", state_dtype="bf16")
    names = [passes.registry.parse_step(s)[0] for s in bf16]
    assert names[-3:] == ["compute-dtype", "state-dtype", "dce"]


@pytest.mark.parametrize("name", ["k3-tiny", "kimi-linear-tiny", "gpt2-tiny", "linear-attn-tiny",
                                  "deltanet-tiny", "gated-deltanet-tiny"])
def test_the_pass_and_the_eager_policy_agree_on_what_is_recurrent(name):
    """The pass goes by name, the eager policy by the model's state spec (no axis growing
    with the context): on every zoo family they pick the same entries."""
    spec = state_spec(k3c.models.build(name))
    by_spec = {k for k, (_, grows, dt) in spec.items() if dt.is_floating_point and not grows}
    assert by_spec == {k for k in spec if is_recurrent(k)}
    assert name == "gpt2-tiny" or by_spec


@pytest.fixture(scope="module")
def case():
    """k3-tiny, its tokens, the eager chain under the BF16 state policy, and one extend and one
    decode from the policy's prefill state (BF16) by the model itself in float32 and float64."""
    model = k3c.models.build("k3-tiny").eval()
    tokens = torch.randint(0, model.config.vocab_size, (BATCH, PROMPT + MORE + STEPS),
                           generator=torch.Generator().manual_seed(5))
    exact = copy.deepcopy(model).double()
    with torch.no_grad():
        want = _run(BF16State(model), tokens)
        start = want[0][1]
        one = {}
        for what, m, dt in (("f32", model, torch.float32), ("f64", exact, torch.float64)):
            wide = {k: v.to(dt) if v.is_floating_point() else v for k, v in start.items()}  # exact
            one[what] = (m.extend(tokens[:, PROMPT:PROMPT + MORE], _clone(wide)),
                         m.decode(tokens[:, PROMPT:PROMPT + 1], _clone(wide)))
    return model, tokens, want, one


def _clone(state: dict) -> dict:
    return {k: v.clone() for k, v in state.items()}


def _run(m, tokens):
    """A ragged prefill (max_context for the eager model), an extend, decode steps: each call's
    logits, and the state after each."""
    lengths = torch.tensor(LENGTHS)
    kw = {"max_context": CAPACITY} if not isinstance(m, CompiledModel) else {}
    out, state = m.prefill(tokens[:, :PROMPT], lengths=lengths, **kw)
    calls = [(out, state)]
    out, state = m.extend(tokens[:, PROMPT:PROMPT + MORE], _clone(state))  # caches may be written in place
    calls.append((out, state))
    for i in range(STEPS):
        at = PROMPT + MORE + i
        out, state = m.decode(tokens[:, at:at + 1], _clone(state))
        calls.append((out, state))
    return calls


def _off(got, want) -> list[str]:
    bad = []
    for i, ((lg, st), (wl, ws)) in enumerate(zip(got, want)):
        for what, a, b in [("logits", lg, wl), *((k, st[k], v) for k, v in ws.items() if k != "positions")]:
            c = compare(a, b, tolerance=BF16_STATE)
            if not c.ok:
                bad.append(f"call {i} {what}: max_abs_err={c.max_abs_err:.2e} rel_rms_err={c.rel_rms_err:.2e}")
    return bad


@pytest.mark.parametrize("backend", BACKENDS)
def test_every_backend_equals_the_eager_policy(case, fixed_graphs, backend, tmp_path):
    model, tokens, want, one = case
    compiled = build(backend, fixed_graphs(model), tmp_path, state_dtype="bf16")
    with torch.no_grad():
        got = _run(compiled, tokens)
        start = want[0][1]
        ext = compiled.extend(tokens[:, PROMPT:PROMPT + MORE], _clone(start))
        dec = compiled.decode(tokens[:, PROMPT:PROMPT + 1], _clone(start))
    for _, state in got:  # what the next call takes: recurrent states in BF16, the caches as they were
        for k, v in state.items():
            assert v.dtype == (torch.bfloat16 if is_recurrent(k) else want[0][1][k].dtype), k
    assert not _off(got, want), _off(got, want)
    assert torch.equal(got[-1][1]["positions"], want[-1][1]["positions"])
    # one call from a BF16 state: widened where read, so the logits are float32's (the model's
    # own tolerance); the state returned is that call's float32 state rounded once (BF16's row)
    for i, (what, (lg, st)) in enumerate([("extend", ext), ("decode", dec)]):
        (w32, s32), (w64, _) = one["f32"][i], one["f64"][i]
        c = compare(lg, w32, tolerance=model_tolerance(w32, w64))
        assert c.ok, f"{backend} {what} logits: {c}"
        for k, v in s32.items():
            if is_recurrent(k):
                assert compare(st[k], v, dtype=torch.bfloat16).ok, f"{backend} {what} {k}"


def test_the_state_handed_between_calls_halves(case, fixed_graphs, tmp_path):
    model, tokens, _, _ = case
    graphs = fixed_graphs(model)
    compiled = build("reference", graphs, tmp_path / "bf16", state_dtype="bf16")
    default = build("reference", graphs, tmp_path / "f32")
    with torch.no_grad():
        _, half = compiled.prefill(tokens[:, :PROMPT], lengths=torch.tensor(LENGTHS))
        _, full = default.prefill(tokens[:, :PROMPT], lengths=torch.tensor(LENGTHS))
    recurrent = [k for k in full if is_recurrent(k)]
    assert recurrent and set(half) == set(full)
    nbytes = lambda st, keys: sum(st[k].nbytes for k in keys)  # noqa: E731
    assert nbytes(half, recurrent) * 2 == nbytes(full, recurrent)
    caches = [k for k in full if k not in recurrent]
    assert nbytes(half, caches) == nbytes(full, caches)
    manifest = json.loads((tmp_path / "bf16" / "manifest.json").read_text())
    assert manifest["recurrent_state"] == {"dtype": "bf16", "names": sorted(recurrent, key=list(full).index)}
    assert json.loads((tmp_path / "f32" / "manifest.json").read_text())["recurrent_state"]["dtype"] == "f32"


def test_a_state_of_the_wrong_dtype_and_an_unknown_dtype_are_user_errors(case, fixed_graphs, tmp_path):
    model, tokens, want, _ = case
    with pytest.raises(UsageError, match="state_dtype='f16'"):
        k3c.compile(model, "reference", (tokens[:, :4],), state_dtype="f16")
    compiled = build("reference", fixed_graphs(model), tmp_path, state_dtype="bf16")
    f32_state = {k: v.float() if v.is_floating_point() else v for k, v in want[0][1].items()}
    with pytest.raises(InputError):
        compiled.decode(tokens[:, PROMPT:PROMPT + 1], f32_state)


@pytest.mark.slow
def test_cli_compile_and_diff_take_the_state_dtype(tmp_path, capsys):
    from k3c import cli

    out = tmp_path / "a"
    assert cli.main(["compile", "--model", "gated-deltanet-tiny", "--backend", "reference", "--out", str(out),
                     "--state-dtype", "bf16"]) == 0
    state = json.loads((out / "manifest.json").read_text())["recurrent_state"]
    assert state["dtype"] == "bf16" and "layers.0.S" in state["names"] and "layers.0.conv_v" in state["names"]
    assert cli.main(["diff", "--model", "gated-deltanet-tiny", "--backends", "reference", "--seq-len", "16",
                     "--decode-steps", "2", "--state-dtype", "bf16", "--json", str(tmp_path / "d.json")]) == 0
    report = json.loads((tmp_path / "d.json").read_text())
    assert report["state_dtype"] == "bf16" and report["backends"]["reference"]["ok"]
    with pytest.raises(SystemExit) as e:
        cli.main(["diff", "--model", "gated-deltanet-tiny", "--backends", "reference", "--state-dtype", "f16"])
    assert e.value.code == 2
