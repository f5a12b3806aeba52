"""The K3 release layout (K3-SPEC.md section 8.1), written by the test, read by k3c: what the
model holds, that it computes what the stored weights mean, and that it is written back
bit for bit."""

from __future__ import annotations

import json
import logging

import pytest
import torch
from release_layout import VISION, write_release
from safetensors import safe_open

from k3c.models import build, from_pretrained, save_pretrained
from k3c.models.moe_layer import MXFP4Experts
from k3c.numerics import assert_close


@pytest.fixture(scope="module")
def release(tmp_path_factory):
    path = tmp_path_factory.mktemp("k3-release")
    return path, write_release(path, seed=3)


def read_all(path) -> dict[str, tuple[str, torch.Tensor, dict]]:
    """name -> (file, tensor, file metadata) over every shard of a folder."""
    out = {}
    for f in sorted(path.glob("*.safetensors")):
        with safe_open(f, framework="pt") as fh:
            meta = fh.metadata()
            for k in fh.keys():
                out[k] = (f.name, fh.get_tensor(k), meta)
    return out


def test_release_loads_with_its_dtypes_and_reports_the_vision_parts(release, caplog):
    path, _ = release
    with caplog.at_level(logging.INFO, logger="k3c.models"):
        model = from_pretrained(path)
    info = model.checkpoint_info
    assert info.skipped == sorted(VISION) and info.prefix == "language_model."
    assert "skipped 5 tensors" in caplog.text and "vision_tower.*" in caplog.text and "mm_projector.*" in caplog.text
    kda, moe = model.model.layers[1].self_attn, model.model.layers[1].block_sparse_moe
    assert kda.q_proj.weight.dtype == torch.bfloat16 and model.lm_head.weight.dtype == torch.bfloat16
    for t in (kda.A_log, kda.dt_bias, kda.q_conv1d.weight, kda.o_norm.weight, moe.gate.e_score_correction_bias):
        assert t.dtype == torch.float32
    assert kda.A_log.shape == (4,)  # sliced from [head_dim] = [32]
    assert isinstance(moe.experts, MXFP4Experts) and moe.experts.w13_packed.dtype == torch.uint8
    assert moe.shared_experts.gate_proj.weight.dtype == moe.gate.weight.dtype == torch.bfloat16
    assert model.model.output_attn_res_proj.weight.shape == (1, 256)
    ids = torch.randint(0, 1024, (2, 9), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        logits = model(ids)  # eager in the model's own dtype, MXFP4 decoded per expert
    assert logits.dtype == torch.bfloat16 and torch.isfinite(logits).all()


def test_release_matches_fp32_eager_on_the_dequantized_weights(release):
    path, dense = release
    reference = build("k3-tiny")
    reference.load_state_dict(dense, strict=True)
    model = from_pretrained(path, dtype=torch.float32)
    assert isinstance(model.model.layers[2].block_sparse_moe.experts, MXFP4Experts)  # still packed
    ids = torch.randint(0, 1024, (2, 67), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        logits, state = model.prefill(ids[:, :65])  # two chunks of the chunked KDA prefill
        want, ref_state = reference.prefill(ids[:, :65])
        assert_close(logits, want, torch.float32, what="release prefill logits")
        for t in range(65, 67):
            logits, state = model.decode(ids[:, t : t + 1], state)
            want, ref_state = reference.decode(ids[:, t : t + 1], ref_state)
            assert_close(logits, want, torch.float32, what=f"release decode step {t}")


def test_bytes_held_are_the_bytes_on_disk(release):
    path, _ = release
    model = from_pretrained(path)
    held = sum(t.numel() * t.element_size() for t in model.state_dict().values())
    on_disk = sum(f.stat().st_size for f in path.glob("*.safetensors"))
    vision = model.checkpoint_info.skipped_bytes
    assert 1 / 1.3 <= held / (on_disk - vision) <= 1.3, (held, on_disk, vision)
    # every text tensor at its stored size, less A_log's padding ([32] on disk, [4] held, F32)
    n_kda = model.config.num_layers - len(model.config.mla_layers)
    assert held == model.checkpoint_info.bytes_read - n_kda * (32 - 4) * 4


def test_save_pretrained_writes_the_release_back_bit_for_bit(release, tmp_path):
    path, _ = release
    save_pretrained(from_pretrained(path), tmp_path)
    before, after = read_all(path), read_all(tmp_path)
    text = {k: v for k, v in before.items() if k not in VISION}
    assert after.keys() == text.keys()
    for k, (file, t, meta) in text.items():
        file2, t2, meta2 = after[k]
        assert (file2, t2.dtype, t2.shape, meta2) == (file, t.dtype, t.shape, meta), k
        assert torch.equal(t2.view(torch.uint8), t.view(torch.uint8)), k
    index = json.loads((tmp_path / "model.safetensors.index.json").read_text())
    old = json.loads((path / "model.safetensors.index.json").read_text())
    assert index["weight_map"] == {k: f for k, f in old["weight_map"].items() if k not in VISION}
    cfg, old_cfg = (json.loads((p / "config.json").read_text()) for p in (tmp_path, path))
    assert cfg["model_type"] == "kimi_k3" and "vision_config" not in cfg
    assert cfg["text_config"]["quantization_config"] == old_cfg["text_config"]["quantization_config"]
    assert cfg["text_config"]["bos_token_id"] == 1  # fields k3c does not read are kept
    again = from_pretrained(tmp_path)
    sa, sb = again.state_dict(), from_pretrained(path).state_dict()
    assert all(torch.equal(sa[k], sb[k]) and sa[k].dtype == sb[k].dtype for k in sb)


def test_k3_small_builds_in_the_release_precision(tmp_path):
    model = build("k3-small", dtype=torch.bfloat16, experts="mxfp4", num_layers=3, mla_layers=(3,))
    dtypes = {str(t.dtype) for t in model.state_dict().values()}
    assert dtypes == {"torch.bfloat16", "torch.float32", "torch.uint8"}
    save_pretrained(model, tmp_path, max_shard_bytes=16 << 20)
    shards = sorted(p.name for p in tmp_path.glob("model-*.safetensors"))
    assert len(shards) > 2 and shards[0] == f"model-00001-of-{len(shards):06d}.safetensors"
    cfg = json.loads((tmp_path / "config.json").read_text())
    assert cfg["dtype"] == "bfloat16"
    assert cfg["text_config"]["quantization_config"]["format"] == "mxfp4-pack-quantized"
    back = from_pretrained(tmp_path)
    sa, sb = back.state_dict(), model.state_dict()
    assert sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) and sa[k].dtype == sb[k].dtype for k in sa)
    packed = sum(t.numel() for k, t in sa.items() if k.endswith(("_packed", "_scale")))
    weights = sum(m.num_weights() for m in back.modules() if isinstance(m, MXFP4Experts))
    assert packed / weights == pytest.approx(0.53125)  # 4 bits + 8 bits per 32: ~0.53 bytes a weight


def test_mxfp4_experts_capture_as_packed_expert_ops():
    """The MXFP4 experts are one IR op each (codes and scales as u8 weights), and the captured
    graph computes what eager does."""
    import k3c
    from k3c.numerics import assert_close

    model = build("k3-tiny", experts="mxfp4", num_layers=2, mla_layers=(2,))
    ids = torch.randint(0, 1024, (2, 16), generator=torch.Generator().manual_seed(0))
    g = k3c.capture(model, (ids,))
    assert g.op_counts()["moe_gate_up_mxfp4"] == g.op_counts()["moe_down_mxfp4"] == 1
    assert {g.types[w].dtype for w in g.weights if w.endswith(("_packed", "_scale"))} == {"u8"}
    with torch.no_grad():
        assert_close(k3c.ir.interpret(g, ids)[0], model(ids), what="captured MXFP4 k3-tiny")


def test_build_precision_arguments():
    default = build("k3-tiny")
    assert {t.dtype for t in default.state_dict().values()} == {torch.float32}
    assert not any(isinstance(m, MXFP4Experts) for m in default.modules())
    kl = build("kimi-linear-tiny", dtype="bfloat16")  # Kimi Linear's release keeps A_log and dt_bias in F32
    f32 = sorted(k for k, t in kl.state_dict().items() if t.dtype == torch.float32)
    assert f32 and all(k.endswith(("A_log", "dt_bias")) for k in f32)
    with pytest.raises(ValueError, match="experts must be None"):
        build("k3-tiny", experts="int4")
    with pytest.raises(ValueError, match="no routed experts"):
        build("gpt2-tiny", experts="mxfp4")
    with pytest.raises(ValueError, match="floating dtype"):
        build("k3-tiny", dtype=torch.int8)
    with pytest.raises(ValueError, match="multiples of 32"):
        build("k3-tiny", experts="mxfp4", moe_intermediate_size=48)
