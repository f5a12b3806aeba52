"""Last-token logits and greedy generation: the prefill_last entry against the full prefill,
`generate` through an artifact against eager greedy decoding (one prompt and a ragged
batch), examples/onnx_generate.py on a fixed-cache artifact, and `k3c generate`."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from serving_testlib import CAPACITY, build

import k3c
from k3c.generate import EagerRunner, generate
from k3c.numerics import compare
from k3c.serving import with_last_entry

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def k3_onnx(tmp_path_factory, fixed_graphs):
    model = k3c.models.build("k3-tiny").eval()
    graphs = with_last_entry(fixed_graphs(model))
    out = tmp_path_factory.mktemp("gen") / "onnx"
    compiled = build("onnx", graphs, out)
    from k3c.serving import record_serving

    record_serving(out, compiled.graphs)
    return model, compiled


def greedy_alone(model, prompt: list[int], n: int) -> list[int]:
    """Eager greedy decoding with growing caches, one sequence: the independent reference."""
    tokens = []
    with torch.no_grad():
        logits, state = model.prefill(torch.tensor([prompt]))
        for _ in range(n):
            tokens.append(int(logits[0, -1].argmax()))
            logits, state = model.decode(torch.tensor([[tokens[-1]]]), state)
    return tokens


def test_prefill_last_is_the_last_row(k3_onnx):
    model, compiled = k3_onnx
    g = compiled.graphs["prefill_last"]
    assert [str(d) for d in g.types[g.output_values[0]].shape] == ["B", "1", str(model.config.vocab_size)]
    ids = torch.randint(0, model.config.vocab_size, (3, 11), generator=torch.Generator().manual_seed(5))
    lengths = torch.tensor([11, 2, 7])
    with torch.no_grad():
        every, _ = compiled.prefill(ids, lengths=lengths)
        last, _ = compiled.prefill(ids, lengths=lengths, logits="last")
        eager, _ = model.prefill(ids, lengths=lengths, logits="last", max_context=CAPACITY)
    rows = torch.stack([every[b, n - 1] for b, n in enumerate(lengths.tolist())])[:, None]
    assert last.shape == (3, 1, model.config.vocab_size)
    assert compare(last, rows).ok and compare(last, eager).ok


def test_generate_matches_eager_greedy(k3_onnx):
    model, compiled = k3_onnx
    prompts = [[1, 17, 42, 99, 256, 7], [5, 600], [9, 8, 7, 6, 5, 4, 3, 2, 1, 0]]
    new, stats = generate(compiled, prompts, 8)
    assert new == [greedy_alone(model, p, 8) for p in prompts]  # a ragged batch, each as if alone
    assert stats["tokens"] == 24 and stats["tokens_per_s"] > 0
    assert generate(EagerRunner(model, CAPACITY), prompts, 8)[0] == new


def test_example_runs_the_fixed_cache_artifact(k3_onnx):
    model, compiled = k3_onnx
    run = subprocess.run([sys.executable, str(ROOT / "examples" / "onnx_generate.py"), str(compiled.out_dir),
                          "--tokens", "6"], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert run.returncode == 0, run.stderr[-2000:]
    result = json.loads(run.stdout.strip().splitlines()[-1])
    assert result["generated"] == greedy_alone(model, result["prompt"], 6)


def test_cli_generate(capsys):
    from k3c.cli import main

    assert main(["generate", "--model", "gated-deltanet-tiny", "--backend", "reference", "--prompt-ids", "3 1 4 1 5",
                 "--max-new-tokens", "4"]) == 0
    out, err = capsys.readouterr()
    model = k3c.models.build("gated-deltanet-tiny").eval()
    assert [int(t) for t in out.split()] == greedy_alone(model, [3, 1, 4, 1, 5], 4)
    assert "tokens/s" in err and "generated 4/4" in err


def test_cli_generate_rejects_two_prompt_sources(tmp_path):
    from k3c.cli import main

    f = tmp_path / "p.txt"
    f.write_text("1 2 3\n")
    assert main(["generate", "--model", "gpt2-tiny", "--backend", "eager", "--prompt-ids", "1 2",
                 "--prompt-file", str(f), "--max-new-tokens", "2"]) == 2


def test_the_manifest_names_the_opset_the_fixed_cache_needs(k3_onnx):
    """TensorScatter, which writes the new rows in place, is an opset-24 op: a runtime that
    reads the manifest must learn it needs 24, not the 23 of the grown form."""
    import onnx

    out = k3_onnx[1].out_dir
    m = json.loads((out / "manifest.json").read_text())
    decode = onnx.load(str(out / m["entries"]["decode"]["file"]), load_external_data=False)
    assert "TensorScatter" in {n.op_type for n in decode.graph.node}
    assert next(o.version for o in decode.opset_import if o.domain == "") == 24
    assert m["entries"]["decode"]["opset"] == 24 and m["opset"] == 24
