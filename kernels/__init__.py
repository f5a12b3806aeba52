"""k3c.kernels: every op's naive definition beside its fast forms, one folder per op.

The public entry points follow fla's `[B, T, H, K]` layout and return `(o, final_state)`.
The `torch.ops.k3c.*` ops that models call are made from the IR op specs (see ops.py).
"""

if __name__ != "k3c.kernels":  # this folder imported under its bare name, e.g. by a script in the repository root
    from . import bare_name  # a library's probe gets a stand-in that holds nothing; an import statement, the error

    bare_name.guard(globals())


from . import mxfp4, ops  # noqa: F401  (ops.kda(...): the torch ops by name)
from .attention.naive import causal_attention
from .attn_res.naive import attn_res_mix
from .delta_rule import delta_rule
from .gated_delta_rule import gated_delta_rule
from .gated_rmsnorm.naive import gated_rmsnorm
from .kda import kda, kda_gate_sigmoid, kda_gate_softplus, l2norm
from .linear_attention import linear_attention
from .mla.naive import mla_attention, mla_attention_absorbed
from .moe.mxfp4 import moe_down_mxfp4, moe_gate_up_mxfp4
from .moe.naive import moe_down, moe_gate_up, route
from .short_conv import short_conv
from .situ.naive import silu_glu, situ, situ_packed

__all__ = [
    "kda", "gated_delta_rule", "delta_rule", "linear_attention", "short_conv",
    "kda_gate_softplus", "kda_gate_sigmoid", "l2norm", "situ", "situ_packed", "silu_glu",
    "gated_rmsnorm", "attn_res_mix", "causal_attention", "mla_attention",
    "mla_attention_absorbed", "route", "moe_gate_up", "moe_down", "moe_gate_up_mxfp4", "moe_down_mxfp4", "mxfp4",
]
