"""The shell reader behind the verl and slime translations (``minirl.peers.shell``): words, quotes and command lists
read as bash reads them."""

from __future__ import annotations

import pytest

from minirl.peers.shell import (
    AND_IF,
    COMMAND,
    OR_IF,
    ansi_c,
    arguments,
    assigned,
    case_matches,
    commands,
    condition,
    default_assignments,
    expand,
    fields,
    shift,
    statements,
    stopped,
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


# bash 5.2 prints each word's fields (`printf '[%s]' WORD`) after: X=abc N=X Y="a b" E= A=(p q r) pre_a=1 pre_b=2
# Z=$'it\'s\tx' V='a\tb' NA="A[1]", the script run as `bash run.sh 'x y' z` (ARGUMENTS) or `bash run.sh` (none)
SCRIPT = {"X": "abc", "N": "X", "Y": "a b", "E": "", "A": "p", "pre_a": "1", "pre_b": "2", "Z": "it's\tx", "V": "a\\tb",
          "NA": "A[1]"}
SCRIPT_ARRAYS = {"A": ["p", "q", "r"]}
ARGUMENTS = ["x y", "z"]


def _fields(word: str, variables: dict[str, str]) -> list[str] | None:
    [(_, words)] = commands(f"printf '[%s]' {word}\n")
    return fields(words[2], variables, arrays=SCRIPT_ARRAYS)


@pytest.mark.parametrize(("word", "value"), [
    ('"${!N}"', ["abc"]), ("${!N}x", ["abcx"]), ('"${!N:-d}"', ["abc"]), ('"${!N@Q}"', ["'abc'"]), ("${!N^^}", ["ABC"]),
    ('"${!NA}"', ["q"]), ("${!A[@]}", ["0", "1", "2"]), ('"${!pre_*}"', ["pre_a pre_b"]), ("${!#}", ["z"]),
])
def test_indirect_expansions_as_bash(word: str, value: list[str]):
    """``${!X}`` (X's value names the parameter, ``A[1]`` and ``$#`` too; an operation after it is on that one),
    ``${!A[@]}`` an array's indices, ``${!p*}`` the names starting with p: what bash prints."""
    assert _fields(word, {**SCRIPT, **arguments(ARGUMENTS)}) == value


def test_indirect_expansions_bash_stops_at_are_unresolved():
    """``${!U}`` with U unset, or naming no parameter, is bash's `invalid indirect expansion`: unresolved."""
    assert expand("${!U}", SCRIPT) is None and expand("${!Y}", SCRIPT) is None and expand("${!E}", SCRIPT) is None


@pytest.mark.parametrize(("word", "value"), [
    ('"${X@Q}"', ["'abc'"]), ('"${Y@Q}"', ["'a b'"]), ("${Y@Q}", ["'a", "b'"]), ('"${E@Q}"', ["''"]),
    ('"${Z@Q}"', ["$'it\\'s\\tx'"]), ('"${V@E}"', ["a\tb"]), ('"${X@U}"', ["ABC"]), ('"${X@u}"', ["Abc"]),
    ('"${Y@L}"', ["a b"]), ("${A[@]@U}", ["P", "Q", "R"]),
])
def test_transformations_as_bash(word: str, value: list[str]):
    """``${X@Q}`` (``'...'``, ``$'...'`` where a control character is in it), ``@E``, ``@U``, ``@u``, ``@L``: what
    bash prints; the others (``@P`` a prompt, ``@A`` / ``@K`` / ``@a`` declarations) are unresolved."""
    assert _fields(word, SCRIPT) == value
    assert all(expand(f"${{X@{op}}}", SCRIPT) is None for op in "PAKak")


@pytest.mark.parametrize(("word", "value"), [
    ('"${X:-"a b"}"', ["abc"]), ('${U:-"a b"}', ["a b"]), ("${U:-'a b'}", ["a b"]), ("${U:-$Y}", ["a", "b"]),
    ('"${U:-$Y}"', ["a b"]), ('"${U:-"quoted default"}"', ["quoted default"]), ('${U:-"$Y"x}', ["a bx"]),
    ("\"${U:-'a b'}\"", ["'a b'"]), ("${U:-a\\ b}", ["a b"]), ('"${U:-a\\ b}"', ["a\\ b"]), ('${U:-"\\$Y"}', ["$Y"]),
    ('${X:+"$Y"}x', ["a bx"]), ("${U:-}", []), ('${U:-""}', [""]), ('"${U:-}"', [""]), ("${U:-$E}x", ["x"]),
    ('${U:-${W:-"c d"}}', ["c d"]), ("\"${U:-${W:-'c d'}}\"", ["'c d'"]), ('pre${X:+"1  2"}post', ["pre1  2post"]),
])
def test_quotes_inside_defaults_as_bash(word: str, value: list[str]):
    """A default's or an alternative's own quotes: unquoted, a quoted part is one word and an unquoted expansion is
    split (``${U:-"a b"}`` one word, ``${U:-$Y}`` two); inside double quotes, its double quotes removed and its single
    quotes and backslashes as written: what bash prints."""
    assert _fields(word, SCRIPT) == value


@pytest.mark.parametrize(("word", "given", "none"), [
    ('"$1"', ["x y"], [""]), ('"${1}"', ["x y"], [""]), ('"$@"', ["x y", "z"], []), ('"$*"', ["x y z"], [""]),
    ('"$#"', ["2"], ["0"]), ('"${1:-d}"', ["x y"], ["d"]), ('"${3:-d}"', ["d"], ["d"]), ("$@", ["x", "y", "z"], []),
    ("$*", ["x", "y", "z"], []), ('"a$@b"', ["ax y", "zb"], ["ab"]), ('"${@:2}"', ["z"], []),
    ('"${@/#/--}"', ["--x y", "--z"], []), ("${#}", ["2"], ["0"]), ("${#@}", ["2"], ["0"]), ("${#1}", ["3"], ["0"]),
    ('"${@:-d}"', ["x y", "z"], ["d"]), ('"$@$@"', ["x y", "zx y", "z"], []), ('x"$@"y', ["xx y", "zy"], ["xy"]),
    ("${2}x", ["zx"], ["x"]), ('"${10}"', [""], [""]), ('"${@: -1}"', ["z"], ["run.sh"]),
])
def test_positional_parameters_as_bash(word: str, given: list[str], none: list[str]):
    """``$1``, ``${1}``, ``"$@"`` (each argument a word; none for none), ``$*``, ``$#``, ``${1:-d}``, ``${@:2}``...:
    what bash prints for the script run with ``'x y' z`` (``arguments``) and with none (a reader's default)."""
    assert _fields(word, {**SCRIPT, **arguments(ARGUMENTS, "run.sh")}) == given
    assert _fields(word, {**SCRIPT, **arguments([], "run.sh")}) == none
    if "@: -1" not in word:  # $0: not known without arguments' script
        assert _fields(word, SCRIPT) == none


def test_shift_drops_the_first_arguments_as_bash():
    """``shift`` / ``shift 2`` / ``shift $N``: the arguments after them become ``$1``...; a count past ``$#``
    shifts none (bash: `shift 5` fails); another command is no ``shift``."""
    variables = {"N": "1", **arguments(["a", "b", "c", "d"])}
    found = []
    for _, words, _ in statements("shift\nshift 2\nshift 5\nshift $N\necho x\n"):
        found.append((shift(words, variables), _fields('"$@"', variables), variables["#"]))
    assert found == [(True, ["b", "c", "d"], "3"), (True, ["d"], "1"), (True, ["d"], "1"), (True, [], "0"),
                     (False, [], "0")]


def test_a_required_value_keeps_its_message_through_variables():
    """``A=${X:?msg}`` with X unset stops bash there (`run.sh: line 1: X: msg`): A is unresolved, and ``stopped``
    gives the message and line for a word taking A (through ``B=$A/sub`` too); a ``${X:?}`` / ``${X?}`` in the word
    itself, bash's own message; a set X, none."""
    variables: dict[str, str] = {}
    variables["A"] = assigned("${X:?set X to your model}", variables, where="run.sh:1") or ""
    variables["B"] = assigned("$A/sub", variables, where="run.sh:2") or ""
    assert fields("$B", variables) is None and expand("${A:-d}", variables) is None
    assert stopped("--model=$B", variables) == stopped("$A", variables) == "run.sh:1: X: set X to your model"
    assert stopped("${X:?}", {}) == "X: parameter null or not set" and stopped("${X?}", {"X": ""}) is None
    assert stopped("${M:-${X?}}", {}) == "X: parameter not set" and stopped("${X:?need $N}", {"N": "X"}) == "X: need X"
    assert assigned("${X:?set X}", {"X": "m"}) == "m" and stopped("$M", {"M": "m"}) is None


@pytest.mark.parametrize("test, held", [
    ('[ "$D" = gpu ]', True), ('[ "$D" = npu ]', False), ('[ "$D" != npu ]', True), ('[[ $D == g* ]]', True),
    ('[[ $D == "g*" ]]', False), ('[ "$D" = "g*" ]', False), ('[ -n "$E" ]', False), ('[ -z "$E" ]', True),
    ('[ "$D" ]', True), ('! [ "$D" = gpu ]', False), ('[ "$N" -gt 4 ]', True), ('[ "$N" -le 4 ]', False),
    ('test "$N" -eq 8', True), ('[ "$U" = x ]', None), ('[ -f /etc/passwd ]', None), ('[ "$C" = x ]', None),
    ('[ "$N" -gt x ]', None), ('command -v npu-smi', None),
])
def test_conditions_as_bash_reads_them(test: str, held: bool | None):
    """``condition``: what the verl reader decides an ``if`` by (None where it is not known here: an unset variable, a
    file test, a command's output, a command's status)."""
    [(_, words)] = commands(test + "\n")
    assert condition(words, {"D": "gpu", "E": "", "N": "8", "C": COMMAND}) is held


@pytest.mark.parametrize("subject, patterns, matched", [
    ("$D", ["npu"], False), ("$D", ["gpu"], True), ("$D", ["g?u"], True), ("$D", ["*"], True),
    ("$D", ["npu", "cuda", "gp*"], True), ('"$D"', ['"g*"'], False), ("$U", ["gpu"], None),
])
def test_case_patterns_as_bash_matches_them(subject: str, patterns: list[str], matched: bool | None):
    [(_, words)] = commands(" ".join([subject, *patterns]) + "\n")
    assert case_matches(words, {"D": "gpu"}) is matched
