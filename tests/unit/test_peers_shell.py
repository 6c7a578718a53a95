"""The shell reader behind the verl and slime translations (``minirl.peers.shell``): words, quotes and command lists
read as bash reads them."""

from __future__ import annotations

from minirl.peers.shell import AND_IF, OR_IF, ansi_c, commands, expand, fields, substitution, unquoted


def test_ansi_c_quotes_read_bashs_escapes():
    """``$'...'``: letters, ``\\\\``, ``\\'``, hex, octal, unicode and control escapes; an unknown one stays as written."""
    assert ansi_c(r"a\tb\n\\ \'q\' \x41\101\u00e9 \cA \z \x") == "a\tb\n\\ 'q' AA\u00e9 \x01 \\z \\x"
    [(_, words)] = commands("echo $'it\\'s a\\ttab' '$\\n' \"$'x'\"\n")
    assert [fields(word, {}) for word in words[1:]] == [["it's a\ttab"], ["$\\n"], ["$'x'"]]  # in "...": as written


def test_and_or_lists_mark_the_commands_they_guard():
    """A command after ``&&`` / ``||`` (a newline may follow them) starts with ``AND_IF`` / ``OR_IF``; ``;``, ``|``
    and newlines start a command of its own."""
    found = commands("a && b || c\nd &&\n  # why\n  e; f | g\nh=(x && y)\n")
    assert [(line, [unquoted(word) for word in words]) for line, words in found] == [
        (1, ["a"]), (1, [AND_IF, "b"]), (1, [OR_IF, "c"]), (2, ["d"]), (4, [AND_IF, "e"]), (4, ["f"]), (4, ["g"]),
        (5, ["h=", "\x00(", "x", "y", "\x00)"])]


def test_command_substitutions_stay_whole_and_are_not_expanded():
    """``$(...)`` and backticks (quoted or not, nested quotes inside) are one part of their word, never run: a word
    taking one expands to None, as does ``expand`` of a value needing one (verl's scripts); a ``${X:-$(cmd)}`` whose
    X is set needs none."""
    [(_, first), (_, second)] = commands('D="$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")" &>/dev/null && pwd)"\n'
                                         'Y=`date +%s` "run-$(nproc)x" "\\$(no)" \'$(no)\'\n')
    assert substitution(first[0]) == '$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")" &>/dev/null && pwd)'
    assert [substitution(word) for word in second] == ["`date +%s`", "$(nproc)", None, None]
    assert [fields(word, {}) for word in second] == [None, None, ["$(no)"], ["$(no)"]]
    assert expand("$(pwd)/ckpt", {}) is None and expand("`pwd`", {}) is None
    assert expand("${X:-$(pwd)}", {"X": "a"}) == "a" and expand("${X:-$(pwd)}", {}) is None
