"""The partition: one rank's part of a Kimi model (Kimi Linear, K3) on a mesh (the zoo's
GPT-2 and linear-attention models on tp: k3c/distributed/partition_zoo.py).

The split is made on the module tree before capture, so each rank's graph is the capture of
a model that holds only its shards and calls the collectives where a partial sum must become
whole; every pass and backend then sees an ordinary graph with `all_reduce` nodes in it.

    tp (tensor parallel, group: the rank's tp group)
      KDA   q/k/v projections and their convs, f_b, b and g (g_b) projections, A_log and
            dt_bias by head (colwise); o_proj by its input columns (rowwise) + all_reduce.
            The recurrent state S [B, H, K, V] and the conv tails are the rank's heads.
      MLA   q (q_b) projection, kv_b_proj and g_proj by head; o_proj rowwise + all_reduce.
            The latent cache (ckv, krope) has no head axis: every tp rank keeps all of it.
      MLP   dense and shared-expert MLPs: gate/up colwise, down rowwise + all_reduce.
    ep (expert parallel, group: the rank's expert group, Mesh.expert_group: the world without dp)
      routed experts: rank (e, t) holds experts [e E/ep, (e+1) E/ep) and, of each, the
      intermediate columns [t I/tp, (t+1) I/tp). Every rank routes every token (the router is
      replicated). The outputs are combined by one of two forms (`combine`): "all_reduce",
      each rank runs its experts on the slots routed to them (the other slots weight 0) and
      one all_reduce over the expert group sums the partial outputs; or "all_to_all", each
      rank sends the slots of its token slice to the tp ranks holding their expert's columns
      (moe_dispatch), runs its experts on the rows it receives and sends the outputs back
      (moe_combine: weighted, summed per token, the slices gathered). "auto" takes the one
      passes/cost.py prices lower per token. The latent norm and up-projection follow.
    dp (data parallel; one of dp and ep divides the other): each copy runs its own batch rows
      (the runner hands them over) on whole attention weights (split over its tp group only);
      the routed experts are split over each block of ep copies as over ep (dp = k ep: k
      blocks, each with every expert shard, exchanging nothing with each other) and, with ep
      > 1, combined by the all-to-all only, with `peers` = Mesh.token_peers (a rank sends its
      slice of its own copy's tokens, the outputs are gathered among the ranks that hold
      them). With ep = 1 every copy holds every expert (split over its tp group, summed there).
      The zoo's models take dp without ep (nothing to exchange).
    vocab (a mesh with "vocab"): the embedding by rows (ids outside the rank's range give
      zeros, an all_reduce over tp sums), the lm_head by output columns + all_gather.
    replicated: norms, routers, AttnRes, the latent projections (and without "vocab" the
      embedding and the lm_head).

Every name stays: a rank's weights and state carry the names of the one-process model, with
the rank's shapes; k3c.distributed.state splits and reassembles states.
"""

from __future__ import annotations

import copy

import torch
import torch.nn as nn
import torch.nn.functional as F

from ..errors import UsageError
from ..kernels import ops
from ..kernels.collectives import current
from ..models.common import GatedMLP
from ..models.kda_layer import KDAMixer
from ..models.mla_layer import MLAMixer
from ..models.moe_layer import MoE, MXFP4Experts
from ..models.validate import _SPEC, state_spec
from ..passes.cost import combine_bytes, exchange_bytes, sent_bytes
from .mesh import Mesh, check_divides
from .partition_zoo import partition_zoo


def _reduce(x: torch.Tensor, group: list[int]) -> torch.Tensor:
    if len(group) <= 1:
        return x
    if x.is_meta:  # meta tensors run only the op's fake: tell the communicator (k3c plan counts)
        current("all_reduce").all_reduce(x, list(group))
    return ops.all_reduce(x, list(group))


def _gather(x: torch.Tensor, group: list[int], dim: int) -> torch.Tensor:
    if x.is_meta:
        current("all_gather").all_gather(x, list(group), dim)
    return ops.all_gather(x, list(group), dim=dim % x.dim())


class VocabEmbedding(nn.Embedding):
    """Rows [lo, lo + n) of an embedding table: the ids in that range looked up here, the
    others zero, summed over `group` (every id is in one rank's range)."""

    group: list[int]

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        local = ids - self.vocab_lo  # a buffer: every rank's graph is one capture
        below, above = local < 0, local > self.num_embeddings - 1
        y = F.embedding(local.masked_fill(below, 0).masked_fill(above, 0), self.weight)
        y = y.masked_fill(below.unsqueeze(-1), 0.0).masked_fill(above.unsqueeze(-1), 0.0)
        return _reduce(y, self.group)


class GatheredLinear(nn.Linear):
    """A colwise shard of a Linear: its output columns, joined over `group`."""

    group: list[int]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _gather(super().forward(x), self.group, -1)


class ReducedLinear(nn.Linear):
    """A rowwise shard of a Linear: the partial product, summed over `group`."""

    group: list[int]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _reduce(super().forward(x), self.group)


class ReducedMLP(GatedMLP):
    """A colwise/rowwise shard of a gated MLP, summed over `group`."""

    group: list[int]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _reduce(super().forward(x), self.group)


class ShardedMoE(MoE):
    """The routed experts [lo, lo + n) of a MoE (intermediate columns already sliced), combined
    by `combine`: "all_reduce" (every rank runs its experts on the slots routed to them and the
    partial outputs are summed over `group`) or "all_to_all" (each rank sends its token
    slice's slots to the ranks holding their experts' columns and takes the outputs back:
    moe_dispatch / moe_combine); `group` is the rank's expert group."""

    lo: int
    n_local: int
    group: list[int]
    combine: str = "all_reduce"
    peers: int = 0  # dp: the ranks of the group that share a copy's tokens (moe_dispatch's `peers`)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, d = x.shape
        x2 = x.reshape(B * T, d)
        idx, w = self.route(x2)  # every rank routes every token, as the MoE it shards
        h = self.routed_expert_down_proj(x2) if hasattr(self, "routed_expert_down_proj") else x2
        if self.combine == "all_to_all":
            y = self._exchanged(h, idx, w).view(B, T, -1)
        else:
            y = _reduce(self._masked(h, idx, w).view(B, T, -1), self.group)  # [B, T, width]: dims a segment binds
        if hasattr(self, "routed_expert_norm"):
            y = self.routed_expert_norm(y)
        if hasattr(self, "routed_expert_up_proj"):
            y = self.routed_expert_up_proj(y)
        if hasattr(self, "shared_experts"):
            y = y + self.shared_experts(x)
        return y

    def _masked(self, h: torch.Tensor, idx: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        """This rank's experts on every token, the slots of other ranks' experts weighted 0."""
        local = idx - self.expert_lo  # a buffer, not a constant: every rank's graph is one capture
        below, above = local < 0, local > self.n_local - 1
        w = w.masked_fill(below, 0.0).masked_fill(above, 0.0)
        local = local.masked_fill(below, 0).masked_fill(above, 0)
        return self.routed(h, local, w)

    def _exchanged(self, h: torch.Tensor, idx: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        """The slots of this rank's token slice to their experts' owners, the owners' outputs
        (unweighted) back, weighted and summed per token, every token's row gathered. Over
        the expert group: an expert's columns are split over its tp group, so each slot goes
        to each of those tp ranks (as a slot of its own, weighted alike) and its partial
        outputs sum in the combine."""
        idx, w = self._replicated(idx, w)
        if h.is_meta:  # shapes only (k3c plan): the rows at balanced routing, the bytes counted
            return _meta_exchange(self, h, idx)
        rows, ids, route = ops.moe_dispatch(h, idx, group=list(self.group), experts=self.n_local, peers=self.peers)
        y = self.routed(rows, ids, torch.ones_like(ids, dtype=torch.float32))
        return ops.moe_combine(y, route, w, group=list(self.group), peers=self.peers)

    def _replicated(self, idx: torch.Tensor, w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Expert e's t-th column slice as the slot id of group member (e // n) tp + t's local
        expert e % n (moe_dispatch sends slot id v to member v // n as local expert v % n),
        looked up in `slot_ids` [E, tp]; each copy of a slot weighted alike."""
        if not hasattr(self, "slot_ids"):
            return idx, w
        N, k = idx.shape
        ids = F.embedding(idx, self.slot_ids)  # [N, k, tp]
        return ids.reshape(N, -1), w.unsqueeze(-1).expand(N, k, self.slot_ids.shape[1]).reshape(N, -1)


def _meta_exchange(m: ShardedMoE, h: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
    """moe_dispatch + moe_combine on meta tensors: the comm told what a rank sends at balanced
    routing (passes/cost.py's `exchange_bytes`), the result [N, width] as combine makes it."""
    comm = current("moe_dispatch")
    if hasattr(comm, "expect"):
        N, k = idx.shape
        for nbytes in exchange_bytes(N, k, h.shape[1], h.element_size(), len(m.group), m.peers):
            comm.expect("all_to_all", nbytes)
    rows = h.new_empty((h.shape[0] * idx.shape[1] // len(m.group) + 1, h.shape[1]))
    y = m.routed(rows, idx.new_zeros((rows.shape[0], 1)), h.new_ones((rows.shape[0], 1), dtype=torch.float32))
    return y.new_empty((h.shape[0], y.shape[1]))


def _rows(p: nn.Parameter, lo: int, hi: int, dim: int = 0) -> nn.Parameter:
    return nn.Parameter(p.detach().narrow(dim, lo, hi - lo).clone(), requires_grad=False)


def _slice(module: nn.Module, name: str, lo: int, hi: int, dim: int = 0) -> None:
    setattr(module, name, _rows(getattr(module, name), lo, hi, dim))


def _colwise(linear: nn.Linear, lo: int, hi: int) -> None:
    _slice(linear, "weight", lo, hi, 0)
    linear.out_features = hi - lo


def _rowwise(linear: nn.Linear, lo: int, hi: int, group: list[int] | None) -> None:
    """Keep input columns [lo, hi); with a `group`, the product is summed over it."""
    _slice(linear, "weight", lo, hi, 1)
    linear.in_features = hi - lo
    if group is not None:
        linear.__class__, linear.group = ReducedLinear, list(group)


def _mlp(mlp: GatedMLP, t: int, tp: int, group: list[int]) -> None:
    n = mlp.gate_proj.out_features // tp
    _colwise(mlp.gate_proj, t * n, (t + 1) * n)
    _colwise(mlp.up_proj, t * n, (t + 1) * n)
    _rowwise(mlp.down_proj, t * n, (t + 1) * n, None)  # the MLP sums its output once
    mlp.__class__, mlp.group = ReducedMLP, list(group)


def _vocab(model: nn.Module, t: int, tp: int, group: list[int]) -> None:
    emb, head = model.model.embed_tokens, model.lm_head
    n = emb.num_embeddings // tp
    _slice(emb, "weight", t * n, (t + 1) * n)
    emb.num_embeddings, emb.__class__, emb.group = n, VocabEmbedding, list(group)
    emb.register_buffer("vocab_lo", torch.tensor(t * n, dtype=torch.int64, device=emb.weight.device))
    _colwise(head, t * n, (t + 1) * n)
    head.__class__, head.group = GatheredLinear, list(group)


def _kda(m: KDAMixer, t: int, tp: int, group: list[int]) -> None:
    H = m.H // tp
    lo, hi = t * H * m.K, (t + 1) * H * m.K
    for name in ("q_proj", "k_proj", "v_proj", "f_b_proj", "g_proj", "g_b_proj"):
        if hasattr(m, name):
            _colwise(getattr(m, name), lo, hi)
    for name in ("q_conv1d", "k_conv1d", "v_conv1d"):
        _slice(getattr(m, name), "weight", lo, hi)
    _slice(m, "dt_bias", lo, hi)
    _slice(m, "A_log", t * H, (t + 1) * H)
    _colwise(m.b_proj, t * H, (t + 1) * H)
    _rowwise(m.o_proj, t * H * m.V, (t + 1) * H * m.V, group)
    m.H = H


def _mla(m: MLAMixer, t: int, tp: int, group: list[int]) -> None:
    H = m.H // tp
    qk = m.nope + m.rope
    _colwise(m.q_proj if hasattr(m, "q_proj") else m.q_b_proj, t * H * qk, (t + 1) * H * qk)
    kv = m.nope + m.vdim
    _colwise(m.kv_b_proj, t * H * kv, (t + 1) * H * kv)
    if hasattr(m, "g_proj"):
        _colwise(m.g_proj, t * H * m.vdim, (t + 1) * H * m.vdim)
    _rowwise(m.o_proj, t * H * m.vdim, (t + 1) * H * m.vdim, group)
    m.H = H


def _moe(m: MoE, mesh: Mesh, rank: int, combine: str) -> None:
    e, t = mesh.coords(rank)
    ex = m.experts
    E = ex.w13_packed.shape[0] if isinstance(ex, MXFP4Experts) else ex.w13.shape[0]
    n, i = E // mesh.ep, m.I // mesh.tp
    lo = e * n
    gate = slice(t * i, (t + 1) * i)
    up = slice(m.I + t * i, m.I + (t + 1) * i)
    # w13 rows: the w1 (gate) block, then the w3 (up) block; keep that order for the slice
    names = (("w13_packed", "w2_packed"), ("w13_scale", "w2_scale")) if isinstance(ex, MXFP4Experts) \
        else (("w13", "w2"),)
    for w13, w2 in names:
        a = getattr(ex, w13).detach()[lo:lo + n]
        setattr(ex, w13, nn.Parameter(torch.cat([a[:, gate], a[:, up]], 1).clone(), requires_grad=False))
        b = getattr(ex, w2).detach()[lo:lo + n]
        per = b.shape[2] // mesh.tp  # w2's last dim is I (or I/2 packed, I/32 scales)
        setattr(ex, w2, nn.Parameter(b[:, :, t * per:(t + 1) * per].clone(), requires_grad=False))
    m.I, m.lo, m.n_local, m.group = i, lo, n, mesh.expert_group(rank)
    m.combine, m.peers = combine, (mesh.token_peers if mesh.dp > 1 else 0)
    device = ex.w2.device if hasattr(ex, "w2") else ex.w2_packed.device
    m.register_buffer("expert_lo", torch.tensor(lo, dtype=torch.int64, device=device))
    if combine == "all_to_all" and mesh.tp > 1:  # the same table on every rank: one capture serves all
        ids = torch.arange(E)
        table = torch.stack([(ids // n * mesh.tp + tt) * n + ids % n for tt in range(mesh.tp)], 1)
        m.register_buffer("slot_ids", table.to(device))
    m.__class__ = ShardedMoE
    if hasattr(m, "shared_experts"):
        _mlp(m.shared_experts, t, mesh.tp, mesh.tp_group(rank))


COMBINES = ("auto", "all_reduce", "all_to_all")


def choose_combine(moe: MoE, mesh: Mesh) -> dict:
    """{"all_reduce": bytes per token, "all_to_all": ..., "chosen": the fewer}: the routed
    experts' combine priced both ways by passes/cost.py (ties: the all-reduce, one collective)."""
    width = moe.routed_expert_down_proj.out_features if hasattr(moe, "routed_expert_down_proj") \
        else moe.gate.weight.shape[1]
    item = moe.gate.weight.element_size()
    if mesh.dp > 1:  # the copies hold different tokens: no sum over them, only the exchange
        a2a = sum(exchange_bytes(1 << 16, moe.top_k * mesh.tp, width, item, mesh.tp * mesh.ep,
                                 mesh.token_peers)) / (1 << 16)
        ar = sent_bytes("all_reduce", width * item, mesh.tp)
        return {"all_reduce": None if mesh.ep > 1 else ar, "all_to_all": a2a,
                "chosen": "all_to_all" if mesh.ep > 1 else "all_reduce"}
    price = combine_bytes(width, item, moe.top_k, mesh.tp, mesh.ep)
    return {**price, "chosen": "all_to_all" if price["all_to_all"] < price["all_reduce"] else "all_reduce"}


def combine_report(model: nn.Module, mesh: Mesh, combine: str = "auto") -> dict | None:
    """What the routed experts' combine costs each way per token (all MoE layers) and which
    form the partition runs with `combine`; None for a model without routed experts or a
    mesh that does not split them (tp = ep = 1)."""
    moes = [m for m in model.modules() if isinstance(m, MoE)]
    if not moes or mesh.tp * mesh.ep == 1:
        return None
    rows = [choose_combine(m, mesh) for m in moes]
    run = [(r["chosen"] if combine == "auto" or mesh.dp > 1 else combine) if mesh.ep > 1 else "all_reduce"
           for r in rows]
    return {"layers": len(moes), "asked": combine,
            "all_reduce_bytes_per_token": None if rows[0]["all_reduce"] is None else
            sum(r["all_reduce"] for r in rows),
            "all_to_all_bytes_per_token": sum(r["all_to_all"] for r in rows),
            "chosen": rows[0]["chosen"], "run": run[0]}


def partition(model: nn.Module, mesh: Mesh | str, rank: int, combine: str = "auto") -> nn.Module:
    """Rank `rank`'s part of `model` on `mesh` (a copy; `model` is left whole). A mesh that
    does not divide the heads, widths or experts is a UsageError naming each. `combine`: how
    the routed experts' outputs are combined ("auto": the form `choose_combine` prices lower)."""
    mesh = Mesh.parse(mesh)
    check_divides(mesh, model.config)
    if combine not in COMBINES:
        raise UsageError(f"combine must be one of {', '.join(COMBINES)}, got {combine!r}")
    if mesh.dp > 1 and mesh.ep > 1 and combine == "all_reduce":
        raise UsageError(f"mesh {mesh}: the data-parallel copies hold different tokens, so their routed experts "
                         f"combine by all_to_all only (combine all_reduce asked)")
    e, t = mesh.coords(rank)
    group = mesh.tp_group(rank)
    spec = state_spec(model)  # the one-process state's shapes, before the copy (it caches them)
    part = copy.deepcopy(model)
    if getattr(model.config, "family", None) != "kimi":  # the zoo's models with heads (tp only)
        partition_zoo(part, t, mesh.tp, group)
    for layer in part.model.layers if getattr(model.config, "family", None) == "kimi" else ():
        if mesh.tp > 1:
            (_mla if isinstance(layer.self_attn, MLAMixer) else _kda)(layer.self_attn, t, mesh.tp, group)
            if hasattr(layer, "mlp"):
                _mlp(layer.mlp, t, mesh.tp, group)
        if hasattr(layer, "block_sparse_moe") and mesh.tp * mesh.ep > 1:
            moe = layer.block_sparse_moe
            how = choose_combine(moe, mesh)["chosen"] if combine == "auto" else combine
            _moe(moe, mesh, rank, how if mesh.ep > 1 else "all_reduce")  # one ep member: nothing to exchange
    if mesh.vocab:
        _vocab(part, t, mesh.tp, group)
    part.mesh, part.rank = mesh, rank
    # the rank's state spec, so decode checks a shard against the shard's shapes (found by
    # running the rank's model it would need the other ranks)
    first = next(iter(part.parameters()))
    part.__dict__[_SPEC] = ((first.dtype, first.device), {
        k: (_shard_shape(k, shape, mesh.tp), grow, dt) for k, (shape, grow, dt) in spec.items()})
    return part


_BY_HEAD = {"S": 1, "z": 1, "conv_q": 1, "conv_k": 1, "conv_v": 1, "k": 2, "v": 2}


def split_dim(name: str) -> int | None:
    """The dim a state entry is split along over tp: a recurrent state S [B, H, K, V] and the
    normaliser z [B, H, K] by head, the conv tails [B, H K, W - 1] by channel, GPT-2's KV cache
    [B, P, H, D] by head; None for the MLA latent cache (no head axis)."""
    return _BY_HEAD.get(name.rsplit(".", 1)[-1])


def _shard_shape(name: str, shape: tuple[int, ...], tp: int) -> tuple[int, ...]:
    d = split_dim(name)
    return shape if d is None else tuple(n // tp if i == d else n for i, n in enumerate(shape))
