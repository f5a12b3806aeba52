"""Fixtures of the ONNX backend tests: the tiny zoo captured once per session, its ONNX
artifacts per (flavour, pipeline), and the eager results they are compared with."""

from __future__ import annotations

import pytest
import torch

import k3c

TINY = ["gpt2-tiny", "linear-attn-tiny", "deltanet-tiny", "gated-deltanet-tiny", "kimi-linear-tiny", "k3-tiny"]
CAPTURE_T = 16  # as the CLI captures
PREFILL_T = (1, 63, 130)
DECODE_PROMPT, DECODE_STEPS = 20, 16
BATCH = 2


def token_ids(model, B: int, T: int, seed: int = 0) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(0, model.config.vocab_size, (B, T), generator=gen)


@pytest.fixture(scope="session")
def zoo_captured():
    """zoo_captured(name) -> (model, {"prefill": graph, "decode": graph}) as captured."""
    models, captured = {}, {}

    def get(name: str):
        if name not in captured:
            models[name] = k3c.models.build(name)
            ids = token_ids(models[name], BATCH, CAPTURE_T)
            captured[name] = k3c.capture_entries(models[name], (ids,))
        return models[name], captured[name]

    return get


@pytest.fixture(scope="session")
def zoo_graphs(zoo_captured):
    """zoo_graphs(name, pipeline) -> (model, {"prefill": graph, "decode": graph}) after the passes."""
    piped = {}

    def get(name: str, pipeline: str = "default"):
        model, captured = zoo_captured(name)
        if (name, pipeline) not in piped:
            piped[name, pipeline] = {e: k3c.passes.run(g, pipeline) for e, g in captured.items()}
        return model, piped[name, pipeline]

    return get


@pytest.fixture(scope="session")
def zoo_artifact(zoo_captured, tmp_path_factory):
    """zoo_artifact(name, flavour, pipeline) -> (model, graphs, out_dir, runner), lowered once
    from the graphs k3c.compile would lower (the flavour's pipeline, legalized)."""
    from k3c.backends.onnx import OnnxBackend
    from k3c.compiler import prepare

    cache = {}

    def get(name: str, flavour: str, pipeline: str = "default"):
        key = (name, flavour, pipeline)
        if key not in cache:
            model, captured = zoo_captured(name)
            be = OnnxBackend(flavour)
            graphs = prepare(captured, be, pipeline)
            out = tmp_path_factory.mktemp(f"{name}-{flavour}-{pipeline}")
            be.lower(graphs, out, model_config=model.config)
            cache[key] = (model, graphs, out, be.load(out))
        return cache[key]

    return get


@pytest.fixture(scope="session")
def eager_results():
    """eager_results(model) -> ids, prefill outputs per T, and a greedy-free decode trajectory
    (the next token is fixed by `ids`), computed once per model."""
    cache = {}

    @torch.no_grad()
    def get(model):
        if model.name not in cache:
            ids = token_ids(model, BATCH, max(PREFILL_T[-1], DECODE_PROMPT + DECODE_STEPS), seed=1)
            prefill = {T: model.prefill(ids[:, :T]) for T in PREFILL_T}
            logits, state = model.prefill(ids[:, :DECODE_PROMPT])
            steps = []
            for t in range(DECODE_PROMPT, DECODE_PROMPT + DECODE_STEPS):
                logits, state = model.decode(ids[:, t:t + 1], state)
                steps.append(logits)
            cache[model.name] = {"ids": ids, "prefill": prefill, "decode": steps, "final_state": state}
        return cache[model.name]

    return get
