"""One line, exit 2, before any work, for what a hostile but realistic user types: flags that
contradict each other or would be ignored, backend names with flavours, requests that cannot
fit the memory or a GPU's launch limits."""

from __future__ import annotations

import pytest
from cli_testlib import fails as _fails

import k3c
from k3c.backend_spec import BackendSpec, parse_backend
from k3c.cli import main
from k3c.diff import seeded_ids
from k3c.errors import UsageError

GPT2 = ["--model", "gpt2-tiny"]
CASES = [
    (["show", *GPT2, "--inputs", "x=f32[2,4]"], "--inputs applies to --model FILE.py:NAME"),
    (["compile", *GPT2, "--backend", "onnx", "--cache", "grow", "--max-context", "64"], "contradict each other"),
    (["compile", *GPT2, "--backend", "onnx", "--cache", "fixed"], "--cache fixed needs --max-context"),
    (["compile", *GPT2, "--backend", "onnx:ort", "--flavour", "portable"], "contradict each other"),
    (["compile", *GPT2, "--backend", "tvm", "--flavour", "ort"], "has no flavours"),
    (["compile", *GPT2, "--backend", "onnx", "--seq-len", "64"], "--seq-len applies to --backend all"),
    (["compile", *GPT2, "--backend", "all", "--target", "cuda"], "--target with --backend all"),
    (["compile", *GPT2, "--backend", "onnx,tvm", "--max-context", "64", "--verify"],
     "--max-context, --verify with --backend onnx,tvm"),
    (["compile", *GPT2, "--backend", "triton", "--target", "sm_90", "--seq-len", "1000000000000"],
     "exceed CUDA's launch limit of 65535 blocks"),
    (["bench", *GPT2, "--backends", "reference", "--plot", "p.png", "--json", "p.png"], "name the same file"),
    (["diff", *GPT2, "--backends", "reference", "--flavour", "ort"], "applies to a bare onnx"),
    (["diff", *GPT2, "--backends", "onnx:fast"], "unknown onnx flavour 'fast'"),
    (["diff", *GPT2, "--backends", "reference", "--mesh", ""], "--mesh '' names no mesh"),
    (["diff", *GPT2, "--backends", "reference", "--out", "D", "--keep"], "kept anyway"),
    (["show", *GPT2, "--target", "cuda"], "--target applies to show --backend tvm"),
    (["show", *GPT2, "--backend", "tvm", "--dot", "g.dot"], "--dot with --backend tvm"),
    (["generate", *GPT2, "--backend", "eager", "--prompt-ids", "1 2", "--max-new-tokens", "2", "--out", "F"],
     "--out with --backend eager"),
    (["generate", *GPT2, "--backend", "onnx:fast", "--prompt-ids", "1 2", "--max-new-tokens", "2"],
     "unknown onnx flavour"),
]


@pytest.mark.parametrize("argv, words", CASES, ids=[" ".join(a[0:1] + a[3:]) for a, _ in CASES])
def test_refused_in_one_line_before_any_work(argv, words, capsys, no_work):
    _fails(argv, capsys, words)


def test_one_parser_of_backend_names():
    assert parse_backend("onnx:ort") == BackendSpec("onnx", "ort")
    assert parse_backend("onnx", flavour="ort") == BackendSpec("onnx", "ort")
    assert str(parse_backend("onnx:portable")) == "onnx" and str(parse_backend("onnx:ort")) == "onnx:ort"
    assert parse_backend("tvm").variant("cuda") == "cuda" and parse_backend("tvm").variant() == "llvm"
    assert parse_backend("onnx").variant() == "portable" and parse_backend("onnx").options() == {}
    with pytest.raises(UsageError, match="unknown backend 'onnxx'"):
        parse_backend("onnxx")


def test_generate_takes_a_flavoured_backend(capsys, monkeypatch, tmp_path):
    """`generate --backend onnx:ort` compiles for onnx with flavour ort (the compile itself is
    stood in for by the eager model: what is checked is what generate asks for)."""
    from k3c.generate import EagerRunner

    asked = []

    def fake_compile(model, backend, example, out_dir=None, max_context=None, force=False, **options):
        asked.append((backend, options, max_context))
        run = EagerRunner(model, max_context)
        run.out_dir = tmp_path
        return run

    monkeypatch.setattr(k3c, "compile", fake_compile)
    assert main(["generate", *GPT2, "--backend", "onnx:ort", "--prompt-ids", "1 2 3", "--max-new-tokens", "3"]) == 0
    assert asked == [("onnx", {"flavour": "ort"}, 6)]
    out = capsys.readouterr()
    assert len(out.out.split()) == 3 and "compiled gpt2-tiny for onnx:ort" in out.err


def test_generate_refuses_caches_past_the_memory(capsys, monkeypatch):
    monkeypatch.setattr("k3c.resources.available_memory", lambda: 1 << 30)
    _fails(["generate", "--model", "k3-tiny", "--backend", "eager", "--prompt-ids", "1 2",
            "--max-new-tokens", "100000000"], capsys, "more than the 1 GiB of memory available")


def test_generate_refuses_caches_past_the_position_table(capsys):
    _fails(["generate", *GPT2, "--backend", "eager", "--prompt-ids", "1 2", "--max-new-tokens", "100000000"],
           capsys, "exceed gpt2-tiny's position table (n_positions = 512)")


def test_diff_refuses_a_batch_past_the_memory(capsys, monkeypatch):
    monkeypatch.setattr("k3c.resources.available_memory", lambda: 1 << 30)
    _fails(["diff", *GPT2, "--backends", "reference", "--batch", "100000"], capsys,
           "diff: batch 100000 x 138 tokens of 1024 logits needs at least")


def test_compile_names_a_bad_chunk_size():
    model = k3c.models.build("deltanet-tiny")
    ids = (seeded_ids(1024, 1, 4),)
    with pytest.raises(UsageError, match="chunk_size=0: the chunk length of chunk-delta-rule must be a positive int"):
        k3c.compile(model, "reference", ids, chunk_size=0)
    with pytest.raises(UsageError, match="has no chunk-delta-rule pass"):
        k3c.compile(model, "reference", ids, passes="none", chunk_size=32)


def test_a_compiled_prefill_names_one_dimensional_ids():
    model = k3c.models.build("gpt2-tiny")
    run = k3c.compile(model, "reference", (seeded_ids(1024, 1, 4),))
    with pytest.raises(k3c.errors.InputError, match=r"prefill: input_ids must be \[B, T\], got shape \[3\]"):
        run.prefill(seeded_ids(1024, 1, 3)[0])
