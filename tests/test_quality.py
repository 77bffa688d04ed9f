"""helpers.quality on planted values: PSNR / SSIM of identical and noised images, the classifier on real and wrong
digits, the Frechet distance of real digits (about 0) and of noise (large), the grid, the random-weights refusal."""

import math
import subprocess
import sys

import numpy as np
import pytest
import torch
from PIL import Image

from helpers import quality


@pytest.fixture(scope="module")
def digits():
    images8, labels = quality.load_digits()
    _, held = quality.holdout_split(labels)
    return quality.upsample(images8), labels, held


def test_identical_image_has_infinite_psnr_and_unit_ssim(digits):
    images, _, _ = digits
    assert quality.psnr(images[:4], images[:4].clone()) == math.inf
    assert quality.ssim(images[:4], images[:4].clone()) == pytest.approx(1.0, abs=1e-6)


def test_noised_image_scores_lower(digits):
    images, _, _ = digits
    ref = images[:4]
    gen = torch.Generator().manual_seed(0)
    slight = (ref + 0.02 * torch.randn(ref.shape, generator=gen)).clamp(0, 1)
    strong = (ref + 0.2 * torch.randn(ref.shape, generator=gen)).clamp(0, 1)
    assert quality.psnr(strong, ref) < quality.psnr(slight, ref)
    assert quality.ssim(strong, ref) < quality.ssim(slight, ref) < 1.0


def test_psnr_is_torchmetrics_psnr_without_torchmetrics(digits):
    """The plain-torch PSNR equals torchmetrics' (data range 1, whole batch); a planted offset moves it as 20 log10."""
    from torchmetrics.functional.image import peak_signal_noise_ratio

    images, _, _ = digits
    ref = images[:4]
    noised = (ref + 0.05 * torch.randn(ref.shape, generator=torch.Generator().manual_seed(1))).clamp(0, 1)
    assert quality.psnr(noised, ref) == pytest.approx(float(peak_signal_noise_ratio(noised, ref, data_range=1.0)),
                                                      abs=1e-4)
    assert quality.psnr(ref + 0.1, ref) == pytest.approx(20.0, abs=1e-4)  # mse 0.01: 10 log10(1 / 0.01)
    with pytest.raises(ValueError, match="differ in shape"):
        quality.psnr(ref[:2], ref)


def test_psnr_accepts_pil_images(digits):
    images, _, _ = digits
    pil = quality._to_pil(images[0], 128)
    assert quality.psnr([pil], images[:1]) > 40  # only the uint8 rounding differs


def test_real_held_out_digits_are_recognized(digits):
    images, labels, held = digits
    assert quality.recognized(images[held], labels[held]) >= 0.95
    assert quality.classifier_info()["held_out_accuracy"] >= 0.95


def test_wrong_digit_is_not_recognized(digits):
    images, labels, held = digits
    sevens = held[labels[held] == 7][:10]
    assert quality.recognized(images[sevens], [7] * len(sevens)) >= 0.9
    assert quality.recognized(images[sevens], [1] * len(sevens)) <= 0.1


def test_recognized_reads_pil_images_and_checks_lengths(digits):
    images, labels, held = digits
    pils = [quality._to_pil(im, 128) for im in images[held[:10]]]
    assert quality.recognized(pils, labels[held[:10]]) >= 0.9
    with pytest.raises(ValueError, match="images but"):
        quality.recognized(pils, [0, 1])


def test_frechet_distance_real_is_about_zero_and_noise_is_large(digits):
    images, _, held = digits
    assert quality.frechet_distance(images) == pytest.approx(0.0, abs=1e-3)  # the shipped real statistics
    real_held = quality.frechet_distance(images[held])
    noise = quality.frechet_distance(torch.rand((len(held), 3, 128, 128), generator=torch.Generator().manual_seed(0)))
    assert real_held < 5 and noise > 50 * max(real_held, 1.0)
    assert quality.frechet_distance(images[held], reference=images[held]) == pytest.approx(0.0, abs=1e-3)


def test_image_grid_lays_out_rows(digits):
    images, _, _ = digits
    grid = quality.image_grid([images[:3], [quality._to_pil(im, 128) for im in images[3:6]]], ["ref", "lever"],
                              size=32, pad=2)
    assert isinstance(grid, Image.Image)
    assert grid.height == 2 * 34 + 2 and grid.width > 3 * 34
    headed = quality.image_grid([images[:3]], ["ref"], size=32, pad=2, columns=["0", "1", "2"])
    assert headed.height == 20 + 34 + 2  # a strip above for the column titles
    strip = np.asarray(headed.convert("L"))[:20]
    assert (strip < 128).any(), "the column titles are drawn"


def test_random_weights_cannot_be_judged():
    assert "cannot be judged" in quality.judgeable("random")
    assert quality.judgeable(str(quality.SMOKE_MODEL_DIR)) is None


def test_prompt_words():
    assert quality.prompt(7) == "a handwritten digit seven"
    assert len({quality.prompt(d, p) for d in range(10) for p in range(len(quality.PHRASINGS))}) == 30


def test_importing_quality_needs_neither_sklearn_nor_torchmetrics():
    code = ("import sys, helpers.quality; "
            "print(sorted(m for m in ('sklearn', 'torchmetrics') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_scores_bundle_the_four_metrics(digits):
    images, labels, held = digits
    some = images[held[:20]]
    got = quality.scores(some, labels[held[:20]], reference=some)
    assert set(got) == {"recognized", "frechet", "psnr", "ssim"}
    assert got["psnr"] == math.inf and got["ssim"] == pytest.approx(1.0, abs=1e-6) and got["recognized"] >= 0.9
    assert set(quality.scores(some, labels[held[:20]])) == {"recognized", "frechet"}


def _noise(kind: str, n: int = 200) -> torch.Tensor:
    """Planted images that are not digits: uniform noise, grey noise on a flat colour (the texture of 08's old
    call), a flat grey and a smooth blob."""
    gen = torch.Generator().manual_seed(3)
    if kind == "uniform":
        return torch.rand(n, 3, 128, 128, generator=gen)
    if kind == "textured":
        return (torch.rand(n, 3, 1, 1, generator=gen) * 0.5 + 0.1 * torch.randn(n, 3, 128, 128, generator=gen)).clamp(0, 1)
    if kind == "flat":
        return torch.rand(n, 1, 1, 1, generator=gen).expand(-1, 3, 128, 128)
    yy, xx = torch.meshgrid(torch.linspace(-1, 1, 128), torch.linspace(-1, 1, 128), indexing="ij")
    centre = torch.rand(n, 2, 1, 1, generator=gen) - 0.5
    blob = torch.exp(-((xx - centre[:, :1]) ** 2 + (yy - centre[:, 1:]) ** 2) / 0.2)
    return blob.expand(-1, 3, -1, -1).contiguous()  # (n, 1, 128, 128) -> RGB


@pytest.mark.parametrize("kind", ["uniform", "textured", "flat", "blob"])
def test_noise_is_not_read_as_a_digit(kind):
    """Planted noise: the argmax alone reads a '7' in about half of such images; the judge reads no digit in any."""
    images = _noise(kind)
    reads = quality.read(images)
    assert not any(r.is_digit for r in reads), [str(r) for r in reads if r.is_digit][:3]
    assert all(quality.recognized(images, [d] * len(images)) == 0.0 for d in range(10))


def test_judge_limits_are_the_held_out_digits(digits):
    """judge.json is what calibrate chooses from the held-out digits (recomputed here into a scratch folder), and
    the limits admit almost every held-out digit."""
    import shutil
    import tempfile
    from pathlib import Path

    images, labels, held = digits
    images8, _ = quality.load_digits()
    train, _ = quality.holdout_split(labels)
    shipped = quality.limits()
    with tempfile.TemporaryDirectory() as tmp:
        for name in ("model.safetensors", "info.json"):
            shutil.copy(quality.CLASSIFIER_DIR / name, Path(tmp) / name)
        again = quality.calibrate(quality.classifier(), Path(tmp), images8, labels, train, held)
    assert {k: again[k] for k in ("confidence_floor", "distance_ceiling")} == \
        {k: shipped[k] for k in ("confidence_floor", "distance_ceiling")}
    reads = quality.read(images[held])
    assert sum(r.is_digit for r in reads) / len(reads) >= 0.98


def test_a_wrong_limit_is_caught(digits, monkeypatch):
    """Planted: with a distance ceiling of 0 nothing is a digit, so the held-out share collapses."""
    images, labels, held = digits
    ref8, ref_labels, lim = quality._judge(str(quality.CLASSIFIER_DIR))
    monkeypatch.setattr(quality, "_judge", lambda folder: (ref8, ref_labels, lim | {"distance_ceiling": 0.0}))
    assert quality.recognized(images[held], labels[held]) < 0.05


def test_ssim_is_torchmetrics_ssim_without_torchmetrics(digits):
    """The plain-torch SSIM equals torchmetrics' (its defaults, data range 1) on noised digits and on RGB noise."""
    from torchmetrics.functional.image import structural_similarity_index_measure as tm_ssim

    images, _, _ = digits
    ref = images[:4]
    gen = torch.Generator().manual_seed(2)
    for noise in (0.02, 0.2):
        noised = (ref + noise * torch.randn(ref.shape, generator=gen)).clamp(0, 1)
        assert quality.ssim(noised, ref) == pytest.approx(float(tm_ssim(noised, ref, data_range=1.0)), abs=1e-5)
    a, b = torch.rand(2, 3, 64, 64, generator=gen), torch.rand(2, 3, 64, 64, generator=gen)
    assert quality.ssim(a, b) == pytest.approx(float(tm_ssim(a, b, data_range=1.0)), abs=1e-5)
    with pytest.raises(ValueError, match="differ in shape"):
        quality.ssim(ref[:2], ref)


def test_real_digits_frechet_is_the_training_reports_floor_and_shrinks_with_the_sample(monkeypatch):
    """01 prints ten real digits' distance beside the formats'; the helper gives the figure training recorded, from
    the shipped held-out digits, on a host without scikit-learn (the GPU hosts have none)."""
    import json

    recorded = json.loads((quality.CLASSIFIER_DIR.parent / "flux-dev-smoke" / "metrics.json").read_text())["real_fd"]
    monkeypatch.setitem(sys.modules, "sklearn", None)  # an import of scikit-learn now fails
    assert quality.real_frechet(10) == pytest.approx(recorded, rel=1e-6)  # train_smoke's eval: 10 of each digit
    assert quality.real_frechet(1) > quality.real_frechet(4) > quality.real_frechet(10)  # biased up for small samples


def test_the_shipped_held_out_digits_are_the_judges_held_out_split():
    from safetensors.torch import load_file

    images, labels = quality.load_digits()
    _, held = quality.holdout_split(labels)
    shipped = load_file(str(quality.CLASSIFIER_DIR / quality.HELDOUT_FILE))
    assert torch.equal(shipped["images"], images[held]) and torch.equal(shipped["labels"].long(), labels[held])
