#!/usr/bin/env python3
"""The library boundary of libferry, checked (run by scripts/test.sh and
tests/integration/test_install.sh).

  scripts/check-exports.py [--lib libferry.so] [--list]

Reads the public headers (include/ferry/*.h) and checks that
  1. every function they declare is marked FERRY_API (include/ferry/export.h), and
     every FERRY_API mark stands on a declaration;
  2. every ferry_* name their comments cite is published: a function, variable,
     type or constant that a public header declares (a comment that points a library
     user at a private helper sends them where they cannot go);
and, with --lib, that
  3. the library's dynamic symbol table (nm -D --defined-only) holds exactly the
     functions and variables the headers declare: nothing private leaks (layers are
     compiled with -fvisibility=hidden), nothing published is missing.
--list prints the published functions and variables, one per line. Exit 1 on any
finding, each printed as FILE: what.
"""
import argparse
import os
import re
import subprocess
import sys

# Public headers whose functions another library provides (libferry-cuda, a library of
# its own so that libferry never links CUDA): not in libferry's symbol table.
OTHER_LIBRARY = {"cuda.h"}
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
INC = os.path.join(ROOT, "include", "ferry")


def strip_comments(text):
    """(code without comments, list of comment texts); strings are left alone."""
    comments = []

    def repl(m):
        s = m.group(0)
        if s.startswith("/*") or s.startswith("//"):
            comments.append(s)
            return " " * len(s) if "\n" not in s else "\n" * s.count("\n")
        return s

    code = re.sub(r'/\*.*?\*/|//[^\n]*|"(?:\\.|[^"\\])*"', repl, text, flags=re.S)
    return code, comments


def drop_preprocessor(code):
    out, cont = [], False
    for line in code.split("\n"):
        if cont or line.lstrip().startswith("#"):
            cont = line.rstrip().endswith("\\")
            out.append("")
            continue
        out.append(line)
    return "\n".join(out)


def statements(code):
    """Top-level statements: text up to each ';' at brace depth 0, with brace blocks
    (struct and enum bodies, extern "C") collapsed to '{}' when nested."""
    code = re.sub(r'extern\s+"C"\s*\{', " ", code)
    out, cur, depth = [], [], 0
    for ch in code:
        if ch == "{":
            depth += 1
            if depth == 1:
                cur.append("{}")
            continue
        if ch == "}":
            depth = max(depth - 1, 0)
            continue
        if depth > 0:
            continue
        if ch == ";":
            out.append(" ".join("".join(cur).split()))
            cur = []
        else:
            cur.append(ch)
    return out


def parse(path):
    """Functions (name -> marked), variables, other names (types, constants, macros)."""
    text = open(path, encoding="utf-8").read()
    code, comments = strip_comments(text)
    macros = set(re.findall(r"^\s*#\s*define\s+(\w+)", code, flags=re.M))
    body = drop_preprocessor(code)
    # extern "C" { ... } is not a real block: drop its closing brace at file end too.
    funcs, variables, names = {}, set(), set(macros)
    for st in statements(body):
        if not st:
            continue
        names.update(re.findall(r"\b(ferry_\w+|FERRY_\w+)\b", st))
        if st.startswith("typedef"):
            continue
        m = re.search(r"\b(ferry_\w+)\s*\(", st)
        if m and "{}" not in st.split("(")[0]:
            funcs[m.group(1)] = st.startswith("FERRY_API ") or " FERRY_API " in st
            continue
        m = re.match(r"(?:FERRY_API\s+)?extern\b.*?\b(ferry_\w+)\s*(\[|$)", st)
        if m:
            variables.add(m.group(1))
    # enum constants inside bodies
    names.update(re.findall(r"\b(FERRY_\w+)\s*[=,]", body))
    return funcs, variables, names, comments, text


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--lib")
    ap.add_argument("--list", action="store_true")
    args = ap.parse_args()
    problems = []
    funcs, variables, names, cited = {}, set(), set(), []
    elsewhere = set()
    for f in sorted(os.listdir(INC)):
        if not f.endswith(".h"):
            continue
        path = os.path.join(INC, f)
        fn, var, nm, comments, text = parse(path)
        for name, marked in fn.items():
            if not marked:
                problems.append(f"include/ferry/{f}: {name} is declared without FERRY_API")
        marks = len(re.findall(r"^FERRY_API\b", text, flags=re.M))
        if marks != len(fn) + len(var) and f != "export.h":
            problems.append(f"include/ferry/{f}: {marks} FERRY_API marks at line starts for "
                            f"{len(fn) + len(var)} declarations (one each, at the start)")
        funcs.update(fn)
        if f in OTHER_LIBRARY:
            elsewhere |= set(fn)
        variables |= var
        names |= nm
        for c in comments:
            cited += [(f, n) for n in re.findall(r"\b(ferry_\w+)(?=\s*\(|\b)", c)]
    published = set(funcs) | variables | names
    for f, n in sorted(set(cited)):
        base = n.rstrip("_")
        # "ferry_backend_*" and the like name a family, not one function.
        if base in published or any(p.startswith(base + "_") for p in published):
            continue
        problems.append(f"include/ferry/{f}: a comment cites {n}, which no public header declares")
    exported = (set(funcs) - elsewhere) | variables
    if args.list:
        print("\n".join(sorted(exported)))
    if args.lib:
        out = subprocess.run(["nm", "-D", "--defined-only", args.lib], check=True,
                             capture_output=True, text=True).stdout
        have = set()
        for line in out.splitlines():
            parts = line.split()
            if len(parts) == 3 and parts[1] in "TWDBRVi":
                have.add(parts[2].split("@")[0])
        for n in sorted(have - exported):
            problems.append(f"{args.lib}: exports {n}, which no public header declares")
        for n in sorted(exported - have):
            problems.append(f"{args.lib}: does not export {n}, declared in include/ferry/")
        if not problems:
            print(f"check-exports: {os.path.basename(args.lib)} exports exactly the "
                  f"{len(set(funcs) - elsewhere)} functions and {len(variables)} variables that "
                  f"include/ferry/ declares (not counting {', '.join(sorted(OTHER_LIBRARY))}: "
                  f"libferry-cuda's)")
    for p in problems:
        print(p, file=sys.stderr)
    if not problems and not args.lib and not args.list:
        print(f"check-exports: {len(funcs)} public functions and {len(variables)} variables, "
              f"each marked FERRY_API; every ferry_* name a public comment cites is published")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
