#!/usr/bin/env python3
"""Checks that no two source files call each other, in a loop of any length.

usage: scripts/check-calls.py BUILD_DIR

For each program and library the build links (every CMakeFiles/*.dir/link.txt
at the top of BUILD_DIR), it reads the symbols each object file defines and
the ones it uses (nm, run once over all of them), draws an arrow from a source file to each file of the
same link whose functions or data it uses, and reports every group of files
that reach each other through those arrows (a strongly connected component
of more than one file), with the symbols that close the loop. A file's own
static functions are its business and do not count.

Exits 1 naming each loop, 0 when there is none, 2 when the build cannot be
read (no link.txt, or nm missing).
"""
import os
import re
import subprocess
import sys


def objects_of(build, unit_dir):
    """The object files a link.txt names, libraries unfolded to their objects."""
    with open(os.path.join(unit_dir, "link.txt")) as f:
        words = f.read().split()
    objs = []
    for w in words:
        w = w.strip('"')
        if w.endswith(".o"):
            objs.append(os.path.join(build, w))
            continue
        m = re.match(r"^(?:.*/)?lib([^/]+?)\.(?:a|so(?:\.[0-9.]+)?)$", w)
        if m and not w.startswith("/"):
            lib_dir = os.path.join(build, "CMakeFiles", m.group(1) + ".dir")
            for root, _, files in os.walk(lib_dir):
                objs += [os.path.join(root, n) for n in files if n.endswith(".o")]
    return objs


def source_of(obj):
    """CMakeFiles/T.dir/controller/db.c.o -> controller/db.c"""
    m = re.search(r"CMakeFiles/[^/]+\.dir/(.+)\.o$", obj)
    return m.group(1) if m else obj


def symbols(objs):
    """{object: (defined, used)} for every object, from one nm run per 200
    objects (nm -A names the object on each line)."""
    table = {o: (set(), set()) for o in objs}
    objs = sorted(objs)
    for i in range(0, len(objs), 200):
        out = subprocess.run(["nm", "-A"] + objs[i:i + 200], capture_output=True, text=True,
                             check=True).stdout
        for line in out.splitlines():
            cut = line.find(".o:")  # "OBJECT.o:VALUE TYPE NAME"
            if cut < 0 or line[:cut + 2] not in table:
                continue
            name, parts = line[:cut + 2], line[cut + 3:].split()
            if len(parts) == 2 and parts[0] == "U":
                table[name][1].add(parts[1])
            elif len(parts) == 3 and parts[1] in "TDBRVWG":
                table[name][0].add(parts[2])
    return table


def loops(graph):
    """Tarjan's strongly connected components of more than one node."""
    index, low, stack, on, out, n = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = n[0]
        n[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    sys.setrecursionlimit(10000)
    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def main():
    if len(sys.argv) != 2:
        print(__doc__.strip().splitlines()[2], file=sys.stderr)
        return 2
    build = os.path.abspath(sys.argv[1])
    cm = os.path.join(build, "CMakeFiles")
    units = sorted(d for d in os.listdir(cm) if os.path.isfile(os.path.join(cm, d, "link.txt"))) \
        if os.path.isdir(cm) else []
    if not units:
        print(f"check-calls: no linked target under {cm} (build first)", file=sys.stderr)
        return 2
    bad = 0
    arrows = 0
    seen = set()
    linked = {u: [o for o in objects_of(build, os.path.join(cm, u)) if os.path.exists(o)]
              for u in units}
    try:
        table = symbols({o for objs in linked.values() for o in objs})
    except (OSError, subprocess.CalledProcessError) as e:
        print(f"check-calls: cannot read the objects with nm: {e}", file=sys.stderr)
        return 2
    for unit in units:
        syms = {source_of(o): table[o] for o in linked[unit]}
        owner = {}
        for src, (defined, _) in syms.items():
            for s in defined:
                owner.setdefault(s, src)
        graph = {src: set() for src in syms}
        why = {}
        for src, (_, used) in syms.items():
            for s in used:
                dst = owner.get(s)
                if dst and dst != src:
                    arrows += dst not in graph[src]
                    graph[src].add(dst)
                    why.setdefault((src, dst), []).append(s)
        for comp in loops(graph):
            key = tuple(comp)
            if key in seen:
                continue
            seen.add(key)
            bad = 1
            print(f"check-calls: {unit.removesuffix('.dir')}: these files call each other in a loop:")
            for a in comp:
                for b in comp:
                    if b in graph[a]:
                        names = sorted(why[(a, b)])
                        more = f" (+{len(names) - 3} more)" if len(names) > 3 else ""
                        print(f"  {a} -> {b}: {', '.join(names[:3])}{more}")
    if not bad:
        print(f"check-calls: no loop in {arrows} calls from one file to another, "
              f"in {len(units)} linked targets")
    return bad


if __name__ == "__main__":
    sys.exit(main())
