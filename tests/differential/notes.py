"""hypothesis.note that also works outside a hypothesis test (a fixed case run on its own)."""

from hypothesis import note as _note
from hypothesis.errors import InvalidArgument


def note(text: str) -> None:
    """Printed with the minimal failing example; dropped outside a hypothesis test."""
    try:
        _note(text)
    except InvalidArgument:
        pass
