"""Reading the shell scripts peers launch runs with: lines joined at a trailing backslash, ``NAME=value`` variables
(and the environment's) with ``$NAME``, ``${NAME:-default}`` and ``$((...))`` arithmetic expanded. verl's run scripts
(Hydra ``key=value`` overrides) and slime's (bash arrays of ``--flag value`` words) are read with these."""

from __future__ import annotations

import ast
import os
import re

ASSIGNMENT = re.compile(r"^(?:export\s+)?([A-Za-z_][A-Za-z0-9_]*)=(.*)$")

_ARITHMETIC = re.compile(r"\$\(\((.*?)\)\)")


def arithmetic(line: str, variables: dict[str, str]) -> str:
    """Bash's ``$((expr))`` over integers and the script's variables (``$((1024 * 20))``, ``$((a + b))``); one
    it cannot evaluate is left as it is (an override using it is then unresolved)."""
    def evaluate(match: re.Match[str]) -> str:
        expr = re.sub(r"\$\{?([A-Za-z_]\w*)\}?|\b([A-Za-z_]\w*)\b",
                      lambda v: variables.get(v.group(1) or v.group(2), v.group(0)), match.group(1))
        if not re.fullmatch(r"[\d\s+\-*/%()]+", expr):
            return match.group(0)
        try:
            return str(_integer(ast.parse(expr.strip().replace("/", "//"), mode="eval").body))
        except (SyntaxError, ValueError, ZeroDivisionError):
            return match.group(0)

    return _ARITHMETIC.sub(evaluate, line)


def _integer(node: ast.AST) -> int:
    """An integer expression of + - * // % and parentheses (nothing else is evaluated)."""
    if isinstance(node, ast.Constant) and isinstance(node.value, int):
        return node.value
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        return -_integer(node.operand)
    operators = {ast.Add: int.__add__, ast.Sub: int.__sub__, ast.Mult: int.__mul__, ast.FloorDiv: int.__floordiv__,
                 ast.Mod: int.__mod__}
    if isinstance(node, ast.BinOp) and type(node.op) in operators:
        return operators[type(node.op)](_integer(node.left), _integer(node.right))
    raise ValueError("not an integer expression")


def logical_lines(text: str) -> list[tuple[int, list[str]]]:
    """Shell lines joined at a trailing backslash: (first line number, the physical lines)."""
    lines: list[tuple[int, list[str]]] = []
    pending: list[str] = []
    for number, raw in enumerate(text.splitlines(), start=1):
        if not pending:
            start = number
        pending.append(raw[:-1] if raw.endswith("\\") else raw)
        if not raw.endswith("\\"):
            lines.append((start, pending))
            pending = []
    if pending:
        lines.append((start, pending))
    return lines


def expand(value: str, variables: dict[str, str]) -> str | None:
    """``$NAME``, ``${NAME}``, ``${NAME:-default}`` / ``${NAME:=default}`` with nested braces in the default
    (``${DIR:-${HOME}/verl}``, expanded too); None when a variable is set nowhere."""
    out, i, missing = [], 0, False
    while i < len(value):
        if value[i] != "$" or value.startswith("$((", i):
            out.append(value[i])
            i += 1
            continue
        bare = re.match(r"\$([A-Za-z_][A-Za-z0-9_]*)", value[i:])
        if bare:
            name = bare.group(1)
            missing = missing or name not in variables
            out.append(variables.get(name, ""))
            i += bare.end()
            continue
        if not value.startswith("${", i):
            out.append(value[i])
            i += 1
            continue
        depth, j = 0, i + 1
        while j < len(value):  # the matching brace
            depth += {"{": 1, "}": -1}.get(value[j], 0)
            if depth == 0:
                break
            j += 1
        inner = value[i + 2:j]
        parts = re.match(r"([A-Za-z_][A-Za-z0-9_]*)(?::?[-=](.*))?$", inner, re.S)
        if parts is None or j == len(value):
            return None
        name, default = parts.group(1), parts.group(2)
        if variables.get(name):
            out.append(variables[name])
        elif default is not None:
            if len(default) >= 2 and default[0] == default[-1] and default[0] in "'\"":  # ${X:-"a b"}
                default = default[1:-1]
            expanded_default = expand(default, variables)
            if expanded_default is None:
                return None
            out.append(expanded_default)
        else:
            missing = missing or name not in variables
        i = j + 1
    expanded = "".join(out)
    if missing or "$((" in expanded:  # a variable set nowhere, or arithmetic that could not be evaluated
        return None
    return os.path.expanduser(expanded) if expanded.startswith("~") else expanded


OPEN, CLOSE = "\x00(", "\x00)"  # an array's parentheses among a command's words (no word holds a NUL)


def commands(text: str) -> list[tuple[int, list[str]]]:
    """A script's simple commands: (first line, words) with quotes removed and ``$...`` kept for ``expand``. Words
    end at blanks; commands at newlines, ``;``, ``&``, ``|`` (not inside an array's ``( ... )``, whose parentheses
    are the ``OPEN`` / ``CLOSE`` words). Quotes may span lines; ``${...}`` and ``$(...)`` stay whole (nested quotes
    and parentheses included); a ``#`` starting a word comments out the rest of its line."""
    out: list[tuple[int, list[str]]] = []
    words: list[str] = []
    word: list[str] | None = None
    line, start, depth, i = 1, 1, 0, 0

    def end_word() -> None:
        nonlocal word
        if word is not None:
            words.append("".join(word))
            word = None

    while i < len(text):
        c = text[i]
        if c == "\\" and text.startswith("\n", i + 1):  # a continued line
            i, line = i + 2, line + 1
            continue
        if c in " \t\r" or (c in "\n;&|" and depth):
            end_word()
            line += c == "\n"
            i += 1
            continue
        if c in "\n;&|":
            end_word()
            if words:
                out.append((start, words))
            words = []
            line += c == "\n"
            i += 1
            start = line
            continue
        if c == "#" and word is None:
            while i < len(text) and text[i] != "\n":
                i += 1
            continue
        if c in "()" and (word is None or c == ")" or "".join(word).endswith("=")):
            end_word()
            words.append(OPEN if c == "(" else CLOSE)
            depth = max(depth + (1 if c == "(" else -1), 0)
            i += 1
            continue
        if word is None:
            word, start = [], start if words else line
        part, j = _word_part(text, i)
        word.append(part)
        line += text.count("\n", i, j + 1)
        i = j + 1
    end_word()
    if words:
        out.append((start, words))
    return out


def _word_part(text: str, i: int) -> tuple[str, int]:
    """The part of a word starting at ``i`` (a quoted string unquoted, a whole ``${...}`` / ``$(...)``, an escaped or
    plain character) and the index of its last character."""
    c = text[i]
    if c == "'":
        j = text.find("'", i + 1)
        j = len(text) if j < 0 else j
        return text[i + 1:j], j
    if c == '"':
        j = _closing_quote(text, i)
        return re.sub(r'\\(["\\$`])', r"\1", text[i + 1:j]), j
    if c == "$" and text.startswith(("${", "$("), i):
        j = _matching(text, i + 1)
        return text[i:j + 1], j
    if c == "\\" and i + 1 < len(text):
        return text[i + 1], i + 1
    return c, i


def _closing_quote(text: str, i: int) -> int:
    """The index of the ``"`` closing the one at ``i`` (skipping escapes, ``${...}`` and ``$(...)``)."""
    j = i + 1
    while j < len(text) and text[j] != '"':
        if text[j] == "\\":
            j += 2
        elif text.startswith(("${", "$("), j):
            j = _matching(text, j + 1) + 1
        else:
            j += 1
    return min(j, len(text))


def _matching(text: str, i: int) -> int:
    """The index of the bracket closing the ``{`` or ``(`` at ``i`` (quotes inside skipped)."""
    opening = text[i]
    closing = "}" if opening == "{" else ")"
    depth, j = 0, i
    while j < len(text):
        c = text[j]
        if c == opening:
            depth += 1
        elif c == closing:
            depth -= 1
            if depth == 0:
                return j
        elif c == "'":
            j = max(text.find("'", j + 1), j)
        elif c == '"':
            j = _closing_quote(text, j)
        j += 1
    return len(text) - 1
