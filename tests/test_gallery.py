"""helpers.gallery: every shown image is judged on the trained smoke model, and the Checks cell fails when one is not
its prompt's digit (planted: 08's old pipeline call without max_sequence_length draws a texture, not a digit)."""

import dataclasses

import pytest
import torch
from diffusers import FluxPipeline

from helpers import checks, gallery, quality, session
from helpers.params import PROFILE_SETTINGS

SMOKE = PROFILE_SETTINGS["smoke"]
PROMPT = "a handwritten digit seven"


@pytest.fixture(scope="module")
def pipe():
    pipe = FluxPipeline.from_pretrained(quality.SMOKE_MODEL_DIR, dtype=torch.float32)
    pipe.set_progress_bar_config(disable=True)
    return pipe


def _draw(pipe, prompt=PROMPT, seed=0, **extra):
    kwargs = {"height": SMOKE.height, "width": SMOKE.width, "num_inference_steps": SMOKE.steps,
                  "guidance_scale": SMOKE.guidance, "generator": torch.Generator().manual_seed(seed)} | extra
    return pipe(prompt=prompt, **kwargs).images[0]


def _session(tmp_path, weights="auto"):
    return session.start("gallery_test", PROFILE="smoke", WEIGHTS=weights, DTYPE="fp32", RESULTS_DIR=str(tmp_path))


def test_digit_in_prompt():
    assert gallery.digit_in("a handwritten digit seven") == 7
    assert gallery.digit_in("the number zero, handwritten") == 0
    assert gallery.digit_in("a cat") is None
    assert gallery.digit_in("one or two") is None


def test_shown_digit_is_judged_and_claimed(tmp_path, pipe, capsys):
    s = _session(tmp_path)
    got = s.gallery.show(_draw(pipe, max_sequence_length=SMOKE.max_sequence_length), PROMPT, "the image")
    assert got["judged"] and got["rows"][0]["holds"]
    out = capsys.readouterr().out
    assert "asked for a 7; the judge reads a 7" in out and out.count(gallery.EDGE_NOTE) == 1
    assert gallery.judge_rule() in out and "shrunk to 8x8 pixels" in out  # what the distance is measured in
    s.gallery.show(_draw(pipe, max_sequence_length=SMOKE.max_sequence_length), PROMPT, "again")
    again = capsys.readouterr().out
    assert gallery.EDGE_NOTE not in again, "the edge note is said once a run, not under every image"
    assert gallery.judge_rule() not in again and "from the nearest real 7" in again  # the rule once, the read each time
    claims = checks.Checks()
    claims.add("something", 1, 1, True)
    table = claims.evaluate(s.writer)
    assert table.loc["every image shown reads as its prompt's digit (a grid row: at least its floor)", "holds"]


def test_old_call_without_max_sequence_length_fails_the_checks(tmp_path, pipe):
    """Planted: 08's and 12's first call left out max_sequence_length (T5 pads to 512 tokens against a model trained
    on 32); the image is a texture, and the Checks cell now says so."""
    s = _session(tmp_path)
    got = s.gallery.show(_draw(pipe), PROMPT, "the image")
    assert got["judged"] and not got["rows"][0]["holds"]
    claims = checks.Checks()
    claims.add("something", 1, 1, True)
    with pytest.raises(checks.ChecksFailed, match="every image shown reads as its prompt's digit"):
        claims.evaluate(s.writer)


def test_grid_row_below_its_floor_fails(tmp_path, pipe, capsys):
    s = _session(tmp_path)
    msl = SMOKE.max_sequence_length
    prompts = [quality.prompt(d) for d in range(3)]
    good = [_draw(pipe, p, max_sequence_length=msl) for p in prompts]
    bad = [_draw(pipe, p) for p in prompts]
    got = s.gallery.show([good, bad], prompts, "two rows", labels=["ok", "padded"], floor=0.6)
    assert [r["holds"] for r in got["rows"]] == [True, False]
    assert got["rows"][0]["missed"] == [] and got["rows"][1]["missed"], got["rows"]  # the caption names the misses
    assert got["rows"][1]["missed"][0].startswith("the 0 (") and "from the nearest real " in got["rows"][1]["missed"][0]
    assert not gallery.claim(s.writer)[3]
    assert "of 3 read as their prompt's digit (this row needs 2)" in capsys.readouterr().out  # 0.6 of 3, rounded up


def test_random_weights_are_said_to_be_noise(tmp_path, capsys):
    s = _session(tmp_path, weights="random")
    got = s.gallery.show(torch.rand(3, 128, 128), PROMPT, "noise")
    assert not got["judged"]
    assert "random weights: the image is noise by design" in capsys.readouterr().out
    assert gallery.claim(s.writer) is None


def test_prompt_without_a_digit_is_not_judged(tmp_path, pipe, capsys):
    s = _session(tmp_path)
    s.show(_draw(pipe, "a cat", max_sequence_length=SMOKE.max_sequence_length), "a cat", "a cat")
    assert "names no digit" in capsys.readouterr().out
    assert gallery.claim(s.writer) is None


def test_committed_figures_skip_cpu():
    found = gallery.committed_figures("00_setup_and_baseline", "time_per_component")
    assert found and all(hw != "cpu" for hw, _ in found)
    assert gallery.committed_figures("00_setup_and_baseline", "no_such_figure") == []


def test_confident_texture_is_caught_by_the_distance(pipe):
    """Confidence alone is not enough: the textures of the call without max_sequence_length reach a confidence above
    the floor (up to 0.99 for a '3'), and the distance to the nearest real digit refuses every one of them."""
    images = [_draw(pipe, quality.prompt(d)) for d in range(10)]
    lim = quality.limits()
    reads = quality.read(images)
    confident = [r for r in reads if r.confidence >= lim["confidence_floor"]]
    assert confident, "no texture reached the confidence floor: this test would prove nothing"
    assert not any(r.is_digit for r in reads) and all(r.distance > lim["distance_ceiling"] for r in confident)


def test_the_card_names_the_step_count_the_images_take(tmp_path):
    """14's images take CACHE_STEPS (8 on smoke), not the profile's 2: the card's workload line says the notebook's."""
    s = _session(tmp_path)
    assert s.card_table().loc["workload", "value"].startswith(f"{SMOKE.height}x{SMOKE.width}, {SMOKE.steps} steps,")
    assert s.card_table(steps=8).loc["workload", "value"].startswith(f"{SMOKE.height}x{SMOKE.width}, 8 steps,")


def test_the_card_names_the_timing_the_notebook_used(tmp_path):
    """12 times 2 runs on smoke and 14 no warm-up: the full card's timing row says what ran, not the profile's."""
    s = _session(tmp_path)
    default = f"{SMOKE.warmup} warm-up + {SMOKE.repeats} timed runs, median reported"
    assert s.card_table(full=True).loc["timing", "value"] == default
    assert s.card_table(full=True, timing=(0, 2)).loc["timing", "value"] == "0 warm-up + 2 timed runs, median reported"


def test_the_cards_dtype_line_fits_the_table_whole(tmp_path):
    """At a glance the dtype line is the choice and its first reason, short enough that pandas does not cut it at
    max_colwidth (a planted 300-character reason was cut to '...' before); full=True keeps the whole reason."""
    s = _session(tmp_path)
    s.run = dataclasses.replace(s.run, dtype_reason="auto: fp32, because " + "x" * 150 + "; then " + "y" * 150)
    glance, full = s.card_table().loc["dtype", "value"], s.card_table(full=True).loc["dtype", "value"]
    assert len(glance) <= 200 and glance.endswith("x") and full == s.run.dtype_reason
    assert s.run.dtype_reason in s.card_table(full=True)._repr_html_(), "the displayed table shows the reason uncut"


def test_an_empty_grid_says_why_instead_of_crashing(tmp_path, capsys):
    """Planted: 08 on a small card, eager skipped and model offload's first image out of memory: no image at all."""
    s = _session(tmp_path)
    got = s.gallery.show([], [PROMPT], ", same seed", labels=[])
    assert got == {"judged": False, "rows": []}
    assert "same seed: no image to show" in capsys.readouterr().out
    assert gallery.claim(s.writer) is None


def test_the_full_card_says_each_thing_once_in_words(tmp_path):
    s = _session(tmp_path)
    full = s.card_table(full=True)
    names = list(full.index)
    assert len(names) == len(set(names)), "a row repeated"
    assert not {"device_name", "git_rev", "cpu_cores", "peak_tflops", "memory_cap"} & set(names)  # field names
    assert "GPU memory cap" not in names  # no cap: no empty row
    assert "measured matmul peak (TFLOP/s)" in names and "version: torch" not in names  # torch is in the top rows
    from helpers import session
    assert session.knob_text(None).startswith("None (the notebook's default") and session.knob_text("a b") == "a b"
    assert session.knob_text(["fp8", "cache"]) == "fp8, cache"


def test_the_card_names_each_models_text_tokens_in_notebook_16(tmp_path):
    """16 runs three models: its card gives each one's text tokens, not the profile's 32 for all (Qwen-Image read 15)."""
    s = session.start("gallery_test", PROFILE="smoke", MODEL="all", WEIGHTS="auto", DTYPE="fp32",
                      RESULTS_DIR=str(tmp_path), models=("all", "flux-dev", "qwen-image", "flux2-dev"))
    line = s.card_table().loc["workload", "value"]
    assert "32 for Flux-1-Dev, 64 for FLUX.2" in line and "own count for Qwen-Image" in line, line
    assert "32 T5 tokens" in _session(tmp_path).card_table().loc["workload", "value"]
