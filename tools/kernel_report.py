"""Condense compiler output about our kernels into one line per kernel (used by gpu_check.sh).

    python3 tools/kernel_report.py ptxas build.log     # registers, spills, smem per kernel
    python3 tools/kernel_report.py sass sass.txt       # instruction census per kernel
    python3 tools/kernel_report.py local sass.txt      # where local memory (spills) sits

ptxas mode reads `-Xptxas -v` output (TK_PTXAS_VERBOSE=1); sass mode reads
`cuobjdump --dump-sass` output and counts the instructions that show whether a kernel uses what
we think it uses: tensor cores (HMMA = mma.sync, HGMMA = wgmma), ldmatrix (LDSM), cp.async
(LDGSTS), TMA (UTMALDG/UTMASTG), plain shared/global traffic, MUFU (exp2), barriers. Only kernels
with at least one of those are listed. local mode (same input) lists the kernels with local
loads/stores and how many sit in their tensor-core loops (sass_loops.py). Names are demangled
with c++filt when it is installed.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from collections import Counter

import sass_loops

CENSUS = ["HMMA", "HGMMA", "LDSM", "LDGSTS", "UTMALDG", "UTMASTG", "LDS", "STS", "LDG", "STG",
          "LDL", "STL", "MUFU", "SHFL", "BAR", "SYNCS"]


def shorten(name: str) -> str:
    """'void ns::(anonymous namespace)::kernel<T, 64>(args...)' -> 'ns::kernel<T, 64>'."""
    name = name.removeprefix("void ").replace("(anonymous namespace)::", "")
    if name.endswith(")"):  # drop the parameter list: the last top-level parenthesised group
        depth = 0
        for index in range(len(name) - 1, -1, -1):
            depth += {")": 1, "(": -1}.get(name[index], 0)
            if depth == 0:
                return name[:index]
    return name


def demangle(names: list[str]) -> list[str]:
    if not names or shutil.which("c++filt") is None:
        return names
    result = subprocess.run(["c++filt"], input="\n".join(names), capture_output=True, text=True)
    lines = result.stdout.splitlines()
    return [shorten(line) for line in lines] if len(lines) == len(names) else names


def ptxas(text: str) -> list[str]:
    rows, function, arch, spills = [], "?", "?", "?"
    for line in text.splitlines():
        if match := re.search(r"Compiling entry function '([^']+)' for '(sm_\w+)'", line):
            function, arch, spills = match.group(1), match.group(2), "?"
        elif match := re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", line):
            spills = f"{match.group(1)}/{match.group(2)}"
        elif match := re.search(r"Used (\d+) registers", line):
            smem = re.search(r"(\d+) bytes smem", line)
            rows.append((arch, match.group(1), spills, smem.group(1) if smem else "0", function))
    names = demangle([row[4] for row in rows])
    return [f"{arch:<7} regs={regs:<4} spill(st/ld)={spill:<9} smem={smem:<7} {name}"
            for (arch, regs, spill, smem, _), name in zip(rows, names)]


def sass(text: str) -> list[str]:
    counts: dict[tuple[str, str], Counter] = {}
    arch, key = "?", None
    for line in text.splitlines():
        if match := re.search(r"arch = (sm_\w+)", line):
            arch = match.group(1)
        elif match := re.search(r"Function : (\S+)", line):
            key = (arch, match.group(1))
            counts.setdefault(key, Counter())
        elif key and (match := re.search(r"/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_]*)", line)):
            counts[key][match.group(1)] += 1
    keys = [k for k, c in counts.items() if any(c[op] for op in CENSUS)]
    names = demangle([name for _, name in keys])
    return [f"{arch:<7} " + " ".join(f"{op}={counts[(arch, raw)][op]}" for op in CENSUS
                                     if counts[(arch, raw)][op]) + f"  {name}"
            for (arch, raw), name in zip(keys, names)]


def local(text: str) -> list[str]:
    rows = sass_loops.report(text)
    names = demangle([row.name for row in rows])
    return [f"{row.arch:<7} local={row.total:<4} in-hot-loop={row.hot:<3} "
            f"({' '.join(f'{role}={n}' for role, n in row.by_role.items() if n)}) {name}"
            for row, name in zip(rows, names)]


MODES = {"ptxas": ptxas, "sass": sass, "local": local}


def main() -> int:
    if len(sys.argv) != 3 or sys.argv[1] not in MODES:
        print(__doc__, file=sys.stderr)
        return 2
    with open(sys.argv[2], errors="replace") as handle:
        text = handle.read()
    for row in MODES[sys.argv[1]](text):
        print(row)
    return 0


if __name__ == "__main__":
    sys.exit(main())
