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

    def _decision(self) -> fit.Decision | None:
        """helpers.fit's decision for this run's full profile on this GPU (or its cap); None off it or off CUDA."""
        if self.run.profile != "full" or not self.run.is_cuda:
            return None
        gpu = params._gpu()
        return fit.decide(self.run.notebook, self.run.model, gpu.total_gib if gpu else 0.0, self.run.gpu_memory_gib,
                          self.run.dtype_name)

    def skip_reason(self, part: str) -> str:
        """'' when a part of the notebook (a fit.PARTS key, or its Need.part name) fits this GPU on the full profile,
        else why not."""
        decision = self._decision()
        return decision.part(part) if decision is not None else ""

    def skipped_parts(self, only: tuple[str, ...] | None = None) -> dict[str, str]:
        """fit.PARTS key -> why this run skips it: every part that does not fit this GPU (or GPU_MEMORY_GIB) on the
        full profile (none off it or off CUDA), and those the knob SKIP_PARTS names, to rehearse a smaller card on
        any profile. only: the parts the notebook can leave out (default: all its parts). A bad SKIP_PARTS raises a
        ParameterError naming the parts."""
        parts = fit.PARTS.get(self.run.notebook, ()) if only is None else only
        rehearse = self.run.knobs.get("SKIP_PARTS")
        if rehearse is not None:
            if isinstance(rehearse, str):  # a bare string would be read letter by letter
                raise params.ParameterError(f"SKIP_PARTS={rehearse!r} is not allowed; use None or a list of parts, "
                                            f"each one of: {', '.join(repr(p) for p in parts)}")
            params.check_subset("SKIP_PARTS", rehearse, parts)
        decision = self._decision()
        fits_not = decision.skipped if decision is not None else {}
        needs = {n.key: n for n in fit.needs(self.run.notebook, self.run.model)}
        out = {}
        for part in parts:
            if part in fits_not:
                out[part] = fits_not[part]
            elif part in (rehearse or ()):
                need = f"; on the full profile it needs {needs[part].gib:.1f} GiB" if part in needs else ""
                out[part] = f"SKIP_PARTS rehearses a smaller card: skipped as if it did not fit this GPU{need}"
        return out

    def guard(self, scenario: str, **fields: Any) -> Any:
        """A part that may run out of GPU memory: an 'oom' row with the figure instead of a crash (fit.guard)."""
        return fit.guard(self.writer, scenario, **fields)

    def show_committed(self, name: str, caption: str = "") -> None:
        """Show the figure of this name that a GPU run committed (gallery.Gallery.show_committed; returns nothing,
        so a cell ending in it echoes no list)."""
        self.gallery.show_committed(name, caption)

    def _tokens(self) -> str:
        """The text tokens the denoiser reads, per model (notebook 16's three each their own)."""
        r, n = self.run, self.run.settings.max_sequence_length
        if r.model != "all":
            return {"flux-dev": f"{n} T5 tokens", "sdxl": "77 CLIP tokens"}.get(r.model, f"{n} text tokens")
        from helpers.pipelines import SMOKE_TEXT_TOKENS  # diffusers' import, only for notebook 16

        flux2 = SMOKE_TEXT_TOKENS["flux2-dev"] if r.profile == "smoke" else n
        return (f"text tokens: {n} for Flux-1-Dev, {flux2} for FLUX.2 (its system message included), the prompt's "
                "own count for Qwen-Image")

    def card_table(self, full: bool = False, steps: int | None = None,
                   timing: tuple[int, int] | None = None) -> pd.DataFrame:
        """The run at a glance (8 rows: device, dtype, profile, model, weights, workload, versions, revision), or with
        full=True every field of the environment card, the timing settings, the results file and the knobs; `steps`
        where the notebook's images take a step count of their own instead of the profile's, `timing` (warm-up calls,
        timed calls) where its timings use their own."""
        r, c = self.run, self.card
        steps = r.settings.steps if steps is None else steps
        device = c.device_name if c.device != "cpu" else f"{c.cpu} ({c.cpu_cores} cores, no GPU)"
        if c.memory_cap:
            device += f", {c.memory_cap}"
        pd.set_option("display.max_colwidth", None)  # reasons are sentences: shown whole, never cut
        dtype = r.dtype_reason or r.dtype_name
        dtype = dtype if full else dtype.split("; ")[0]  # at a glance: the choice and its reason, not the forensics
        rows = [("device", device), ("dtype", dtype), ("profile", r.profile_reason),
                ("model", r.model), ("weights", r.weights_reason or r.weights),
                ("workload", (f"{r.settings.height}x{r.settings.width}, {steps} steps, {self._tokens()}, "
                              f"guidance {r.settings.guidance}")),
                ("torch / diffusers", f"{c.versions.get('torch', '?')} / {c.versions.get('diffusers', '?')}"),
                ("git revision", c.git_rev)]
        if full:
            warmup, repeats = timing or (r.settings.warmup, r.settings.repeats)
            rows += [("notebook", r.notebook), ("seed", str(r.seed)),
                     ("timing", f"{warmup} warm-up + {repeats} timed runs, median reported"),
                     ("results file", str(self.writer.path))]
            shown = {environment.CARD_LABELS[k] for k in ("device", "device_name", "git_rev")} | {
                "version: torch", "version: diffusers"}  # in the 8 rows above
            no_cap = environment.CARD_LABELS["memory_cap"]  # an empty cap: the whole GPU, said by no row
            rows += [(k, v) for k, v in c.as_table() if k not in shown and (v or k != no_cap)]
            rows += [(f"parameter: {k}", knob_text(v)) for k, v in r.knobs.items()]
        return pd.DataFrame(rows, columns=["what", "value"]).set_index("what")


def knob_text(value: Any) -> str:
    """A notebook parameter as the card shows it: None as 'None (the notebook's default, resolved in its setup
    cell)', text without quotes, a list as its items joined by commas."""
    if value is None:
        return "None (the notebook's default, resolved in its setup cell)"
    if isinstance(value, list | tuple):
        return ", ".join(knob_text(v) for v in value) or "none"
    return str(value)


def start(notebook: str, **parameters: Any) -> Session:
    """Validate parameters (fails fast, writes nothing), measure the card, and prepare the results file."""
    run = params.resolve(notebook, **parameters)
    cap = fit.apply_cap(run.gpu_memory_gib) if run.gpu_memory_gib is not None and run.is_cuda else None
    card = environment.environment_card(run.device, run.dtype)
    if cap is not None:
        card = dataclasses.replace(card, memory_cap=str(cap))
    return Session(run=run, card=card, writer=results.ResultWriter(run, card))
