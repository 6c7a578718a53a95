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
    (``${DIR:-${HOME}/verl}``, expanded too); None when a variable is set nowhere or a command's output
    (``$(...)``, backticks: not run here) is needed."""
    out, i, missing = [], 0, False
    while i < len(value):
        if value[i] == "`" or (value.startswith("$(", i) and not value.startswith("$((", i)):
            return None  # a command's output: not run here
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
AND_IF, OR_IF = "\x00&&", "\x00||"  # the first word of a command run only if the list before it succeeded / failed
QUOTED, UNQUOTED, LITERAL, UNLITERAL, COMMAND, UNCOMMAND = "\x01", "\x02", "\x03", "\x04", "\x05", "\x06"
"""Marks in ``commands``' words: a double-quoted part (expanded, never split) between ``QUOTED`` and ``UNQUOTED``; a
single-quoted or escaped part (kept as written) between ``LITERAL`` and ``UNLITERAL``; a command substitution
(``$(...)`` or backticks, as written: not run) between ``COMMAND`` and ``UNCOMMAND``; the rest is unquoted."""


def unquoted(word: str) -> str:
    """A word of ``commands`` as text, its quote marks removed (for keywords and file names)."""
    return re.sub("[\x01-\x06]", "", word)


def substitution(word: str) -> str | None:
    """The first command substitution of a word of ``commands`` (``$(nproc)``, ```date```), as written."""
    return next((text for text, kind in _parts(word) if kind == COMMAND), None)


def fields(word: str, variables: dict[str, str], split: bool = True) -> list[str] | None:
    """A word of ``commands`` as bash expands it: ``$NAME``, ``${...}`` and ``$((...))`` in its unquoted and
    double-quoted parts, its single-quoted parts as written, and (``split``) an unquoted expansion's blanks splitting
    it into words (``$EXTRA`` holding ``--lr 1e-6`` gives two words, ``"$EXTRA"`` one, an empty ``$EMPTY`` none).
    None when a variable is set nowhere or the word takes a command's output (``substitution``, or a variable whose
    value is the ``COMMAND`` mark: one set from a command's output)."""
    out: list[str] = []
    current: str | None = None
    for text, kind in _parts(word):
        if kind == COMMAND:
            return None
        value = text if kind == LITERAL else expand(arithmetic(text, variables), variables)
        if value is None or (kind != LITERAL and COMMAND in value):  # a variable holding a command's output
            return None
        if kind or not split:
            current = (current or "") + value
            continue
        for k, piece in enumerate(re.split(r"[ \t\n]+", value)):
            if k and current is not None:  # a blank ends the word
                out.append(current)
                current = None
            if piece:
                current = (current or "") + piece
    if current is not None:
        out.append(current)
    return out


def word_value(word: str, variables: dict[str, str]) -> str | None:
    """A word of ``commands`` expanded whole (an assignment's value: bash does not split it); None as ``fields``."""
    parts = fields(word, variables, split=False)
    return None if parts is None else "".join(parts)


def _parts(word: str) -> list[tuple[str, str]]:
    """A marked word's parts: (text, ``QUOTED``, ``LITERAL``, ``COMMAND`` or "" for an unquoted part)."""
    closing = {QUOTED: UNQUOTED, LITERAL: UNLITERAL, COMMAND: UNCOMMAND}
    parts: list[tuple[str, str]] = []
    i = 0
    while i < len(word):
        if word[i] in closing:
            j = word.find(closing[word[i]], i + 1)
            j = len(word) if j < 0 else j
            parts.append((word[i + 1:j], word[i]))
            i = j + 1
        else:
            j = min((k for k in map(word.find, closing, (i,) * 3) if k >= 0), default=len(word))
            parts.append((word[i:j], ""))
            i = j
    return parts


def commands(text: str) -> list[tuple[int, list[str]]]:
    """A script's simple commands: (first line, words), quotes as marks (``QUOTED``, ``LITERAL``, ``COMMAND``) and
    ``$...`` kept for ``fields``. Words end at blanks; commands at newlines, ``;``, ``&``, ``|`` (not inside an array's
    ``( ... )``, whose parentheses are the ``OPEN`` / ``CLOSE`` words); one after ``&&`` / ``||`` starts with the word
    ``AND_IF`` / ``OR_IF``. Quotes may span lines; ``${...}``, ``$(...)`` and backticks stay whole (nested quotes and
    parentheses too); a ``#`` starting a word comments out the rest of its line."""
    out: list[tuple[int, list[str]]] = []
    words: list[str] = []
    word: list[str] | None = None
    joined: str | None = None  # the AND_IF / OR_IF before the command being read
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
            connector = {"&&": AND_IF, "||": OR_IF}.get(text[i:i + 2])
            if words:
                out.append((start, [joined, *words] if joined else words))
            joined = connector or (None if words else joined)  # a newline may follow && / ||
            words = []
            line += c == "\n"
            i += 2 if connector else 1
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
        out.append((start, [joined, *words] if joined else words))
    return out


def _word_part(text: str, i: int) -> tuple[str, int]:
    """The part of a word starting at ``i`` (a quoted string between its marks, a whole ``${...}`` / ``$((...))``, a
    command substitution, an escaped or plain character) and the index of its last character. A ``$(command)`` or
    ```command```, which is not run, is kept as written (``COMMAND``); an escaped character too (``LITERAL``), and
    ``$'...'`` as bash reads its escapes."""
    c = text[i]
    if c == "'":
        j = text.find("'", i + 1)
        j = len(text) if j < 0 else j
        return LITERAL + text[i + 1:j] + UNLITERAL, j
    if text.startswith("$'", i):
        j = _closing_ansi_c(text, i + 1)
        return LITERAL + ansi_c(text[i + 2:j]) + UNLITERAL, j
    if c == '"':
        j = _closing_quote(text, i)
        return QUOTED + _double_quoted(text[i + 1:j]) + UNQUOTED, j
    if c == "`" or (text.startswith("$(", i) and not text.startswith("$((", i)):
        j = _closing_backtick(text, i) if c == "`" else _matching(text, i + 1)
        return COMMAND + text[i:j + 1] + UNCOMMAND, j
    if c == "$" and text.startswith(("${", "$(("), i):
        j = _matching(text, i + 1)
        return text[i:j + 1], j
    if c == "\\" and i + 1 < len(text):
        return LITERAL + text[i + 1] + UNLITERAL, i + 1
    return c, i


def _double_quoted(inner: str) -> str:
    """A double-quoted string's text, marked: ``\\"`` and ``\\\\`` as the character, ``\\$`` and ``\\```
    kept as written (``LITERAL``), a ``$(command)`` / ```command``` as a ``COMMAND`` part; ``${...}`` stays whole."""
    out, i = [], 0
    while i < len(inner):
        c = inner[i]
        if c == "\\" and inner[i + 1:i + 2] in ('"', "\\"):
            out.append(inner[i + 1])
            i += 2
            continue
        if c == "\\" and inner[i + 1:i + 2] in ("$", "`"):
            j, part = i + 1, LITERAL + inner[i + 1] + UNLITERAL
        elif c == "`" or (inner.startswith("$(", i) and not inner.startswith("$((", i)):
            j = _closing_backtick(inner, i) if c == "`" else _matching(inner, i + 1)
            part = COMMAND + inner[i:j + 1] + UNCOMMAND
        else:
            j = _matching(inner, i + 1) if inner.startswith("${", i) else i
            out.append(inner[i:j + 1])
            i = j + 1
            continue
        out.append(UNQUOTED + part + QUOTED)
        i = j + 1
    return "".join(out)


_ANSI_C = re.compile(r"\\(x[0-9A-Fa-f]{1,2}|u[0-9A-Fa-f]{1,4}|U[0-9A-Fa-f]{1,8}|[0-7]{1,3}|c.|.)", re.S)
_ANSI_C_LETTERS = {"a": "\a", "b": "\b", "e": "\x1b", "E": "\x1b", "f": "\f", "n": "\n", "r": "\r", "t": "\t",
                   "v": "\v", "\\": "\\", "'": "'", '"': '"', "?": "?"}


def ansi_c(text: str) -> str:
    """The text of bash's ``$'...'`` with its escapes read: ``\\n``, ``\\t``, ``\\\\``, ``\\'``, ``\\xHH``,
    ``\\nnn`` (octal), ``\\uHHHH``, ``\\cX``...; an unknown escape stays as written."""
    def one(match: re.Match[str]) -> str:
        escape = match.group(1)
        if escape[0] in "xuU" and len(escape) > 1:
            return chr(min(int(escape[1:], 16), 0x10FFFF))
        if escape[0] in "01234567":
            return chr(int(escape, 8) & 0xFF)
        if escape[0] == "c" and len(escape) == 2:
            return chr(ord(escape[1]) & 0x1F)
        return _ANSI_C_LETTERS.get(escape, match.group(0))

    return _ANSI_C.sub(one, text)


def _closing_ansi_c(text: str, i: int) -> int:
    """The index of the ``'`` closing the one at ``i`` of a ``$'...'`` (a ``\\'`` inside does not)."""
    j = i + 1
    while j < len(text) and text[j] != "'":
        j += 2 if text[j] == "\\" else 1
    return min(j, len(text))


def _closing_backtick(text: str, i: int) -> int:
    """The index of the backtick closing the one at ``i`` (an escaped one inside does not)."""
    j = i + 1
    while j < len(text) and text[j] != "`":
        j += 2 if text[j] == "\\" else 1
    return min(j, len(text) - 1)


def _closing_quote(text: str, i: int) -> int:
    """The index of the ``"`` closing the one at ``i`` (skipping escapes, ``${...}``, ``$(...)`` and backticks)."""
    j = i + 1
    while j < len(text) and text[j] != '"':
        if text[j] == "\\":
            j += 2
        elif text.startswith(("${", "$("), j):
            j = _matching(text, j + 1) + 1
        elif text[j] == "`":
            j = _closing_backtick(text, j) + 1
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
