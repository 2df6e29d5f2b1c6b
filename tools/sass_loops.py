"""Where a kernel's local-memory traffic (spills) sits in its control flow, from its SASS.

ptxas -v reports spill bytes per kernel, not where they are: a spill in a producer's per-task
setup costs nothing, the same spill in the consumers' main loop costs every step. This module
rebuilds the control-flow graph of one kernel's SASS (cuobjdump --dump-sass or nvdisasm text),
finds its loops (natural loops of the back edges), and counts the local loads/stores (LDL/STL)
inside the "hot" loops: the innermost loops that issue tensor-core instructions (HGMMA for
wgmma, HMMA for mma.sync). It also splits them by role when the kernel is warp-specialised:
code reachable after setmaxnreg.dec (USETMAXREG.DEALLOC, the producer) or after setmaxnreg.inc
(USETMAXREG.TRYALLOC, the consumers). Used by `kernel_report.py local`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

TENSOR_CORE = ("HGMMA", "HMMA")
LOCAL_MEMORY = ("LDL", "STL")

_INSTRUCTION = re.compile(
    r"/\*([0-9a-f]{4,})\*/\s+(?:@(!?U?P\w+)\s+)?([A-Z][A-Z0-9_.]*)([^;]*);")
_LABEL = re.compile(r"^\s*(\.L_x_\d+):")


@dataclass
class Instruction:
    address: int
    predicate: str | None  # None: always executes
    opcode: str  # with modifiers, e.g. "BRA.U.ANY"
    operands: str

    @property
    def base(self) -> str:
        return self.opcode.split(".")[0]


@dataclass
class Kernel:
    name: str
    arch: str = "?"  # cuobjdump's "arch = sm_90a" before the kernel's cubin
    instructions: list[Instruction] = field(default_factory=list)
    labels: dict[str, int] = field(default_factory=dict)  # nvdisasm's labels -> address


def parse(text: str) -> list[Kernel]:
    """Kernels of a cuobjdump ("Function : name") or nvdisasm (".text.name:") listing."""
    kernels: list[Kernel] = []
    pending_labels: list[str] = []
    arch = "?"
    for line in text.splitlines():
        if match := re.search(r"arch = (sm_\w+)", line):
            arch = match.group(1)
        elif match := re.search(r"Function : (\S+)", line) or re.match(r"\.text\.(\S+):", line):
            kernels.append(Kernel(match.group(1), arch))
            pending_labels = []
        elif not kernels:
            continue
        elif match := _LABEL.match(line):
            pending_labels.append(match.group(1))
        elif match := _INSTRUCTION.search(line):
            address = int(match.group(1), 16)
            kernel = kernels[-1]
            for label in pending_labels:
                kernel.labels[label] = address
            pending_labels = []
            kernel.instructions.append(Instruction(address, match.group(2), match.group(3),
                                                   match.group(4).strip()))
    return kernels


def _branch_target(instruction: Instruction, labels: dict[str, int]) -> int | None:
    """The address a direct branch or call goes to (None if indirect or not a branch)."""
    if match := re.search(r"`\((\.L_x_\d+)\)", instruction.operands):
        return labels.get(match.group(1))
    if match := re.match(r"(?:`\()?(0x[0-9a-f]+)", instruction.operands):
        return int(match.group(1), 16)
    return None


def _always(instruction: Instruction) -> bool:
    return instruction.predicate in (None, "PT", "UPT")


class Graph:
    """Basic blocks of one kernel: start index -> successors (start indices)."""

    def __init__(self, kernel: Kernel):
        code = kernel.instructions
        self.code = code
        index_of = {ins.address: i for i, ins in enumerate(code)}
        leaders = {0}
        targets: dict[int, int | None] = {}
        for i, ins in enumerate(code):
            if ins.base in ("BRA", "CALL", "JMP", "BRX", "JMX", "EXIT", "RET", "KILL"):
                leaders.add(i + 1)
                if ins.base in ("BRA", "CALL", "JMP"):
                    target = _branch_target(ins, kernel.labels)
                    targets[i] = index_of.get(target) if target is not None else None
                    if targets[i] is not None:
                        leaders.add(targets[i])
            # Role boundaries (setmaxnreg) start blocks, so that roles split cleanly.
            if ins.opcode.startswith("USETMAXREG"):
                leaders.add(i)
        self.starts = sorted(s for s in leaders if s < len(code))
        self.block_of = {}
        self.ends: dict[int, int] = {}  # block start -> one past its last instruction
        self.successors: dict[int, list[int]] = {}
        for n, start in enumerate(self.starts):
            end = self.starts[n + 1] if n + 1 < len(self.starts) else len(code)
            self.ends[start] = end
            for i in range(start, end):
                self.block_of[i] = start
            last, successors = code[end - 1], []
            falls_through = True
            if last.base in ("BRA", "JMP", "CALL"):
                target = targets.get(end - 1)
                if target is None:  # indirect: could go anywhere
                    successors.extend(self.starts)
                else:
                    successors.append(target)
                falls_through = last.base == "CALL" or not _always(last)
            elif last.base in ("BRX", "JMX"):
                successors.extend(self.starts)
                falls_through = False
            elif last.base in ("EXIT", "RET", "KILL"):
                falls_through = not _always(last)
            if falls_through and end < len(code):
                successors.append(end)
            self.successors[start] = sorted(set(successors))
        self.predecessors: dict[int, list[int]] = {s: [] for s in self.starts}
        for block, successors in self.successors.items():
            for successor in successors:
                self.predecessors[successor].append(block)

    def block_range(self, start: int) -> range:
        return range(start, self.ends[start])

    def reachable(self, entry: int) -> set[int]:
        seen, stack = {entry}, [entry]
        while stack:
            for successor in self.successors[stack.pop()]:
                if successor not in seen:
                    seen.add(successor)
                    stack.append(successor)
        return seen

    def dominators(self) -> dict[int, set[int]]:
        blocks = self.reachable(0)
        dominators = {b: set(blocks) for b in blocks}
        dominators[0] = {0}
        changed = True
        while changed:
            changed = False
            for block in self.starts:
                if block == 0 or block not in blocks:
                    continue
                incoming = [dominators[p] for p in self.predecessors[block] if p in blocks]
                new = set.intersection(*incoming) | {block} if incoming else {block}
                if new != dominators[block]:
                    dominators[block], changed = new, True
        return dominators

    def loops(self) -> list[set[int]]:
        """Natural loops (one per header, the union over its back edges), as sets of blocks."""
        dominators = self.dominators()
        bodies: dict[int, set[int]] = {}
        for block, successors in self.successors.items():
            for header in successors:
                if block in dominators and header in dominators[block]:  # back edge
                    body = bodies.setdefault(header, {header})
                    stack = [block] if block not in body else []
                    body.add(block)
                    while stack:
                        for predecessor in self.predecessors[stack.pop()]:
                            if predecessor not in body:
                                body.add(predecessor)
                                stack.append(predecessor)
        return list(bodies.values())


@dataclass
class LocalTraffic:
    name: str
    arch: str
    total: int  # LDL/STL instructions in the kernel
    hot: int  # of those, inside the innermost loops that issue tensor-core instructions
    by_role: dict[str, int]  # "producer" / "consumer" / "shared" (reachable from both) / "setup"
    hot_loops: int  # number of such loops


def local_traffic(kernel: Kernel) -> LocalTraffic:
    graph = Graph(kernel)
    code = graph.code

    def count(blocks: set[int], opcodes: tuple[str, ...]) -> int:
        return sum(code[i].base in opcodes for b in blocks for i in graph.block_range(b))

    tensor_loops = [loop for loop in graph.loops() if count(loop, TENSOR_CORE)]
    hot = [loop for loop in tensor_loops if not any(other < loop for other in tensor_loops)]
    hot_blocks = set().union(*hot) if hot else set()

    def entry(prefix: str) -> set[int]:
        blocks = [graph.block_of[i] for i, ins in enumerate(code) if ins.opcode.startswith(prefix)]
        return set().union(*(graph.reachable(b) for b in blocks)) if blocks else set()

    producer, consumer = entry("USETMAXREG.DEALLOC"), entry("USETMAXREG.TRYALLOC")
    by_role = {"producer": 0, "consumer": 0, "shared": 0, "setup": 0}
    for block in graph.starts:
        n = count({block}, LOCAL_MEMORY)
        if n:
            role = ("shared" if block in producer and block in consumer else
                    "producer" if block in producer else
                    "consumer" if block in consumer else "setup")
            by_role[role] += n
    return LocalTraffic(kernel.name, kernel.arch, count(set(graph.starts), LOCAL_MEMORY),
                        count(hot_blocks, LOCAL_MEMORY), by_role, len(hot))


def report(text: str) -> list[LocalTraffic]:
    """Local-memory traffic of every kernel in a listing that has any (the control flow is built
    only for those)."""
    return [local_traffic(kernel) for kernel in parse(text)
            if any(ins.base in LOCAL_MEMORY for ins in kernel.instructions)]
