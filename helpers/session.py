"""The first cell of every notebook: validate parameters, print the environment card, open the results."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pandas as pd

from helpers import environment, params, results


@dataclass
class Session:
    """A notebook run: its resolved parameters, the machine it runs on, and its result writer."""

    run: params.Run
    card: environment.EnvironmentCard
    writer: results.ResultWriter

    def card_table(self) -> pd.DataFrame:
        """The environment card and the resolved run as a two-column table."""
        r = self.run
        rows = [("notebook", r.notebook), ("profile", r.profile_reason), ("model", r.model),
                ("weights", r.weights), ("dtype", r.dtype_reason or r.dtype_name), ("seed", str(r.seed)),
                ("workload", (f"{r.settings.height}x{r.settings.width}, {r.settings.steps} steps, "
                             f"{r.settings.max_sequence_length} text tokens, guidance {r.settings.guidance}")),
                ("timing", f"{r.settings.warmup} warm-up + {r.settings.repeats} timed runs, median reported"),
                ("results file", str(self.writer.path))]
        rows += self.card.as_table()
        rows += [(f"knob: {k}", repr(v)) for k, v in r.knobs.items()]
        return pd.DataFrame(rows, columns=["what", "value"]).set_index("what")


def start(notebook: str, **parameters: Any) -> Session:
    """Validate parameters (fails fast, writes nothing), measure the card, and prepare the results file."""
    run = params.resolve(notebook, **parameters)
    card = environment.environment_card(run.device, run.dtype)
    return Session(run=run, card=card, writer=results.ResultWriter(run, card))
