"""Greedy generation from a k3c ONNX artifact with onnxruntime alone.

    python examples/onnx_generate.py DIR [--tokens N]

DIR holds prefill.onnx, decode.onnx, weights.bin and manifest.json (`k3c compile --model
k3-tiny --backend onnx --out DIR`). When DIR has no manifest yet, k3-tiny is compiled into it
first; that step needs k3c, the generation itself only onnxruntime, numpy and json: the
manifest says which outputs are state and which decode input each one feeds.
"""

import json
import sys

import numpy as np
import onnxruntime as ort


def compile_k3_tiny(out_dir):
    """The only part that needs k3c: write the artifact."""
    import torch

    import k3c

    model = k3c.models.build("k3-tiny")
    k3c.compile(model, "onnx", (torch.zeros(2, 16, dtype=torch.long),), out_dir=out_dir)


def load_manifest(out_dir):
    try:
        with open(f"{out_dir}/manifest.json") as f:
            return json.load(f)
    except FileNotFoundError:
        compile_k3_tiny(out_dir)
        with open(f"{out_dir}/manifest.json") as f:
            return json.load(f)


def generate(out_dir, prompt, new_tokens):
    manifest = load_manifest(out_dir)
    prefill_spec, decode_spec = manifest["entries"]["prefill"], manifest["entries"]["decode"]
    prefill = ort.InferenceSession(f"{out_dir}/{prefill_spec['file']}", providers=["CPUExecutionProvider"])
    decode = ort.InferenceSession(f"{out_dir}/{decode_spec['file']}", providers=["CPUExecutionProvider"])

    ids = np.array([prompt], dtype=np.int64)  # [B = 1, T]
    outs = prefill.run(None, {"input_ids": ids})
    state = {o["state"]: v for o, v in zip(prefill_spec["outputs"], outs) if "state" in o}
    logits, tokens = outs[0], []
    for _ in range(new_tokens):
        token = int(np.argmax(logits[0, -1]))
        tokens.append(token)
        feed = {"input_ids": np.array([[token]], dtype=np.int64)}
        feed.update({i["name"]: state[i["state"]] for i in decode_spec["inputs"] if "state" in i})
        outs = decode.run(None, feed)
        logits = outs[0]
        state = {o["state"]: v for o, v in zip(decode_spec["outputs"], outs) if "state" in o}
    return tokens


def main(argv):
    if not argv or argv[0].startswith("-"):
        sys.exit(__doc__)
    out_dir, new_tokens = argv[0], 8
    if "--tokens" in argv:
        new_tokens = int(argv[argv.index("--tokens") + 1])
    prompt = [1, 17, 42, 99, 256, 7, 3, 512]
    tokens = generate(out_dir, prompt, new_tokens)
    print(json.dumps({"prompt": prompt, "generated": tokens}))


if __name__ == "__main__":
    main(sys.argv[1:])
