"""Redraw figures/h200/00_setup_and_baseline_time_per_component.png from the committed H200 rows, with the
notebook's current labels (the bars are the rows' medians x calls per image, as notebook 00 computes them)."""
from helpers import paths, plots, results

r = results.read_rows(paths.RESULTS_DIR, notebook="00_setup_and_baseline")
r = r[(r.hardware == "h200") & (r.profile == "full") & (r.model == "flux-dev")]
last = r[r.run_id == r.run_id.iloc[-1]].set_index("scenario")
per_image = {n: last.loc[n, "latency_median_s"] * last.loc[n, "extra"]["calls_per_image"]
             for n in ("text encoders", "denoiser step", "vae decode")}
steps = int(last.loc["denoiser step", "extra"]["calls_per_image"])
print(per_image, steps, last.loc["denoiser step", "device_name"], last.loc["denoiser step", "dtype"])
fig = plots.bars(["text encoders", "denoiser, all steps", "VAE decode"], list(per_image.values()),
                 title=f"Where the time goes (full profile, {steps} steps)", ylabel="seconds per image",
                 xlabel="pipeline component", note=f"{last.loc['denoiser step', 'device_name'][:40]}, bf16")
fig.savefig("figures/h200/00_setup_and_baseline_time_per_component.png", dpi=110, bbox_inches="tight")
