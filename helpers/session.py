"""The first cell of every notebook: validate parameters, print the environment card, open the results."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import pandas as pd

from helpers import environment, fit, gallery, params, results


@dataclass
class Session:
    """A notebook run: its resolved parameters, the machine it runs on, and its result writer."""

    run: params.Run
    card: environment.EnvironmentCard
    writer: results.ResultWriter

    def __post_init__(self) -> None:
        """The gallery every shown image goes through."""
        self.gallery = gallery.Gallery(self.writer)

    def show(self, images: Any, prompts: str | list[str], title: str, **options: Any) -> None:
        """Show an image or a grid, judged and recorded (gallery.Gallery.show; its verdicts are in s.gallery's rows)."""
        self.gallery.show(images, prompts, title, **options)

    def skip_reason(self, part: str) -> str:
        """'' when a part of the notebook (helpers.fit's Need.part) fits this GPU on the full profile, else why not."""
        if self.run.profile != "full" or not self.run.is_cuda:
            return ""
        gpu = params._gpu()
        return fit.decide(self.run.notebook, self.run.model, gpu.total_gib if gpu else 0.0, self.run.gpu_memory_gib,
                          self.run.dtype_name).part(part)

    def guard(self, scenario: str, **fields: Any) -> Any:
        """A part that may run out of GPU memory: an 'oom' row with the figure instead of a crash (fit.guard)."""
        return fit.guard(self.writer, scenario, **fields)

    def show_committed(self, name: str, caption: str = "") -> list:
        """Show the figure of this name that a GPU run committed (gallery.Gallery.show_committed)."""
        return self.gallery.show_committed(name, caption)

    def card_table(self, full: bool = False) -> pd.DataFrame:
        """The run at a glance (8 rows: device, dtype, profile, model, weights, workload, versions, revision), or with
        full=True every field of the environment card, the timing settings, the results file and the knobs."""
        r, c = self.run, self.card
        device = c.device_name if c.device != "cpu" else f"{c.cpu} ({c.cpu_cores} cores, no GPU)"
        if c.memory_cap:
            device += f", {c.memory_cap}"
        rows = [("device", device), ("dtype", r.dtype_reason or r.dtype_name), ("profile", r.profile_reason),
                ("model", r.model), ("weights", r.weights_reason or r.weights),
                ("workload", (f"{r.settings.height}x{r.settings.width}, {r.settings.steps} steps, "
                              f"{r.settings.max_sequence_length} text tokens, guidance {r.settings.guidance}")),
                ("torch / diffusers", f"{c.versions.get('torch', '?')} / {c.versions.get('diffusers', '?')}"),
                ("git revision", c.git_rev)]
        if full:
            rows += [("notebook", r.notebook), ("seed", str(r.seed)),
                     ("timing", f"{r.settings.warmup} warm-up + {r.settings.repeats} timed runs, median reported"),
                     ("results file", str(self.writer.path))]
            rows += c.as_table()
            rows += [(f"knob: {k}", repr(v)) for k, v in r.knobs.items()]
        return pd.DataFrame(rows, columns=["what", "value"]).set_index("what")


def start(notebook: str, **parameters: Any) -> Session:
    """Validate parameters (fails fast, writes nothing), measure the card, and prepare the results file."""
    run = params.resolve(notebook, **parameters)
    cap = fit.apply_cap(run.gpu_memory_gib) if run.gpu_memory_gib is not None and run.is_cuda else None
    card = environment.environment_card(run.device, run.dtype)
    if cap is not None:
        card = dataclasses.replace(card, memory_cap=str(cap))
    return Session(run=run, card=card, writer=results.ResultWriter(run, card))
