"""The final Checks cell of a notebook: its claims in one table (claim, measured, expected, holds), kept as a row.

A notebook adds each claim where its evidence is ready to hand and evaluates them all at the end; the lesson cells
stay free of asserts. The claim that every image shown reads as its prompt's digit is added by itself (gallery). The table is recorded as the row "checks", so the notebook's test reads every claim back."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pandas as pd

from helpers import gallery, text
from helpers.results import ResultWriter


class ChecksFailed(AssertionError):
    """One or more of a notebook's claims did not hold."""


@dataclass(frozen=True)
class Claim:
    """One claim: what is claimed, what was measured, what was expected, and whether it holds."""

    claim: str
    measured: str
    expected: str
    holds: bool


def at_most(bound: float, unit: str = "") -> str:
    """An expected upper bound in words: '<= 0.03 (relative L2)', or '0, bit for bit (relative L2)' where it is 0."""
    said = "0, bit for bit" if bound == 0 else f"<= {bound:g}"
    return f"{said} ({unit})" if unit else said


class Checks:
    """A notebook's claims, gathered as they are computed and evaluated together in the Checks cell."""

    def __init__(self) -> None:
        """An empty list of claims."""
        self.claims: list[Claim] = []

    def add(self, claim: str, measured: Any, expected: Any, holds: bool) -> None:
        """Add one claim; holds is the comparison itself (a NaN comparison is False, so it fails)."""
        if any(c.claim == claim for c in self.claims):
            raise ValueError(f"claim {claim!r} is already listed; name each claim once")
        self.claims.append(Claim(claim, text.words(measured), text.words(expected), bool(holds)))

    def table(self) -> pd.DataFrame:
        """The claims as a table: claim, measured, expected, holds (yes / no)."""
        table = pd.DataFrame([c.__dict__ for c in self.claims], columns=["claim", "measured", "expected", "holds"])
        return table.assign(holds=table["holds"].map(text.words)).set_index("claim")

    def evaluate(self, writer: ResultWriter | None = None) -> pd.DataFrame:
        """Record the table as the row 'checks' (when a writer is given), return it, and raise ChecksFailed naming
        every claim that does not hold; an empty list raises too (a Checks cell that checks nothing is a defect)."""
        shown = gallery.claim(writer) if writer is not None else None
        if shown is not None and not any(c.claim == shown[0] for c in self.claims):
            self.add(*shown)  # the images the notebook showed, judged as they were shown
        if not self.claims:
            raise ChecksFailed("no claim was added: the Checks cell checks nothing")
        failed = [c for c in self.claims if not c.holds]
        if writer is not None:
            writer.record("checks", status="ok" if not failed else "failed",
                          reason="" if not failed else f"{text.count(len(failed), 'claim')} failed",
                          checks=[c.__dict__ for c in self.claims])
        if failed:
            lines = "\n".join(f"- {c.claim}: measured {c.measured}, expected {c.expected}" for c in failed)
            raise ChecksFailed(f"{len(failed)} of {len(self.claims)} claims do not hold:\n{lines}")
        return self.table()
