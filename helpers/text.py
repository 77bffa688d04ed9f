"""Short text for result rows and tables: an error's first line, a message cut to a width."""

from __future__ import annotations


def first_line(err: BaseException) -> str:
    """'ExceptionType: the first line of its message'."""
    text = str(err).strip()
    return f"{type(err).__name__}: {text.splitlines()[0] if text else ''}"


def cut(text: str, limit: int) -> str:
    """text, or its first limit - 1 characters and an ellipsis when it is longer."""
    return text if len(text) <= limit else text[: limit - 1] + "…"


def count(n: int, noun: str, plural: str = "") -> str:
    """'1 graph', '3 graphs', '0 graph breaks': n and the noun in the number n takes (plural: when not noun + 's')."""
    return f"{n} {noun if n == 1 else plural or noun + 's'}"
