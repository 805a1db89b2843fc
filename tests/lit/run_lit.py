#!/usr/bin/env python3
"""Runs braze's text tests: a small, dependency-free take on LLVM lit + FileCheck.

Each test file (tests/lit/*.txt) is an input graph whose comment lines hold the directives:

    # RUN: braze-opt %s --print=decomposed
    # RUN: not braze-opt %s --passes=frob 2>&1 | FileCheck %s --check-prefix=ERR
    # CHECK-LABEL: graph(
    # CHECK:       exp(
    # CHECK-NEXT:  sum(
    # CHECK-NOT:   softmax
    # ERR:         unknown pass 'frob'

Directives may start with `#` (the graph's comment syntax) or `//`.

RUN: `%s` (also inside a word) becomes the test file and `braze-opt` the --braze-opt path.
Without a leading `not` the command must succeed; with it, it must exit with status 1, a user
error (an internal error, 2, or a crash fails the test). A final `< FILE` feeds FILE to
stdin; a final `2>&1` (after any `< FILE`) checks stderr together with stdout;
`| FileCheck %s --check-prefix=P` checks the output against the P directives (default
CHECK). No shell is involved.

Checks (PREFIX = CHECK or the --check-prefix), matched against the output in file order:
  PREFIX:        the pattern occurs at or after the end of the previous match
  PREFIX-NEXT:   ... on the line right after the previous match's line
  PREFIX-SAME:   ... on the same line as the previous match
  PREFIX-EMPTY:  the line right after the previous match is empty
  PREFIX-NOT:    the pattern does not occur between the previous match and the next one (or the
                 end of the label's block)
  PREFIX-LABEL:  like PREFIX, but labels are matched first and split the output into blocks;
                 the other checks are matched inside their label's block
A pattern is a substring; `{{regex}}` embeds a Python regular expression (`{{$}}` is a line's
end, `{{^}}` its start), and any run of spaces
matches any run of spaces and tabs. Leading and trailing spaces of a pattern are ignored.
`[[NAME:regex]]` matches the regex and binds NAME to the text it matched; a later `[[NAME]]`
matches exactly that text (names are shared by all checks of one RUN line).

Usage: run_lit.py --braze-opt PATH [-v] DIR_OR_FILE...
Exit status 0 when every test passes, 1 otherwise.
"""

import argparse
import bisect
import os
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass

DIRECTIVE = re.compile(r"^\s*(?:#|//)\s*([A-Za-z][A-Za-z0-9_-]*):(.*)$")
SUFFIXES = ("-NEXT", "-SAME", "-EMPTY", "-NOT", "-LABEL")
CONTEXT_LINES = 4


class TestFailure(Exception):
    pass


@dataclass
class Check:
    kind: str  # "", "NEXT", "SAME", "EMPTY", "NOT" or "LABEL"
    pattern: str
    line: int  # 1-based line of the directive in the test file


@dataclass
class RunLine:
    argv: list
    expect_failure: bool
    merge_stderr: bool
    stdin_path: str  # "" for none
    prefix: str
    line: int


def closing_brackets(pattern, start):
    """Index of the `]]` closing the `[[` at `start`; brackets inside the regex may nest."""
    depth, i = 0, start + 2
    while i < len(pattern):
        ch = pattern[i]
        if ch == "\\":
            i += 2
            continue
        if ch == "[":
            depth += 1
        elif ch == "]":
            if depth == 0 and pattern.startswith("]]", i):
                return i
            depth = max(depth - 1, 0)
        i += 1
    raise ValueError("'[[' without a closing ']]'")


def compile_pattern(pattern, variables):
    """A check pattern as a regex: literal text with flexible spaces, {{regex}} parts and
    [[NAME:regex]] / [[NAME]] variables (`variables` holds the bound ones)."""
    parts, defined = [], set()
    pos = 0
    while pos < len(pattern):
        starts = [i for i in (pattern.find("{{", pos), pattern.find("[[", pos)) if i >= 0]
        start = min(starts) if starts else len(pattern)
        literal = pattern[pos:start]
        parts.append(r"[ \t]+".join(re.escape(w) for w in re.split(r"[ \t]+", literal)))
        if start == len(pattern):
            break
        if pattern.startswith("{{", start):
            end = pattern.find("}}", start + 2)
            if end < 0:
                raise ValueError("'{{' without a closing '}}'")
            parts.append("(?:" + pattern[start + 2:end] + ")")
            pos = end + 2
            continue
        end = closing_brackets(pattern, start)
        name, colon, regex = pattern[start + 2:end].partition(":")
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name):
            raise ValueError(f"bad variable name '{name}'")
        if colon:
            if name in defined:
                raise ValueError(f"variable '{name}' is defined twice in one pattern")
            defined.add(name)
            parts.append(f"(?P<{name}>{regex})")
        elif name in defined:
            parts.append(f"(?P={name})")
        elif name in variables:
            parts.append(re.escape(variables[name]))
        else:
            raise ValueError(f"variable '{name}' is used before it is defined")
        pos = end + 2
    return re.compile("".join(parts), re.MULTILINE), defined


def parse_run(text, line, path, braze_opt):
    try:
        words = shlex.split(text)
    except ValueError as e:
        raise TestFailure(f"{path}:{line}: cannot split the RUN line: {e}")
    prefix = "CHECK"
    if "|" in words:
        bar = words.index("|")
        checker = words[bar + 1:]
        words = words[:bar]
        if not checker or checker[0] != "FileCheck":
            raise TestFailure(f"{path}:{line}: only '| FileCheck ...' may follow a pipe")
        for w in checker[1:]:
            if w.startswith("--check-prefix="):
                prefix = w.split("=", 1)[1]
            elif w != "%s":
                raise TestFailure(f"{path}:{line}: unknown FileCheck argument '{w}'")
    expect_failure = bool(words) and words[0] == "not"
    if expect_failure:
        words = words[1:]
    merge_stderr = bool(words) and words[-1] == "2>&1"
    if merge_stderr:
        words = words[:-1]
    stdin_path = ""
    if len(words) >= 2 and words[-2] == "<":
        stdin_path = words[-1].replace("%s", path)
        words = words[:-2]
    if not words or words[0] != "braze-opt":
        raise TestFailure(f"{path}:{line}: a RUN line must run braze-opt")
    argv = [braze_opt] + [w.replace("%s", path) for w in words[1:]]
    return RunLine(argv, expect_failure, merge_stderr, stdin_path, prefix, line)


def parse_test(path, braze_opt):
    runs, directives = [], []
    with open(path, encoding="utf-8") as f:
        for number, text in enumerate(f, start=1):
            m = DIRECTIVE.match(text)
            if not m:
                continue
            name, rest = m.group(1), m.group(2)
            if name == "RUN":
                runs.append(parse_run(rest.strip(), number, path, braze_opt))
            else:
                directives.append((name, rest.strip(), number))
    if not runs:
        raise TestFailure(f"{path}: no RUN line")
    checks = {}
    for run in runs:
        checks.setdefault(run.prefix, [])
    for name, pattern, number in directives:
        base = name
        for suffix in SUFFIXES:
            if name.endswith(suffix):
                base = name[:-len(suffix)]
        if base not in checks and re.fullmatch(r"[A-Z][A-Z0-9_]*", base):
            raise TestFailure(f"{path}:{number}: no RUN line checks the prefix of {name}")
        for prefix in checks:
            kind = None
            if name == prefix:
                kind = ""
            else:
                for suffix in SUFFIXES:
                    if name == prefix + suffix:
                        kind = suffix[1:]
            if kind is None:
                if name.startswith(prefix + "-"):
                    raise TestFailure(f"{path}:{number}: unknown directive {name}")
                continue
            if not pattern and kind != "EMPTY":
                raise TestFailure(f"{path}:{number}: {name} has an empty pattern")
            check = Check(kind, pattern, number)
            try:
                _, defined = compile_pattern(pattern, AnyValue())
            except (ValueError, re.error) as e:
                raise TestFailure(f"{path}:{number}: bad pattern: {e}")
            if defined and kind == "NOT":
                raise TestFailure(f"{path}:{number}: {name} cannot define a variable")
            checks[prefix].append(check)
    for prefix, group in checks.items():
        if not any(c.kind != "NOT" for c in group):
            raise TestFailure(f"{path}: no positive {prefix} check: a test that cannot fail")
        if group[0].kind in ("NEXT", "SAME", "EMPTY"):
            raise TestFailure(f"{path}:{group[0].line}: {prefix}-{group[0].kind} "
                              f"is the first check")
    return runs, checks


class AnyValue(dict):
    """Stands in for the bound variables when a pattern is only checked for syntax."""

    def __contains__(self, name):
        return True

    def __getitem__(self, name):
        return ""


class Output:
    """The checked text with offsets <-> line numbers."""

    def __init__(self, text):
        self.text = text
        self.line_starts = [0] + [m.end() for m in re.finditer("\n", text)]

    def line_of(self, offset):
        return max(bisect.bisect_right(self.line_starts, offset) - 1, 0)

    def line_span(self, index):
        start = self.line_starts[index]
        end = self.text.find("\n", start)
        return start, len(self.text) if end < 0 else end

    def excerpt(self, offset, mark=None):
        """Output lines around `offset`, numbered; `mark` (an offset) gets an arrow."""
        center = self.line_of(min(offset, len(self.text)))
        lines = self.text.split("\n")
        lo = max(0, center - CONTEXT_LINES)
        hi = min(len(lines), center + CONTEXT_LINES + 1)
        marked = self.line_of(mark) if mark is not None else center
        out = []
        for i in range(lo, hi):
            arrow = ">>" if i == marked else "  "
            out.append(f"  {arrow} {i + 1:4d} | {lines[i]}")
        return "\n".join(out) if out else "  (the output is empty)"


def check_output(path, prefix, checks, out):
    """Raises TestFailure at the first check that does not hold."""

    variables = {}

    def search(check, start, end):
        try:
            regex, _ = compile_pattern(check.pattern, variables)
        except ValueError as e:
            fail(check, str(e), start)
        m = regex.search(out.text, start, end)
        if m and check.kind != "NOT":
            variables.update(m.groupdict())
        return m

    def fail(check, message, offset, mark=None):
        name = prefix + ("-" + check.kind if check.kind else "")
        used = [v for v in re.findall(r"\[\[([A-Za-z_][A-Za-z0-9_]*)\]\]", check.pattern)
                if v in variables]
        bound = "".join(f"\n  with {v} = {variables[v]!r}" for v in dict.fromkeys(used))
        raise TestFailure(f"{path}:{check.line}: {name}: {message}\n"
                          f"  expected: {check.pattern!r}{bound}\n"
                          f"  output near the search position:\n{out.excerpt(offset, mark)}")

    # 1. Labels first: each one after the previous; they split the output into blocks.
    blocks = []  # (first check index, last check index, block start, block end)
    pos = 0
    label_indices = [i for i, c in enumerate(checks) if c.kind == "LABEL"]
    label_spans = []
    for i in label_indices:
        m = search(checks[i], pos, len(out.text))
        if not m:
            fail(checks[i], "label not found", pos)
        label_spans.append((m.start(), m.end()))
        pos = m.end()
    bounds = [-1] + label_indices + [len(checks)]
    for k in range(len(bounds) - 1):
        first, last = bounds[k] + 1, bounds[k + 1]
        start = label_spans[k - 1][1] if k > 0 else 0
        end = label_spans[k][0] if k < len(label_spans) else len(out.text)
        blocks.append((first, last, start, end))

    # 2. In each block, match the checks in order from the end of the previous match.
    for b, (first, last, start, end) in enumerate(blocks):
        pos = start
        prev_line = out.line_of(start - 1) if b > 0 else None
        pending_nots = []
        for i in range(first, last):
            c = checks[i]
            if c.kind == "NOT":
                pending_nots.append(c)
                continue
            if c.kind in ("NEXT", "EMPTY", "SAME"):
                if prev_line is None:
                    fail(c, "there is no previous match", pos)
                want = prev_line if c.kind == "SAME" else prev_line + 1
                if want >= len(out.line_starts):
                    fail(c, "the output ends before the line it needs", pos)
                line_start, line_end = out.line_span(want)
                from_ = max(pos, line_start) if c.kind == "SAME" else line_start
                if c.kind == "EMPTY":
                    if line_start != line_end:
                        fail(c, "the next line is not empty", pos, line_start)
                    match_start, match_end = line_start, line_end
                else:
                    m = search(c, from_, line_end)
                    if not m:
                        where = "the same line" if c.kind == "SAME" else "the next line"
                        fail(c, f"not found on {where}", pos, line_start)
                    match_start, match_end = m.start(), m.end()
            else:
                m = search(c, pos, end)
                if not m:
                    fail(c, "not found", pos)
                match_start, match_end = m.start(), m.end()
            check_nots(pending_nots, pos, match_start, search, fail)
            pending_nots = []
            pos = match_end
            prev_line = out.line_of(max(match_end - 1, match_start))
        check_nots(pending_nots, pos, end, search, fail)


def check_nots(nots, start, end, search, fail):
    for c in nots:
        m = search(c, start, end)
        if m:
            fail(c, "found where it must not be", start, m.start())


def run_test(path, braze_opt, verbose):
    runs, checks = parse_test(path, braze_opt)
    for run in runs:
        command = " ".join(shlex.quote(a) for a in run.argv)
        if run.stdin_path:
            command += " < " + shlex.quote(run.stdin_path)
        try:
            stdin = open(run.stdin_path, "rb") if run.stdin_path else subprocess.DEVNULL
        except OSError as e:
            raise TestFailure(f"{path}:{run.line}: cannot open the RUN line's stdin: {e}")
        try:
            proc = subprocess.run(run.argv, stdin=stdin, stdout=subprocess.PIPE,
                                  stderr=subprocess.STDOUT if run.merge_stderr else subprocess.PIPE)
        finally:
            if run.stdin_path:
                stdin.close()
        proc.stdout = proc.stdout.decode("utf-8", errors="replace")
        proc.stderr = proc.stderr.decode("utf-8", errors="replace") if proc.stderr else ""
        if verbose:
            print(f"  $ {command}")
        if proc.returncode != (1 if run.expect_failure else 0):
            want = "exit status 1 (a user error)" if run.expect_failure else "success"
            raise TestFailure(f"{path}:{run.line}: expected {want}, got exit status "
                              f"{proc.returncode}\n  command: {command}\n"
                              f"  stdout:\n{proc.stdout}\n  stderr:\n{proc.stderr}")
        try:
            check_output(path, run.prefix, checks[run.prefix], Output(proc.stdout))
        except TestFailure as e:
            raise TestFailure(f"{e}\n  command: {command}")


def collect(paths):
    files = []
    for p in paths:
        if os.path.isdir(p):
            files += sorted(os.path.join(p, f) for f in os.listdir(p) if f.endswith(".txt"))
        else:
            files.append(p)
    return files


def main():
    parser = argparse.ArgumentParser(description="Runs braze's text tests.")
    parser.add_argument("--braze-opt", required=True, help="path of the braze-opt executable")
    parser.add_argument("-v", "--verbose", action="store_true", help="print each command")
    parser.add_argument("paths", nargs="+", help="test files or directories of *.txt tests")
    args = parser.parse_args()
    if not os.access(args.braze_opt, os.X_OK):
        print(f"run_lit.py: braze-opt '{args.braze_opt}' is not an executable", file=sys.stderr)
        return 1
    files = collect(args.paths)
    if not files:
        print("run_lit.py: no tests found", file=sys.stderr)
        return 1
    failures = 0
    for path in files:
        try:
            run_test(path, args.braze_opt, args.verbose)
            print(f"PASS: {path}")
        except TestFailure as e:
            failures += 1
            print(f"FAIL: {path}\n{e}\n")
    print(f"\n{len(files) - failures} of {len(files)} tests passed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
