"""The GPU run script and its bundle: bad input refused before any work, groups within the slot, results merged."""

import importlib.util
import json
import subprocess
import tarfile

import pytest

from helpers import environment, gpu_run, paths

_spec = importlib.util.spec_from_file_location("gpu_bundle", paths.ROOT / "tools" / "gpu_bundle.py")
gpu_bundle = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(gpu_bundle)


@pytest.fixture
def no_install(monkeypatch):
    """Fail the test if the script gets as far as installing anything."""
    def boom(*a, **k):
        raise AssertionError("install reached: bad input was not refused first")
    monkeypatch.setattr(gpu_run, "install", boom)


def test_unknown_group_is_refused_naming_the_known_ones(no_install, tmp_path, capsys):
    assert gpu_run.main(["G9", "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "unknown group 'G9'" in err and all(g in err for g in gpu_run.GROUPS)


def test_missing_bundle_is_refused_with_the_command_that_builds_it(no_install, tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(gpu_run, "BUNDLE", tmp_path / "no-whl")
    with pytest.raises(gpu_run.UsageError, match="make gpu-bundle"):
        gpu_run.run_group("G1", tmp_path / "out", bundle=tmp_path / "no-whl")
    (tmp_path / "whl").mkdir()
    (tmp_path / "whl" / "x-1-py3-none-any.whl").write_bytes(b"")  # wheels but no manifest: not a built bundle
    with pytest.raises(gpu_run.UsageError, match="make gpu-bundle"):
        gpu_run.check_bundle(tmp_path / "whl")


def test_groups_cover_notebooks_00_to_10_and_fit_the_slot():
    planned = {job.notebook for jobs in gpu_run.GROUPS.values() for job in jobs}
    notebooks = {p.stem for p in paths.NOTEBOOKS_DIR.glob("[0-9][0-9]_*.ipynb")} - {"11_reproduction_report"}
    assert notebooks <= planned, f"not in any GPU group: {sorted(notebooks - planned)}"
    for name, jobs in gpu_run.GROUPS.items():
        wall = gpu_run.check_wall_s(name) if name in gpu_run.PARALLEL else sum(j.estimate_s for j in jobs)
        assert wall <= gpu_run.BUDGET_S, f"{name} is estimated past the budget"
        labels = [j.label for j in jobs]
        assert len(labels) == len(set(labels)), f"{name}: two runs would write the same executed copy"
    # a planted group that overruns is caught by the same check
    assert sum(j.estimate_s for j in gpu_run.GROUPS["G1"] * 3) > gpu_run.BUDGET_S


def lease_sums(leases):
    return {lease: gpu_run.lease_estimate_s(lease) for lease in leases}


def test_leases_run_every_group_and_fit_a_lease():
    order = [g for lease in gpu_run.LEASES for g in lease]
    assert set(order) == set(gpu_run.GROUPS), "every group in LEASES"
    every = order + [g for lease in gpu_run.LEASES_DONE for g in lease if g in gpu_run.GROUPS]
    twice = {g for g in every if every.count(g) > 1}
    assert twice <= gpu_run.RERUNS, f"only RERUNS run twice: {twice - gpu_run.RERUNS}"
    assert gpu_run.LEASES[0] == gpu_run.CHECK_GROUPS, "the GPU check opens the next lease"
    over = {lease: s for lease, s in lease_sums(gpu_run.LEASES).items() if s > gpu_run.LEASE_S}
    assert not over, f"estimated past a lease's {gpu_run.LEASE_S} s: {over}"
    # a planted pairing of the two longest groups is caught by the same check
    assert lease_sums([("G6a", "G6b")])[("G6a", "G6b")] > gpu_run.LEASE_S


def test_the_gpu_check_runs_every_notebook_on_the_smoke_profile_within_its_budget():
    check = [j for g in gpu_run.CHECK_GROUPS for j in gpu_run.GROUPS[g]]
    notebooks = {p.stem for p in paths.NOTEBOOKS_DIR.glob("[0-9][0-9]_*.ipynb")} - {"11_reproduction_report"}
    assert {j.notebook for j in check} == notebooks, "G0a + G0b run every notebook (11 reads rows, no GPU code)"
    assert all(j.parameters["PROFILE"] == "smoke" for j in check)
    assert {j.label for j in check} >= {"01_dtype.sdxl", "02_attention_sdpa.sdxl"}
    assert len({j.label for j in check}) == len(check), "two check runs would write the same executed copy"
    for group in gpu_run.CHECK_GROUPS:
        assert gpu_run.check_wall_s(group) <= gpu_run.CHECK_BUDGET_S <= gpu_run.BUDGET_S
        # list scheduling: a planted single worker would run the jobs one after another, past the budget
        assert sum(j.estimate_s for j in gpu_run.GROUPS[group]) > gpu_run.CHECK_BUDGET_S


def test_the_gpu_check_runs_notebooks_side_by_side(tmp_path, monkeypatch):
    """G0's jobs start on PARALLEL workers (planted jobs that sleep): the wall time is about the longest job's."""
    import threading
    import time

    running, peak = [0], [0]
    lock = threading.Lock()

    def fake_job(job, profile, work, env, deadline):
        with lock:
            running[0] += 1
            peak[0] = max(peak[0], running[0])
        time.sleep(0.2)
        with lock:
            running[0] -= 1
        return "ok in 0 s"

    monkeypatch.setattr(gpu_run, "install", lambda wheels, site: {})
    monkeypatch.setattr(gpu_run, "check_bundle", lambda bundle: [])
    monkeypatch.setattr(gpu_run, "run_job", fake_job)
    group = gpu_run.CHECK_GROUPS[0]
    assert gpu_run.run_group(group, tmp_path / "out", budget_s=300) == 0
    assert peak[0] == gpu_run.PARALLEL[group]
    summary = (tmp_path / "out" / f"{group}.summary.txt").read_text()
    assert all(f"{j.label}: ok" in summary for j in gpu_run.GROUPS[group])


def test_the_gpu_check_merges_apart_from_the_results(tmp_path, monkeypatch):
    """G0's rows are a check, not a published workload: merge puts them under data/gpu-check/, never results/."""
    run = tmp_path / "run"
    (run / "results" / "h100").mkdir(parents=True)
    (run / "results" / "h100" / "00_setup_and_baseline.jsonl").write_text('{"scenario": "a", "profile": "smoke"}\n')
    archive = gpu_run.pack(run, tmp_path / "out", gpu_run.CHECK_GROUPS[1])
    monkeypatch.setattr(paths, "DATA_DIR", tmp_path / "data")
    done = gpu_run.merge(archive)
    assert (tmp_path / "data" / "gpu-check" / "h100" / "00_setup_and_baseline.jsonl").exists(), done


def test_the_plan_lists_the_leases_as_the_code_runs_them():
    """docs/gpu-plan.md's lease table names the same commands, in the same order, as LEASES."""
    text = (paths.ROOT / "docs" / "gpu-plan.md").read_text()
    table = text.split("## The leases")[1].split("\n## ")[0]
    listed = [tuple(g.strip() for g in line.split("|")[2].split(","))
              for line in table.splitlines() if line.startswith("| ") and line.split("|")[1].strip().isdigit()]
    assert listed == gpu_run.LEASES_DONE + gpu_run.LEASES
    for group in gpu_run.GROUPS:
        assert f"\n| {group} | " in text, f"{group} has no row in the plan's group table"


def test_group_parameters_are_the_notebooks_own():
    """Every override a group passes is a parameter of that notebook (papermill would silently add a new one)."""
    for jobs in gpu_run.GROUPS.values():
        for job in jobs:
            nb = json.loads((paths.NOTEBOOKS_DIR / f"{job.notebook}.ipynb").read_text())
            cell = next(c for c in nb["cells"] if "parameters" in c.get("metadata", {}).get("tags", []))
            names = {line.split("=")[0].strip() for line in "".join(cell["source"]).splitlines() if "=" in line}
            assert set(job.parameters) <= names, f"{job.notebook}: {set(job.parameters) - names} unknown"


def test_merge_appends_new_rows_once_and_keeps_the_previous_executed_copy(tmp_path):
    run = tmp_path / "run"
    (run / "results" / "h100-80gb").mkdir(parents=True)
    rows = [{"notebook": "00_setup_and_baseline", "scenario": s, "status": "ok", "run_id": "r1"} for s in "ab"]
    (run / "results" / "h100-80gb" / "00_setup_and_baseline.jsonl").write_text(
        "".join(json.dumps(r, sort_keys=True) + "\n" for r in rows))
    (run / "executed").mkdir()
    host = "/host/checkout"  # the folder the notebook ran in on the GPU host: the merged copy must not name it
    (run / "executed" / "00_setup_and_baseline.ipynb").write_text(json.dumps(
        {"metadata": {"papermill": {"input_path": f"{host}/notebooks/00_setup_and_baseline.ipynb"}}}))
    (run / "figures" / "h100-80gb").mkdir(parents=True)
    (run / "figures" / "h100-80gb" / "plot.png").write_bytes(b"png")
    archive = gpu_run.pack(run, tmp_path / "out", "G1")
    res, figs = tmp_path / "results", tmp_path / "figures"
    dest = res / "h100-80gb" / "00_setup_and_baseline.jsonl"
    dest.parent.mkdir(parents=True)
    dest.write_text(json.dumps({"scenario": "older", "run_id": "r0"}) + "\n")
    gpu_run.merge(archive, res, figs)
    gpu_run.merge(archive, res, figs)  # merging twice adds nothing
    lines = dest.read_text().splitlines()
    assert len(lines) == 3 and json.loads(lines[0])["scenario"] == "older"
    assert host not in (res / "h100-80gb" / "executed" / "00_setup_and_baseline.ipynb").read_text()
    assert len(list((res / "h100-80gb" / "executed" / "previous").glob("*.ipynb"))) == 1
    assert (figs / "h100-80gb" / "plot.png").read_bytes() == b"png"
    with tarfile.open(archive) as tar:
        assert "results/h100-80gb/00_setup_and_baseline.jsonl" in tar.getnames()


def test_git_revision_outside_git_comes_from_the_bundle(tmp_path, monkeypatch):
    monkeypatch.setattr(paths, "ROOT", tmp_path)  # a copy of the tree without .git, as on the GPU host
    monkeypatch.delenv(environment.GIT_REV_ENV, raising=False)
    assert environment.git_revision() == "unknown"
    monkeypatch.setenv(environment.GIT_REV_ENV, "abc123def456")
    assert environment.git_revision() == "abc123def456"


def test_git_revision_from_the_bundle_wins_over_a_stale_git(tmp_path, monkeypatch):
    """The host's copy once carried an older .git: rows named 63970a9b374f+dirty for the tree of c069eed4059b."""
    subprocess.run(["git", "init", "-q"], cwd=tmp_path, check=True)
    monkeypatch.setattr(paths, "ROOT", tmp_path)
    monkeypatch.delenv(environment.GIT_REV_ENV, raising=False)
    assert environment.git_revision() != "c069eed4059b"
    monkeypatch.setenv(environment.GIT_REV_ENV, "c069eed4059b")
    assert environment.git_revision() == "c069eed4059b"


def test_rows_name_the_cuda_build():
    assert environment.library_versions()["cuda"]  # 'none' on a CPU build, e.g. '13.0' on the GPU host


def test_bundle_plan_holds_the_pins_and_leaves_torch_to_the_host():
    bundled, from_image = gpu_bundle.plan()
    pinned = gpu_bundle.pins()
    for name in ("diffusers", "transformers", "huggingface-hub", "peft", "accelerate", "tokenizers", "safetensors",
                 "papermill", "nbclient", "ipykernel", "bitsandbytes"):
        assert bundled.get(name) == pinned[name], f"{name}: bundle {bundled.get(name)} vs pin {pinned[name]}"
    assert not any(gpu_bundle.HOST_STACK.match(n.replace("-", "_")) for n in bundled), "torch stack bundled"
    assert "numpy" in from_image and "numpy" not in bundled


def test_a_capped_group_rehearses_the_skips_its_cap_decides():
    # on the CPU rehearsal a cap (refused without CUDA) becomes the parts fit skips under it on the full profile
    for group, notebook, skipped in (("G5c", "08_cpu_offload", ["eager"]), ("G5d", "09_nf4_quantization",
                                                                          ["eager", "nf4"]),
                                     ("G5e", "08_cpu_offload", ["eager", "model offload"])):
        (job,) = gpu_run.GROUPS[group]
        rehearsed = gpu_run.rehearsal_parameters(job.notebook, job.parameters)
        assert job.notebook == notebook and "GPU_MEMORY_GIB" not in rehearsed
        assert rehearsed["SKIP_PARTS"] == skipped, (group, rehearsed)
        assert {k: v for k, v in rehearsed.items() if k != "SKIP_PARTS"} == {
            k: v for k, v in job.parameters.items() if k != "GPU_MEMORY_GIB"}
    planted = gpu_run.rehearsal_parameters("09_nf4_quantization", {"GPU_MEMORY_GIB": 80})  # a big card skips nothing
    assert planted == {}
    uncapped = {"REPEATS": 1}
    assert gpu_run.rehearsal_parameters("09_nf4_quantization", uncapped) is uncapped
