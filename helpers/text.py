"""Short text for result rows and tables: an error's first line, a message cut to a width, a value in words."""

from __future__ import annotations

from typing import Any


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


def words(value: Any) -> str:
    """A value as a table shows it to a learner: True/False as yes/no, floats to 4 significant digits, a tuple or list
    as its items joined by commas, a dict as 'key: value' pairs, an empty one as 'none' (never Python's brackets and
    quotes)."""
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:.4g}"
    if isinstance(value, tuple | list | set | frozenset):
        items = sorted(value, key=str) if isinstance(value, set | frozenset) else value
        return ", ".join(words(v) for v in items) if items else "none"
    if isinstance(value, dict):
        return "; ".join(f"{k}: {words(v)}" for k, v in value.items()) if value else "none"
    return str(value)
