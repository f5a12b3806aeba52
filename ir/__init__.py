"""k3c.ir: the graph, the op table, the verifier, the text form and the interpreter.

    text = str(graph);  graph2 = k3c.ir.parse(text)
    k3c.ir.verify(graph)
    outputs = k3c.ir.interpret(graph, *inputs)
"""

if __name__ != "k3c.ir":  # this folder imported under its bare name, e.g. by a script in the repository root
    raise ImportError(f"'{__name__}' is a folder of k3c's source tree, not a package: import k3c.ir. A script "
                      f"run from k3c's repository root finds this folder when it, or a library it uses (transformers "
                      f"looks for a package named 'kernels'), imports 'ir': run it from another directory")


from .graph import Graph, Node
from .interpret import InputError, bind_dims, interpret
from .ops import FAMILIES, OPS, OpSpec, ShapeError, family
from .serialize import load, save
from .text import ParseError, parse, print_graph
from .types import DTYPES, TensorType, dtype_name
from .verify import VerifyError, verify

__all__ = ["Graph", "Node", "TensorType", "OPS", "OpSpec", "FAMILIES", "family", "ShapeError",
           "interpret", "bind_dims", "InputError", "verify", "VerifyError", "parse", "print_graph",
           "ParseError", "save", "load", "DTYPES", "dtype_name"]
