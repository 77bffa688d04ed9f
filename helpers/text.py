"""Short text for result rows and tables: an error's first line, a message cut to a width."""

from __future__ import annotations


def first_line(err: BaseException) -> str:
    """'ExceptionType: the first line of its message'."""
    text = str(err).strip()
    return f"{type(err).__name__}: {text.splitlines()[0] if text else ''}"


def cut(text: str, limit: int) -> str:
    """text, or its first limit - 1 characters and an ellipsis when it is longer."""
    return text if len(text) <= limit else text[: limit - 1] + "…"
