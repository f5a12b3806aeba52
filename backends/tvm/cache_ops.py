"""TVM lowerings of the fixed-capacity cache ops (ir/ops/cache.py): TensorIR kernels of
k3c.kernels.cache.tvm.

- `cache_write` runs in place (`call_tir_inplace`): the new rows go into the buffer the
  caller passed, and the op's output aliases it, so a decode step moves one row a
  sequence, not the cache. Taken only where the old cache has no other reader.
- `mla_attention_absorbed_cached` (what fold-latent-moe makes of a decode step over a fixed
  cache) attends in the latent space reading each valid row once, split over key ranges;
  on llvm each split scores blocks of keys in vectors (kernels/cache/tvm_blocked.py).
- `causal_attention_cached` and the expanded `mla_attention_cached` (an extend of several
  tokens: a piece of a chunked prefill, a speculative verify) run the causal attention kernel
  with each sequence's position as its offset: online softmax over the key blocks below the
  tile's last visible key, so a call holds no [T, N] scores and its working memory is that of
  its T rows, not of the capacity. What is O(capacity) is the keys transposed for the kernel
  and, for MLA, the keys and values up-projected from the whole latent cache.
"""

from __future__ import annotations

from tvm import relax

from ...ir import dims as D
from ...ir import named_inputs
from ...kernels.cache import tvm as K
from .context import LowerContext
from .dims import static_int
from .kernel_ops import attention, kernel_supports, mla_attention, tir
from .latent import latent_attention

R = relax.op


def _write_supports(node, graph) -> tuple[bool, str]:
    ok, why = kernel_supports(node, graph)
    if not ok:
        return ok, why
    cache = named_inputs(node)["cache"]
    readers = [n for n in graph.nodes if cache in n.inputs]
    if len(readers) != 1 or cache in graph.output_values:
        return False, f"the in-place write needs %{cache} read by this cache_write alone"
    if not isinstance(graph.types[cache].shape[1], int):
        return False, "the in-place write needs a static capacity N"
    return True, ""


def _cache_write(ctx: LowerContext, node, cache, new, positions):
    ir = ctx.ir(node)
    shape = ctx.type_of(ir["cache"]).shape
    N = static_int(shape[1], "cache capacity")
    C = 1
    for i, d in enumerate(shape[2:]):
        C *= static_int(d, f"dim {i + 2} of %{ir['cache']}")
    B = ctx.shape(ir["cache"])[0]
    L = ctx.shape(ir["new"])[1]
    gv = ctx.kernel(("cache_write", C, N), lambda: K.cache_write(C, N), K.WRITE_SCHEDULES)
    c3 = ctx.bb.emit(R.reshape(cache, relax.ShapeExpr([B, N, C])))
    n3 = ctx.bb.emit(R.reshape(new, relax.ShapeExpr([B, L, C])))
    out = ctx.bb.emit(relax.call_tir_inplace(gv, [c3, n3, positions], [0], relax.TensorType([B, N, C], "float32")))
    return R.reshape(out, relax.ShapeExpr(ctx.shape(node.outputs[0])))


def _absorbed_cached(ctx: LowerContext, node, q, ckv, krope, w_uk, w_uv, positions):
    ir = ctx.ir(node)
    qt, ct, rt = (ctx.type_of(ir[n]) for n in ("q", "ckv", "krope"))
    H, Dq = static_int(qt.shape[2], "MLA heads"), static_int(qt.shape[3], "MLA query width")
    N, Dc = static_int(ct.shape[1], "cache capacity"), static_int(ct.shape[2], "latent width")
    Dr = static_int(rt.shape[2], "rope width")
    Dv = static_int(ctx.type_of(ir["w_uv"]).shape[1], "value width")
    B, L = ctx.shape(ir["q"])[:2]
    return latent_attention(ctx, q, ckv, krope, w_uk, w_uv, positions, B, L, H, Dq - Dr, Dv, Dc, Dr, N,
                            ctx.attrs(node)["scale"])


def _causal_cached(ctx: LowerContext, node, q, k, v, positions):
    ir = ctx.ir(node)
    qt, vt = ctx.type_of(ir["q"]), ctx.type_of(ir["v"])
    H, Dq = static_int(qt.shape[2], "query heads"), static_int(qt.shape[3], "query width")
    G, Dv = static_int(vt.shape[2], "key/value heads"), static_int(vt.shape[3], "value width")
    return attention(ctx, q, k, v, H, G, Dq, Dv, ctx.attrs(node)["scale"], ctx.shape(node.outputs[0]),
                     D.decode_step(ctx.graph, ir["q"]), positions=positions)


tir("cache_write", supports=_write_supports)(_cache_write)
tir("causal_attention_cached")(_causal_cached)
tir("mla_attention_cached")(mla_attention)
tir("mla_attention_absorbed_cached")(_absorbed_cached)
