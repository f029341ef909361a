"""The P4 sources of p4/, read as text: one reader for everything that checks
the program against the Python side without a compiler.

:class:`P4Source` strips comments and collects ``#define`` macros, constants,
typedefs, structs and headers, and control bodies, and evaluates constant
expressions. :mod:`p4.controller.p4_schema` derives the BF Runtime names from it;
the tests read headers and decision tables from it (tests/test_p4_headers.py).
A few regular expressions, not a P4 parser: enough for this program's style.
"""

from __future__ import annotations

import re
from pathlib import Path

P4_DIR = Path(__file__).resolve().parent

#: TNA types the program uses without declaring them (tofino1_base.p4): bits
TNA_WIDTHS = {"PortId_t": 9, "MulticastGroupId_t": 16, "bool": 1}


def strip_comments(text: str) -> str:
    """P4 text without ``/* ... */`` and ``// ...`` comments."""
    text = re.sub(r"/\*.*?\*/", " ", text, flags=re.S)
    return re.sub(r"//[^\n]*", "", text)


def block(text: str, start: int | str) -> str:
    """The text inside the first ``{...}`` at or after ``start``: an index, or a
    regular expression whose first match's end is the index."""
    if isinstance(start, str):
        m = re.search(start, text)
        if m is None:
            raise ValueError(f"{start!r} not found in the P4 source")
        start = m.end()
    i = text.index("{", start)
    depth = 0
    for j in range(i, len(text)):
        if text[j] == "{":
            depth += 1
        elif text[j] == "}":
            depth -= 1
            if depth == 0:
                return text[i + 1 : j]
    raise ValueError("unbalanced braces in the P4 source")


class P4Source:
    """The ``.p4`` files of a directory, comment-free, with their names resolved."""

    def __init__(self, directory: Path | str = P4_DIR) -> None:
        paths = sorted(Path(directory).glob("*.p4"))
        if not paths:
            raise FileNotFoundError(f"no .p4 files in {directory}")
        #: file name -> its text, comments included
        self.files = {p.name: p.read_text() for p in paths}
        self.text = "\n".join(strip_comments(t) for t in self.files.values())
        #: object-like macros (include guards: ""), and function-like ones: (params, body)
        self.defines: dict[str, str] = {}
        self.macros: dict[str, tuple[list[str], str]] = {}
        for m in re.finditer(r"^\s*#define\s+(\w+)(\(([^)]*)\))?[ \t]*(.*)$", self.text, re.M):
            name, has_args, args, body = m.groups()
            if has_args:
                self.macros[name] = ([a.strip() for a in args.split(",")], body.strip())
            else:
                self.defines[name] = body.strip()
        self.consts = {
            m.group(1): m.group(2).strip()
            for m in re.finditer(r"\bconst\s+\w+(?:<[^>]*>)?\s+(\w+)\s*=\s*([^;]+);", self.text)
        }
        #: typedef name -> ("bit" or "int", width expression)
        self.typedefs = {
            m.group(3): (m.group(1), m.group(2))
            for m in re.finditer(r"\btypedef\s+(bit|int)<([^>]+)>\s+(\w+)\s*;", self.text)
        }
        #: structs and headers: name -> [(member type, member name)]
        self.structs = {
            m.group(2): re.findall(r"([A-Za-z_]\w*(?:<[^>]*>)?)\s+(\w+)\s*;", m.group(3))
            for m in re.finditer(r"\b(struct|header)\s+(\w+)\s*\{([^}]*)\}", self.text)
        }
        self.controls = {
            m.group(1): block(self.text, m.end())
            for m in re.finditer(r"\bcontrol\s+(\w+)\s*\(", self.text)
        }

    def value(self, expr: str) -> int:
        """Evaluate a constant expression: literals (``32w1``, ``0xBEE0``), named
        constants and macros, and + - * << >> & | ~ with parentheses."""
        for _ in range(10):  # names may refer to names
            expr = re.sub(r"\b\d+w(0x[0-9a-fA-F]+|\d+)\b", r"\1", expr)
            new = re.sub(
                r"\b[A-Za-z_]\w*\b",
                lambda m: (
                    f"({self.defines.get(m.group(0), self.consts.get(m.group(0), m.group(0)))})"
                ),
                expr,
            )
            if new == expr:
                break
            expr = new
        if not re.fullmatch(r"[\s0-9a-fA-FxX()+\-*<>&|~]*", expr):
            raise ValueError(f"not a constant expression: {expr!r}")
        return int(eval(expr, {"__builtins__": {}}))  # digits and operators only

    def width_and_sign(self, type_name: str) -> tuple[int, bool]:
        """Bit width and signedness of ``bit<N>``, ``int<N>``, a typedef or a TNA type."""
        m = re.fullmatch(r"(bit|int)<(.+)>", type_name.strip())
        if m:
            return self.value(m.group(2)), m.group(1) == "int"
        if type_name in self.typedefs:
            kind, width = self.typedefs[type_name]
            return self.value(width), kind == "int"
        if type_name in TNA_WIDTHS:
            return TNA_WIDTHS[type_name], False
        raise KeyError(f"unknown type {type_name}")

    def width(self, type_name: str) -> int:
        """Bits of ``bit<N>``, ``int<N>``, a typedef or a TNA type."""
        return self.width_and_sign(type_name)[0]
