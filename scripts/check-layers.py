#!/usr/bin/env python3
"""Check the #include graph of ferry's C sources against the layering.

Reads every `#include "..."` (and `#include <ferry/...>`) in the C/CUDA
sources, resolves it to a file in the tree, and fails (exit 1) on:
  - an include from one layer into a layer it may not use,
  - the extra rules listed under ALLOWED below,
  - a cycle in the file-level include graph,
  - an include that resolves nowhere, or a file/public header with no layer.

With --doc FILE it also fails when FILE (docs/architecture.md) quotes an output
other than today's in its block after "$ python3 scripts/check-layers.py", so the
figures there cannot go stale; --update-doc FILE rewrites that block.

Usage: scripts/check-layers.py [--dot | --quiet] [--doc FILE | --update-doc FILE]
"""

import argparse
import os
import posixpath
import re
import subprocess
import sys
from collections import deque

# --------------------------------------------------------------------------
# The layering.  This table is the one place it is written down.
#
# LAYER_RULES: (path, layer), first match wins.  A path ending in "/" is a
# directory prefix; anything else is an exact file.
# --------------------------------------------------------------------------
LAYER_RULES = [
    ("server/main.c", "app"),
    ("worker/main.c", "app"),
    ("server/ctl/", "app"),
    ("common/core/", "core"),
    ("common/ops/", "ops"),
    ("include/ferry/export.h", "core"),
    ("include/ferry/status.h", "core"),
    ("include/ferry/log.h", "core"),
    ("include/ferry/version.h", "core"),
    ("common/tensor/", "tensor"),
    ("common/backend/cpu/", "tensor"),
    ("include/ferry/tensor.h", "tensor"),
    ("include/ferry/backend.h", "tensor"),
    ("common/backend/cuda/", "cuda"),
    ("include/ferry/cuda.h", "cuda"),
    ("common/nn/", "nn"),
    ("include/ferry/nn.h", "nn"),
    ("include/ferry/autograd.h", "nn"),
    ("include/ferry/params.h", "nn"),
    ("optim/", "optim"),
    ("include/ferry/optim.h", "optim"),
    ("common/rpc/", "rpc"),
    ("proto/", "rpc"),
    ("common/dist/", "dist"),
    ("include/ferry/ferry.h", "dist"),
    ("server/", "ps"),
    ("worker/", "trainer"),
    ("bench/", "app"),
    ("tests/", "app"),
    ("examples/", "app"),
]

# Headers generated at build time (not in the tree) and their layer.
GENERATED = {"ferry.pb-c.h": "rpc", "health.pb-c.h": "rpc"}

# Layers in order (low to high) and what each may include besides itself.
LAYERS = ["core", "tensor", "cuda", "nn", "optim", "rpc", "dist", "ops", "ps", "trainer", "app"]
ALLOWED = {
    "core": [],
    "tensor": ["core"],
    "cuda": ["core", "tensor"],
    "nn": ["core", "tensor"],
    "optim": ["core", "tensor", "nn"],
    "rpc": ["core"],
    "dist": ["core", "tensor", "nn", "optim", "rpc"],
    "ops": ["core"],
    "ps": ["core", "tensor", "nn", "optim", "rpc", "ops"],
    "trainer": ["core", "tensor", "nn", "optim", "dist", "ops"],
    "app": LAYERS,
}
# Extra rules (enforced in check_include):
#   1. examples/ may include only public headers (built against the install).
#   2. trainer may use dist only through public headers, never common/dist/.
#   3. a public header may include only other public headers (installed).
#   4. no cycle in the file-level include graph.
PUBLIC = "include/ferry/"
EXAMPLES = "examples/"

# --------------------------------------------------------------------------
# Sources and include resolution
# --------------------------------------------------------------------------
SOURCE_DIRS = ("common/", "optim/", "server/", "worker/", "include/",
               "bench/", "tests/", "examples/")
SOURCE_EXTS = (".c", ".h", ".cu", ".cuh")
SKIP_DIRS = ("tests/fuzz/corpus/",)
SEARCH_DIRS = ["include", "common", ""]  # after the including file's dir
EXTRA_SEARCH = {"tests/": ["tests/support"]}  # mirrors tests/CMakeLists.txt

INCLUDE_RE = re.compile(r'^\s*#\s*include\s*(?:"([^"]+)"|<(ferry/[^>]+)>)')


def layer_of(path):
    if path in GENERATED:
        return GENERATED[path]
    for pattern, layer in LAYER_RULES:
        if path == pattern or (pattern.endswith("/") and path.startswith(pattern)):
            return layer
    return None


def is_public(path):
    return path.startswith(PUBLIC)


def tree_files(root):
    """Tracked + untracked-not-ignored files that exist, outside build*/."""
    out = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"],
                         cwd=root, check=True, capture_output=True).stdout
    files = set()
    for path in out.decode().split("\0"):
        if path and not path.split("/")[0].startswith("build") \
                and os.path.isfile(os.path.join(root, path)):
            files.add(path)
    return files


def resolve(src, name, angled, files):
    if angled:  # <ferry/...>
        candidates = ["include/" + name]
    else:
        dirs = [posixpath.dirname(src)] + SEARCH_DIRS
        for prefix, extra in EXTRA_SEARCH.items():
            if src.startswith(prefix):
                dirs += extra
        candidates = [posixpath.normpath(posixpath.join(d, name)) for d in dirs]
    for cand in candidates:
        if cand in files:
            return cand
    return None


# --------------------------------------------------------------------------
# Checks
# --------------------------------------------------------------------------
def check_include(src, line, name, dst, out):
    """Append the layering violations of one resolved include to out."""
    where = "%s:%d: " % (src, line)
    lf, lt = layer_of(src), layer_of(dst)
    if lf and lt and lf != lt and lt not in ALLOWED[lf]:
        kind = "upward" if LAYERS.index(lt) > LAYERS.index(lf) else "disallowed"
        out.append(where + '%s include "%s" (layer %s -> %s)' % (kind, name, lf, lt))
    if src.startswith(EXAMPLES) and not is_public(dst):
        out.append(where + 'example includes non-public header "%s" (%s)' % (name, dst))
    if lf == "trainer" and lt == "dist" and not is_public(dst):
        out.append(where + 'trainer includes private dist header "%s" '
                   '(use the public API in include/ferry/)' % name)
    if is_public(src) and not is_public(dst):
        out.append(where + 'public header includes non-public header "%s" (%s)'
                   % (name, dst))


def bfs_parents(graph, start):
    """Breadth-first tree from start: {node: predecessor} for every node
    reachable in one or more steps (start itself only if it is on a cycle)."""
    parent, queue = {}, deque([start])
    while queue:
        v = queue.popleft()
        for w in sorted(graph[v]):
            if w not in parent:
                parent[w] = v
                queue.append(w)
    return parent


def find_cycles(graph):
    """One shortest cycle (a -> ... -> a) per strongly connected component."""
    reach = {v: bfs_parents(graph, v) for v in graph}
    done, cycles = set(), []
    for start in sorted(graph):
        parent = reach[start]
        if start in done or start not in parent:
            continue
        done.update(w for w in parent if start in reach[w])  # its component
        path, v = [start], parent[start]
        while v != start:
            path.append(v)
            v = parent[v]
        cycles.append([start] + path[:0:-1] + [start])
    return cycles


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    mode = ap.add_mutually_exclusive_group()
    mode.add_argument("--dot", action="store_true", help="print the layer graph as Graphviz")
    mode.add_argument("--quiet", action="store_true", help="print only violations")
    doc = ap.add_mutually_exclusive_group()
    doc.add_argument("--doc", metavar="FILE", help="fail if FILE quotes another output")
    doc.add_argument("--update-doc", metavar="FILE", help="rewrite FILE's quoted output")
    args = ap.parse_args()

    root = subprocess.run(["git", "rev-parse", "--show-toplevel"], check=True,
                          capture_output=True, text=True).stdout.strip()
    files = tree_files(root)
    sources = sorted(p for p in files
                     if p.startswith(SOURCE_DIRS) and p.endswith(SOURCE_EXTS)
                     and not p.startswith(SKIP_DIRS))

    violations, graph, edge_line, layer_edges = [], {}, {}, set()
    for src in sources:
        if layer_of(src) is None:
            what = "unassigned public header" if is_public(src) else "file not assigned to a layer"
            violations.append("%s: %s (add it to LAYER_RULES)" % (src, what))
        graph.setdefault(src, set())
        with open(os.path.join(root, src), encoding="utf-8", errors="replace") as f:
            for line, text in enumerate(f, 1):
                m = INCLUDE_RE.match(text)
                if not m:
                    continue
                name = m.group(1) or m.group(2)
                dst = resolve(src, name, m.group(2) is not None, files)
                if dst is None and name in GENERATED:
                    dst = name
                if dst is None:
                    violations.append('%s:%d: unresolved include "%s"' % (src, line, name))
                    continue
                graph[src].add(dst)
                graph.setdefault(dst, set())
                edge_line.setdefault((src, dst), line)
                check_include(src, line, name, dst, violations)
                lf, lt = layer_of(src), layer_of(dst)
                if lf and lt and lf != lt and "app" not in (lf, lt):
                    layer_edges.add((lf, lt))

    for cycle in find_cycles(graph):
        line = edge_line.get((cycle[0], cycle[1]), 0)
        violations.append("%s:%d: include cycle: %s" % (cycle[0], line, " -> ".join(cycle)))

    layers = [l for l in LAYERS if l != "app"]
    if args.dot:
        print("digraph layers {")
        print("  rankdir=BT;")
        for l in layers:
            print('  "%s";' % l)
        for lf, lt in sorted(layer_edges, key=lambda e: (LAYERS.index(e[0]), LAYERS.index(e[1]))):
            style = "" if lt in ALLOWED[lf] else " [color=red]"
            print('  "%s" -> "%s"%s;' % (lf, lt, style))
        print("}")
        return 1 if violations else 0
    out = []
    n_edges = sum(len(dsts) for dsts in graph.values())
    out.append("files:       %d" % len(sources))
    out.append("file edges:  %d" % n_edges)
    out.append("layer edges: %d" % len(layer_edges))
    width = max(len(l) for l in layers)
    for l in layers:
        uses = [lt + ("" if lt in ALLOWED[l] else "(!)")
                for lt in LAYERS if (l, lt) in layer_edges]
        out.append("  %-*s -> %s" % (width, l, " ".join(uses) or "-"))
    out.append("violations:  %d" % len(violations))
    out.append("OK" if not violations else "FAIL")
    doc_path = args.doc or args.update_doc
    if doc_path:
        doc_problem = quoted_output(os.path.join(root, doc_path), out, args.update_doc)
        if doc_problem:
            violations.append(doc_problem)
    if not args.quiet:
        print("\n".join(out[:-2]))
        print("violations:  %d" % len(violations))

    for v in violations:
        print(v)
    if not args.quiet:
        print("FAIL" if violations else "OK")
    return 1 if violations else 0


DOC_PROMPT = "$ python3 scripts/check-layers.py"


def quoted_output(path, out, update):
    """None if the fenced block after DOC_PROMPT in path is `out` (or was rewritten
    to it with update), else what is wrong."""
    with open(path, encoding="utf-8") as f:
        text = f.read()
    start = text.find("```\n" + DOC_PROMPT + "\n")
    if start < 0:
        return "%s: no block quoting '%s' to check" % (path, DOC_PROMPT)
    body = start + len("```\n" + DOC_PROMPT + "\n")
    end = text.find("```", body)
    if end < 0:
        return "%s: the block quoting '%s' is not closed" % (path, DOC_PROMPT)
    want = "\n".join(out) + "\n"
    if text[body:end] == want:
        return None
    if update:
        with open(path, "w", encoding="utf-8") as f:
            f.write(text[:body] + want + text[end:])
        return None
    return ("%s quotes an older output of this script (%s); run scripts/check-layers.py "
            "--update-doc %s" % (os.path.relpath(path), text[body:end].split("\n")[0].strip(),
                                 os.path.relpath(path)))


if __name__ == "__main__":
    sys.exit(main())
