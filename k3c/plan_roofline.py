"""A deployment's arithmetic: per rank memory, the largest concurrency that fits, and a roofline
estimate of decode and prefill tokens/s, from a model's Profile (k3c/plan_model.py), a
DeployMesh (k3c/plan_mesh.py) and a Device (k3c/plan_devices.py).

Memory per rank: its stage's weights (heads and widths / tp, routed experts / tp ep, the
ranks of an expert group, the rest whole) and the state pool of the sequences its dp copy
serves (ceil(N / dp)), each at context L (recurrent KDA state and conv tails / tp, the MLA
latent cache whole).

A decode step of one stage on one rank (b sequences of its dp copy in the step; with pp the N
sequences go as pp micro-batches, b = ceil(N / (dp pp))):
    bytes  = its weights once, the routed experts only as far as the step's tokens touch them:
             the n = min(dp, ep) b tokens of its expert group (the copies that share its
             experts) each pick k of E experts, an expert is missed by all of them with
             probability (1 - k/E)^n, so a share 1 - (1 - k/E)^n of the expert bytes is read;
             + the state read and written (2x recurrent + conv tails), the latent cache read
             (L tokens) and one row written; + one embedding row per token.
    flops  = 2 x the weights a token multiplies with x b (routed: k experts a token, the step's
             n tokens spread evenly over the ranks), + attention over the context (absorbed MLA:
             2 L (2 kv_lora + rope) a head; KDA: 7 K V a head).
    comm   = the bytes the rank sends (tp all-reduces of each mixer and MLP output, the routed
             experts' combine, the hidden state and the AttnRes bank between stages).
    time   = max(bytes / HBM, flops_bf16 / peak_bf16 + flops_experts / peak_fp4) + comm / link
             (MXFP4 experts at the FP4 peak, or FP8 where there is none; BF16 experts at BF16)
             (one NVLink direction: a rank sends and receives at once).
    decode tokens/s per user = 1 / (pp x the slowest stage's time); per GPU = N x that / world.
Prefill: the dp copy's sequences of L tokens in one pass (weights once, causal MLA over L / 2
on average, chunked KDA, the LM head on each sequence's last token), prefill tokens/s per GPU
= N L / (the slowest stage's time x world).

It is an upper bound: it leaves out kernel efficiency (no kernel reaches the peaks), the time a
collective waits (latency, not bandwidth, rules small messages), launch and scheduling gaps,
activations' own traffic, imbalance of the routing, and prefill's interference with decode.
"""

from __future__ import annotations

import math

from .errors import UsageError
from .passes.cost import combine_bytes, exchange_bytes, sent_bytes
from .plan_devices import HEADROOM, Device
from .plan_mesh import DeployMesh
from .plan_model import Profile

KDA_CHUNK = 64  # the chunk size prefill is priced at


def _stage_layers(p: Profile, mesh: DeployMesh) -> list[list]:
    return [[p.layers[i] for i in r] for r in mesh.stages(len(p.layers))]


def _state_scale(p: Profile, state_item: int | None) -> float:
    rec = p.layers and next((lay.recurrent_item for lay in p.layers if lay.recurrent), 4)
    return 1.0 if state_item is None else state_item / rec


def rank_weights(p: Profile, mesh: DeployMesh, stage: int) -> float:
    """Bytes of weights one rank of `stage` holds."""
    vocab = mesh.tp if mesh.vocab else 1
    layers = _stage_layers(p, mesh)[stage]
    w = sum(lay.split.bytes / mesh.tp + lay.replicated.bytes + lay.routed.bytes / mesh.expert_split
            for lay in layers)
    if stage == 0:
        w += p.embed.bytes / vocab
    if stage == mesh.pp - 1:
        w += p.head.bytes / vocab + p.final.bytes
    return w


def seq_state(p: Profile, mesh: DeployMesh, stage: int, context: int, state_item: int | None = None) -> float:
    """Bytes of one sequence's state one rank of `stage` holds at `context` tokens."""
    scale = _state_scale(p, state_item)
    return sum((lay.recurrent * scale + lay.conv) / mesh.tp + lay.fixed + lay.latent * context
               for lay in _stage_layers(p, mesh)[stage])


def memory(p: Profile, mesh: DeployMesh, dev: Device, concurrency: int, context: int,
           state_item: int | None = None, headroom: float = HEADROOM) -> dict:
    """Per stage: weights and state pool of one rank; whether every rank fits; the largest
    concurrency that fits (every dp copy serving as many sequences)."""
    usable = dev.memory_bytes * (1 - headroom)
    seqs = math.ceil(concurrency / mesh.dp)
    rows, per_copy = [], []
    for s in range(mesh.pp):
        w, st = rank_weights(p, mesh, s), seq_state(p, mesh, s, context, state_item)
        rows.append({"stage": s, "weight_bytes": w, "state_bytes": seqs * st, "state_bytes_per_seq": st})
        per_copy.append(max(0, math.floor((usable - w) / st)) if st > 0 else 0)
    fits = all(r["weight_bytes"] + r["state_bytes"] <= usable for r in rows)
    return {"usable_bytes": usable, "stages": rows, "fits": fits, "max_concurrency": mesh.dp * min(per_copy)}


def touched(p: Profile, tokens: float) -> float:
    """The expected share of a MoE layer's experts that `tokens` tokens' top-k picks reach."""
    E, k = p.config.num_experts, p.config.top_k
    return 1.0 - (1.0 - k / E) ** tokens


def comm_per_token(p: Profile, mesh: DeployMesh, stage: int, combine: str = "auto") -> dict:
    """{op: {"count", "bytes"}}: collectives of one pass of `stage` and the bytes one rank sends
    per token of its dp copy (passes/cost.py's conventions: an all-reduce over M sends
    2 (M-1)/M of the buffer). The routed experts' combine over an expert group (tp ep ranks):
    dp = 1 or ep = 1 as the runtime prices it (all-reduce or all-to-all, `combine`), else the
    runtime's four all-to-alls (each rank sends its slice of its copy's tokens' slots, the
    outputs are gathered among the ranks that share the copy's tokens: moe_dispatch's `peers`)."""
    cfg, d, item, tp = p.config, p.config.hidden_size, p.item, mesh.tp
    width = cfg.routed_expert_hidden_size or d
    R, out = mesh.expert_split, {}  # the ranks of an expert group

    def add(op: str, count: int, nbytes: float) -> None:
        if nbytes > 0:
            row = out.setdefault(op, {"count": 0, "bytes": 0.0})
            row["count"] += count
            row["bytes"] += nbytes

    for lay in _stage_layers(p, mesh)[stage]:
        add("all_reduce", 1, sent_bytes("all_reduce", d * item, tp))  # the mixer's o_proj
        if lay.routed.bytes == 0 or cfg.num_shared_experts:  # the dense MLP or the shared experts
            add("all_reduce", 1, sent_bytes("all_reduce", d * item, tp))
        if lay.routed.bytes == 0 or R == 1:
            continue
        k = cfg.top_k
        if mesh.dp == 1 or mesh.ep == 1:
            price = combine_bytes(width, item, k, tp, mesh.ep)
            how = combine if combine != "auto" else min(price, key=price.get)
            how = how if mesh.ep > 1 else "all_reduce"
            add(how, 1 if how == "all_reduce" else 4, price[how])
        else:
            n = 1 << 16  # tokens of a copy, to spread the row counts' bytes
            add("all_to_all", 4, sum(exchange_bytes(n, k * tp, width, item, R, mesh.token_peers)) / n)
    if mesh.vocab and stage == 0:
        add("all_reduce", 1, sent_bytes("all_reduce", d * item, tp))
    if mesh.vocab and stage == mesh.pp - 1:
        add("all_gather", 1, sent_bytes("all_gather", cfg.vocab_size // tp * item, tp))
    if stage < mesh.pp - 1:  # the hidden state and the AttnRes bank to the next stage: each rank
        nxt = _stage_layers(p, mesh)[stage][-1].index + 1  # sends its whole copy to its tp peer there
        block = cfg.attn_res_block_size
        values = (math.ceil(nxt / block) + 1) if block else 1
        add("send", values, values * d * item)
    return out


def _context_flops(p: Profile, lay, context: int, prefill: bool) -> float:
    """Attention FLOPs a token spends on its context in one layer (all heads)."""
    c = p.config
    if lay.mixer == "mla":
        if prefill:  # naive causal: scores over qk dims, values over v, (L + 1) / 2 keys on average
            return c.mla_heads * 2 * (context + 1) / 2 * (c.qk_nope_head_dim + c.qk_rope_head_dim + c.v_head_dim)
        return c.mla_heads * 2 * context * (2 * c.kv_lora_rank + c.qk_rope_head_dim)  # absorbed
    K = V = c.kda_head_dim
    if prefill:  # chunked: L and Aqk (2 C K each), W, U and Aqk Vn, three state products
        C = KDA_CHUNK
        return c.kda_heads * (6 * C * K + 4 * C * V + 6 * K * V)
    return c.kda_heads * 7 * K * V


def stage_time(p: Profile, mesh: DeployMesh, dev: Device, stage: int, seqs: int, tokens: int,
               context: int, state_item: int | None = None, prefill: bool = False,
               combine: str = "auto") -> dict:
    """One pass of `stage` on one rank: `seqs` sequences of its dp copy, `tokens` tokens each
    (1 for a decode step); bytes, FLOPs, bytes sent and the roofline time."""
    vocab = mesh.tp if mesh.vocab else 1
    layers = _stage_layers(p, mesh)[stage]
    n = seqs * tokens  # the copy's tokens in this pass
    share = touched(p, mesh.expert_tokens * n)
    scale = _state_scale(p, state_item)
    nbytes = flops = fexp = 0.0
    for lay in layers:
        nbytes += lay.split.bytes / mesh.tp + lay.replicated.bytes + lay.routed.bytes / mesh.expert_split * share
        rw = 1 if prefill else 2  # prefill writes the state once; decode reads and writes it
        nbytes += seqs * (rw * (lay.recurrent * scale + lay.conv) / mesh.tp + rw * lay.fixed)
        nbytes += seqs * lay.latent * (tokens if prefill else context + 1)
        flops += 2 * n * (lay.split.macs / mesh.tp + lay.replicated.macs)
        flops += n * _context_flops(p, lay, context, prefill) / mesh.tp
        fexp += 2 * mesh.expert_tokens * n * p.config.top_k * lay.routed.macs / mesh.expert_split
    if stage == 0:
        nbytes += n * p.embed.bytes / p.config.vocab_size
    if stage == mesh.pp - 1:
        nbytes += p.head.bytes / vocab + p.final.bytes
        rows = seqs if prefill else n  # prefill needs the logits of each sequence's last token only
        flops += 2 * rows * (p.head.macs / vocab + p.final.macs)
    sent = n * sum(v["bytes"] for v in comm_per_token(p, mesh, stage, combine).values())
    peak_experts = dev.expert_flops if p.experts_mxfp4 else dev.bf16_flops  # BF16 experts: the BF16 rate
    hbm, compute = nbytes / dev.hbm_bytes_per_s, flops / dev.bf16_flops + fexp / peak_experts
    link = sent / dev.send_bytes_per_s
    return {"bytes": nbytes, "flops": flops, "expert_flops": fexp, "sent_bytes": sent,
            "experts_touched": share, "moe_tokens": mesh.expert_tokens * n, "top_k": p.config.top_k,
            "experts": p.config.num_experts, "hbm_s": hbm, "compute_s": compute, "link_s": link,
            "bound": "hbm" if hbm >= compute else "compute", "seconds": max(hbm, compute) + link}


def estimate(p: Profile, mesh: DeployMesh, dev: Device, concurrency: int, context: int, *,
             state_item: int | None = None, headroom: float = HEADROOM, combine: str = "auto") -> dict:
    """The plan's "estimate": fits, max_concurrency, decode tokens/s per GPU and per user,
    prefill tokens/s per GPU, and the slowest stage's decode step and prefill pass."""
    if concurrency < 1 or context < 1:
        raise UsageError(f"plan: concurrency and context must be >= 1, got {concurrency} and {context}")
    mem = memory(p, mesh, dev, concurrency, context, state_item, headroom)
    mb = math.ceil(concurrency / (mesh.dp * mesh.pp))  # sequences of a dp copy in one micro-batch
    steps = [stage_time(p, mesh, dev, s, mb, 1, context, state_item, False, combine) for s in range(mesh.pp)]
    step = max(steps, key=lambda r: r["seconds"])
    per_user = 1.0 / (mesh.pp * step["seconds"])
    seqs = math.ceil(concurrency / mesh.dp)
    pre = max((stage_time(p, mesh, dev, s, seqs, context, context, state_item, True, combine)
               for s in range(mesh.pp)), key=lambda r: r["seconds"])
    return {"device": dev.name, "headroom": headroom, "concurrency": concurrency, "context": context,
            "fits": mem["fits"], "max_concurrency": mem["max_concurrency"],
            "decode_tokens_per_s_per_gpu": concurrency * per_user / mesh.world,
            "decode_tokens_per_s_per_user": per_user,
            "prefill_tokens_per_s_per_gpu": mesh.dp * seqs * context / pre["seconds"] / mesh.world,
            "memory": mem, "decode_step": step, "prefill_pass": pre}
