"""helpers.transfer (notebook 16): no cell says "works" when the lever did not work. Each check is shown to fail on a
planted failure: a graph break and a recompile planted in a real denoiser, a cache that skips nothing, and planted
measurements (a silent attention fallback, drift past a band, a swap that recompiled, an edited verdict)."""

from __future__ import annotations

import contextlib
import json

import pytest
import torch

from helpers import compile_tools, pipelines, transfer

TOL = compile_tools.PARITY_TOLERANCE["bf16"]


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """Tiny models gain nothing from two threads, and on a busy 2-core machine OpenMP waits dominate."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture
def sub() -> transfer.Subject:
    """Qwen-Image's smoke pipeline with two transformer blocks (a small graph to compile), as a Subject."""
    two_blocks = {"num_layers": 2}  # First Block Cache needs a block after the first
    pipe = pipelines.build_pipeline("qwen-image", "smoke", dtype=torch.bfloat16, denoiser_config=two_blocks)
    pipe.set_progress_bar_config(disable=True)
    return transfer.make_subject(pipe, "qwen-image", "smoke", device=torch.device("cpu"), dtype=torch.bfloat16,
                                 dtype_name="bf16", compiler="eager", height=128, width=128, steps=2, tokens=32,
                                 guidance=3.5, denoiser_config=two_blocks)


def test_compile_works_and_a_planted_graph_break_is_caught(sub):
    clean = transfer.probe_compile(sub)
    assert clean.outcome == "works" and clean.measured["graph_breaks"] == 0, clean.text()
    assert transfer.works_problems(clean, TOL) == [] and transfer.verdict_holds(clean, TOL)

    block = sub.net.transformer_blocks[0]
    original = block.forward

    def broken(*args, **kwargs):
        torch._dynamo.graph_break()  # planted: what a print or an .item() in a block does to the graph
        return original(*args, **kwargs)

    block.forward = broken
    try:
        planted = transfer.probe_compile(sub)
    finally:
        del block.forward
    assert planted.outcome == "fails" and not planted.works, planted.text()
    assert planted.measured["graph_breaks"] >= 1 and "fullgraph=True refused" in planted.figure
    # the same cell edited to "works" is caught by the Checks cell's two checks
    edited = transfer.Cell(planted.model, planted.lever, "works", measured=dict(planted.measured, error=""))
    assert any("graph break" in p for p in transfer.works_problems(edited, TOL))
    assert not transfer.verdict_holds(transfer.Cell("qwen-image", "compile", "works", measured=planted.measured), TOL)


def test_a_planted_recompile_is_caught(sub):
    block = sub.net.transformer_blocks[0]
    original, calls = block.forward, [0]

    def drifting(*args, **kwargs):
        calls[0] += 1
        out = original(*args, **kwargs)
        return out if calls[0] % 2 else tuple(o * 1.0 for o in out)  # planted: a Python int the graph guards on

    block.forward = drifting
    try:
        planted = transfer.probe_compile(sub)
    finally:
        del block.forward
    assert planted.outcome == "recompiles" and planted.measured["recompiles"] >= 1, planted.text()
    edited = transfer.Cell("qwen-image", "compile", "works", measured=planted.measured)
    assert any("recompiles" in p for p in transfer.works_problems(edited, TOL))


def test_a_cache_that_skips_nothing_does_not_work(sub, monkeypatch):
    works = transfer.probe_cache(sub, "mag cache", "a cat", 6)
    assert works.outcome == "works" and works.measured["skipped"] > 0, works.text()
    monkeypatch.setitem(transfer.CACHE_SETTINGS, "first-block cache", 0.0)  # planted: threshold 0 skips nothing
    planted = transfer.probe_cache(sub, "first-block cache", "a cat", 6)
    assert planted.outcome == "fails" and "never took effect" in planted.message, planted.text()
    assert transfer.works_problems(transfer.Cell("qwen-image", "first-block cache", "works",
                                                 measured=planted.measured), TOL)


@pytest.fixture(scope="module")
def flux2() -> transfer.Subject:
    """FLUX.2 [dev]'s smoke pipeline as a Subject: diffusers 0.42.1's Flux2Pipeline opens no cache context."""
    pipe = pipelines.build_pipeline("flux2-dev", "smoke", dtype=torch.bfloat16)
    pipe.set_progress_bar_config(disable=True)
    return transfer.make_subject(pipe, "flux2-dev", "smoke", device=torch.device("cpu"), dtype=torch.bfloat16,
                                 dtype_name="bf16", compiler="eager", height=128, width=128, steps=2,
                                 tokens=transfer.text_tokens("flux2-dev", "smoke", 32), guidance=3.5)


def test_a_cache_that_asks_for_a_context_is_tried_inside_one(flux2, monkeypatch):
    taylor = transfer.probe_cache(flux2, "taylorseer cache", "a cat", 6)
    assert taylor.outcome == "needs a change" and taylor.measured["skipped"] > 0, taylor.text()
    assert transfer.NO_CACHE_CONTEXT in taylor.measured["plain_error"]
    assert taylor.measured["change"] == transfer.CACHE_CONTEXT_LINE and transfer.works_problems(taylor, TOL) == []
    # inside the context, diffusers 0.42.1's First Block Cache trips over FLUX.2's two block kinds (diffusers#14280;
    # when a release fixes it this cell turns to "needs a change" and this line says to look again)
    fbc = transfer.probe_cache(flux2, "first-block cache", "a cat", 6)
    assert fbc.outcome == "fails" and "TypeError" in fbc.message, fbc.text()
    assert transfer.NO_CACHE_CONTEXT in fbc.measured["plain_error"] and "plain call: ValueError" in fbc.message
    # planted: a cache_context that sets nothing: the retry raises the plain error again and the cell fails
    monkeypatch.setattr(type(flux2.net), "cache_context", lambda self, name: contextlib.nullcontext())
    planted = transfer.probe_cache(flux2, "taylorseer cache", "a cat", 6)
    assert planted.outcome == "fails" and transfer.NO_CACHE_CONTEXT in planted.measured["error"], planted.text()


def test_regional_compile_names_the_block_class_that_compiled_twice():
    pipe = pipelines.build_pipeline("flux-dev", "smoke", dtype=torch.bfloat16)
    sub = transfer.make_subject(pipe, "flux-dev", "smoke", device=torch.device("cpu"), dtype=torch.bfloat16,
                                dtype_name="bf16", compiler="eager", height=128, width=128, steps=2, tokens=32,
                                guidance=3.5)
    cell = transfer.probe_regional(sub)
    per_class = cell.measured["graphs_per_class"]
    # the single-stream block's first call gets contiguous image states, the later ones slices of the joined tensor
    assert per_class == {"FluxTransformerBlock": 1, "FluxSingleTransformerBlock": 2}, cell.text()
    assert sum(per_class.values()) == cell.measured["graphs"] and cell.works
    assert "(FluxSingleTransformerBlock 2 graphs: 'hidden_states' came with other strides)" in cell.figure
    assert "stride mismatch" in cell.measured["guard_failures"]["FluxSingleTransformerBlock"][0]  # the guard, kept
    assert transfer.guard_words("tensor 'x' size mismatch at index 1") == "'x' came with another size"
    assert transfer.guard_words("L['self'].training == True") == "L['self'].training == True"  # unknown: as it is
    assert transfer.extra_graphs({"graphs_per_class": {"A": 1, "B": 1}}) == ""  # nothing extra: nothing said


def test_the_library_s_refusal_is_recorded_with_its_message(sub):
    fp8 = transfer.probe_quantized(sub, "fp8")
    if torch.cuda.is_available():
        pytest.skip("a CUDA machine may run fp8")
    assert fp8.outcome == "refused here" and "compute capability" in fp8.message, fp8.text()
    model = transfer.probe_offload(sub, "model")
    assert model.outcome == "refused here" and "accelerator" in model.message
    group = transfer.probe_offload(sub, "group")
    assert group.outcome == "not run here" and "moves nothing" in group.figure and group.measured["drift"] == 0.0


@pytest.mark.parametrize(("lever", "measured", "outcome"), [
    # planted: every check of the verdicts, one failure each
    ("new resolution", {"sizes": [[160, 160], [192, 192]], "default_recompiles": 1, "dynamic_recompiles": 1},
     "recompiles"),
    ("new resolution", {"sizes": [[160, 160], [192, 192]], "default_recompiles": 1, "dynamic_recompiles": 0,
                        "graph_breaks": 2}, "breaks"),
    ("int8", {"layers": 4, "graphs": 1, "graph_breaks": 0, "recompiles": 0, "drift": 0.5}, "fails"),
    ("int8", {"refused": "AssertionError: needs CUDA"}, "refused here"),
    ("nf4", {"layers": 4, "drift": 0.9}, "fails"),
    ("lora hot-swap", {"ranks": [4, 8], "layers": 8, "swap_recompiles": 1, "drift": 0.0}, "recompiles"),
    ("lora hot-swap", {"ranks": [4, 8], "layers": 8, "swap_recompiles": 0, "drift": 0.2}, "fails"),
    ("group offload", {"drift": 0.3, "weights_off_device": "x"}, "fails"),
    ("group offload", {"drift": 0.0, "weights_off_device": "x", "moved": False}, "not run here"),  # a CPU moves nothing
    ("context parallel", {"cp_plan": 0}, "fails"),
    ("context parallel", {"cp_plan": 4, "drift": 0.5, "degree": 2, "backend": "gloo"}, "fails"),
    # planted: the change an error named, tried, and still not enough
    ("context parallel", {"cp_plan": 4, "drift": 0.5, "degree": 2, "backend": "gloo", "change": "ulysses_anything=True",
                          "plain_error": "AssertionError: ... divisible by mesh size"}, "fails"),
    ("context parallel", {"cp_plan": 4, "error": "RuntimeError: x", "change": "ulysses_anything=True",
                          "plain_error": "AssertionError: ... divisible by mesh size"}, "fails"),
    ("taylorseer cache", {"setting": 2, "unit": "attention", "steps": 6, "skipped": 0, "calls": 18, "finite": True,
                          "change": transfer.CACHE_CONTEXT_LINE, "plain_error": "ValueError: No cache context"}, "fails"),
    ("first-block cache", {"setting": 0.5, "unit": "block", "steps": 6, "error": "TypeError: x",
                           "change": transfer.CACHE_CONTEXT_LINE, "plain_error": "ValueError: No cache context"},
     "fails"),
    ("attention backends", {"ran": {"_native_math": {"fallback": "_native_math: expected a kernel matching 'math', "
                                                                 "ran flash", "drift": 0.0}}, "skipped": {}}, "fails"),
    ("attention backends", {"ran": {}, "skipped": {"flash": "not installed"}}, "fails"),
    ("regional compile", {"repeated_blocks": [], "full_compile_s": 1.0}, "fails"),
    ("regional compile", {"repeated_blocks": ["Block"], "graphs": 1, "graph_breaks": 0, "recompiles": 0,
                          "drift": 0.0, "compile_s": 2.0, "full_compile_s": 1.0}, "fails"),
])
def test_planted_measurements_never_read_as_works(lever, measured, outcome):
    cell = transfer.Cell("qwen-image", lever, "works", measured=measured)
    assert transfer.recompute(cell, TOL)[0] == outcome
    assert not transfer.verdict_holds(cell, TOL)


CHANGED = {
    "taylorseer cache": {"setting": 2, "unit": "attention", "steps": 6, "skipped": 6, "calls": 18, "finite": True,
                         "change": transfer.CACHE_CONTEXT_LINE, "plain_error": "ValueError: No cache context is set."},
    "context parallel": {"cp_plan": 4, "drift": 0.0, "degree": 2, "backend": "gloo", "weights": "random",
                         "dtype": "bf16", "text_tokens": 15, "image_tokens": 64, "change": "ulysses_anything=True",
                         "plain_error": "AssertionError: Tensor size ... must be divisible by mesh size"},
}


@pytest.mark.parametrize("lever", list(CHANGED))
def test_a_lever_that_works_only_with_a_change_says_so(lever):
    measured = CHANGED[lever]
    outcome, figure, message = transfer.recompute(transfer.Cell("qwen-image", lever, "fails", measured=measured), TOL)
    cell = transfer.Cell("qwen-image", lever, outcome, figure, message, measured)
    assert outcome == "needs a change" and not cell.works and transfer.works_problems(cell, TOL) == []
    assert cell.text().startswith("works with a change: `") and measured["plain_error"][:20] in cell.text()
    assert measured["change"] in transfer.row_fields(cell)["reason"]
    # planted: the same cell edited to a plain "works" is caught by both checks of the Checks cell
    edited = transfer.Cell("qwen-image", lever, "works", figure, "", measured)
    assert not transfer.verdict_holds(edited, TOL)
    assert any("only with a change" in p for p in transfer.works_problems(edited, TOL))
    # planted: a change claimed with no plain call that asked for it, and a change whose run drifted
    bare = {k: v for k, v in measured.items() if k != "plain_error"}
    assert any("no plain call failed" in p for p in transfer.works_problems(
        transfer.Cell("qwen-image", lever, "needs a change", measured=bare), TOL))
    assert any("drift" in p for p in transfer.works_problems(
        transfer.Cell("qwen-image", lever, "needs a change", measured=measured | {"drift": 0.5}), TOL))


def test_compile_seconds_are_labelled_by_backend():
    clean = {"graphs": 1, "graph_breaks": 0, "recompiles": 0, "drift": 0.0, "compile_s": 2.0}
    assert "cold trace (dynamo, eager backend) 2.00 s" in transfer.verdict_compile(clean | {"backend": "eager"}, TOL)[1]
    assert "cold compile 2.00 s" in transfer.verdict_compile(clean | {"backend": "inductor"}, TOL)[1]
    regional = clean | {"backend": "eager", "repeated_blocks": ["A", "B"], "full_compile_s": 4.0, "compile_s": 1.0}
    assert "cold trace (dynamo, eager backend) 1.00 s, 4.0x less" in transfer.verdict_regional(regional, TOL)[1]


def test_the_smoke_header_does_not_claim_more_than_the_backend_shows():
    assert "only on the full profile" in transfer.scope("smoke", "eager") and "token counts" in transfer.scope(
        "smoke", "eager")
    assert "only on the full profile" not in transfer.scope("smoke", "inductor") and transfer.scope("full", "x") == ""


def test_clean_measurements_read_as_works():
    for lever, measured in [
        ("new resolution", {"sizes": [[160, 160], [192, 192]], "default_recompiles": 1, "dynamic_recompiles": 0}),
        ("lora hot-swap", {"ranks": [4, 8], "layers": 8, "swap_recompiles": 0, "drift": 0.0, "graph_breaks": 0}),
        ("attention backends", {"ran": {"native": {"fallback": "", "drift": 0.0}}, "skipped": {}}),
        ("context parallel", {"cp_plan": 4, "drift": 1e-3, "degree": 2, "backend": "gloo"}),
    ]:
        cell = transfer.Cell("flux2-dev", lever, transfer.recompute(
            transfer.Cell("flux2-dev", lever, "works", measured=measured), TOL)[0], measured=measured)
        assert cell.works and transfer.works_problems(cell, TOL) == [], (lever, cell.outcome)


def test_the_table_and_its_rows_agree(tmp_path):
    cells = [transfer.Cell("flux-dev", "compile", "works", "1 graph(s), 0 breaks", measured={"graphs": 1}),
             transfer.Cell("qwen-image", "compile", "breaks", "2 graph break(s)", measured={"graph_breaks": 2}),
             transfer.Cell("qwen-image", "fp8", "refused here", "", "AssertionError: a | b")]
    frame = transfer.cells_frame(cells)
    assert list(frame.columns) == ["Flux-1-Dev", "Qwen-Image"] and list(frame.index) == ["compile", "fp8"]
    assert frame.loc["compile", "Qwen-Image"] == "works with graph breaks: 2 graph break(s)"
    assert frame.loc["fp8", "Flux-1-Dev"] == "" and "a / b" in frame.loc["fp8", "Qwen-Image"]  # '|' escaped
    path = transfer.write_table(tmp_path / "t.md", cells, "# header")
    lines = path.read_text().splitlines()
    assert lines[0] == "# header" and lines[2].startswith("| lever | Flux-1-Dev | Qwen-Image |") and len(lines) == 6
    fields = transfer.row_fields(cells[2])
    assert fields["status"] == "skipped" and fields["reason"].startswith("AssertionError")
    fails = transfer.row_fields(transfer.Cell("flux2-dev", "first-block cache", "fails", "", "ValueError: no context"))
    assert fails["status"] == "ok" and fails["reason"] == (  # measured, and says why, so 'ok' does not read as works
        "the lever fails here (a measured outcome): ValueError: no context")
    assert transfer.row_fields(cells[0])["reason"] == ""
    back = transfer.cell_from_row({"extra": {k: v for k, v in fields.items() if k not in ("status", "reason")}})
    assert back.text() == cells[2].text()
    with pytest.raises(ValueError, match="outcome="):
        transfer.Cell("flux-dev", "compile", "mostly works")
    # the TL;DR count: a planted failure or break is counted as such, never as working
    assert transfer.counts_line(cells) == ("Flux-1-Dev: 1 of 1 work; Qwen-Image: 0 of 2 work, 1 works with breaks or "
                                           "recompiles (compile), 1 refused or not run here (fp8)")
    planted = [*cells, transfer.Cell("flux-dev", "int8", "fails", "", "RuntimeError: x")]
    assert transfer.counts_line(planted).startswith("Flux-1-Dev: 1 of 2 work, 1 fails (int8);")
    changed = [*cells, *(transfer.Cell("flux-dev", lever, "needs a change", measured=CHANGED[lever])
                         for lever in CHANGED)]  # counted apart from plain works, never as works
    assert transfer.counts_line(changed).startswith(
        "Flux-1-Dev: 1 of 3 work, 2 work with a change (taylorseer cache, context parallel);")


def test_the_committed_counts_read_the_rows_each_machine_wrote(tmp_path):
    assert transfer.committed_counts(tmp_path) == "no run of this notebook is committed yet"
    (tmp_path / "cpu").mkdir()
    cell = transfer.Cell("qwen-image", "compile", "works", "1 graph(s)", measured={"graphs": 1})
    fields = transfer.row_fields(cell)  # as the writer stores them: status and reason, the rest under extra
    row = {"hardware": "cpu", "notebook": "16_does_it_transfer", "model": "all", "profile": "smoke", "run_id": "r1",
           "git_rev": "abcdef123456", "scenario": "compile | qwen-image", "status": fields.pop("status"),
           "reason": fields.pop("reason"), "extra": fields}
    (tmp_path / "cpu" / "16_does_it_transfer.jsonl").write_text(json.dumps(row) + "\n")
    assert transfer.committed_counts(tmp_path) == ("committed run (cpu, smoke profile): "
                                                   "Qwen-Image: 1 of 1 work")


def test_knobs_are_refused_naming_what_is_allowed():
    from helpers.params import ParameterError

    with pytest.raises(ParameterError, match="MODEL='all'"):
        transfer.check_model_weights("all", "Qwen/Qwen-Image")
    transfer.check_model_weights("qwen-image", "Qwen/Qwen-Image")
    with pytest.raises(ParameterError, match="TABLE_FILE"):
        transfer.table_path("table.txt", transfer.Path("/tmp"), "cpu", "smoke", "all")
    assert transfer.table_path(None, transfer.Path("/r"), "h100", "full", "qwen-image").name == \
        "transfer-table.qwen-image.md"


@pytest.mark.parametrize(("text", "device", "refusal"), [
    ("No GPU found. A GPU is needed for quantization.", "cpu", True),
    ("`enable_model_cpu_offload` requires accelerator, but not found", "cpu", True),
    ("Float8 dynamic quantization requires CUDA compute capability >=8.9 or MI300+ or XPU.", "cuda", True),
    # planted on a GPU: errors that name CUDA there are the failures the GPU check exists to find
    ("Expected all tensors to be on the same device, but found at least two devices, cuda:0 and cpu!", "cuda", False),
    ("CUDA out of memory. Tried to allocate 2.00 GiB", "cuda", False),
    ("CUBLAS_STATUS_NOT_SUPPORTED when calling cublasLtMatmul", "cuda", False),
])
def test_a_refusal_off_the_gpu_is_hardware_and_on_it_only_a_compute_capability(text, device, refusal):
    assert transfer._hardware_refusal(RuntimeError(text), torch.device(device)) is refusal


def test_a_quantized_probe_leaves_inductor_s_global_flags_at_their_defaults(sub):
    """torchao's configs switch on inductor flags for the whole process (set_inductor_config=True); the probe puts
    them back, so the probes after it (16's LoRA hot-swap among them) compile as they would alone."""
    from helpers import stack

    transfer.probe_quantized(sub, "int8")  # int8 runs on a CPU too
    assert {f: getattr(torch._inductor.config, f) for f in stack.INDUCTOR_DEFAULTS} == stack.INDUCTOR_DEFAULTS
