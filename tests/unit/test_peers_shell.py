"""The shell reader behind the verl and slime translations (``minirl.peers.shell``): words, quotes and command lists
read as bash reads them."""

from __future__ import annotations

import pytest

from minirl.peers.shell import (
    AND_IF,
    COMMAND,
    OR_IF,
    ansi_c,
    assigned,
    commands,
    default_assignments,
    expand,
    fields,
    statements,
    substitution,
    unquoted,
)


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


def test_redirections_and_their_targets_are_not_words():
    """``N>`` / ``N>&M`` / ``&>`` / ``>>`` / ``<`` / ``<<<`` / ``>|`` and their targets are no words of the command,
    wherever they stand (``--x=1>log`` is ``--x=1``; ``a2>x`` keeps ``a2``: only a whole number is a descriptor);
    ``2>&1`` is one redirection, not ``2>`` and a background command; ``|&`` is a pipe; a here-document's lines are
    no commands; ``<(cmd)`` / ``>(cmd)`` are words (a command's output, not run)."""
    found = commands("python3 train.py --a 1 2>&1 | tee log.txt\n"
                     "b > out.log 2>&1; c &> log\n"
                     "d >> log 2>/dev/null < input 1>&2 <<< \"x y\" |& e\n"
                     "f --x=1>log a2>x 2>&- >| y &>>z \"q\">'r s'\n"
                     "cat <<-'EOF' > cfg.yaml\n\tA=1 (\n\tEOF\n"
                     "g <(h) >(i) <<EOF\nB=2\nEOF\nC=3\n")
    assert [(line, [unquoted(word) for word in words]) for line, words in found] == [
        (1, ["python3", "train.py", "--a", "1"]), (1, ["tee", "log.txt"]), (2, ["b"]), (2, ["c"]), (3, ["d"]), (3, ["e"]),
        (4, ["f", "--x=1", "a2", "q"]), (5, ["cat"]), (8, ["g", "<(h)", ">(i)"]), (11, ["C=3"])]
    assert [substitution(word) for word in found[-2][1][1:]] == ["<(h)", ">(i)"]


def test_locale_quotes_read_as_double_quotes():
    """``$"..."`` (bash's locale translation) is a double-quoted string: expanded, not split."""
    [(_, words)] = commands('echo $"a $X  b" $"c"d\n')
    assert [fields(word, {"X": "1"}) for word in words[1:]] == [["a 1  b"], ["cd"]]


def test_array_elements_counts_and_lengths():
    """``${A[n]}`` (a number, an arithmetic index such as ``$i``, negative from the end), ``${A[@]}`` / ``${A[*]}``
    its elements joined, ``${#A[@]}`` their count, ``${#X}`` a value's length (inside ``$((...))`` too); an index
    past the end is empty; a scalar is an array of one; an unknown index or name, None."""
    arrays = {"A": ["a", "bc", "d"]}
    variables = {"X": "abcd", "i": "1", "A": "a"}
    assert expand("${A[0]}-${A[$i]}-${A[i+1]}-${A[-1]}-${#A[@]}-${#A[*]}-${#X}-${#A[1]}", variables, arrays) == \
        "a-bc-d-d-3-3-4-2"
    assert expand("${A[@]}|${A[*]}|${A[7]}|${A[7]:-z}|${X[0]}|${X[1]}", variables, arrays) == "a bc d|a bc d||z|abcd|"
    assert fields("$((${#A[@]} * 2 + ${#X}))", variables, arrays=arrays) == ["10"]
    assert expand("${A[$j]}", variables, arrays) is None and expand("${B[0]}", variables, arrays) is None
    assert expand("${#B[@]}", variables, arrays) is None


def test_default_assignments_are_what_bash_assigns():
    """``${X:=v}`` assigns v when X is unset or empty, ``${X=v}`` when unset; each in turn, as bash expands."""
    variables = {"E": "", "S": "set"}
    [(_, words)] = commands(': ${A:=1} "${E:=${A}2}" ${S:=3} ${E2=4} ${A:=5} ${S=6} ${N:-7}\n')
    assigned = []
    for word in words[1:]:
        for name, value in default_assignments(word, variables):
            assigned.append((name, value))
            variables[name] = expand(value, variables) or ""
    assert [(name, variables[name]) for name, _ in assigned] == [("A", "1"), ("E", "12"), ("E2", "4")]


VARIABLES = {"M": "/root/Qwen3-4B", "C": "/ckpt/", "N": "my-run-name", "X": "abcdef", "P": "*", "E": "", "i": "1"}
ARRAYS = {"D": ["a1", "b2", "c3", "d4"]}
BASH = [  # each as bash 5.2 prints it: M=/root/Qwen3-4B C=/ckpt/ N=my-run-name X=abcdef P='*' E= i=1 D=(a1 b2 c3 d4)
    ("${M##*/}", "Qwen3-4B"), ("${C%/}", "/ckpt"), ("${N//-/_}", "my_run_name"), ("${M%/*}", "/root"),
    ("${X#*c}", "def"), ("${X##*[bd]}", "ef"), ("${X%?}", "abcde"), ("${X%%c*}", "ab"), ("${X%%}", "abcdef"),
    ('${X#"$P"}', "abcdef"), ("${X#$P}", "abcdef"), ("${X##$P}", ""), ("${X/c?/_}", "ab_ef"), ("${X/#a/A}", "Abcdef"),
    ("${X/%f/F}", "abcdeF"), ("${X/#/pre}", "preabcdef"), ("${X//[ace]/}", "bdf"), ("${X//[!ace]/.}", "a.c.e."),
    ("${X//[[:alpha:]]/x}", "xxxxxx"), ("${X/'c'*/\\&}", "ab&"), ("${X//[bd]/<&>}", "a<b>c<d>ef"),
    ("${X/\\c/C}", "abCdef"), ("${X^^}", "ABCDEF"), ("${X^}", "Abcdef"), ("${N~~}", "MY-RUN-NAME"),
    ("${N^^[-r]}", "my-Run-name"), ("${X:2}", "cdef"), ("${X:1:3}", "bcd"), ("${X: -2}", "ef"), ("${X:(-3):2}", "de"),
    ("${X:2:-1}", "cde"), ("${X: -10}", ""), ("${X:10}", ""), ("${X:i}", "bcdef"), ("${X:i+1:i}", "c"), ("${X::2}", "ab"),
    ("${E:+a}", ""), ("${E+a}", "a"), ("${U+a}", ""), ("${U:-d}", "d"), ("${U-d}", "d"), ("${E-d}", ""),
    ("${E:-d}", "d"), ('${X:+"a b"}', "a b"), ("${X:+$N}", "my-run-name"), ("${D[@]:1}", "b2 c3 d4"),
    ("${D[@]:1:2}", "b2 c3"), ("${D[@]: -1}", "d4"), ("${D[@]/#/--}", "--a1 --b2 --c3 --d4"), ("${D[@]%?}", "a b c d"),
    ("${D[*]^^}", "A1 B2 C3 D4"), ("${D[1]:1}", "2"), ("${D:1}", "1"), ("${D[@]:0:0}", ""),
]


@pytest.mark.parametrize(("word", "value"), BASH)
def test_trims_substrings_replacements_and_cases_as_bash(word: str, value: str):
    """``${X#p}`` / ``##`` / ``%`` / ``%%`` (glob patterns, shortest / longest; a quoted part literal),
    ``${X/p/r}`` / ``//`` / ``/#`` / ``/%`` (``&`` the match, bash 5.2's ``patsub_replacement``), ``${X^^}`` / ``,,``
    / ``~~``, ``${X:offset:length}``, ``${X:+alt}`` / ``${X+alt}`` / ``${X-d}``, array slices and each element's
    trim: what bash 5.2 prints for them."""
    assert expand(word, VARIABLES, ARRAYS) == value
    [(_, words)] = commands(f'echo "{word}" {word}\n')
    assert fields(words[1], VARIABLES, arrays=ARRAYS) == [value]


def test_required_values_are_unresolved_where_bash_stops():
    """``${X:?msg}`` (X unset or empty) / ``${X?msg}`` (X unset) stop bash's script: None (unresolved); else X."""
    assert expand("${X:?set X}", {}) is None and expand("${X:?set X}", {"X": ""}) is None
    assert expand("${X?set X}", {}) is None and expand("${X?set X}", {"X": ""}) == ""
    assert expand("${X:?set X}/a", {"X": "m"}) == "m/a" and expand("${X?}", {"X": "m"}) == "m"


def test_a_command_output_in_a_brace_is_one():
    """``${X:=$(cmd)}`` / ``${X:-`cmd`}`` with X unset take a command's output (``COMMAND``), not a variable set
    nowhere; with X set, none."""
    assert assigned("${X:=$(nproc)}", {}) == COMMAND and assigned('"${X:-`date`}"', {}) == COMMAND
    assert assigned("${X:=$(nproc)}", {"X": "4"}) == "4" and assigned("${X:=${Y}}", {}) is None
    [(_, words)] = commands('echo "a-${X:-$(pwd)}" ${X:+${Y:-`date`}}\n')
    assert [substitution(word) for word in words] == [None, "$(pwd)", "`date`"]


def test_appends_read_as_the_value_after_the_old():
    """``X+=y`` (``export X+=y`` too) appends to X's value (to an array's first element); ``A+=(x y)`` stays an
    array's append."""
    found = [[unquoted(word) for word in words] for _, words, _ in statements('X+=y\nexport Y+="a b" Z=1\nA+=(x y)\n')]
    assert found == [["X=${X-}y"], ["Y=${Y-}a b", "Z=1"], ["A+=", "\x00(", "x", "y", "\x00)"]]
