"""An op's decisions kept per layout of a call (_attention/calls.py, _fftconv/calls.py,
_based/step_calls.py).

A model makes the same few calls over and over (a decoding step, a layer's convolution), and
deciding each afresh (argument checks, the kernel family, the kernel lengths a GPU runs) costs
more host time than the kernel launch. A DecisionCache maps a call's key to what was decided for
it (``decided``). The key must hold everything the decision reads of the call, and the kernel
choice (``choice()``); what the decision reads of the process (module globals, constant while a
process runs, which the CPU suite patches) empties the cache whenever it changes.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from . import _config, _extension, _scaffold

T = TypeVar("T")


class DecisionCache:
    """Decisions of ``op``'s calls by key. ``op_facts`` gives what the op's own decision reads
    of the process besides what every op's does (its thresholds, its shared-memory table); at
    ``max_entries`` the cache is emptied (a process makes a handful of layouts)."""

    def __init__(self, op: str, op_facts: Callable[[], tuple], max_entries: int = 256):
        self.max_entries = max_entries
        self._kernel_stack = _config._kernel_stack[op]
        self._env_var = _config.env_var_for(op)
        self._op_facts = op_facts
        self._entries: dict[tuple, object] = {}
        self._facts_seen: tuple = ()

    def choice(self) -> str:
        """The kernel choice as set now, for the key: use_kernel's innermost block, else the
        environment variable's raw value (checked when a miss decides)."""
        stack = self._kernel_stack
        return stack[-1] if stack else _config.environ_value(self._env_var)

    def decided(self, key: tuple | None, decide: Callable[..., T], *args) -> T:
        """The decision kept for ``key``, else ``decide(*args)``, kept under ``key`` unless it
        is None (a call that is not cached). A decide that raises keeps nothing."""
        if key is not None:
            # What every op's decision reads besides the call (the kernels' device type and
            # dtypes, the GPU's capability, the families, the build's ops and targets), and the
            # op's own.
            facts = (_scaffold.KERNEL_DEVICE_TYPE, _scaffold.KERNEL_DTYPES, _scaffold.device_capability,
                     _scaffold._FAMILIES, _scaffold._BY_NAME, _extension.BUILT_OPS, _extension.BUILT_ARCHS,
                     _extension._TARGETS, _extension.has_kernel_image_for,
                     _extension.has_arch_specific_code_for, self._op_facts())
            if facts != self._facts_seen:
                self._entries.clear()
                self._facts_seen = facts
            found = self._entries.get(key)
            if found is not None:
                return found
        decision = decide(*args)
        if key is not None:
            if len(self._entries) >= self.max_entries:
                self._entries.clear()
            self._entries[key] = decision
        return decision

    def __len__(self) -> int:
        return len(self._entries)

    def clear(self) -> None:
        """Forget every decision."""
        self._entries.clear()
