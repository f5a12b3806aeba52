"""The text form of the IR: prints and parses back to a structurally equal graph.

    graph k3-tiny.prefill {
      dim B in [1, inf]
      input %input_ids: i64[B, T]
      weight %lm_head.weight: f32[1024, 256]
      %h: f32[B, T, 256] = embedding(%model.embed_tokens.weight, %input_ids)  # models/kimi.py:80
      %o, %S: f32[...], f32[...] = ...            (each output carries its own type)
      %y: f32[B, T, 256] = rms_norm(%h, %w) {eps=1e-05}
      output logits = %y
    }

Attribute values: ints, floats (repr, so exact), "strings", true/false/none, [lists], and
dim expressions over the declared dims (B, P + 1). A malformed line is a ParseError that
gives its line number.
"""

from __future__ import annotations

import json
import re

import sympy

from ..errors import ParseError
from . import dims as D
from .graph import Graph, Node
from .types import DTYPES, TensorType

NAME = r"[A-Za-z0-9_.\-]+"


# ---- printing ------------------------------------------------------------------------

def format_value(v) -> str:
    if v is None:
        return "none"
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        return repr(v)
    if isinstance(v, str):
        return json.dumps(v)
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(format_value(x) for x in v) + "]"
    if isinstance(v, sympy.Basic):
        return D.to_str(v)
    raise TypeError(f"attribute value {v!r} of type {type(v).__name__} has no text form")


def format_node(graph: Graph, node: Node) -> str:
    outs = ", ".join(f"%{o}: {graph.types[o]}" for o in node.outputs)
    ins = ", ".join("%" + i for i in node.inputs)
    attrs = ""
    if node.attrs:
        attrs = " {" + ", ".join(f"{k}={format_value(v)}" for k, v in node.attrs.items()) + "}"
    loc = f"  # {node.loc}" if node.loc else ""
    return f"{outs} = {node.op}({ins}){attrs}{loc}"


def print_graph(graph: Graph) -> str:
    lines = [f"graph {graph.name} {{"]
    for n, (lo, hi) in graph.dims.items():
        lines.append(f"  dim {n} in [{lo}, {'inf' if hi is None else hi}]")
    if graph.meta:
        lines.append(f"  meta {json.dumps(graph.meta, sort_keys=True)}")
    for i in graph.inputs:
        lines.append(f"  input %{i}: {graph.types[i]}")
    for w in graph.weights:
        lines.append(f"  weight %{w}: {graph.types[w]}")
    lines.extend("  " + format_node(graph, n) for n in graph.nodes)
    lines.extend(f"  output {k} = %{v}" for k, v in graph.outputs)
    lines.append("}")
    return "\n".join(lines) + "\n"


# ---- parsing -------------------------------------------------------------------------

def split_top(text: str, sep: str = ",") -> list[str]:
    """Split on `sep` outside brackets, parentheses, braces and strings."""
    parts, depth, buf, quote = [], 0, [], False
    i = 0
    while i < len(text):
        c = text[i]
        if quote:
            buf.append(c)
            if c == "\\":
                buf.append(text[i + 1])
                i += 1
            elif c == '"':
                quote = False
        elif c == '"':
            quote = True
            buf.append(c)
        elif c in "([{":
            depth += 1
            buf.append(c)
        elif c in ")]}":
            depth -= 1
            buf.append(c)
        elif depth == 0 and text.startswith(sep, i):
            parts.append("".join(buf))
            buf = []
            i += len(sep)
            continue
        else:
            buf.append(c)
        i += 1
    if "".join(buf).strip() or parts:
        parts.append("".join(buf))
    return [p.strip() for p in parts]


def parse_type(text: str, symbols) -> TensorType:
    m = re.fullmatch(r"(\w+)\[(.*)\]", text.strip())
    if not m:
        raise ValueError(f"malformed type {text!r} (expected like f32[B, T, 256])")
    dtype, body = m.groups()
    if dtype not in DTYPES:
        raise ValueError(f"unknown dtype {dtype!r}")
    dims = tuple(D.parse(s, symbols) for s in split_top(body))
    for d in dims:
        if isinstance(d, int) and d < 0:
            raise ValueError(f"negative dimension {d} in type {text.strip()!r}")
    return TensorType(dtype, dims)


def parse_value(text: str, symbols):
    t = text.strip()
    if t in ("true", "false"):
        return t == "true"
    if t == "none":
        return None
    if t.startswith('"'):
        return json.loads(t)
    if t.startswith("["):
        if not t.endswith("]"):
            raise ValueError(f"unclosed list {t!r}")
        return [parse_value(x, symbols) for x in split_top(t[1:-1])]
    if re.fullmatch(r"-?\d+", t):
        return int(t)
    if t in ("inf", "-inf", "nan"):
        return float(t)
    try:
        return float(t)
    except ValueError:
        pass
    return D.parse(t, symbols)


def _split_comment(line: str) -> tuple[str, str | None]:
    """Separate a trailing `  # loc` comment, ignoring '#' inside strings."""
    quote = False
    for i, c in enumerate(line):
        if c == '"' and (i == 0 or line[i - 1] != "\\"):
            quote = not quote
        elif c == "#" and not quote and line[i - 2:i] == "  ":
            return line[:i].rstrip(), line[i + 1:].strip()
    return line.rstrip(), None


def parse(text: str) -> Graph:
    """Parse the text form; raises ParseError naming the line for malformed input."""
    g: Graph | None = None
    symbols: dict = {}
    closed = False
    for lineno, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line:
            continue
        try:
            if g is None:
                m = re.fullmatch(rf"graph ({NAME}) \{{", line)
                if not m:
                    raise ValueError("expected 'graph NAME {'")
                g = Graph(m.group(1))
                continue
            if closed:
                raise ValueError("text after the closing '}'")
            if line == "}":
                closed = True
                continue
            _parse_line(g, line, symbols)
        except ParseError:
            raise
        except (ValueError, TypeError, KeyError, sympy.SympifyError) as e:
            raise ParseError(lineno, raw, str(e)) from None
    if g is None or not closed:
        raise ParseError(len(text.splitlines()), "", "missing 'graph NAME {' header or closing '}'")
    return g


def _parse_line(g: Graph, line: str, symbols: dict) -> None:
    head = line.split(" ", 1)[0]
    if head == "dim":
        m = re.fullmatch(r"dim (\w+) in \[(\d+), (\d+|inf)\]", line)
        if not m:
            raise ValueError("malformed dim line (expected 'dim NAME in [lo, hi]')")
        name, lo, hi = m.groups()
        g.dims[name] = (int(lo), None if hi == "inf" else int(hi))
        symbols[name] = D.sym(name)
    elif head == "meta":
        g.meta = json.loads(line[5:])
    elif head in ("input", "weight"):
        m = re.fullmatch(rf"{head} %({NAME}): (.+)", line)
        if not m:
            raise ValueError(f"malformed {head} line (expected '{head} %name: type')")
        name, ty = m.group(1), parse_type(m.group(2), symbols)
        if name in g.types:
            raise ValueError(f"%{name} declared twice")
        g.types[name] = ty
        if head == "input":
            g.inputs.append(name)
        else:
            g.weights[name] = _meta_tensor(ty)
    elif head == "output":
        m = re.fullmatch(rf"output ({NAME}) = %({NAME})", line)
        if not m:
            raise ValueError("malformed output line (expected 'output NAME = %value')")
        g.outputs.append((m.group(1), m.group(2)))
    elif line.startswith("%"):
        g.nodes.append(_parse_node(g, line, symbols))
    else:
        raise ValueError(f"unknown statement {head!r}")


def _parse_node(g: Graph, line: str, symbols: dict) -> Node:
    body, loc = _split_comment(line)
    lhs, sep, rhs = body.partition(" = ")
    if not sep:
        raise ValueError("a node line needs '%out: type = op(...)'")
    outputs = []
    for part in split_top(lhs):
        m = re.fullmatch(rf"%({NAME}): (.+)", part)
        if not m:
            raise ValueError(f"malformed output {part!r} (expected '%name: type')")
        name = m.group(1)
        if name in g.types:
            raise ValueError(f"%{name} defined twice")
        g.types[name] = parse_type(m.group(2), symbols)
        outputs.append(name)
    m = re.fullmatch(r"(\w+)\((.*?)\)(?: \{(.*)\})?", rhs)
    if not m:
        raise ValueError(f"malformed op call {rhs!r} (expected 'op(%a, %b) {{k=v}}')")
    op, args, attrs_text = m.groups()
    inputs = []
    for a in split_top(args):
        if not re.fullmatch(rf"%{NAME}", a):
            raise ValueError(f"operand {a!r} is not a %value")
        inputs.append(a[1:])
    attrs = {}
    for item in split_top(attrs_text or ""):
        k, eq, v = item.partition("=")
        if not eq:
            raise ValueError(f"malformed attribute {item!r} (expected key=value)")
        attrs[k.strip()] = parse_value(v, symbols)
    return Node(op, inputs, outputs, attrs, {"loc": loc} if loc else {})


def _meta_tensor(ty: TensorType):
    """A placeholder for weight data that the text form does not carry."""
    import torch

    shape = [d if isinstance(d, int) else 1 for d in ty.shape]
    return torch.empty(shape, dtype=ty.torch_dtype, device="meta")

