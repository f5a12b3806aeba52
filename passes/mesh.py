"""A device mesh: `tp` ranks split the attention heads and MLP widths, `ep` ranks split the
routed experts; the world is tp * ep ranks. Models without experts (the zoo's GPT-2 and
linear-attention models) take tp only.

Rank r sits at (ep index, tp index) = divmod(r, tp). Its tensor-parallel group is the tp ranks
of its ep index (r // tp * tp ...), its expert-parallel group the ep ranks of its tp index.
Every rank sees the same tokens: the ep axis does not split attention (it runs replicated
across it, tensor-parallel inside each tp group); the routed experts of a MoE are split over
the ep group, each rank holding E / ep of them.

    mesh = Mesh.parse("tp=2,ep=2");  mesh.world == 4;  mesh.tp_group(3) == [2, 3]

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

    def __post_init__(self):
        for axis, n in (("tp", self.tp), ("ep", self.ep)):
            if not isinstance(n, int) or isinstance(n, bool) or n < 1:
                raise UsageError(f"mesh: {axis} must be a whole number >= 1, got {n!r}")

    @staticmethod
    def parse(text: str | Mesh) -> Mesh:
        """"tp=2,ep=2" (either axis may be left out: it is 1); ",vocab" splits the vocabulary."""
        if isinstance(text, Mesh):
            return text
        sizes, vocab = parse_axes(text, ("tp", "ep"))
        mesh = Mesh(**sizes, vocab=vocab)
        if vocab and mesh.tp == 1:
            raise UsageError(f"mesh {text!r}: 'vocab' splits the vocabulary over tp, and tp is 1")
        return mesh

    @property
    def world(self) -> int:
        return self.tp * self.ep

    def coords(self, rank: int) -> tuple[int, int]:
        """(ep index, tp index) of `rank`."""
        if not 0 <= rank < self.world:
            raise UsageError(f"rank {rank} is outside the mesh {self} of {self.world} ranks")
        return divmod(rank, self.tp)

    def tp_group(self, rank: int) -> list[int]:
        e, _ = self.coords(rank)
        return [e * self.tp + t for t in range(self.tp)]

    def ep_group(self, rank: int) -> list[int]:
        _, t = self.coords(rank)
        return [e * self.tp + t for e in range(self.ep)]

    def groups(self) -> list[list[int]]:
        """Every group of more than one rank, tp groups first: what each rank process creates."""
        tp = [self.tp_group(e * self.tp) for e in range(self.ep)] if self.tp > 1 else []
        ep = [self.ep_group(t) for t in range(self.tp)] if self.ep > 1 else []
        return tp + ep

    def to_json(self) -> dict:
        return {"tp": self.tp, "ep": self.ep, "world": self.world, "vocab": self.vocab}

    @staticmethod
    def from_json(d: dict) -> Mesh:
        return Mesh(d["tp"], d["ep"], bool(d.get("vocab", False)))

    def __str__(self) -> str:
        return f"tp={self.tp},ep={self.ep}" + (",vocab" if self.vocab else "")


def check_divides(mesh: Mesh, config) -> None:
    """A UsageError naming every head count, width or expert count of a config the mesh does
    not divide (config-level, before any capture): a Kimi model's, or a zoo model's with heads
    (passes/partition_zoo.py), which has no experts for ep nor a split vocabulary."""
    if getattr(config, "family", None) != "kimi":
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
