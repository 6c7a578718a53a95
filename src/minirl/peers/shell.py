"""Reading the shell scripts peers launch runs with as bash reads them: their commands (``commands``; those that may
run, ``statements``), quotes and redirections, ``NAME=value`` variables and arrays (and the environment's) and the
script's arguments (``arguments``, ``shift``) with ``$NAME``, ``$1``, ``"$@"``, ``${...}`` and ``$((...))`` arithmetic
expanded; nothing is run. verl's run scripts (Hydra ``key=value`` overrides) and slime's (bash arrays of ``--flag
value`` words) are read with these."""

from __future__ import annotations

import ast
import os
import re
import string
from collections.abc import Callable, Iterator, Mapping, MutableMapping, Sequence
from typing import Any

Arrays = Mapping[str, Sequence[str | None]]
"""A script's arrays: each one's elements (``COMMAND`` for one taking a command's output, None for one naming a
variable set nowhere)."""

_ARITHMETIC = re.compile(r"\$\(\((.*?)\)\)")


def arithmetic(line: str, variables: Mapping[str, str], arrays: Arrays | None = None) -> str:
    """Bash's ``$((expr))`` over integers and the script's variables (``$((1024 * 20))``, ``$((a + b))``,
    ``$((${#A[@]} * 2))``); one it cannot evaluate is left as it is (an override using it is then unresolved)."""
    def evaluate(match: re.Match[str]) -> str:
        value = _evaluate(match.group(1), variables, arrays or {})
        return match.group(0) if value is None else str(value)

    return _ARITHMETIC.sub(evaluate, line)


def _evaluate(expr: str, variables: Mapping[str, str], arrays: Arrays) -> int | None:
    """An arithmetic expression's value: ``${...}`` and ``$NAME`` expanded first, as bash does, then the script's
    variables' names read; None where it is not an integer expression of + - * / % and parentheses here."""
    if "$" in expr:
        expanded = expand(expr, variables, arrays)
        if expanded is None:
            return None
        expr = expanded
    expr = re.sub(r"\b([A-Za-z_]\w*)\b", lambda v: variables.get(v.group(1), v.group(0)), expr)
    if not re.fullmatch(r"[\d\s+\-*/%()]+", expr):
        return None
    try:
        return _integer(ast.parse(expr.strip().replace("/", "//"), mode="eval").body)
    except (SyntaxError, ValueError, ZeroDivisionError):
        return None


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


def expand(value: str, variables: Mapping[str, str], arrays: Arrays | None = None) -> str | None:
    """``$NAME``, ``$1`` / ``$#`` / ``$@`` / ``$*`` (``arguments``) and ``${...}`` (``_brace``: defaults,
    alternatives, lengths, substrings, trims, replacements, case changes, ``@Q``-style transformations, indirection,
    array elements and slices, each word inside expanded too); None when a variable is set nowhere, bash stops the
    script (``${X:?msg}``: ``stopped``) or a command's output (``$(...)``, backticks: not run here) is needed."""
    out, i = [], 0
    while i < len(value):
        if value[i] == "`" or (value.startswith("$(", i) and not value.startswith("$((", i)):
            return None  # a command's output: not run here
        bare = re.match(r"\$([A-Za-z_][A-Za-z0-9_]*|[0-9@*#])", value[i:])
        j = _matching(value, i + 1) if value.startswith("${", i) else i
        text = (_brace(bare.group(1), variables, arrays or {}) if bare else _brace(value[i + 2:j], variables, arrays or {})
                if value.startswith("${", i) else value[i])
        if text is None or (j > i and value[j] != "}"):
            return None
        out.append(text)
        i = i + bare.end() if bare else j + 1
    expanded = "".join(out)
    if "$((" in expanded:  # arithmetic that could not be evaluated
        return None
    return os.path.expanduser(expanded) if expanded.startswith("~") else expanded


_PARAMETER = re.compile(r"(#?)(!?)([A-Za-z_][A-Za-z0-9_]*|\d+|[@*#])(?:\[([^\]]+)\])?(.*)$", re.S)
"""A ``${...}``'s inside: ``#`` (a length), ``!`` (indirection), the name (a positional or special parameter's too),
an ``[index]``, the operation on its value (``:-d``, ``#p``...)."""
_TEST = re.compile(r"(:?)([-=+?])")


def _brace(inner: str, variables: Mapping[str, str], arrays: Arrays) -> str | None:
    """A ``${...}`` (``inner``: what is inside its braces) as bash expands it: ``_elements`` joined by blanks."""
    values = _elements(inner, variables, arrays)
    return None if values is None else " ".join(values)


def _elements(inner: str, variables: Mapping[str, str], arrays: Arrays) -> list[str] | None:
    """A ``${...}``'s values (one, or each element of ``${A[@]...}`` / ``${@...}``): its parameter's (``_values``)
    tested (``_test``: ``:-`` ``-`` ``:=`` ``=`` ``:+`` ``+`` ``:?`` ``?``), sliced (``:offset:length``, ``bounds``),
    trimmed, replaced, its case changed or transformed (``_modify``: ``#`` ``##`` ``%`` ``%%`` ``/`` ``//`` ``^^``
    ``,,`` ``@Q``...); ``${#...}`` a length, ``${!...}`` an indirection (``_indirect``). None where it is not known
    here (a command's output to change is ``COMMAND``)."""
    parts = _PARAMETER.match(inner)
    if parts is None:
        return None
    length, indirect, name, index, operation = parts.groups()
    if indirect:
        return _indirect(name, index, operation, variables, arrays)
    values = _values(name, index, variables, arrays)
    every = index in ("@", "*") or name in ("@", "*")
    if length:
        counted = None if operation else _length(values, every)
        return None if counted is None else [counted]
    test = _TEST.match(operation)
    if test:
        return _test(values, bool(test.group(1)), test.group(2), operation[test.end():], variables, arrays)
    known = [value for value in values or [None] if value is not None]
    if values is None or len(known) < len(values):
        return None
    if operation and any(COMMAND in value for value in known):
        return [COMMAND]
    if operation.startswith(":"):  # ${@:1} starts at $1: $0 before them
        return _substring([variables.get("0"), *known] if name in ("@", "*") else known, operation[1:], every,
                          variables, arrays)
    return _modify(known, operation, variables, arrays) if operation else known


def _indirect(name: str, index: str | None, operation: str, variables: Mapping[str, str],
              arrays: Arrays) -> list[str] | None:
    """``${!X...}``: the parameter whose name is X's value (``${!X:-d}``, ``${!X@Q}``...: the operation is on it;
    ``${!#}`` the last argument); ``${!A[@]}`` an array's indices; ``${!p*}`` / ``${!p@}`` the names starting with p.
    None where bash stops (X unset or no name) or X is not known here."""
    if index in ("@", "*") and not operation:
        values = _values(name, index, variables, arrays)
        return None if values is None else [str(k) for k in range(len(values))]
    if index is None and operation in ("@", "*"):
        return sorted(key for key in {*variables, *arrays} if key.startswith(name))
    target = (_values(name, index, variables, arrays) or [None])[0]
    if target is None or not re.fullmatch(r"[A-Za-z_]\w*(\[[^\]]+\])?|\d+|[@*#]", target):
        return None
    return _elements(target + operation, variables, arrays)


def _values(name: str, index: str | None, variables: Mapping[str, str], arrays: Arrays) -> list[str | None] | None:
    """A parameter's values: a variable's (one), an array's element's (``NAME[index]``: an arithmetic index, ``$i``
    or ``-1`` counting from the end; none past the end; a scalar is an array of one), all of ``NAME[@]`` /
    ``NAME[*]``; the arguments (``$@``, ``$*``), one (``$1``: none past ``$#``) or their count (``$#``); a None among
    them where one is not known here. None where the name is set nowhere (``$0`` unless ``arguments`` names it)."""
    if name in ("@", "*", "#") or (name.isdigit() and name != "0"):
        args: list[str | None] = [*_arguments(variables)]
        return args if name in ("@", "*") else [str(len(args))] if name == "#" else args[int(name) - 1:int(name)]
    items: list[str | None] | None = (list(arrays[name]) if name in arrays else [variables[name]] if name in variables
                                      else None)
    if items is None:
        return None
    items = [None if item and STOPPED in item else item for item in items]  # stopped at a ${X:?msg}: not known
    if index in ("@", "*"):
        return items
    k = 0 if index is None else _evaluate(index, variables, arrays)
    if k is None:
        return [None]
    k += len(items) if k < 0 else 0
    return [items[k]] if 0 <= k < len(items) else []


def _length(values: list[str | None] | None, count: bool) -> str | None:
    """``${#A[@]}``: the count of the values; ``${#X}``: the length of the value (a command's output unknown)."""
    if values is None or (not count and None in values):
        return None
    text = values[0] if values and values[0] is not None else ""
    return str(len(values)) if count else text if COMMAND in text else str(len(text))


def _missing(values: list[str | None] | None, colon: bool) -> bool | None:
    """Whether ``${X-word}`` takes its word: X unset (``colon``: or empty); None where that is not known here (a
    value not known, a command's output). A name set nowhere (or none of an array's elements) is unset."""
    text = " ".join(value or "" for value in values or [])
    if (values is not None and None in values) or (colon and COMMAND in text):
        return None
    return not values or (colon and not text)


def _test(values: list[str | None] | None, colon: bool, operator: str, word: str, variables: Mapping[str, str],
          arrays: Arrays) -> list[str] | None:
    """``${X:-word}`` / ``${X:=word}``: word where X is unset or empty (without ``:``, unset only), else X;
    ``${X:+word}`` / ``${X+word}``: word where X is set and not empty / set, else empty; ``${X:?msg}`` /
    ``${X?msg}``: bash stops the script where X is unset or empty / unset (None here: unresolved), else X. Whether a
    command's output is empty is not known here (it is the value)."""
    missing = _missing(values, colon)
    known = [value for value in values or [] if value is not None]
    if missing is None:  # a command's output, or a value not known here
        return None if len(known) < len(values or []) else [" ".join(known)]
    if not missing and operator != "+":
        return known
    if operator == "?":
        return None
    chosen = "" if operator == "+" and missing else _inner_word(word, variables, arrays)
    return None if chosen is None else [chosen]


def _inner_word(text: str, variables: Mapping[str, str], arrays: Arrays) -> str | None:
    """A word inside ``${...}`` (a default, an alternative) as bash expands it: quotes removed, not split."""
    return word_value(_marked(text), variables, arrays)


def _marked(text: str) -> str:
    """``text`` as one word of ``commands``, its quotes, escapes and command substitutions marked."""
    parts, i = [], 0
    while i < len(text):
        part, j = _word_part(text, i)
        parts.append(part)
        i = j + 1
    return "".join(parts)


def _substring(values: Sequence[str | None], spec: str, elements: bool, variables: Mapping[str, str],
               arrays: Arrays) -> list[str] | None:
    """``${X:offset:length}``: the characters of X's value in ``bounds``; ``${A[@]:offset:length}`` the elements."""
    text = values[0] or "" if values else ""
    span = bounds(spec, len(values) if elements else len(text), variables, arrays, elements)
    if span is None:
        return None
    chosen = list(values[span[0]:span[1]]) if elements else [text[span[0]:span[1]]]
    known = [value for value in chosen if value is not None]
    return known if len(known) == len(chosen) else None


def bounds(spec: str, size: int, variables: Mapping[str, str], arrays: Arrays | None = None,
           elements: bool = False) -> tuple[int, int] | None:
    """The span (start, end) that ``${X:spec}`` (``offset`` or ``offset:length``, arithmetic) takes of a value of
    ``size`` characters (``elements``: of ``${A[@]:spec}``'s elements): a negative offset counts from the end
    (``${X: -3}``; ``${X:-3}`` is a default), one past either end gives none, a negative length ends that far before
    the end. None where bash stops (``${X:}``, a length ending before the offset; a negative one of elements) or the
    numbers are not known here."""
    first, second = _split(spec, ":")
    start = _evaluate(first or "0", variables, arrays or {}) if spec else None
    length = None if second is None else _evaluate(second or "0", variables, arrays or {})
    if start is None or (second is not None and length is None):
        return None
    start += size if start < 0 else 0
    if not 0 <= start <= size:
        return size, size
    end = size if length is None else start + length if length >= 0 else size + length
    if end < start or (elements and length is not None and length < 0):
        return None
    return start, min(end, size)


def _split(text: str, separator: str) -> tuple[str, str | None]:
    """``text`` before its first ``separator`` outside quotes, escapes, ``${...}``, ``$(...)`` (and, for ``:``,
    parentheses), and the text after it (None where there is none)."""
    depth, i = 0, 0
    while i < len(text):
        c = text[i]
        if c == separator and not depth:
            return text[:i], text[i + 1:]
        if c == "\\":
            i += 1
        elif c in "'\"":
            i = max(text.find("'", i + 1), i) if c == "'" else _closing_quote(text, i)
        elif text.startswith(("${", "$("), i):
            i = _matching(text, i + 1)
        elif separator == ":":
            depth += {"(": 1, ")": -1}.get(c, 0)
        i += 1
    return text, None


_OPERATION = re.compile(r"(##?|%%?|/[/#%]?|\^\^?|,,?|~~?)(.*)$", re.S)
def _modify(values: list[str], operation: str, variables: Mapping[str, str], arrays: Arrays) -> list[str] | None:
    """Each value with ``#p`` / ``##p`` (its shortest / longest prefix matching the glob p removed), ``%p`` /
    ``%%p`` (suffix; ``_trim``), ``/p/r`` / ``//p/r`` / ``/#p/r`` / ``/%p/r`` (``_replace``), ``^p`` / ``^^p`` /
    ``,p`` / ``,,p`` / ``~p`` / ``~~p`` (``_case``; p ``?`` where none), ``@Q`` / ``@E`` / ``@U`` / ``@u`` / ``@L``
    (``_TRANSFORMS``); None for an operation not read here (``@P``, ``@A``, ``@K``, ``@a``...) or a pattern not known."""
    found = _OPERATION.match(operation)
    if operation[:1] == "@":
        transform = _TRANSFORMS.get(operation[1:])
        return None if transform is None else [transform(value) for value in values]
    if found is None:
        return None
    mode, rest = found.groups()
    pattern_text, replacement = _split(rest, "/") if mode[0] == "/" else (rest, None)
    glob = _escaped(pattern_text or ("?" if mode[0] in "^,~" else ""), "\\*?[]", variables, arrays)
    template = _escaped(replacement or "", "\\&", variables, arrays)
    if glob is None or template is None:
        return None
    pattern = re.compile(_glob(glob), re.S)
    if mode[0] in "#%":
        return [_trim(value, pattern, mode) for value in values]
    if mode[0] in "^,~":
        return [_case(value, pattern, mode) for value in values]
    return values if not glob and mode in ("/", "//") else [_replace(value, pattern, mode, template) for value in values]


def _escaped(text: str, special: str, variables: Mapping[str, str], arrays: Arrays) -> str | None:
    """A pattern's or a replacement's text expanded, the ``special`` characters of its quoted and escaped parts (a
    quoted variable's value too) after a backslash: bash takes them as written there."""
    out = []
    for part, kind in _parts(_marked(text)):
        value = part if kind == LITERAL else None if kind == COMMAND else expand(arithmetic(part, variables, arrays),
                                                                                 variables, arrays)
        if value is None or (kind != LITERAL and COMMAND in value):
            return None
        out.append(re.sub(f"([{re.escape(special)}])", r"\\\1", value) if kind else value)
    return "".join(out)


_CLASSES = {"alpha": "a-zA-Z", "digit": "0-9", "alnum": "a-zA-Z0-9", "upper": "A-Z", "lower": "a-z", "space": r"\s",
            "blank": r" \t", "xdigit": "0-9A-Fa-f", "word": r"\w", "punct": re.escape(string.punctuation),
            "print": " -~", "graph": "!-~", "cntrl": r"\x00-\x1f\x7f"}
_BRACKET = re.compile(r"\[([!^]?)(\]?(?:\[:\w+:\]|\\.|[^\]])*)\]", re.S)


def _glob(glob: str) -> str:
    """Bash's glob pattern as a regular expression: ``*``, ``?``, ``\\c`` (c as written), ``[...]`` (``[!...]`` /
    ``[^...]`` negated, ``[:alpha:]``... classes); a ``[`` with no ``]`` is itself."""
    out, i = [], 0
    while i < len(glob):
        c, bracket = glob[i], _BRACKET.match(glob, i)
        if bracket:
            out.append(_bracket(*bracket.groups()))
            i = bracket.end()
            continue
        out.append(re.escape(glob[i + 1:i + 2] or "\\") if c == "\\" else ".*" if c == "*" else "." if c == "?"
                   else re.escape(c))
        i += 2 if c == "\\" else 1
    return "".join(out)


def _bracket(negated: str, inside: str) -> str:
    """A glob's ``[...]`` as a regular expression's character set (an unknown ``[:class:]`` matches nothing)."""
    def one(match: re.Match[str]) -> str:
        if match.group(1):
            return _CLASSES.get(match.group(1), "")
        return re.escape(match.group(2) if match.group(2) is not None else match.group(3))

    body = re.sub(r"\[:(\w+):\]|\\(.)|([\\\]\[^])", one, inside, flags=re.S)
    return f"[{'^' if negated else ''}{body}]" if body else "[^\\s\\S]" if not negated else "[\\s\\S]"


def _trim(value: str, pattern: re.Pattern[str], mode: str) -> str:
    """``value`` without its shortest (``#``) / longest (``##``) prefix, or its shortest (``%``) / longest (``%%``)
    suffix, matching ``pattern``; as it is where none does."""
    n = len(value)
    if mode[0] == "#":
        ends = range(n + 1) if mode == "#" else range(n, -1, -1)
        return next((value[k:] for k in ends if pattern.fullmatch(value, 0, k)), value)
    starts = range(n, -1, -1) if mode == "%" else range(n + 1)
    return next((value[:k] for k in starts if pattern.fullmatch(value, k)), value)


def _replace(value: str, pattern: re.Pattern[str], mode: str, template: str) -> str:
    """``${X/p/r}``: X with the longest match of p at the first place one starts replaced by r (``//``: each, left to
    right; ``/#``: one at the start; ``/%``: one at the end); an ``&`` in r is the match (bash 5.2's
    ``patsub_replacement``), ``\\&`` an ``&``."""
    n = len(value)
    if mode == "/%":
        k = next((k for k in range(n + 1) if pattern.fullmatch(value, k)), None)
        return value if k is None else value[:k] + _substitute(template, value[k:])
    out, i, done = [], 0, False
    while not done and (i < n or i == 0):
        end = next((e for e in range(n, i - 1, -1) if pattern.fullmatch(value, i, e)), None)
        if end is None:
            out.append(value[i:i + 1])
            i += 1
        else:  # an empty match keeps the character after it
            out.append(_substitute(template, value[i:end]) + value[end:end + (end == i)])
            i, done = max(end, i + 1), mode != "//"
        done = done or mode == "/#"
    return "".join(out) + value[i:]


def _substitute(template: str, matched: str) -> str:
    """A replacement's text: ``&`` the match, ``\\c`` c."""
    return re.sub(r"\\(.)|&", lambda m: matched if m.group(1) is None else m.group(1), template, flags=re.S)


def _case(value: str, pattern: re.Pattern[str], mode: str) -> str:
    """``^`` / ``,`` / ``~``: the first character upper-cased / lower-cased / its case swapped where it matches
    ``pattern``; doubled (``^^``...), each character that does."""
    change = {"^": str.upper, ",": str.lower, "~": str.swapcase}[mode[0]]
    return "".join(change(c) if (k == 0 or len(mode) == 2) and pattern.fullmatch(c) else c for k, c in enumerate(value))


def default_assignments(word: str, variables: Mapping[str, str]) -> Iterator[tuple[str, str]]:
    """The ``${NAME:=value}`` (NAME unset or empty) / ``${NAME=value}`` (NAME unset) of a word of ``commands``, which
    bash assigns as it expands the word (``: ${X:=v}``): (NAME, the ``${...}``, whose expansion is the value), each as
    it is reached (the caller assigns it before the next is looked at)."""
    for text, kind in _parts(word):
        for _, _, inner in _braces(text, kind):
            given = re.match(r"([A-Za-z_]\w*)(:?)=", inner)
            if given and (not variables.get(given.group(1)) if given.group(2) else given.group(1) not in variables):
                yield given.group(1), f"${{{inner}}}"


def _braces(text: str, kind: str) -> Iterator[tuple[int, int, str]]:
    """Each ``${...}`` of a word's unquoted or double-quoted part (``kind``), not those nested in it: the indices of
    its ``$`` and ``}``, what is inside its braces."""
    i = text.find("${") if kind in ("", QUOTED) else -1
    while i >= 0:
        j = _matching(text, i + 1)
        yield i, j, text[i + 2:j]
        i = text.find("${", j + 1)


def names(word: str) -> set[str]:
    """The names a word's ``$NAME`` / ``${NAME...}`` / ``${#NAME...}`` / ``${!NAME...}`` / ``$((NAME ...))`` read."""
    found = set(re.findall(r"\$\{?[#!]?([A-Za-z_]\w*)", word))
    for expr in re.findall(r"\$\(\((.*?)\)\)", word):
        found |= set(re.findall(r"[A-Za-z_]\w*", expr))
    return found


def assigned(value: str, variables: Mapping[str, str], arrays: Arrays | None = None, where: str = "") -> str | None:
    """What ``NAME=value`` leaves in NAME: the word expanded whole (bash does not split it); ``COMMAND`` where it
    takes a command's output (not run here: whatever NAME held, the environment's value too, is gone); where bash
    stops the script at a ``${X:?msg}`` in it, ``STOPPED`` and ``stopped``'s message (``where``: the script's
    ``file:line``, its start), which a word taking NAME is unresolved by; None where it names a variable set nowhere."""
    expanded = word_value(value, variables, arrays)
    if expanded is not None:
        return expanded
    fired = _fired(value, variables, arrays or {})
    message = f"{where}: {fired}" if fired and where else fired or stopped(value, variables, arrays)
    if message:
        return STOPPED + message
    return COMMAND if substitution(value) or any(COMMAND in text for text in _held(value, variables, arrays)) else None


def _held(word: str, variables: Mapping[str, str], arrays: Arrays | None) -> list[str]:
    """The values of the variables (an array's elements) a word reads (``names``)."""
    return [item or "" for name in sorted(names(word)) for item in [variables.get(name), *(arrays or {}).get(name, [])]]


def stopped(word: str, variables: Mapping[str, str], arrays: Arrays | None = None) -> str | None:
    """Why bash stops the script at a word of ``commands`` that ``fields`` leaves unresolved: ``X: msg`` for a
    ``${X:?msg}`` / ``${X?msg}`` in it whose X is unset (or empty), ``file:line: X: msg`` for a variable it takes
    that ``assigned`` stopped at one; None for none."""
    held = (text[len(STOPPED):] for text in _held(word, variables, arrays) if text.startswith(STOPPED))
    return next(held, None) or _fired(word, variables, arrays or {})


def why_unresolved(text: str, word: str, variables: Mapping[str, str], arrays: Arrays | None = None) -> str:
    """``text`` (how an unresolved ``word`` is shown) with, where bash stops the script at a ``${X:?msg}`` the word
    takes through a variable (or at one without a message), bash's message after it (``stopped``)."""
    reason = stopped(word, variables, arrays)
    return text if reason is None or reason.rpartition(": ")[2] in text else f"{text}: bash stops at {reason}"


def _fired(word: str, variables: Mapping[str, str], arrays: Arrays) -> str | None:
    """``X: msg`` (as bash prints it) for the first ``${X:?msg}`` / ``${X?msg}`` of a marked word that stops bash
    (in a default or an alternative taken too); None for none."""
    for text, kind in _parts(word):
        for _, _, inner in _braces(text, kind):
            name, operator, taken = _taken(inner, variables, arrays) or ("", "", "")
            if operator[-1:] == "?":
                message = _inner_word(taken, variables, arrays) or taken
                return f"{name}: {message or ('parameter null or not set' if operator == ':?' else 'parameter not set')}"
            found = _fired(_marked(taken), variables, arrays) if operator else None
            if found:
                return found
    return None


def _taken(inner: str, variables: Mapping[str, str], arrays: Arrays) -> tuple[str, str, str] | None:
    """The name, operator and word of a ``${X:-word}`` / ``${X-word}`` / ``${X:+word}`` / ``${X+word}`` (``inner``: what
    is inside its braces) that takes its word, or of a ``${X:?msg}`` / ``${X?msg}`` that stops bash; None for another
    (one whose value is not known here too)."""
    parts = _PARAMETER.match(inner)
    test = re.match(r"(:?)([-+?])", parts.group(5)) if parts and not parts.group(1) and not parts.group(2) else None
    if parts is None or test is None:
        return None
    missing = _missing(_values(parts.group(3), parts.group(4), variables, arrays), bool(test.group(1)))
    if missing is None or missing == (test.group(2) == "+"):
        return None
    return parts.group(3), test.group(0), parts.group(5)[test.end():]


OPEN, CLOSE = "\x00(", "\x00)"  # an array's parentheses among a command's words (no word holds a NUL)
AND_IF, OR_IF = "\x00&&", "\x00||"  # the first word of a command run only if the list before it succeeded / failed
QUOTED, UNQUOTED, LITERAL, UNLITERAL, COMMAND, UNCOMMAND = "\x01", "\x02", "\x03", "\x04", "\x05", "\x06"
"""Marks in ``commands``' words: a double-quoted part (expanded, never split) between ``QUOTED`` and ``UNQUOTED``; a
single-quoted or escaped part (kept as written) between ``LITERAL`` and ``UNLITERAL``; a command substitution
(``$(...)`` or backticks, as written: not run) between ``COMMAND`` and ``UNCOMMAND``; the rest is unquoted."""
_CLOSING = {QUOTED: UNQUOTED, LITERAL: UNLITERAL, COMMAND: UNCOMMAND}
STOPPED = "\x07"
"""The start of the value ``assigned`` gives a variable where bash stops the script at a ``${X:?msg}`` (its message
after it): a word taking the variable is unresolved (``stopped``: why)."""


def arguments(args: Sequence[str], script: str | None = None) -> dict[str, str]:
    """The positional parameters of a script run as ``bash script args...``, as variables to read it with (``$1``,
    ``${2:-d}``, ``$@``, ``"$@"`` each argument a word, ``$*``, ``$#``; ``$0``: ``script``). A script read without
    them has none (``$#`` is 0, ``$1`` empty); ``$0`` is then not known."""
    return {"#": str(len(args)), **{str(k): arg for k, arg in enumerate(args, 1)}, **({"0": script} if script else {})}


def _arguments(variables: Mapping[str, str]) -> list[str]:
    """The positional parameters ``$1``... among ``variables`` (``arguments``; none where ``$#`` is not there)."""
    return [variables.get(str(k), "") for k in range(1, int(variables.get("#", "0")) + 1)]


def shift(words: Sequence[str], variables: MutableMapping[str, str]) -> bool:
    """``shift [n]``, a command of ``commands``: ``$n+1``... become ``$1``... in ``variables`` (n 1 where not given;
    none shifted where n is more than ``$#`` or not known here, as bash does). False for another command."""
    if not words or unquoted(words[0]) != "shift":
        return False
    count = _evaluate(unquoted(words[1]) if len(words) > 1 else "1", variables, {})
    args = _arguments(variables)
    if count is not None and 0 <= count <= len(args):
        variables.update(arguments(args[count:]))  # $# bounds them: those after it are not read
    return True


def unquoted(word: str) -> str:
    """A word of ``commands`` as text, its quote marks removed (for keywords and file names)."""
    return re.sub("[\x01-\x06]", "", word)


def substitution(word: str) -> str | None:
    """The first command substitution of a word of ``commands`` (``$(nproc)``, ```date```), as written; one inside a
    ``${...}`` too (``${X:=$(nproc)}``: X unset, the word takes its output)."""
    for text, kind in _parts(word):
        if kind == COMMAND:
            return text
        for _, _, inner in _braces(text, kind):
            found = substitution(_marked(inner))
            if found:
                return found
    return None


def fields(word: str, variables: Mapping[str, str], split: bool = True, arrays: Arrays | None = None) -> list[str] | None:
    """A word of ``commands`` as bash expands it: ``$NAME``, ``${...}`` and ``$((...))`` in its unquoted and
    double-quoted parts, its single-quoted parts as written, and (``split``) an unquoted expansion's blanks splitting
    it into words (``$EXTRA`` holding ``--lr 1e-6`` gives two words, ``"$EXTRA"`` one, an empty ``$EMPTY`` none; a
    default's own quotes too: ``_chosen``); ``"$@"`` each argument a word (``_expansions``). None when a variable is set
    nowhere, bash stops at the word (``stopped``) or it takes a command's output (``substitution``, or a variable whose
    value is the ``COMMAND`` mark: one set from a command's output); ``arrays``: the script's, for ``${A[n]}``."""
    out: list[str] = []
    current: str | None = None
    for text, kind in _chosen(word, variables, arrays or {}):
        if kind == COMMAND:
            return None
        pieces = [text] if kind == LITERAL else _expansions(text, variables, arrays or {})
        if pieces is None or (kind != LITERAL and any(COMMAND in piece for piece in pieces)):  # a command's output
            return None
        if kind == QUOTED and split:  # "$@": each argument a word (none for none)
            for k, piece in enumerate(pieces):
                if k:
                    out.append(current or "")
                    current = ""
                current = (current or "") + piece
            continue
        value = " ".join(pieces)
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


def _expansions(text: str, variables: Mapping[str, str], arrays: Arrays) -> list[str] | None:
    """A word's unquoted or double-quoted part expanded (``$((...))``, then ``expand``): one value, but ``$@`` /
    ``${@...}`` each argument one, the text before it joining the first, the text after it the last (none for no
    arguments where the part is otherwise empty); None as ``expand``. An array's ``"${A[@]}"`` stays one value here
    (slime's reader takes a whole word's element by element)."""
    i = 0
    while i < len(text) and not text.startswith(("$@", "${@"), i):
        i = _matching(text, i + 1) + 1 if text.startswith(("${", "$(("), i) else i + 1
    before = expand(arithmetic(text[:i], variables, arrays), variables, arrays)
    if i == len(text) or before is None:
        return None if before is None else [before]
    j = i + 1 if text[i + 1] == "@" else _matching(text, i + 1)
    elements = _elements("@" if j == i + 1 else text[i + 2:j], variables, arrays)
    after = _expansions(text[j + 1:], variables, arrays)
    if elements is None or after is None:
        return None
    pieces = _glued(_glued([before], elements), after)
    return [] if not elements and pieces == [""] else pieces


def _glued(first: list[str], then: list[str]) -> list[str]:
    """Two parts' values one after the other, the first's last joining the second's first."""
    return [*first[:-1], first[-1] + then[0], *then[1:]] if first and then else first + then


def _chosen(word: str, variables: Mapping[str, str], arrays: Arrays) -> list[tuple[str, str]]:
    """A marked word's parts (``_parts``), each ``${X:-word}`` / ``${X-word}`` / ``${X:+word}`` / ``${X+word}`` that
    takes its word (``_taken``) replaced by the word's parts as bash reads them there: unquoted, as in a script
    (``${X:-"a b"}`` is one word, ``${X:-$Y}`` split as ``$Y``); inside double quotes, its single quotes and
    backslashes as written."""
    out = []
    for text, kind in _parts(word):
        start = 0
        for i, j, inner in _braces(text, kind):
            _, operator, taken = _taken(inner, variables, arrays) or ("", "?", "")
            if operator[-1] != "?":
                marked = QUOTED + _double_quoted(taken) + UNQUOTED if kind else _marked(taken)
                out += [(text[start:i], kind), *_chosen(marked, variables, arrays)]
                start = j + 1
        out.append((text[start:], kind))
    return out


def word_value(word: str, variables: Mapping[str, str], arrays: Arrays | None = None) -> str | None:
    """A word of ``commands`` expanded whole (an assignment's value: bash does not split it); None as ``fields``."""
    parts = fields(word, variables, split=False, arrays=arrays)
    return None if parts is None else "".join(parts)


def _parts(word: str) -> list[tuple[str, str]]:
    """A marked word's parts: (text, ``QUOTED``, ``LITERAL``, ``COMMAND`` or "" for an unquoted part)."""
    parts: list[tuple[str, str]] = []
    i = 0
    while i < len(word):
        if word[i] in _CLOSING:
            j = word.find(_CLOSING[word[i]], i + 1)
            j = len(word) if j < 0 else j
            parts.append((word[i + 1:j], word[i]))
            i = j + 1
        else:
            j = min((k for k in map(word.find, _CLOSING, (i,) * 3) if k >= 0), default=len(word))
            parts.append((word[i:j], ""))
            i = j
    return parts


def commands(text: str) -> list[tuple[int, list[str]]]:
    """A script's simple commands: (first line, words), quotes as marks (``QUOTED``, ``LITERAL``, ``COMMAND``) and
    ``$...`` kept for ``fields``. Words end at blanks; commands at newlines, ``;``, ``&``, ``|`` (not inside an array's
    ``( ... )``: ``OPEN`` / ``CLOSE`` words); one after ``&&`` / ``||`` starts with ``AND_IF`` / ``OR_IF``. Quotes may
    span lines; ``${...}``, ``$(...)`` and backticks stay whole; a ``#`` starting a word comments out the rest of its
    line; redirections are no words (``_redirection``: ``2>&1``, ``> log``, a here-document and its lines...)."""
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
        if (c in "<>" and text[i + 1:i + 2] != "(") or text.startswith("&>", i):  # not a <(command) word
            word = None if word and "".join(word).isdigit() else word  # the descriptor it redirects (2>, 1>&2)
            end_word()
            text, j = _redirection(text, i)
            line, i = line + text.count("\n", i, j), j
            continue
        if c in " \t\r" or (c in "\n;&|" and depth):
            end_word()
            line, i = line + (c == "\n"), i + 1
            continue
        if c in "\n;&|":
            end_word()
            connector = {"&&": AND_IF, "||": OR_IF}.get(text[i:i + 2])
            if words:
                out.append((start, [joined, *words] if joined else words))
            joined, words = connector or (None if words else joined), []  # a newline may follow && / ||
            line, i = line + (c == "\n"), i + (2 if connector else 1)
            start = line
            continue
        if c == "#" and word is None:
            i = len(text) if text.find("\n", i) < 0 else text.find("\n", i)
            continue
        if c in "()" and (word is None or c == ")" or "".join(word).endswith("=")):
            end_word()
            words.append(OPEN if c == "(" else CLOSE)
            depth, i = max(depth + (1 if c == "(" else -1), 0), i + 1
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


_REDIRECTION = re.compile(r"&>>?|<<<|<<-?|<>|>>|[<>]&|>\||[<>]")


def _redirection(text: str, i: int) -> tuple[str, int]:
    """The redirection at ``i`` (``>``, ``>>``, ``>|``, ``<``, ``<>``, ``>&``, ``<&``, ``&>``, ``&>>``, ``<<<``,
    ``<<`` / ``<<-``) and its target word, which are no words of the command: the index after them, and the text with
    a here-document's lines (up to its delimiter line) blanked, so that they are read as no commands."""
    operator = _REDIRECTION.match(text, i).group(0)  # type: ignore[union-attr]
    j = i + len(operator)
    while j < len(text) and text[j] in " \t":
        j += 1
    parts = []
    while j < len(text) and text[j] not in " \t\r\n;&|()<>" and not text.startswith("\\\n", j):
        part, j = _word_part(text, j)
        parts.append(part)
        j += 1
    if operator in ("<<", "<<-"):
        text = _blank_here_document(text, j, unquoted("".join(parts)), operator == "<<-")
    return text, j


def _blank_here_document(text: str, i: int, delimiter: str, tabs: bool) -> str:
    """``text`` with the lines of the here-document opened before ``i`` blanked: those after ``i``'s line up to the
    one that is its (unquoted) delimiter (after leading tabs with ``<<-``), or to the end."""
    start = text.find("\n", i) + 1
    if not start:
        return text
    found = re.compile(("^\t*" if tabs else "^") + re.escape(delimiter) + "$", re.M).search(text, start)
    stop = found.end() if found else len(text)
    return text[:start] + "\n" * text.count("\n", start, stop) + text[stop:]


BLOCKS = {"if": "fi", "case": "esac", "for": "done", "while": "done", "until": "done", "select": "done"}
"""Shell blocks whose commands may or may not run: an assignment in one is read as if it ran (the last one wins)."""
IN_BLOCK, IN_FUNCTION = "inside an if / case / loop block", "inside a function (run where it is called)"
AFTER_CONDITION = "after a `&&` / `||` condition"
"""How an assignment may not run: in a block or a function, or after ``cond &&`` / ``cond ||`` (read as if it ran)."""
DECLARE = ("export", "declare", "typeset", "local", "readonly")
NAME_VALUE = re.compile(r"([A-Za-z_]\w*)=(.*)", re.S)
ARRAY = re.compile(r"([A-Za-z_]\w*)(\+?)=")

_Block = tuple[str, str, bool | None, Any]
"""An open block: the word closing it, how its commands may not run (``IN_BLOCK``...; "" for none), whether it runs
(a ``{ ...; }`` group as the list before it lets it: False never, None not known here), and a decided ``if``'s or
``case``'s state (``_branch``: whether a branch was taken; a case's subject too), else None."""


Decide = Callable[[str, list[str]], "bool | None"]
"""``statements``' ``decide(kind, words)``: whether an ``if`` / ``elif`` condition holds (kind ``if``, its words), or a
``case``'s subject matches a branch's patterns (kind ``case``: the subject word, then the patterns); None: not known."""


def statements(text: str, decide: Decide | None = None) -> Iterator[tuple[int, list[str], str]]:
    """The simple commands of a script that bash may run: (first line, words without the shell syntax around them,
    how: "" for one that runs, else ``IN_BLOCK``, ``IN_FUNCTION`` or ``AFTER_CONDITION``). One bash never runs
    (``false && X=1``, a ``false && { ...; }`` group's) is left out; a bare ``{ ...; }`` group's commands run. With
    ``decide`` (the caller knows the variables as the script reaches each block), an ``if`` / ``elif`` / ``else`` or
    ``case`` branch whose condition it decides runs alone (how "") and the others not at all; an undecided one is read
    as if it ran (``IN_BLOCK``), as every branch is without it."""
    blocks: list[_Block] = []  # the open if / case / loops, groups and function bodies
    status: int | None = 0  # the exit status of the && / || list so far (None: not known)
    if decide is not None and FALL_THROUGH.search(text):  # a case branch may go on into the next: none decided
        decide = _cases_undecided(decide)
    listed = commands(text)
    alternatives: list[str] = []  # a case pattern's `a|b)` alternatives read so far (the | ends a command)
    for index, (line, words) in enumerate(listed):
        joined = words[0] if words[0] in (AND_IF, OR_IF) else None
        words, runs = words[1:] if joined else words, _runs(joined, status)
        if words == ["}"] and blocks and blocks[-1][0] == "}":  # a group's end: its status, its last command's
            status = None if blocks.pop()[2] is None else status
            continue
        if decide is not None:
            following = listed[index + 1] if index + 1 < len(listed) else (0, [])
            if _alternative(words, blocks, line, following):
                alternatives.append(words[0])
                continue
            compound = bool(following[1]) and following[1][0] in (AND_IF, OR_IF)  # `if [ a ] && [ b ]`: not read
            words = _branch(words, blocks, (lambda kind, w: None) if compound else decide, alternatives)
        words = _keywords(words, blocks)
        body = _group(words, blocks, runs)
        words, runs = (body, True) if body is not None else (words, runs)
        words = _appended(_declared(words))
        if runs is False or any(block[2] is False for block in blocks):
            continue
        status = _status(words) if runs else None
        if decide is not None and runs and status is None and words and unquoted(words[0]) in ("[", "[[", "test", "!"):
            held = decide("if", words)  # `[ -n "$X" ] && Y=1`: the test's status, where it is known
            status = None if held is None else int(not held)
        if words:
            hows = {block[1] for block in blocks} | ({AFTER_CONDITION} if runs is None else set())
            yield line, words, next((how for how in (IN_BLOCK, IN_FUNCTION, AFTER_CONDITION) if how in hows), "")


FALL_THROUGH = re.compile(r";;?&")
"""bash's case terminators ``;&`` (run the next branch too) and ``;;&`` (test the next patterns too)."""


def _cases_undecided(decide: Decide) -> Decide:
    """``decide`` for ``if`` conditions only: every case branch is read as if it ran (``IN_BLOCK``)."""
    return lambda kind, words: None if kind == "case" else decide(kind, words)


def _alternative(words: list[str], blocks: list[_Block], line: int, following: tuple[int, list[str]]) -> bool:
    """A case pattern's alternative before a ``|`` (``gpu|cuda)`` reads as ``gpu``, then ``cuda ) ...``): one word in a
    case block, the next command on its line opening a branch."""
    nxt = following[1]
    return (bool(blocks) and blocks[-1][0] == "esac" and len(words) == 1 and CLOSE not in words and following[0] == line
            and len(nxt) > 1 and nxt[1] == CLOSE)


def _branch(words: list[str], blocks: list[_Block], decide: Decide, alternatives: list[str]) -> list[str]:
    """An ``if`` / ``elif`` / ``else`` line or a case branch's ``pattern)`` decided (``statements``' ``decide``): the
    block's entry set to whether its branch runs; the words as ``_keywords`` then reads them."""
    keyword = unquoted(words[0]) if words else ""
    top = blocks[-1] if blocks else None
    if keyword == "if":
        ran = decide("if", words[1:])
        blocks.append(("fi", "" if ran else IN_BLOCK, ran is not False, ran))
        return []
    if top is not None and top[0] == "fi" and keyword in ("elif", "else"):
        taken = top[3]
        ran = (False if taken else None if taken is None else decide("if", words[1:])) if keyword == "elif" else (
            None if taken is None else not taken)
        blocks[-1] = ("fi", "" if ran else IN_BLOCK, ran is not False, True if taken else ran)
        return [] if keyword == "elif" else words[1:]
    if keyword == "case" and len(words) >= 3:
        blocks.append(("esac", IN_BLOCK, False, (words[1], False)))  # nothing runs before a pattern
        return _branch(words[3:], blocks, decide, alternatives) if len(words) > 3 else []  # `case X in a) ...`
    if top is not None and top[0] == "esac" and CLOSE in words and not (len(words) > 1 and words[1] == OPEN):
        subject, taken = top[3]
        simple = len(words) > 1 and words[1] == CLOSE  # `pattern) ...` (not `(pattern) ...`)
        matched = False if taken else decide("case", [subject, *alternatives, words[0]]) if simple else None
        alternatives.clear()
        blocks[-1] = ("esac", "" if matched and taken is False else IN_BLOCK, matched is not False,
                      (subject, True if matched else None if matched is None or taken is None else taken))
        return words[words.index(CLOSE) + 1:]
    return words


def command_behind(word: str, commanded: Mapping[str, str], where: str) -> str | None:
    """The command whose output a word takes, itself (``$(nproc)``) or through a variable set from one (``commanded``:
    each such variable's ``command (file:line)``), as ``command (file:line)`` (``where``: the word's); None for none."""
    direct = substitution(word)
    if direct:
        return f"{direct} ({where})"
    return next((commanded[name] for name in sorted(names(word)) if name in commanded), None)


def depends_on(word: str, depends: Mapping[str, set[str]]) -> set[str]:
    """The conditionally set names behind a word's ``$NAME`` / ``${NAME...}`` / ``$((NAME ...))`` (``depends``: each
    variable's)."""
    return set().union(*(depends.get(name, set()) for name in names(word)))


def condition(words: list[str], variables: Mapping[str, str], arrays: Arrays | None = None) -> bool | None:
    """Whether bash's ``[ ... ]`` / ``[[ ... ]]`` / ``test ...`` holds: ``A = B`` / ``==`` / ``!=`` (a glob on the
    right within ``[[ ]]``), ``-n A`` / ``-z A`` / ``A``, ``-eq`` ``-ne`` ``-lt`` ``-le`` ``-gt`` ``-ge`` of integers, a
    leading ``!``; None for any other condition (a command's status, ``-f``, ``&&`` inside) or an operand not known."""
    negate = bool(words) and unquoted(words[0]) == "!"
    words = words[1:] if negate else words
    shape = [unquoted(w) for w in words]
    if shape[:1] == ["test"]:
        inner, glob = words[1:], False
    elif shape[:1] == ["["] and shape[-1:] == ["]"]:
        inner, glob = words[1:-1], False
    elif shape[:1] == ["[["] and shape[-1:] == ["]]"]:
        inner, glob = words[1:-1], True
    else:
        return None
    held = _held_test(inner, glob, variables, arrays)
    return None if held is None else held != negate


def _held_test(inner: list[str], glob: bool, variables: Mapping[str, str], arrays: Arrays | None) -> bool | None:
    expanded = [word_value(word, variables, arrays) for word in inner]
    values = [value for value in expanded if value is not None and COMMAND not in value]
    if len(values) < len(expanded):
        return None
    ops = [unquoted(word) for word in inner]
    if len(inner) == 1:
        return bool(values[0])
    if len(inner) == 2 and ops[0] in ("-n", "-z"):
        return bool(values[1]) == (ops[0] == "-n")
    if len(inner) != 3:
        return None
    left, right = values[0], values[2]
    if ops[1] in ("=", "==", "!="):
        same = (re.fullmatch(_glob(right), left, re.S) is not None) if glob and QUOTED not in inner[2] and \
            LITERAL not in inner[2] else left == right
        return same == (ops[1] != "!=")
    numbers = {"-eq": int.__eq__, "-ne": int.__ne__, "-lt": int.__lt__, "-le": int.__le__, "-gt": int.__gt__,
               "-ge": int.__ge__}
    if ops[1] in numbers and re.fullmatch(r"-?\d+", left.strip()) and re.fullmatch(r"-?\d+", right.strip()):
        return bool(numbers[ops[1]](int(left), int(right)))
    return None


def case_matches(words: list[str], variables: Mapping[str, str], arrays: Arrays | None = None) -> bool | None:
    """Whether a case subject (``words[0]``) matches one of the patterns after it (globs; a quoted part as written);
    None where the subject or a pattern is not known here."""
    subject = word_value(words[0], variables, arrays)
    if subject is None or COMMAND in subject:
        return None
    for pattern in words[1:]:
        glob = _escaped(pattern, "\\*?[]", variables, arrays or {})
        if glob is None:
            return None
        if re.fullmatch(_glob(glob), subject, re.S):
            return True
    return False


def _runs(joined: str | None, status: int | None) -> bool | None:
    """Whether bash runs a command: the first of an ``&&`` / ``||`` list always, one after ``&&`` when the list before
    it succeeded (status 0), after ``||`` when it failed; None when that status is not known here."""
    if joined is None:
        return True
    return None if status is None else (status == 0) == (joined == AND_IF)


def _status(words: list[str]) -> int | None:
    """A command's exit status where bash's is known without running anything: 0 for assignments (none taking a
    command's output) and ``true`` / ``:``, 1 for ``false``; None for any other command."""
    if not words:
        return None
    if unquoted(words[0]) in ("true", ":", "false"):
        return int(unquoted(words[0]) == "false")
    array = ARRAY.fullmatch(words[0]) and words[1:2] == [OPEN]
    assigns = array or all(NAME_VALUE.fullmatch(word) for word in words)
    return 0 if assigns and not any(map(substitution, words)) else None


def _keywords(words: list[str], blocks: list[_Block]) -> list[str]:
    """A command's words without the block syntax around them (``then`` / ``else`` / ``do``, a case's ``pattern)``),
    keeping ``blocks`` up to date; none for an ``if`` / ``case`` / loop's opening line (its condition) or its end."""
    keyword = unquoted(words[0]) if words else ""
    if blocks and keyword == blocks[-1][0] and keyword in BLOCKS.values():
        blocks.pop()
        return []
    if keyword in BLOCKS or keyword == "elif":
        blocks += [(BLOCKS[keyword], IN_BLOCK, True, None)] if keyword in BLOCKS else []
        rest = words[3:] if keyword == "case" else []  # `case X in a) N=1;;` on one line: its first branch
        return _keywords(rest, blocks) if rest else []
    while words and unquoted(words[0]) in ("then", "else", "do"):
        words = words[1:]
    if blocks and blocks[-1][0] == "esac" and CLOSE in words and not (len(words) > 1 and words[1] == OPEN):
        words = words[words.index(CLOSE) + 1:]  # a case's `pattern)`
    return words


def _group(words: list[str], blocks: list[_Block], runs: bool | None) -> list[str] | None:
    """The words after the ``{`` opening a group (run as the list before it lets it: ``runs``) or a function's body
    (``f() {``, ``function f {``: run where it is called), its block pushed; None where words open neither. A
    function's ``{`` may be on a later line."""
    function = _function(words)
    if function is not None and function[:1] != ["{"]:
        blocks.append(("{", IN_FUNCTION, True, None))  # its { to come
        return []
    if blocks and blocks[-1][0] == "{":
        blocks.pop()
        function = words if words[:1] == ["{"] else None
    body = words if function is None else function
    if body[:1] != ["{"]:
        return None
    blocks.append(("}", IN_FUNCTION, True, None) if function is not None else
                  ("}", "" if runs else AFTER_CONDITION, runs, None))
    return body[1:]


def _function(words: list[str]) -> list[str] | None:
    """The words after a function definition's name (``f()``, ``function f``, ``function f()``); None for none."""
    if words and unquoted(words[0]) == "function":
        return words[3:] if words[2:3] == [CLOSE] else words[2:]
    if len(words) > 1 and words[0].endswith("(") and words[1] == CLOSE:
        return words[2:]
    return None


def _declared(words: list[str]) -> list[str]:
    """A command's words without a leading ``export`` / ``declare -a`` / ``local`` / ``readonly`` and its options."""
    if words and unquoted(words[0]) in DECLARE:
        words = words[1:]
        while words and words[0].startswith("-"):  # declare -a, -r, -x ...
            words = words[1:]
    return words


_APPEND = re.compile(r"([A-Za-z_]\w*)\+=")


def _appended(words: list[str]) -> list[str]:
    """A command's leading ``NAME+=value`` words as bash assigns them: ``NAME=${NAME-}value`` (the value after NAME's,
    an unset NAME's empty; an array's first element's); ``NAME+=( ... )`` stays an array's append."""
    out = list(words)
    for k, word in enumerate(words):
        append = _APPEND.match(word)
        if append is None and not NAME_VALUE.fullmatch(word):
            break
        if append and words[k + 1:k + 2] != [OPEN]:
            out[k] = f"{append.group(1)}=${{{append.group(1)}-}}{word[append.end():]}"
    return out


def _word_part(text: str, i: int) -> tuple[str, int]:
    """The part of a word starting at ``i`` (a quoted string between its marks, a whole ``${...}`` / ``$((...))``, a
    command substitution, an escaped or plain character) and the index of its last character. A ``$(command)``,
    ```command``` or process substitution (``<(command)``), which is not run, is kept as written (``COMMAND``); an
    escaped character too (``LITERAL``), ``$'...'`` as bash reads its escapes, ``$"..."`` as ``"..."``."""
    c = text[i]
    if c == "'":
        j = text.find("'", i + 1)
        j = len(text) if j < 0 else j
        return LITERAL + text[i + 1:j] + UNLITERAL, j
    if text.startswith("$'", i):
        j = _closing(text, i + 1, "'")
        return LITERAL + ansi_c(text[i + 2:j]) + UNLITERAL, j
    if c == '"' or text.startswith('$"', i):  # $"...": bash's locale translation, a double-quoted string here
        k = i + (c == "$")
        j = _closing_quote(text, k)
        return QUOTED + _double_quoted(text[k + 1:j]) + UNQUOTED, j
    if c == "`" or (text.startswith(("$(", "<(", ">("), i) and not text.startswith("$((", i)):
        j = _closing(text, i, "`") if c == "`" else _matching(text, i + 1)
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
        if c == '"':  # a quote inside a ${X:-"word"} inside double quotes (``_chosen``): bash removes it
            i += 1
            continue
        if c == "\\" and inner[i + 1:i + 2] in ("$", "`"):
            j, part = i + 1, LITERAL + inner[i + 1] + UNLITERAL
        elif c == "`" or (inner.startswith("$(", i) and not inner.startswith("$((", i)):
            j = _closing(inner, i, "`") if c == "`" else _matching(inner, i + 1)
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


_ESCAPES = {char: "\\" + letter for letter, char in _ANSI_C_LETTERS.items() if letter not in "e\"?"}


def _quote(value: str) -> str:
    """``${X@Q}``: X quoted as bash prints it: ``'...'``, or ``$'...'`` (``ansi_c``'s escapes, ``\\nnn`` octal) where
    a control character is in it."""
    if not re.search(r"[\x00-\x1f\x7f]", value):
        return "'" + value.replace("'", "'\\''") + "'"
    return "$'" + "".join(_ESCAPES.get(c) or (f"\\{ord(c):03o}" if c < " " or c == "\x7f" else c) for c in value) + "'"


_TRANSFORMS: dict[str, Callable[[str], str]] = {"Q": _quote, "E": ansi_c, "U": str.upper, "L": str.lower,
                                                "u": lambda value: value[:1].upper() + value[1:]}
"""``${X@op}``'s transformations read here: quoted (``Q``), escapes read as ``$'...'`` (``E``), upper / lower case
(``U`` / ``L``), the first character upper-cased (``u``)."""


def _closing(text: str, i: int, mark: str) -> int:
    """The index of the ``mark`` (``'`` of a ``$'...'``, a backtick) closing the one at ``i`` (an escaped one inside
    does not), or the end of ``text``."""
    j = i + 1
    while j < len(text) and text[j] != mark:
        j += 2 if text[j] == "\\" else 1
    return min(j, len(text))


def _closing_quote(text: str, i: int) -> int:
    """The index of the ``"`` closing the one at ``i`` (skipping escapes, ``${...}``, ``$(...)`` and backticks)."""
    j = i + 1
    while j < len(text) and text[j] != '"':
        if text[j] == "\\":
            j += 2
        elif text.startswith(("${", "$("), j):
            j = _matching(text, j + 1) + 1
        elif text[j] == "`":
            j = _closing(text, j, "`") + 1
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
