"""tools/sass_loops.py finds where local-memory traffic sits in a kernel's control flow.

Synthetic listings in the two formats it reads: a warp-specialised kernel whose producer (after
setmaxnreg.dec) spills in its loop, and whose consumers (after setmaxnreg.inc) run a tensor-core
loop nested in a per-task loop; variants put a spill in the consumers' task loop (not hot) or
in their tensor-core loop (hot).
"""

import importlib
import sys
from pathlib import Path

import pytest

TOOLS = Path(__file__).resolve().parents[1] / "tools"


@pytest.fixture(scope="module")
def sass_loops():
    # Imported here, not at collection: tools/ is not a package and not on the path.
    sys.path.insert(0, str(TOOLS))
    try:
        return importlib.import_module("sass_loops")
    finally:
        sys.path.remove(str(TOOLS))


# (label, opcode text) in program order; branches name their target label.
KERNEL = [
    ("", "S2R R0, SR_TID.X"),
    ("", "ISETP.GE.AND P0, PT, R0, 0x100, PT"),
    ("", "@!P0 BRA consumer"),
    ("", "USETMAXREG.DEALLOC.CTAPOOL 0x18"),
    ("producer_loop", "STL [R1], R2"),          # producer spill (per stage)
    ("", "LDL R2, [R1]"),
    ("", "ISETP.NE.AND P1, PT, R2, RZ, PT"),
    ("", "@P1 BRA producer_loop"),
    ("", "EXIT"),
    ("consumer", "USETMAXREG.TRYALLOC.CTAPOOL 0xf0"),
    ("task_loop", "{task_spill}"),                # per task
    ("step_loop", "HGMMA.64x64x16.F32 R24, gdesc[UR4], R24"),
    ("", "{step_spill}"),                         # per step: the hot loop
    ("", "ISETP.NE.AND P2, PT, R3, RZ, PT"),
    ("", "@P2 BRA step_loop"),
    ("", "ISETP.NE.AND P3, PT, R4, RZ, PT"),
    ("", "@P3 BRA task_loop"),
    ("", "EXIT"),
]


def listing(style: str, task_spill: str = "NOP", step_spill: str = "NOP") -> str:
    """The kernel as cuobjdump (absolute branch addresses) or nvdisasm (labels) prints it."""
    rows = [(label, text.format(task_spill=task_spill, step_spill=step_spill)) for label, text in KERNEL]
    address = {label: 16 * i for i, (label, _) in enumerate(rows) if label}
    lines = ["\t\tFunction : kernel" if style == "cuobjdump" else ".text.kernel:"]
    for i, (label, text) in enumerate(rows):
        if "BRA" in text:
            target = text.split()[-1]
            text = text.replace(target, f"{address[target]:#x}" if style == "cuobjdump"
                                else f"`(.L_x_{address[target]})")
        if label and style == "nvdisasm":
            lines.append(f".L_x_{address[label]}:")
        lines.append(f"        /*{16 * i:04x}*/                   {text} ;")
    return "\n".join(lines)


@pytest.mark.parametrize("style", ["cuobjdump", "nvdisasm"])
def test_producer_spills_are_not_in_the_hot_loop(sass_loops, style):
    (row,) = sass_loops.report(listing(style))
    assert (row.total, row.hot, row.hot_loops) == (2, 0, 1)
    assert row.by_role == {"producer": 2, "consumer": 0, "shared": 0, "setup": 0}


@pytest.mark.parametrize("style", ["cuobjdump", "nvdisasm"])
def test_a_per_task_spill_is_not_hot(sass_loops, style):
    (row,) = sass_loops.report(listing(style, task_spill="STL [R1+0x8], R5"))
    assert (row.total, row.hot) == (3, 0)
    assert row.by_role["consumer"] == 1


@pytest.mark.parametrize("style", ["cuobjdump", "nvdisasm"])
def test_a_spill_in_the_tensor_core_loop_is_hot(sass_loops, style):
    (row,) = sass_loops.report(listing(style, step_spill="LDL R7, [R1+0x10]"))
    assert (row.total, row.hot) == (3, 1)


def test_kernels_without_local_memory_are_not_listed(sass_loops):
    text = listing("cuobjdump").replace("STL [R1], R2", "NOP").replace("LDL R2, [R1]", "NOP")
    assert sass_loops.report(text) == []
