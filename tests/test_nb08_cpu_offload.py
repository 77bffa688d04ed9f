"""Notebook 08 on the smoke profile: offload hooks, parity, the sequential cpu:0 cause and stand-in, the fullgraph
trace per mode, diffusers' whole-model compile recipe under group offload (raised recompile_limit), skipped GPU
measurements with reasons, the Checks cell, and fail-fast knobs."""

import math

import pytest
import torch

from helpers import footprint, offload, params
from tests.nbrun import run_notebook, run_setup

pytestmark = pytest.mark.notebook

MODES = ("model", "sequential", "group_block", "group_leaf")
RECOMPILE_LIMIT = 1000  # diffusers' docs raise dynamo's recompile limit (cache_size_limit) to this under offloading


def test_offload_rows(tmp_path):
    nb = run_notebook("08_cpu_offload", tmp_path)
    rows = nb.rows
    assert set(rows["run_id"]) == {rows["run_id"].iloc[0]} and (rows["profile"] == "smoke").all()

    base = nb.row("no offload eager")
    assert base["status"] == "ok" and base["latency_median_s"] > 0 and base["peak_memory_bytes"] > 0
    assert base["memory_kind"] == "cpu_allocated_during_call"
    sizes = nb.row("component weights")["extra"]
    # model offload's floor is the largest component: on the tiny smoke models that is the VAE, not the DiT
    assert sizes["largest_component"] == "vae" == max(sizes["component_bytes"], key=sizes["component_bytes"].get)

    for mode in MODES:
        hooks_row = nb.row(f"{mode} offload: hooks")
        extra, hooks = hooks_row["extra"], hooks_row["extra"]["hooks"]
        assert hooks_row["status"] == "ok" and extra["onload_device"] == "cpu"
        assert set(hooks) == {"vae", "text_encoder", "text_encoder_2", "transformer"}
        assert "accelerator" in extra["default_call_error"]
        if mode == "model":
            assert all(h["accelerate_hook_types"] == ["CpuOffload"] and h["accelerate_hooks"] == 1
                       for h in hooks.values())
            assert extra["execution_device"] == "cpu:0"  # diffusers' rewrite, harmless for whole-module moves
        if mode == "sequential":
            assert all(h["accelerate_hooks"] > 1 and h["parameter_devices"] == ["meta"] for h in hooks.values())
            assert extra["execution_device"] == "cpu:0"
        if mode.startswith("group"):
            assert all(h["group_offload_hooks"] > 0 for h in hooks.values())
            assert "stream" in extra["stream_error"] and extra["use_stream"] is False

        parity = nb.row(f"{mode} offload: parity")
        if mode == "sequential":  # diffusers passes cpu:0, which accelerate's leaf hooks cannot handle on a CPU
            assert parity["status"] == "skipped" and parity["extra"]["run_error"].startswith("TypeError")
            assert "as expected on a CPU" in parity["reason"]  # the learner is told it is no bug of theirs
            assert parity["extra"]["drift_vs_no_offload"] is None
        elif mode == "model":  # Module.to('cpu:0') copies the weights: at most the last bits move, exactly as a copy
            copied = nb.row("model offload: weights copied, no offload")["extra"]
            assert parity["status"] == "ok" and parity["extra"]["run_error"] == ""
            assert 0.0 <= parity["extra"]["drift_vs_no_offload"] <= offload.CPU_COPY_BOUND
            assert copied["equals_model_offload"] is True
            assert copied["drift_vs_no_offload"] == parity["extra"]["drift_vs_no_offload"]
        else:
            assert parity["status"] == "ok" and parity["extra"]["run_error"] == ""
            assert parity["extra"]["drift_vs_no_offload"] == 0.0
        # the weights a mode holds at once, read off its installed hooks
        assert hooks_row["extra"]["weights_at_once_bytes"] > 0

        # for Flux only model offload's hooks sit outside the blocks: the others stop fullgraph tracing
        trace = nb.row(f"{mode} offload: fullgraph trace")
        assert trace["status"] == "ok" and trace["extra"]["backend"] == "eager"
        assert (trace["extra"]["hooks_in_repeated_blocks"] == 0) == (mode == "model")
        if mode == "model":
            assert trace["extra"]["traced"] is True and trace["graph_breaks"] == 0
            assert trace["extra"]["graphs_traced"] >= 2 and trace["extra"]["trace_error"] == ""
        else:
            assert trace["extra"]["traced"] is False and trace["graph_breaks"] >= 1
            assert "torch.compiler.disable" in trace["extra"]["trace_error"]
        assert trace["extra"]["traced_pipeline"].startswith("stand-in" if mode == "sequential" else "diffusers")

        # group offload also gets diffusers' recipe: transformer.compile() (graph breaks allowed at the hooks) with
        # recompile_limit raised while dynamo compiles; traced on the eager backend on every profile
        group = mode.startswith("group")
        if group:
            whole = nb.row(f"{mode} offload: compile trace")
            assert whole["status"] == "ok" and whole["extra"]["backend"] == "eager"
            assert whole["extra"]["traced"] is True and whole["extra"]["trace_error"] == ""
            assert whole["graph_breaks"] >= 1 and whole["recompiles"] == 0
            assert whole["extra"]["recompile_limit_at_compile"] == [RECOMPILE_LIMIT]
            assert whole["extra"]["matches_eager"] is True
        else:
            assert not {f"{mode} offload: compile trace", f"{mode} offload compile"} & set(rows["scenario"])

        # every GPU measurement is skipped on the CPU, with the reason
        for variant in ("eager", "regional compile") + (("compile",) if group else ()):
            row = nb.row(f"{mode} offload {variant}")
            assert row["status"] == "skipped" and "no CUDA GPU" in row["reason"]
            assert pd_isna(row["latency_median_s"]) and pd_isna(row["peak_memory_bytes"])

    # the verified cause: Parameter.to('cpu:0') copies to a plain Tensor, which accelerate cannot rebuild
    cause = nb.row("sequential offload: cpu:0 check")["extra"]["checks"]
    assert cause["cpu"] == {"nn.Parameter(cpu tensor).to(device) returns": "the same Parameter",
                            "nn.Linear under accelerate.cpu_offload": "runs"}
    assert cause["cpu:0"]["nn.Parameter(cpu tensor).to(device) returns"] == "a new Tensor"
    assert cause["cpu:0"]["nn.Linear under accelerate.cpu_offload"] == nb.row(
        "sequential offload: parity")["extra"]["run_error"]
    stand_in = nb.row("sequential offload: stand-in parity")
    assert stand_in["status"] == "ok" and stand_in["extra"]["drift_vs_no_offload"] == 0.0
    assert stand_in["extra"]["execution_device"] == "cpu"
    assert stand_in["extra"]["hooks"] == nb.row("sequential offload: hooks")["extra"]["hooks"]

    compiled = nb.row("no offload regional compile")
    assert compiled["status"] == "skipped" and "CUDA GPU" in compiled["reason"]
    assert "offload ratios" not in set(rows["scenario"])  # no GPU, no ratios: nothing is invented
    assert (rows[rows["status"] != "ok"]["reason"].str.len() > 20).all()
    assert not (rows["status"] == "failed").any(), "a CPU's expected sequential-offload error is a skipped row"
    assert (nb.figures_dir / "cpu" / "08_cpu_offload_weights_at_once.png").stat().st_size > 1000
    # the full-size floor of each mode, counted on the meta device with diffusers' own hooks: model offload holds the
    # DiT whole, block-level group offload all of T5 (its blocks sit one level down), leaf level one layer
    at_once = nb.row("full-size weights at once")["extra"]["weights_bytes"]
    full = footprint.component_bytes(footprint.meta_components("flux-dev", "full", torch.bfloat16), torch.bfloat16)
    assert at_once["none"] == sum(full.values()) and at_once["model"] == full["transformer"]
    assert at_once["group_block"] == full["text_encoder_2"]
    assert at_once["sequential"] == at_once["group_leaf"] < 2**30 < at_once["group_block"] < at_once["model"]
    shown = nb.row("shown: no offload and model offload, same seed")["extra"]  # a digit, the same in both rows
    assert shown["judged"] is True and [g["share"] for g in shown["grid"]] == [1.0, 1.0]
    # the guide's five figures, said once as not measured here, each with its published value (report.beside_published)
    said = nb.text()
    assert said.count("not measured on this run (cpu, smoke profile); published:") == 1
    assert "- model offload, peak GPU memory: 22.7 GiB for flux-dev on H100 (hands-on-guide)" in said

    claims = nb.checks()  # the Checks cell's table, every claim held (the cell raises otherwise)
    assert all(c["holds"] for c in claims.values()) and nb.row("checks")["status"] == "ok"
    expected = {"a freshly loaded pipeline carries no offload hooks",
                "without an accelerator diffusers refuses the plain call",
                "model offload: one CpuOffload hook on each whole component",
                "sequential offload: an AlignDevicesHook on every leaf, weights on meta between calls",
                "on a CPU, diffusers' sequential offload fails with the TypeError of the device cpu:0",
                "accelerate's cpu_offload fails with the device 'cpu:0' and runs with 'cpu'",
                "sequential offload leaves the latents unchanged (accelerate stand-in)",
                "model offload: no hook in the blocks, so they trace as one graph",
                "on a CPU, model offload's latents equal the reference's with its weights copied, bit for bit",
                "weights at once: the meta-device count equals what the installed hooks move, per mode (bytes)",
                "every image shown reads as its prompt's digit (a grid row: at least its floor)"}
    for mode in MODES:
        expected.add(f"{mode} offload: enabling it works")
    for mode in ("model", "group_block", "group_leaf"):
        expected.add(f"{mode} offload leaves the latents unchanged")
    for mode in ("sequential", "group_block", "group_leaf"):
        expected.add(f"{mode} offload: hooks in the blocks stop a fullgraph trace at torch.compiler.disable")
    for mode in ("group_block", "group_leaf"):
        expected |= {f"{mode} offload: group hooks on every component",
                     f"{mode} offload: diffusers' whole-model compile runs, breaks at the hooks, matches eager",
                     f"{mode} offload: dynamo compiled with the raised recompile_limit"}
    assert expected <= set(claims), expected - set(claims)


@pytest.mark.slow  # make test-all: a second run of the notebook
def test_a_12_gb_card_rehearsed_skips_the_reference_and_model_offload(tmp_path):
    """SKIP_PARTS rehearses the decision helpers.fit makes for a 12-16 GB card (no reference, no model offload) on the
    smoke profile: nothing is compared against the missing reference (each such claim a `not checkable` row with the
    reason), the first image comes from group offload, and the Checks cell still passes."""
    nb = run_notebook("08_cpu_offload", tmp_path, SKIP_PARTS=["eager", "model offload"])
    scenarios = set(nb.rows["scenario"])
    for scenario in ("no offload eager", "model offload eager"):
        row = nb.row(scenario)
        assert row["status"] == "skipped" and row["reason"].startswith("SKIP_PARTS rehearses a smaller card")
        assert "on the full profile it needs" in row["reason"]
    assert not {"model offload: hooks", "model offload: parity", "model offload: weights copied, no offload"} & scenarios
    for mode in ("group_block", "group_leaf"):
        parity = nb.row(f"{mode} offload: parity")
        assert parity["status"] == "skipped" and "no reference: SKIP_PARTS" in parity["reason"]
        assert parity["extra"]["latents_finite"] is True and parity["extra"]["drift_vs_no_offload"] is None
        assert nb.row(f"{mode} offload: fullgraph trace")["extra"]["traced"] is False  # traced on its own inputs
        assert nb.row(f"{mode} offload: compile trace")["extra"]["matches_eager"] is True
    for claim in ("group_block offload leaves the latents unchanged", "group_leaf offload leaves the latents unchanged",
                  "sequential offload leaves the latents unchanged (accelerate stand-in)"):
        row = nb.row(f"not checkable: {claim}")
        assert row["status"] == "skipped" and row["reason"].startswith("no reference: SKIP_PARTS rehearses")
    shown = nb.row("shown: group_block offload, the first mode that ran")["extra"]
    assert shown["judged"] is True and [g["share"] for g in shown["grid"]] == [1.0]
    assert [s for s in scenarios if s.startswith("shown: ")] == ["shown: group_block offload, the first mode that ran"]

    claims = nb.checks()
    assert all(c["holds"] for c in claims.values()) and nb.row("checks")["status"] == "ok"
    assert {"group_block offload runs and draws finite latents", "group_leaf offload runs and draws finite latents",
            "sequential offload runs and draws finite latents (accelerate stand-in)",
            "every image shown reads as its prompt's digit (a grid row: at least its floor)"} <= set(claims)
    assert not [c for c in claims if "leaves the latents unchanged" in c or c.startswith("model offload")]


@pytest.mark.parametrize("knob, value, allowed", [
    ("SKIP_PARTS", ["nf4"], "'group offload', 'model offload', 'sequential offload', 'eager'"),
    ("SKIP_PARTS", "eager", "list of parts.*'group offload'"),
    ("OFFLOAD_MODES", ["disk"], "'model', 'sequential', 'group_block', 'group_leaf'"),
    ("VARIANTS", ["max-autotune"], "'eager', 'regional', 'compile'"),
    ("OFFLOAD_REPEATS", -1, "must be a positive integer"),
    ("USE_STREAM", "yes", "True, False"),
    ("PROMPT", "", "non-empty string"),
])
def test_bad_knobs_fail_fast(tmp_path, knob, value, allowed):
    with pytest.raises(params.ParameterError, match=f"{knob}.*{allowed}"):
        run_setup("08_cpu_offload", tmp_path, **{knob: value})
    assert not (tmp_path / "results").exists(), "nothing may be written before the parameters are checked"


def test_weights_at_once_counts_what_the_hooks_move():
    """The meta-device count of notebook 08 against the hooks installed on a real module; a planted wrong group
    size (two blocks per group counted against one installed) must differ."""
    class Net(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.proj = torch.nn.Linear(8, 8)
            self.blocks = torch.nn.ModuleList([torch.nn.Linear(8, 64), torch.nn.Linear(64, 8), torch.nn.Linear(8, 8)])

    class Pipe:
        def __init__(self, net: torch.nn.Module) -> None:
            self.components = {"net": net}

    one = offload.weights_at_once({"net": Net().to("meta")}, "group_block", 1)
    two = offload.weights_at_once({"net": Net().to("meta")}, "group_block", 2)
    assert one == (8 * 64 + 64) * 4 and two == ((8 * 64 + 64) + (64 * 8 + 8)) * 4 != one
    assert offload.weights_at_once({"net": Net().to("meta")}, "group_leaf") == (8 * 64 + 64) * 4
    assert offload.weights_at_once({"net": Net()}, "none") == sum(p.numel() * 4 for p in Net().parameters())
    from diffusers.hooks import apply_group_offloading

    net = Net()
    apply_group_offloading(net, onload_device=torch.device("cpu"), offload_type="block_level", num_blocks_per_group=1)
    assert offload.installed_weights_at_once(Pipe(net), "group_block") == one != two
    with pytest.raises(ValueError, match="mode="):
        offload.weights_at_once({"net": Net()}, "disk")


def test_copy_weights_moves_every_tensor():
    """offload.copy_weights puts every weight in fresh memory with the same values (the cause model offload's
    last-bit drift on a CPU is checked against)."""
    class Pipe:
        def __init__(self) -> None:
            self.components = {"net": torch.nn.Linear(4, 4), "name": "not a module"}

    pipe = Pipe()
    before = {n: (t.data_ptr(), t.clone()) for n, t in pipe.components["net"].named_parameters()}
    offload.copy_weights(pipe)
    for n, t in pipe.components["net"].named_parameters():
        assert t.data_ptr() != before[n][0] and torch.equal(t, before[n][1])


def pd_isna(value) -> bool:
    """True for None or NaN."""
    return value is None or (isinstance(value, float) and math.isnan(value))


def test_without_a_reference_what_holds_is_checked_and_the_comparison_is_a_skipped_row(tmp_path):
    """ModeChecks without a reference: it needs the reason; a mode's claim becomes 'runs and draws finite latents'
    (planted non-finite latents fail it), the comparison a 'not checkable' row with the reason; the first mode that
    ran draws the first image only where there is no reference."""
    from helpers import session

    s = session.start("08_cpu_offload", PROFILE="smoke", DTYPE="fp32", RESULTS_DIR=str(tmp_path))
    with pytest.raises(ValueError, match="no_reference"):
        offload.ModeChecks(s.run, s.writer, reference=None, inputs=None, variants=[], repeats=1, recompile_limit=8)
    with pytest.raises(ValueError, match="no_reference"):
        offload.ModeChecks(s.run, s.writer, reference=torch.zeros(1), inputs=None, variants=[], repeats=1,
                           recompile_limit=8, no_reference="needs 33.9 GiB")
    checker = offload.ModeChecks(s.run, s.writer, reference=None, inputs=None, variants=[], repeats=1,
                                 recompile_limit=8, no_reference="needs 33.9 GiB, this GPU has 23.0 GiB usable")
    hooks = {"transformer": {"accelerate_hooks": 0, "accelerate_hook_types": [], "group_offload_hooks": 2,
                             "parameter_devices": ["cpu"]}}
    assert not checker.first_to_run("group_block")
    for finite in (True, False):
        s.writer.record("group_block offload: hooks", hooks=hooks)
        s.writer.record("group_block offload: parity", status="skipped", reason="ran", run_error="",
                        latents_finite=finite)
        checker.info["group_block"] = {}
        got = {c[0]: c[3] for c in checker.claims("group_block")}
        assert got["group_block offload runs and draws finite latents"] is finite
        assert "group_block offload leaves the latents unchanged" not in got
        row = s.writer.rows[-1]
        assert (row.scenario, row.status) == ("not checkable: group_block offload leaves the latents unchanged",
                                              "skipped") and "needs 33.9 GiB" in row.reason
    assert checker.first_to_run("group_block") and not checker.first_to_run("group_leaf")
    with_ref = offload.ModeChecks(s.run, s.writer, reference=torch.zeros(1), inputs=None, variants=[], repeats=1,
                                  recompile_limit=8, info={"group_block": {}})
    assert not with_ref.first_to_run("group_block")


def test_a_gpu_run_without_the_regional_variant_says_so_in_the_trace_columns(tmp_path, monkeypatch):
    """The capped GPU groups run VARIANTS=["eager"]: no fullgraph trace row, so the per-mode table says the variant
    was left out, not the CPU's stand-in label."""
    from helpers import session

    s = session.start("08_cpu_offload", PROFILE="smoke", DTYPE="fp32", RESULTS_DIR=str(tmp_path))
    checker = offload.ModeChecks(s.run, s.writer, reference=torch.zeros(1), inputs=None, variants=["eager"],
                                 repeats=1, recompile_limit=8)
    assert checker.summary("model")["blocks trace as one graph"] == "on a CPU: its stand-in, Going deeper"
    monkeypatch.setattr(type(s.run), "is_cuda", property(lambda self: True))
    line = checker.summary("model")
    assert line["blocks trace as one graph"] == line["hooks in repeated blocks (count)"] == (
        "not traced: VARIANTS has no 'regional'")
