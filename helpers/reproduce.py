"""`make reproduce`: run every notebook (full profile on a big enough GPU, else smoke) and print a summary."""

from __future__ import annotations

import argparse
import os
import sys
import time

import pandas as pd
import papermill
import torch

from helpers import environment, kernel_env, params, paths, report, results

# Extra runs beyond each notebook's defaults: the SDXL settings that published figures (diffusion-fast) answer.
VARIANTS: dict[str, list[dict[str, str]]] = {
    "01_dtype": [{"MODEL": "sdxl"}],
    "02_attention_sdpa": [{"MODEL": "sdxl"}],
}

def main(argv: list[str] | None = None) -> int:
    """Execute the notebooks in order, keep their executed copies, and print the rows they wrote."""
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--profile", default="auto", choices=params.PROFILES)
    ap.add_argument("--only", default="", help="comma-separated notebook numbers, e.g. 00,03")
    ap.add_argument("--timeout", type=int, default=3600, help="seconds per cell")
    args = ap.parse_args(argv)

    device = torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")
    hardware = environment.hardware_slug(device)
    resolved = params.resolve("reproduce", PROFILE=args.profile)
    profile, why = resolved.profile, f" ({resolved.profile_reason})"
    wanted = {n.strip() for n in args.only.split(",") if n.strip()}
    notebooks = [p for p in sorted(paths.NOTEBOOKS_DIR.glob("[0-9][0-9]_*.ipynb"))
                 if not wanted or p.name[:2] in wanted]
    executed = paths.RESULTS_DIR / hardware / "executed"
    executed.mkdir(parents=True, exist_ok=True)
    os.environ.update(kernel_env.quiet_progress(os.environ))  # the kernels papermill starts inherit it
    print(f"reproduce: {len(notebooks)} notebooks, profile {profile}{why}, hardware {hardware}; "
          f"executed copies in {executed.relative_to(paths.ROOT)}", flush=True)

    runs = [(nb, {}) for nb in notebooks]
    runs += [(nb, v) for nb in notebooks for v in VARIANTS.get(nb.stem, [])]
    runs.sort(key=lambda r: (r[0].stem == "11_reproduction_report", r[0].name))  # the report reads every other's rows
    status = {}
    for nb, variant in runs:
        label = nb.stem + "".join(f".{v}" for v in variant.values())
        out = executed / f"{label}.ipynb"
        results.set_aside(out)  # keep the previous executed copy instead of overwriting it
        t0 = time.perf_counter()
        print(f"\n=== {label} ...", flush=True)
        try:
            extra = {"UPDATE_README": True} if nb.stem == "11_reproduction_report" else {}
            papermill.execute_notebook(str(nb), str(out), parameters={"PROFILE": args.profile} | variant | extra,
                                       kernel_name="python3", cwd=str(paths.NOTEBOOKS_DIR),
                                       execution_timeout=args.timeout, progress_bar=False)
            status[label] = f"ok ({time.perf_counter() - t0:.0f} s)"
        except Exception as err:  # noqa: BLE001 (keep going: one failing notebook should not hide the others)
            status[label] = f"FAILED ({type(err).__name__}; see {out.relative_to(paths.ROOT)})"
        if out.exists():
            results.strip_root(out)  # the copy is committed: no absolute path of this machine in it
        print(f"=== {label}: {status[label]}", flush=True)

    rows = results.read_rows(paths.RESULTS_DIR, hardware=hardware)
    with pd.option_context("display.width", 200, "display.max_columns", 20, "display.max_rows", 500,
                           "display.max_colwidth", 60):
        print("\nNotebooks:")
        print(pd.Series(status, name="status").to_string())
        if not rows.empty:
            print(f"\nLatest rows on {hardware}:")
            for name, group in rows.groupby("notebook"):
                print(f"\n[{name}]")
                print(results.rows_table(group).to_string(index=False, float_format=lambda v: f"{v:.4g}"))
            print("\nPublished vs measured:")
            print(report.compare(rows).drop(columns=["note"]).to_string(index=False))
    return 0 if all(s.startswith("ok") for s in status.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
