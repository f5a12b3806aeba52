"""A device mesh: `tp` ranks split the attention heads and MLP widths, `ep` ranks split the
routed experts, `dp` ranks each own their sequences (data-parallel attention); the world is
tp * max(dp, ep) ranks. Models without experts (the zoo's GPT-2 and linear-attention models)
take tp (and dp) only.

Rank r sits at (copy index a, tp index t) = divmod(r, tp). Its tensor-parallel group is the tp
ranks of its copy index (a tp ...). The routed experts are split over ep: copy a holds expert
shard a % ep, so each block of ep consecutive copies (copies [b ep, (b+1) ep)) holds every
expert once; the rank's expert group is the tp ep ranks of its block (where a token reaches
its experts: the all-reduce or the all-to-all of a MoE runs over it), its ep group the ranks
of its tp index in that block. Without dp every rank sees the same tokens: the ep axis does
not split attention (it runs replicated across it, tensor-parallel inside each tp group); the
routed experts of a MoE are split over the ep group, each rank holding E / ep of them.

With dp (data-parallel attention, as DEP deploys K3) the copies own the batch rows of a
request: copy a runs the rows `batch_rows` of dp index a dp // max(dp, ep), on a whole copy
of the attention and KDA weights (split over its tp group), and a token reaches its experts'
ranks in its expert group by all-to-all and comes back. One of dp and ep divides the other:
    dp = k ep   (dp=4,ep=2): dp copies, each its own rows; the expert shards are copied k
                times, once in each of the dp / ep expert groups, which exchange nothing;
    ep = k dp   (dp=2,ep=4): ep copies, k consecutive ones share a dp index (the same rows,
                the attention replicated over them, as ep alone replicates it); one expert
                group, the stage;
    dp = ep     both at once; ep = 1: every copy holds every expert (split over its tp).
`token_peers` is how many members of an expert group hold the same tokens (moe_dispatch's
`peers`). Other dp x ep shapes are refused.

    mesh = Mesh.parse("tp=2,ep=2");  mesh.world == 4;  mesh.tp_group(3) == [2, 3]
    Mesh.parse("dp=2,ep=2").dp_index(1) == 1
    Mesh.parse("dp=4,ep=2").expert_group(3) == [2, 3];  Mesh.parse("dp=4,ep=2").coords(3) == (1, 0)

`pp` (pp=N, with tp or alone): the layers split into N stages of consecutive layers
(`stage_layers`), one group of tp ranks each; rank r is in stage r // (tp max(dp, ep)) and its
groups are stage 0's shifted by the stage's first rank. A stage hands its activations (and the
AttnRes bank) to the next one by point-to-point send/recv (k3c/distributed/pipeline.py). pp
with ep or dp is plan-only.

`vocab` (written "tp=2,vocab"): the vocabulary is split over the tp group too, the embedding
by rows (each rank looks up the ids in its range, an all_reduce sums) and the lm_head by its
output columns (an all_gather joins the logits); without it both are replicated.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import UsageError


@dataclass(frozen=True)
class Mesh:
    tp: int = 1
    ep: int = 1
    vocab: bool = False
    dp: int = 1
    pp: int = 1

    def __post_init__(self):
        for axis, n in (("tp", self.tp), ("ep", self.ep), ("dp", self.dp), ("pp", self.pp)):
            if not isinstance(n, int) or isinstance(n, bool) or n < 1:
                raise UsageError(f"mesh: {axis} must be a whole number >= 1, got {n!r}")
        if self.copies % min(self.dp, self.ep):
            raise UsageError(f"mesh {self}: dp and ep run where one divides the other (dp=k*ep: the expert shards "
                             f"copied k times; ep=k*dp: the attention copied k times); dp={self.dp},ep={self.ep} "
                             f"is neither")
        if self.pp > 1 and self.copies > 1:
            raise UsageError(f"mesh {self}: the runtime runs pipeline stages (pp) with tp only; pp with ep or dp "
                             f"is plan-only (k3c plan)")

    @staticmethod
    def parse(text: str | Mesh) -> Mesh:
        """"tp=2,ep=2" (either axis may be left out: it is 1); ",vocab" splits the vocabulary."""
        if isinstance(text, Mesh):
            return text
        sizes, vocab = parse_axes(text, ("tp", "ep", "dp", "pp"))
        mesh = Mesh(**sizes, vocab=vocab)
        if vocab and mesh.tp == 1:
            raise UsageError(f"mesh {text!r}: 'vocab' splits the vocabulary over tp, and tp is 1")
        return mesh

    @property
    def copies(self) -> int:
        """Groups of tp ranks: max(dp, ep)."""
        return max(self.dp, self.ep)

    @property
    def stage_ranks(self) -> int:
        """Ranks of one pipeline stage: tp * max(dp, ep)."""
        return self.tp * self.copies

    @property
    def world(self) -> int:
        return self.pp * self.stage_ranks

    def stage(self, rank: int) -> int:
        """The pipeline stage `rank` runs (0 without pp)."""
        if not 0 <= rank < self.world:
            raise UsageError(f"rank {rank} is outside the mesh {self} of {self.world} ranks")
        return rank // self.stage_ranks

    def stage_mesh(self) -> Mesh:
        """One stage's mesh (the same without pp): what each stage's ranks are partitioned by."""
        return Mesh(self.tp, self.ep, self.vocab, self.dp)

    def _place(self, rank: int) -> tuple[int, int]:
        return divmod(rank - self.stage(rank) * self.stage_ranks, self.tp)

    def _base(self, rank: int) -> int:
        return self.stage(rank) * self.stage_ranks

    @property
    def token_peers(self) -> int:
        """Members of an expert group that hold the same tokens: a copy's tp ranks, times the
        ep / dp copies that share a dp index (the whole group without dp)."""
        return self.tp * self.copies // self.dp

    def coords(self, rank: int) -> tuple[int, int]:
        """(ep index: the expert shard, tp index) of `rank`."""
        a, t = self._place(rank)
        return a % self.ep, t

    def dp_index(self, rank: int) -> int:
        """The dp copy whose sequences `rank` runs (0 without dp)."""
        a, _ = self._place(rank)
        return a * self.dp // self.copies

    def batch_rows(self, rank: int, batch: int) -> slice:
        """The rows of a batch of `batch` sequences that `rank`'s copy owns (all without dp)."""
        if self.dp == 1:
            return slice(0, batch)
        if batch < self.dp:
            raise UsageError(f"mesh {self}: a batch of {batch} sequence(s) cannot give each of the {self.dp} "
                             f"data-parallel copies one")
        d = self.dp_index(rank)
        return slice(d * batch // self.dp, (d + 1) * batch // self.dp)

    def tp_group(self, rank: int) -> list[int]:
        a, _ = self._place(rank)
        return [self._base(rank) + a * self.tp + t for t in range(self.tp)]

    def ep_group(self, rank: int) -> list[int]:
        """The ranks of `rank`'s tp index in its block of ep copies (one per expert shard)."""
        a, t = self._place(rank)
        first = a - a % self.ep
        return [self._base(rank) + c * self.tp + t for c in range(first, first + self.ep)] if self.ep > 1 else [rank]

    def expert_group(self, rank: int) -> list[int]:
        """The tp ep ranks of `rank`'s block of ep copies, which together hold every routed
        expert: what a MoE's combine runs over (the stage unless dp > ep)."""
        a, _ = self._place(rank)
        first = self._base(rank) + (a - a % self.ep) * self.tp
        return list(range(first, first + self.ep * self.tp))

    def stage_group(self, rank: int) -> list[int]:
        """Every rank of `rank`'s stage (the world without pp)."""
        return list(range(self._base(rank), self._base(rank) + self.stage_ranks))

    def groups(self) -> list[list[int]]:
        """Every group of more than one rank, tp groups first: what each rank process creates."""
        firsts = [s * self.stage_ranks for s in range(self.pp)]
        tp = [self.tp_group(f + a * self.tp) for f in firsts for a in range(self.copies)] if self.tp > 1 else []
        blocks = [f + b * self.ep * self.tp for f in firsts for b in range(self.copies // self.ep)]
        ep = [self.ep_group(f + t) for f in blocks for t in range(self.tp)] if self.ep > 1 else []
        experts = [self.expert_group(f) for f in blocks] if self.dp > self.ep and self.ep * self.tp > 1 else []
        stages = [self.stage_group(f) for f in firsts] if self.pp > 1 and self.stage_ranks > 1 else []
        return [list(g) for g in dict.fromkeys(map(tuple, tp + ep + experts + stages))]  # each once

    def to_json(self) -> dict:
        return {"tp": self.tp, "ep": self.ep, "dp": self.dp, "pp": self.pp, "world": self.world, "vocab": self.vocab}

    @staticmethod
    def from_json(d: dict) -> Mesh:
        return Mesh(d["tp"], d["ep"], bool(d.get("vocab", False)), d.get("dp", 1), d.get("pp", 1))

    def __str__(self) -> str:
        dp = f"dp={self.dp}," if self.dp > 1 else ""
        pp = f",pp={self.pp}" if self.pp > 1 else ""
        return f"{dp}tp={self.tp},ep={self.ep}{pp}" + (",vocab" if self.vocab else "")


def stage_layers(layers: int, pp: int) -> list[range]:
    """The layers of each of `pp` stages: consecutive, as even as they go (the first stages
    take one fewer where they do not divide)."""
    return [range(s * layers // pp, (s + 1) * layers // pp) for s in range(pp)]


def check_divides(mesh: Mesh, config) -> None:
    """A UsageError naming every head count, width or expert count of a config the mesh does
    not divide (config-level, before any capture): a Kimi model's, or a zoo model's with heads
    (k3c/distributed/partition_zoo.py), which has no experts for ep nor a split vocabulary."""
    if getattr(config, "family", None) != "kimi":
        if mesh.pp > 1:
            raise UsageError(f"mesh {mesh}: pipeline stages (pp) take the Kimi family, not a {type(config).__name__}")
        return _check_zoo(mesh, config)
    tp_widths = {"KDA heads (kda_heads)": config.kda_heads, "MLA heads (mla_heads)": config.mla_heads,
                 "dense MLP width (dense_intermediate_size)": config.dense_intermediate_size,
                 "shared-expert width (moe_intermediate_size * num_shared_experts)":
                     config.moe_intermediate_size * config.num_shared_experts,
                 "routed-expert width (moe_intermediate_size)": config.moe_intermediate_size}
    bad = [f"tp={mesh.tp} does not divide the {n} {what}" for what, n in tp_widths.items() if n and n % mesh.tp]
    if mesh.vocab and config.vocab_size % mesh.tp:
        bad.append(f"tp={mesh.tp} does not divide the {config.vocab_size} vocabulary entries (vocab_size)")
    if config.num_experts % mesh.ep:
        bad.append(f"ep={mesh.ep} does not divide the {config.num_experts} routed experts (num_experts)")
    if mesh.pp > config.num_layers:
        bad.append(f"pp={mesh.pp} stages for {config.num_layers} layers (num_layers)")
    if bad:
        raise UsageError(f"mesh {mesh}: " + "; ".join(bad))


def _check_zoo(mesh: Mesh, config) -> None:
    from .partition_zoo import zoo_widths

    widths = zoo_widths(config)
    name = type(config).__name__
    if widths is None:
        raise UsageError(f"mesh {mesh}: a {name} has no heads to split (partitioning takes the Kimi family, "
                         f"the linear-attention family and GPT-2)")
    bad = [f"tp={mesh.tp} does not divide the {n} {what}" for what, n in widths.items() if n % mesh.tp]
    if mesh.ep > 1:
        bad.append(f"ep={mesh.ep}: a {name} has no routed experts to split")
    if mesh.vocab:
        bad.append(f"'vocab': a {name}'s vocabulary is not split (only the Kimi family's is)")
    if bad:
        raise UsageError(f"mesh {mesh}: " + "; ".join(bad))


def parse_axes(text, axes: tuple[str, ...]) -> tuple[dict[str, int], bool]:
    """The sizes of "tp=2,ep=2,vocab"-style text over `axes` (each at most once, a whole
    number) and whether it says "vocab"; a UsageError names the part that is not one."""
    sizes: dict[str, int] = {}
    vocab = False
    for part in str(text).replace(" ", "").split(","):
        if part == "vocab":
            vocab = True
            continue
        name, eq, value = part.partition("=")
        if not eq or name not in axes or not value.isdigit():
            raise UsageError(f"mesh {text!r}: expected axes like 'tp=2,ep=2' ({', '.join(axes)}: whole numbers, "
                             f"and optionally 'vocab'), got {part!r}")
        if name in sizes:
            raise UsageError(f"mesh {text!r}: {name} is given twice")
        sizes[name] = int(value)
    return sizes, vocab
