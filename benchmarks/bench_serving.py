"""What a serving engine drives, measured through one backend's artifacts: chunked prefill,
prefix reuse, speculative generation, decode in slots; and the fixed-cache rows (--rows contexts).

    python benchmarks/bench_serving.py [--backend onnx:ort]     # k3-small on tvm (default), every engine row
    python benchmarks/bench_serving.py --quick                  # k3-tiny (4 layers), small sizes: checks the script
    python benchmarks/bench_serving.py --rows contexts          # decode at P = 1024, 16384, 65536, prefill, generate
    python benchmarks/bench_serving.py --decode-only --steps 4 --repeat 2      # those decode rows alone

Engine rows, each checked at the fp32 row of k3c.numerics.TOLERANCES (both sides fp32 artifacts):
- chunked: --tokens T (16384) in pieces of --chunk (1024) against one prefill, each in a
  process of its own: seconds, the prefill's peak RSS (peak reset by /proc/self/clear_refs after
  loading; lifetime ru_maxrss in the JSON); last logits and state compared.
- prefix: two prompts, a shared --prefix (2048) and suffixes of --suffix (256): the prefix once,
  each suffix resumed from its snapshot, against both prefilled whole; last logits compared.
- speculative: greedy tokens/s of k3c.speculative against plain greedy (k3c.generate), with
  the acceptance (accepted / drafted); tokens must be equal. --draft: ngram (prompt lookup),
  self (the target's own artifact: acceptance 1, the mechanism's cost) or a zoo model at the
  target's vocabulary. Zoo weights are random: no other draft predicts the target.
- slots: --slots (32) sequences in k3c.slots.Slots, each the prefix's snapshot + 8 tokens; a
  decode step of all in seconds and as a multiple of its bytes floor: bytes read
  (bench_roofline_cpu.decode_bytes, fp32) / read bandwidth measured in the same run; unfused
  (an artifact compiled with fuse-kda-decode{enable=false}) and with KDA's fused decode step
  (kda_decode_step: the serving artifact, where the backend lowers it, TVM and Triton).
  Checked: slot 0 equals its sequence decoded alone, and the fused step's logits the unfused.
Times: the fastest of --repeat after a settle (k3c.bench.settle); a chunked row is one call.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import pickle
import platform
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

import k3c
from k3c.backend_spec import parse_backend
from k3c.bench import best_of, settle
from k3c.compiler import CompiledModel
from k3c.diff import backend_for
from k3c.generate import EagerRunner, generate
from k3c.numerics import TOLERANCES, compare
from k3c.snapshots import resume
from k3c.speculative import speculative

ROW = TOLERANCES[torch.float32]
ENGINE_ROWS = ("chunked", "prefix", "speculative", "slots")
OWN = 8  # tokens each slot adds after the shared prefix
MB, OK = 2**20, {True: "ok", False: "OFF"}


def roofline():
    """benchmarks/bench_roofline_cpu.py (the bytes a decode step reads, the read bandwidth)."""
    sys.path.insert(0, str(Path(__file__).parent))
    import bench_roofline_cpu

    return bench_roofline_cpu


def build(args) -> torch.nn.Module:
    return k3c.models.build(args.model, **({"num_layers": args.layers} if args.layers else {})).eval()


def compile_fixed(model, spec: str, capacity: int, out: Path, passes: str | list[str] = "default") -> k3c.CompiledModel:
    be = parse_backend(spec)
    print(f"compiling {model.name} for {spec}, max_context {capacity}" + ("" if passes == "default" else
                                                                          f", passes {passes}"), flush=True)
    return k3c.compile(model, be.name, (torch.zeros(1, 16, dtype=torch.long),), out_dir=out, max_context=capacity,
                       passes=passes, **be.options())


def ids(vocab: int, n: int, seed: int) -> torch.Tensor:
    return torch.randint(0, vocab, (1, n), generator=torch.Generator().manual_seed(seed))


def check(got: torch.Tensor, want: torch.Tensor) -> tuple[float, bool]:
    return (c := compare(got, want, tolerance=ROW)).rel_rms_err, c.ok


def status(field: str) -> int | None:
    """A size of /proc/self/status (VmRSS, VmHWM) in bytes; None where there is none."""
    try:
        line = next(ln for ln in Path("/proc/self/status").read_text().splitlines() if ln.startswith(field + ":"))
        return int(line.split()[1]) * 1024
    except (OSError, StopIteration):
        return None


def child(job_file: str) -> None:
    """Load the artifact, warm its entries up on a short prompt, time one prefill of the job's
    prompt (whole, or in pieces of `chunk`), save its last logits and state, print a JSON line."""
    job = json.loads(Path(job_file).read_text())
    with open(job["graphs"], "rb") as f:
        graphs = pickle.load(f)
    out = Path(job["artifact"])
    run = CompiledModel(backend_for(job["backend"]).load(out), graphs, out, job["backend"])
    prompt, chunk = torch.load(job["ids"]), job["chunk"]
    with torch.no_grad():
        run.prefill(prompt[:, :32], logits="last", chunk=16 if chunk else None)  # warm-up: entries' first calls
        try:  # the peak RSS from here on is the prefill's, not that of loading the artifact (Linux)
            Path("/proc/self/clear_refs").write_text("5")
            reset = True
        except OSError:
            reset = False
        before, t0 = status("VmRSS"), time.perf_counter()
        logits, state = run.prefill(prompt, logits="last", chunk=chunk)
        seconds = time.perf_counter() - t0
    lifetime = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux: KiB
    torch.save({"logits": logits, "state": state}, job["out"])
    print(json.dumps({"seconds": seconds, "peak_rss": status("VmHWM") if reset else lifetime,
                      "peak_rss_lifetime": lifetime, "rss_before": before}), flush=True)


def chunked(args, run: k3c.CompiledModel, vocab: int, root: Path) -> dict:
    graphs = {k: dataclasses.replace(g, weights={}) for k, g in run.graphs.items()}  # the artifact holds them
    with open(root / "graphs.pkl", "wb") as f:
        pickle.dump(graphs, f)
    torch.save(ids(vocab, args.tokens, 1), root / "ids.pt")
    res, table = {}, []
    for name, chunk in (("one prefill", None), (f"pieces of {args.chunk}", args.chunk)):
        job = root / f"job-{chunk}.json"
        job.write_text(json.dumps({"graphs": str(root / "graphs.pkl"), "artifact": str(run.out_dir), "chunk": chunk,
                                   "backend": args.backend, "ids": str(root / "ids.pt"),
                                   "out": str(root / f"out-{chunk}.pt")}))
        print(f"chunked: {name} of {args.tokens} tokens, in its own process", flush=True)
        p = subprocess.run([sys.executable, __file__, "--child", str(job)], capture_output=True, text=True)
        if p.returncode:  # reported in the table; the other variant still runs
            res[name] = {"failed": f"exit {p.returncode}: {(p.stderr.strip().splitlines() or [''])[0][:60]}"}
            print(p.stderr[-3000:], file=sys.stderr)
            table.append((f"chunked prefill T={args.tokens}", name, "FAILED " + res[name]["failed"], ""))
            continue
        res[name] = v = json.loads(p.stdout.strip().splitlines()[-1])
        table.append((f"chunked prefill T={args.tokens}", name, f"{v['seconds']:.2f} s, peak RSS "
                      f"{v['peak_rss'] / MB:.0f} MiB (before {(v['rss_before'] or 0) / MB:.0f})", ""))
    if any("failed" in v for v in res.values()):
        return {**res, "ok": False, "table": table}
    one, pieces = (torch.load(root / f"out-{c}.pt") for c in (None, args.chunk))
    err, ok = check(pieces["logits"], one["logits"])
    worst, ok = 0.0, ok and torch.equal(pieces["state"]["positions"], one["state"]["positions"])
    for k, v in one["state"].items():
        if k != "positions":
            e, good = check(pieces["state"][k], v)
            worst, ok = max(worst, e), ok and good
    table[-1] = (*table[-1][:3], f"logits {err:.1e}, state {worst:.1e} rel RMS: {OK[ok]}")
    return {**res, "logits_rel_rms": err, "state_rel_rms": worst, "ok": ok, "table": table}


def prefix_reuse(args, run, model, rf) -> dict:
    vocab = model.config.vocab_size
    prefix = ids(vocab, args.prefix, 2)
    suffixes = [ids(vocab, args.suffix, 3 + i) for i in range(2)]

    def reuse():
        _, at_prefix = run.prefill(prefix, logits="last")  # computed once
        return [resume(run, at_prefix, s, logits="last")[0] for s in suffixes]

    def whole():
        return [run.prefill(torch.cat([prefix, s], 1), logits="last")[0] for s in suffixes]

    res = {}
    with torch.no_grad():
        for name, fn in (("recompute", whole), ("reuse", reuse)):
            out = fn()
            settle()
            res[name] = {"seconds": best_of(fn, args.repeat), "logits": out}
    errs = [check(a, b) for a, b in zip(res["reuse"].pop("logits"), res["recompute"].pop("logits"))]
    err, ok = max(e for e, _ in errs), all(good for _, good in errs)
    return {**res, "logits_rel_rms": err, "ok": ok, "table": [
        (f"prefix {args.prefix} + 2 x {args.suffix}", "both prompts whole", f"{res['recompute']['seconds']:.3f} s", ""),
        ("", "prefix once + resume", f"{res['reuse']['seconds']:.3f} s", f"logits {err:.1e} rel RMS: {OK[ok]}")]}


class NgramDraft:
    """Prompt lookup as a draft model: it proposes the token that followed the latest earlier
    occurrence of the last token (token 0 when there is none). Its state is the tokens so far
    and `positions`, so k3c.speculative checkpoints and rolls it back like a model's."""

    def __init__(self, vocab: int, capacity: int):
        self.vocab, self.max_context = vocab, capacity

    def prefill(self, ids, lengths=None, logits="last"):
        B = ids.shape[0]
        empty = {"tokens": torch.zeros(B, self.max_context, dtype=torch.long), "positions": torch.zeros(B).long()}
        return self.extend(ids, empty, lengths)

    def extend(self, ids, state, lengths=None, logits="all"):
        tokens, pos = state["tokens"].clone(), state["positions"]
        fed = torch.full_like(pos, ids.shape[1]) if lengths is None else torch.as_tensor(lengths).long()
        out = torch.zeros(ids.shape[0], 1, self.vocab)
        for b in range(ids.shape[0]):
            p, m = int(pos[b]), int(fed[b])
            tokens[b, p:p + m] = ids[b, :m]
            seq = tokens[b, :p + m].tolist()
            out[b, 0, next((seq[i + 1] for i in range(len(seq) - 2, -1, -1) if seq[i] == seq[-1]), 0)] = 1.0
        return out, {"tokens": tokens, "positions": pos + fed}

    decode = extend


def speculation(args, run, model, rf) -> dict:
    vocab, res, table = model.config.vocab_size, {}, []
    prompt = [ids(vocab, args.spec_prompt, 5)[0].tolist()]
    generate(run, prompt, 2)  # warm-up: prefill_last and decode
    settle()
    plain, p = generate(run, prompt, args.new_tokens)
    table.append((f"greedy, {args.new_tokens} new tokens", "plain", f"{p['tokens_per_s']:.1f} tokens/s", ""))
    for name in args.draft.split(","):
        draft = NgramDraft(vocab, run.max_context) if name == "ngram" else run if name == "self" else \
            EagerRunner(k3c.models.build(name, vocab_size=vocab).eval(), run.max_context)
        speculative(run, draft, prompt, 2, k=args.draft_tokens)  # warm-up: extend
        settle()
        spec, s = speculative(run, draft, prompt, args.new_tokens, k=args.draft_tokens)
        per_verify = s["accepted"] / max(s["rounds"], 1)
        res[name] = {"tokens_per_s": s["tokens_per_s"], "acceptance": s["acceptance"], "rounds": s["rounds"],
                     "accepted_per_verify": per_verify, "tokens_equal": spec == plain}
        table.append(("", f"speculative, draft {name}, k={args.draft_tokens}", f"{s['tokens_per_s']:.1f} tokens/s, "
                      f"acceptance {s['acceptance']:.2f} ({per_verify:.2f} a verify)",
                      "tokens equal" if spec == plain else "tokens DIFFER"))
    return {"plain_tokens_per_s": p["tokens_per_s"], "k": args.draft_tokens, "drafts": res, "table": table,
            "ok": all(r["tokens_equal"] for r in res.values())}


def slots_decode(args, run, model, rf) -> dict:
    """The slots row, unfused and with KDA's fused decode step (serving_slots.py)."""
    sys.path.insert(0, str(Path(__file__).parent))
    import serving_slots

    return serving_slots.slots_decode(args, run, model, rf, sys.modules[__name__])


def engine(args) -> dict:
    rf, model = roofline(), build(args)
    vocab, rows = model.config.vocab_size, [r for r in args.rows.split(",") if r in ENGINE_ROWS]
    serve_capacity = 8 + max(args.prefix + args.suffix, args.spec_prompt + args.new_tokens + args.draft_tokens,
                             args.prefix + OWN + 1 + args.steps * (args.repeat + 1))
    root = Path(tempfile.mkdtemp(prefix="k3c-serving-"))
    report = {"model": model.name, "layers": args.layers, "backend": args.backend, "rows": rows,
              "machine": f"{platform.machine()}, {os.cpu_count()} cpus", "load_average_at_start": os.getloadavg()[0],
              "sizes": {k: getattr(args, k) for k in ("tokens", "chunk", "prefix", "suffix", "spec_prompt",
                                                      "new_tokens", "slots", "steps", "repeat")}}
    try:
        if "chunked" in rows:
            long = compile_fixed(model, args.backend, max(args.tokens + 64, serve_capacity), root / "long")
            report["chunked"] = chunked(args, long, vocab, root)
            print(json.dumps(report["chunked"]), flush=True)
        run = long if args.shared_artifact and "chunked" in rows else \
            compile_fixed(model, args.backend, serve_capacity, root / "serve") if set(rows) - {"chunked"} else None
        for name, fn in (("prefix", prefix_reuse), ("speculative", speculation), ("slots", slots_decode)):
            if name in rows:
                report[name] = fn(args, run, model, rf)
                print(json.dumps(report[name]), flush=True)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    report["load_average_at_end"] = os.getloadavg()[0]
    report["table"] = rf.markdown([("row", "variant", "result", "check"),
                                   *(t for r in rows for t in report[r]["table"])])
    report["ok"] = all(report[r]["ok"] for r in rows)
    print(report["table"])
    return report


def decode_step_ms(compiled, model, P: int, steps: int, repeat: int) -> float:
    """Decode steps from a state whose caches hold P rows (random, unit scale), the rest zero."""
    tok, times, gen = torch.zeros(1, 1, dtype=torch.long), [], torch.Generator().manual_seed(1)
    for _ in range(repeat):
        with torch.no_grad():
            _, state = compiled.prefill(ids(model.config.vocab_size, 8, 0))
            for k, v in state.items():
                if k != "positions" and v.dim() >= 2 and v.shape[1] == compiled.max_context:
                    v[:, :P] = torch.randn(v[:, :P].shape, generator=gen)
            state["positions"] = torch.full((1,), P, dtype=torch.long)
            settle()  # torch's fill of the caches leaves its threads spinning (k3c.bench.settle)
            t0 = time.perf_counter()
            for _ in range(steps):
                _, state = compiled.decode(tok, state)
            times.append(time.perf_counter() - t0)
    return 1e3 * min(times) / steps


def contexts(args) -> dict:
    """onnx: one artifact a context (N = P + 64: its masked attention spans the capacity); tvm:
    one of the largest N, its kernel reading only the rows below each position."""
    model = build(args)
    cs, root = [int(c) for c in args.contexts.split(",")], Path(tempfile.mkdtemp(prefix="k3c-serving-"))
    report = {"model": args.model, "machine": f"{platform.machine()}, {os.cpu_count()} cpus",
              "decode_ms": {}, "prefill_ms": {}, "generate_tokens_per_s": {}}
    for be in args.backends.split(","):
        spec = "onnx:ort" if be == "onnx" else be
        arts = {P: compile_fixed(model, spec, P + 64, root / f"{be}-{P}") for P in cs} if be == "onnx" else \
            dict.fromkeys(cs, compile_fixed(model, spec, max(cs) + 64, root / be))
        report["decode_ms"][be] = {P: decode_step_ms(arts[P], model, P, args.steps, args.repeat) for P in cs}
        print(be, "decode ms", report["decode_ms"][be], flush=True)
        if args.decode_only:
            continue
        # the smallest artifact that holds the prompt serves the prefill and generation rows
        pre = next((arts[P] for P in cs if P + 64 >= args.prefill), None) or \
            compile_fixed(model, spec, args.prefill, root / f"{be}-pre")
        x = torch.randint(0, model.config.vocab_size, (1, args.prefill))
        with torch.no_grad():
            report["prefill_ms"][be] = {lg: 1e3 * best_of(lambda lg=lg, pre=pre, x=x: pre.prefill(x, logits=lg),
                                                          args.repeat) for lg in ("all", "last")}
        if be == "onnx":
            prompt = [x[0, :16].tolist()]
            generate(pre, prompt, 2)  # warm-up: sessions
            report["generate_tokens_per_s"][be] = generate(pre, prompt, args.new_tokens)[1]["tokens_per_s"]
            eager = EagerRunner(model, pre.max_context)
            report["generate_tokens_per_s"]["eager"] = generate(eager, prompt, args.new_tokens)[1]["tokens_per_s"]
    shutil.rmtree(root, ignore_errors=True)
    return report


def parse(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add = p.add_argument
    add("--model", default="k3-small")
    add("--layers", type=int, help="build the model with this many layers")
    add("--backend", default="tvm", help="the engine rows' backend: NAME or onnx:FLAVOUR")
    add("--rows", default=",".join(ENGINE_ROWS), help=f"of {', '.join(ENGINE_ROWS)}, contexts")
    add("--tokens", type=int, default=16384, help="chunked: prompt length T")
    add("--chunk", type=int, default=1024, help="chunked: tokens a piece")
    add("--prefix", type=int, default=2048, help="prefix and slots: the shared prefix")
    add("--suffix", type=int, default=256)
    add("--spec-prompt", type=int, default=64)
    add("--new-tokens", type=int, default=64)
    add("--draft", default="ngram,self", help="drafts, each ngram, self or a zoo model name")
    add("--draft-tokens", type=int, default=4)
    add("--slots", type=int, default=32)
    add("--steps", type=int, default=4, help="decode steps a timing averages over")
    add("--repeat", type=int, default=3)
    add("--bandwidth-mib", type=int, default=1024)
    add("--shared-artifact", action="store_true", help="one artifact (capacity T + 64) for every row")
    add("--quick", action="store_true", help="k3-tiny, 4 layers, small sizes: checks the script")
    add("--backends", default="onnx,tvm", help="contexts rows: backends")
    add("--contexts", default="1024,16384,65536", help="contexts rows: cache rows P")
    add("--prefill", type=int, default=1024, help="contexts rows: prefill length")
    add("--decode-only", action="store_true", help="contexts rows: decode alone")
    add("--json")
    add("--child", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.quick:
        args.model, args.layers, args.tokens, args.chunk, args.prefix, args.suffix = "k3-tiny", 4, 160, 32, 48, 16
        args.spec_prompt, args.new_tokens, args.steps, args.repeat, args.bandwidth_mib = 16, 24, 2, 1, 64
        args.shared_artifact = True
    if args.decode_only:
        args.rows = "contexts"
    bad = [r for r in args.rows.split(",") if r not in (*ENGINE_ROWS, "contexts")]
    if bad:
        p.error(f"--rows: {bad[0]!r} is not one of {', '.join(ENGINE_ROWS)}, contexts")
    return args


def main(argv=None) -> dict | None:
    args = parse(argv)
    if args.child:
        return child(args.child)
    report = {}
    if "contexts" in args.rows.split(","):
        report["contexts"] = contexts(args)
        print(json.dumps(report["contexts"], indent=1))
    if set(args.rows.split(",")) & set(ENGINE_ROWS):
        report.update(engine(args))
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=1) + "\n")
    return report


if __name__ == "__main__":
    sys.exit(0 if (main() or {}).get("ok", True) else 1)
