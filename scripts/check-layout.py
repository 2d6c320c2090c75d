#!/usr/bin/env python3
"""The layout check of the acemq crate: `scripts/check-layout.py [--strict] [--graph]`.

Reads every `crates/acemq/src/**/*.rs`, finds the crate paths each file uses (`use crate::…`,
`use super::…`, `use self::…`, a `use` of a child module, and `crate::…` / `super::…` written
inline), and fails (exit 1, with a list) when:

  (a) a file under `transport/` uses a module outside `transport/` that is not in
      TRANSPORT_MAY_USE: the transport seam is the ground floor, and what it stands on is
      listed here;
  (b) the modules depend on each other in a circle that spans two top-level modules of the
      crate (a folder such as `consume/`, or a single file such as `engine.rs`; `lib.rs` is
      `lib`), found as strongly connected components of the top-level graph;
  (c) a `.rs` file is over MAX_LINES lines and none of its first REASON_WITHIN lines says
      why with a line containing `over 600 lines:`.

What it counts:
  - Code only: comments (doc comments and their intra-doc links included) and string
    literals are blanked before paths are read, so a doc link is not an import.
  - Items under `#[cfg(test)]` are skipped (a `mod tests { … }` block, or a `mod tests;`
    file and everything below it); how many were skipped is printed (`--tests` reads them
    too, to see what tests reach for). Check (c) still counts test files.
  - `super::` and `self::` are read from the module they are written in, an inline
    `mod name { … }` block included.
  - A path is resolved to the longest module prefix that is a file of the crate, and a
    name re-exported by `lib.rs` (`crate::Error`) to the module it comes from.
  - The graph is at top-level granularity: every file of `transport/` is `transport`.

EXEMPT lists code that other work is rewriting, and KNOWN_CIRCLES the circles left on
purpose (each with its reason): what they cover is printed as "exempt" or "known" and does
not fail the check (`--strict` makes it fail too). Shrink both lists as that work lands.
`--graph` also prints the top-level import graph.

Standard library only.
"""

import argparse
import os
import re
import sys
from collections import defaultdict

# What `transport/` may use outside itself. An entry is a module path; `name::*` also
# admits everything below it. Each is a leaf that does not use `transport` (check (b)
# would show the circle otherwise).
TRANSPORT_MAY_USE = [
    "headers",  # the header table and its values
    "topology::*",  # the declarations a transport declares, and the short-string rule
    "observe",  # the family's transport names (`rabbitmq`, `memory`), not `observe::trace`
    "observe::metrics::*",  # metric names (the recovery counter)
    "util",  # lock helpers
]

# Code being rewritten elsewhere: reported, not failed (see the module doc).
EXEMPT = []

# Circles that cross a top-level boundary on purpose or until other work removes them:
# each is the set of top-level modules and why. Reported as "known", not failed
# (`--strict` fails them too).
KNOWN_CIRCLES = []

MAX_LINES = 600
REASON = "over 600 lines:"
REASON_WITHIN = 15

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SRC = os.path.join(ROOT, "crates", "acemq", "src")


def module_of(rel):
    """The module path (a tuple) of a file, from its path under src/."""
    parts = rel[:-3].split("/")
    if parts == ["lib"]:
        return ()
    if parts[-1] == "mod":
        parts = parts[:-1]
    return tuple(parts)


def top(module):
    return module[0] if module else "lib"


def exempt(rel):
    return any(rel.startswith(e) for e in EXEMPT)


def blank(text):
    """Comments and string/char literals replaced by spaces (newlines kept)."""
    out = []
    i, n = 0, len(text)

    def keep_lines(s):
        return "".join(c if c == "\n" else " " for c in s)

    while i < n:
        c = text[i]
        if text.startswith("//", i):
            j = text.find("\n", i)
            j = n if j < 0 else j
            out.append(" " * (j - i))
            i = j
        elif text.startswith("/*", i):
            depth, j = 1, i + 2
            while j < n and depth:
                if text.startswith("/*", j):
                    depth, j = depth + 1, j + 2
                elif text.startswith("*/", j):
                    depth, j = depth - 1, j + 2
                else:
                    j += 1
            out.append(keep_lines(text[i:j]))
            i = j
        elif c == "r" and re.match(r'r#*"', text[i:i + 260]) and not (
            i and (text[i - 1].isalnum() or text[i - 1] == "_")
        ):
            m = re.match(r'r(#*)"', text[i:])
            end = '"' + m.group(1)
            j = text.find(end, i + len(m.group(0)))
            j = n if j < 0 else j + len(end)
            out.append(keep_lines(text[i:j]))
            i = j
        elif c == '"':
            j = i + 1
            while j < n and text[j] != '"':
                j += 2 if text[j] == "\\" else 1
            j += 1
            out.append(keep_lines(text[i:j]))
            i = j
        elif c == "'":
            # A char literal ('x', '\n', '\u{..}') or a lifetime ('a).
            if i + 1 < n and text[i + 1] == "\\":
                j = text.find("'", i + 2)
                j = n if j < 0 else j + 1
                out.append(keep_lines(text[i:j]))
                i = j
            elif i + 2 < n and text[i + 2] == "'":
                out.append("   ")
                i += 3
            else:
                out.append(c)
                i += 1
        else:
            out.append(c)
            i += 1
    return "".join(out)


CFG_TEST = re.compile(r"#\[cfg\(test\)\]")


def end_of_item(text, start):
    """Where the item starting at `start` ends: its `;` or its closing brace."""
    depth, j, n = 0, start, len(text)
    while j < n:
        c = text[j]
        if c == "{":
            depth += 1
        elif c == "}":
            depth -= 1
            if depth == 0:
                return j + 1
        elif c == ";" and depth == 0:
            return j + 1
        j += 1
    return n


def strip_tests(text):
    """Blanks `#[cfg(test)]` items; returns the text, the count, and `mod x;` test files."""
    count, files = 0, []
    while True:
        m = CFG_TEST.search(text)
        if not m:
            return text, count, files
        j = m.end()
        # Further attributes of the same item.
        while True:
            k = re.match(r"\s*#\[[^\]]*\]", text[j:])
            if not k:
                break
            j += k.end()
        file_mod = re.match(r"\s*(?:pub(?:\([^)]*\))?\s+)?mod\s+(\w+)\s*;", text[j:])
        if file_mod:
            files.append(file_mod.group(1))
        end = end_of_item(text, j)
        count += 1
        text = text[: m.start()] + "".join(
            ch if ch == "\n" else " " for ch in text[m.start():end]
        ) + text[end:]


def use_tree(s):
    """The paths of one `use` tree (`a::{b, c::d as e}` → [a,b], [a,c,d])."""
    tokens = re.findall(r"::|[{},*]|\w+", s)
    pos = 0

    def tree(prefix):
        nonlocal pos
        paths = []
        path = list(prefix)
        while pos < len(tokens):
            t = tokens[pos]
            if t == "::":
                pos += 1
            elif t == "{":
                pos += 1
                while pos < len(tokens) and tokens[pos] != "}":
                    if tokens[pos] == ",":
                        pos += 1
                        continue
                    paths += tree(path)
                pos += 1
                return paths
            elif t in ",}":
                break
            elif t == "as":
                pos += 2
            elif t == "*":
                pos += 1
            else:
                path.append(t)
                pos += 1
        if path and path[-1] == "self":
            path = path[:-1]
        paths.append(path)
        return paths

    return tree([])


USE = re.compile(r"\buse\s+([^;]+);")
INLINE_MOD = re.compile(r"\bmod\s+(\w+)\s*\{")
INLINE = re.compile(r"(?<![\w:$])(crate|super)((?:::\w+)+)")


def line_of(text, index):
    return text.count("\n", 0, index) + 1


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--strict", action="store_true", help="EXEMPT fails too")
    parser.add_argument("--graph", action="store_true", help="print the top-level graph")
    parser.add_argument(
        "--tests", action="store_true", help="read #[cfg(test)] items too (not a gate)"
    )
    args = parser.parse_args()

    files = {}
    for dirpath, _, names in os.walk(SRC):
        for name in names:
            if name.endswith(".rs"):
                full = os.path.join(dirpath, name)
                rel = os.path.relpath(full, SRC).replace(os.sep, "/")
                with open(full, encoding="utf-8") as f:
                    files[rel] = f.read()
    modules = {module_of(rel): rel for rel in files}

    # Names lib.rs re-exports from a module of the crate (`pub use error::Error;`).
    lib_reexports = {}
    for m in USE.finditer(blank(files.get("lib.rs", ""))):
        for path in use_tree(m.group(1)):
            if len(path) >= 2 and (path[0],) in modules:
                lib_reexports[path[-1]] = (path[0],)

    def resolve(segments):
        """The module a crate path names (the root when no module prefix matches)."""
        for k in range(len(segments), 0, -1):
            if tuple(segments[:k]) in modules:
                return tuple(segments[:k])
        if segments and segments[0] in lib_reexports:
            return lib_reexports[segments[0]]
        return ()

    def absolute(here, path):
        """A `use`/inline path made absolute from module `here`, or None (external)."""
        if not path:
            return None
        head, rest = path[0], path[1:]
        if head == "crate":
            return rest
        if head == "self":
            return list(here) + rest
        if head == "super":
            base, rest = list(here), list(path)
            while rest and rest[0] == "super":
                base, rest = base[:-1], rest[1:]
            return base + rest
        if tuple(list(here) + [head]) in modules:
            return list(here) + path
        return None

    test_modules = set()
    skipped = 0
    edges = []  # (source rel, line, source module, target module)
    cleaned = {}
    inline = {}  # rel -> [(start, end, module path)] of its `mod name { … }` blocks
    for rel, text in sorted(files.items()):
        if args.tests:
            body, count, test_files = blank(text), 0, []
        else:
            body, count, test_files = strip_tests(blank(text))
        skipped += count
        here = module_of(rel)
        for name in test_files:
            test_modules.add(here + (name,))
        cleaned[rel] = body
        spans = []
        for m in INLINE_MOD.finditer(body):
            end = end_of_item(body, m.start())
            outer = [sp for sp in spans if sp[0] <= m.start() < sp[1]]
            base = outer[-1][2] if outer else here
            spans.append((m.start(), end, base + (m.group(1),)))
            modules.setdefault(base + (m.group(1),), rel)
        inline[rel] = spans

    def module_at(rel, index):
        """The module a position of a file is in (its file's, or an inline `mod` block's)."""
        inner = [sp for sp in inline[rel] if sp[0] <= index < sp[1]]
        return inner[-1][2] if inner else module_of(rel)

    for rel, body in sorted(cleaned.items()):
        if any(module_of(rel)[: len(t)] == t for t in test_modules):
            continue
        consumed = []
        for m in USE.finditer(body):
            consumed.append((m.start(), m.end()))
            here = module_at(rel, m.start())
            for path in use_tree(m.group(1)):
                target = absolute(here, path)
                if target is not None:
                    edges.append((rel, line_of(body, m.start()), here, resolve(target)))
        rest = list(body)
        for a, b in consumed:
            rest[a:b] = " " * (b - a)
        rest = "".join(rest)
        for m in INLINE.finditer(rest):
            here = module_at(rel, m.start())
            path = [m.group(1)] + m.group(2).split("::")[1:]
            target = absolute(here, path)
            if target is not None:
                edges.append((rel, line_of(rest, m.start()), here, resolve(target)))

    failures = 0
    exempt_findings = []
    known_findings = []

    def report(title, findings):
        nonlocal failures
        fail = [f for f in findings if args.strict or not f[0]]
        held = [f for f in findings if f[0] and not args.strict]
        print(f"{title}: {'none' if not fail else len(fail)}")
        for _, text in fail:
            print(f"  {text}")
        failures += len(fail)
        exempt_findings.extend((title, text) for _, text in held)

    # (a) the transport seam's imports.
    def allowed(target):
        name = "::".join(target)
        for entry in TRANSPORT_MAY_USE:
            if entry.endswith("::*"):
                if name == entry[:-3] or name.startswith(entry[:-1]):
                    return True
            elif name == entry:
                return True
        return False

    upward = []
    for rel, line, here, target in edges:
        if top(here) == "transport" and top(target) != "transport" and not allowed(target):
            shown = "::".join(target) or "lib"
            upward.append((exempt(rel), f"transport/{rel[len('transport/'):]}:{line} uses {shown}"))
    report("(a) transport/ using a module outside it and not in TRANSPORT_MAY_USE", upward)

    # (b) circles across top-level modules, over all edges and over non-exempt ones.
    def circles(edge_list):
        graph = defaultdict(set)
        for _, _, here, target in edge_list:
            a, b = top(here), top(target)
            if a != b:
                graph[a].add(b)
        index, low, stack, on, sccs = {}, {}, [], set(), []
        counter = [0]

        def visit(v):
            index[v] = low[v] = counter[0]
            counter[0] += 1
            stack.append(v)
            on.add(v)
            for w in sorted(graph[v]):
                if w not in index:
                    visit(w)
                    low[v] = min(low[v], low[w])
                elif w in on:
                    low[v] = min(low[v], index[w])
            if low[v] == index[v]:
                scc = []
                while True:
                    w = stack.pop()
                    on.discard(w)
                    scc.append(w)
                    if w == v:
                        break
                if len(scc) > 1:
                    sccs.append(sorted(scc))

        sys.setrecursionlimit(10_000)
        for v in sorted(set(graph) | {w for ws in graph.values() for w in ws}):
            if v not in index:
                visit(v)
        return graph, sccs

    def describe(scc, edge_list):
        members = set(scc)
        ties = defaultdict(list)
        for rel, line, here, target in edge_list:
            a, b = top(here), top(target)
            if a != b and a in members and b in members:
                tie = f"{rel}:{line} -> {'::'.join(target) or 'lib'}"
                if tie not in ties[(a, b)]:
                    ties[(a, b)].append(tie)
        lines = [" <-> ".join(scc)]
        for (a, b), where in sorted(ties.items()):
            shown = ", ".join(where[:4]) + (f", … ({len(where)} in all)" if len(where) > 4 else "")
            lines.append(f"      {a} -> {b}: {shown}")
        return "\n".join(lines)

    strict_edges = [e for e in edges if not exempt(e[0])]
    graph, all_sccs = circles(edges)
    _, kept_sccs = circles(strict_edges)
    findings = []
    for s in kept_sccs:
        known = [why for members, why in KNOWN_CIRCLES if members == set(s)]
        if known and not args.strict:
            known_findings.append(f"{describe(s, strict_edges)}\n      known: {known[0]}")
        else:
            findings.append((False, describe(s, strict_edges)))
    for s in all_sccs:
        if not any(set(k) == set(s) for k in kept_sccs):
            findings.append((True, describe(s, edges)))
    report("(b) import circles spanning two top-level modules", findings)

    # (c) long files.
    long_files = []
    for rel, text in sorted(files.items()):
        lines = text.split("\n")
        count = len(lines) - (1 if text.endswith("\n") else 0)
        if count > MAX_LINES and not any(REASON in l for l in lines[:REASON_WITHIN]):
            long_files.append((exempt(rel), f"{rel}: {count} lines, no `{REASON}` reason in its first {REASON_WITHIN} lines"))
    report(f"(c) files over {MAX_LINES} lines without a reason", long_files)

    if known_findings:
        print("known circles (KNOWN_CIRCLES), not failing:")
        for text in known_findings:
            print(f"  {text}")
    if exempt_findings:
        print(f"exempt (being rewritten: {', '.join(EXEMPT)}), not failing:")
        for title, text in exempt_findings:
            print(f"  {title[:3]} {text}")
    if args.graph:
        print("top-level graph (module -> modules it uses):")
        for a in sorted(graph):
            print(f"  {a} -> {', '.join(sorted(graph[a]))}")
    print(
        f"checked {len(files)} files, {len(edges)} crate paths "
        f"({skipped} #[cfg(test)] items skipped, with {len(test_modules)} test-only files)"
    )
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
