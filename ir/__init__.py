"""k3c.ir: the graph, the op table, the verifier, the text form and the interpreter.

    text = str(graph);  graph2 = k3c.ir.parse(text)
    k3c.ir.verify(graph)
    outputs = k3c.ir.interpret(graph, *inputs)
"""

if __name__ != "k3c.ir":  # imported under its bare name, e.g. from the repository root: kernels/bare_name.py
    import os as _os
    import runpy as _runpy  # by path: under a bare name there is no package to import the guard from

    _runpy.run_path(_os.path.join(_os.path.dirname(_os.path.dirname(__file__)), "kernels", "bare_name.py"))[
        "guard"](globals())  # a probe gets a stand-in that holds nothing; an import statement, the error


from .dims import decode_step
from .graph import Graph, Node
from .interpret import InputError, bind_dims, interpret
from .ops import FAMILIES, OPS, OpSpec, ShapeError, family, named_inputs
from .serialize import load, save
from .text import ParseError, parse, print_graph
from .types import DTYPES, TensorType, dtype_name
from .verify import VerifyError, verify

__all__ = ["Graph", "Node", "TensorType", "OPS", "OpSpec", "FAMILIES", "family", "named_inputs", "ShapeError",
           "decode_step", "interpret", "bind_dims", "InputError", "verify", "VerifyError", "parse", "print_graph",
           "ParseError", "save", "load", "DTYPES", "dtype_name"]
