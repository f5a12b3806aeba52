"""Fixtures of the ONNX backend tests: the tiny zoo captured once per session, its ONNX
artifacts per (flavour, pipeline), and the eager results they are compared with."""

from __future__ import annotations

import pytest
import torch
from factories import BATCH, CAPTURE_T, DECODE_STEPS, PREFILL_T, example_ids
from factories import ONNX_DECODE_PROMPT as DECODE_PROMPT

import k3c


@pytest.fixture(scope="session")
def zoo_captured():
    """zoo_captured(name) -> (model, {"prefill": graph, "decode": graph}) as captured."""
    models, captured = {}, {}

    def get(name: str):
        if name not in captured:
            models[name] = k3c.models.build(name)
            ids = example_ids(models[name], BATCH, CAPTURE_T)
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
            ids = example_ids(model, BATCH, max(PREFILL_T[-1], DECODE_PROMPT + DECODE_STEPS), seed=1)
            prefill = {T: model.prefill(ids[:, :T]) for T in PREFILL_T}
            logits, state = model.prefill(ids[:, :DECODE_PROMPT])
            steps = []
            for t in range(DECODE_PROMPT, DECODE_PROMPT + DECODE_STEPS):
                logits, state = model.decode(ids[:, t:t + 1], state)
                steps.append(logits)
            cache[model.name] = {"ids": ids, "prefill": prefill, "decode": steps, "final_state": state}
        return cache[model.name]

    return get
