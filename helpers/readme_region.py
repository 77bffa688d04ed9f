"""The README's generated regions: text between `<!-- name:start -->` and `<!-- name:end -->`, rewritten in place."""

from __future__ import annotations

from pathlib import Path


def markers(name: str) -> tuple[str, str]:
    """The start and end markers of the README region called name."""
    return f"<!-- {name}:start -->", f"<!-- {name}:end -->"


def replace(text: str, body: str, marks: tuple[str, str]) -> str:
    """text with everything between the markers replaced by body (stripped, one line break each side), markers kept."""
    start, end = text.find(marks[0]), text.find(marks[1])
    if start < 0 or end < start:
        raise ValueError(f"the README has no region between {marks[0]!r} and {marks[1]!r}")
    return text[: start + len(marks[0])] + "\n" + body.strip() + "\n" + text[end:]


def write(readme: Path, body: str, marks: tuple[str, str]) -> bool:
    """Rewrite one generated region of readme with body; True when the file changed."""
    old = Path(readme).read_text()
    new = replace(old, body, marks)
    if new != old:
        Path(readme).write_text(new)
    return new != old
