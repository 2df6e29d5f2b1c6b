"""Exceptions raised by thunderkittens (besides ValueError/TypeError for bad arguments)."""


class FallbackError(RuntimeError):
    """A call would have fallen back to the PyTorch reference path while strict mode was on.

    Strict mode (``TK_STRICT=1`` or ``with thunderkittens.strict():``) exists for benchmarks and
    tests, where silently timing or checking PyTorch instead of our kernel would be a lie.
    The message says why the kernel could not take the call.
    """
