"""Judge generated digits: a small classifier, recognized share, Frechet distance, PSNR and SSIM.

The smoke profile's Flux is trained on scikit-learn's `digits` (8x8, upsampled to 128x128, white on black;
tools/train_smoke.py). A small MLP trained on the same digits, shipped in data/models/digit-classifier/, reads a
generated image reduced back to 8x8. A read counts only when the judge is sure it sees a digit: the classifier's
confidence at least the floor that real held-out digits reach, and the image no farther from the training digits
of that class than any held-out digit is (`read`; the two limits are chosen from the held-out digits by `calibrate`
and shipped in judge.json, so noise reads as "not a digit"). `recognized` is the share read as the prompted digit
(the CLIP-score analogue), `frechet_distance` compares its feature statistics with those of the real digits (the FID
analogue).
`psnr` and `ssim` (both plain torch, torchmetrics' definitions) compare an image with the reference image of the same seed and
prompt, the anchors' way of judging a lossy lever against bf16. scikit-learn is imported inside the function that
loads the digits (training and tests only), so judging needs neither it nor torchmetrics: the GPU host has neither.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np
import torch
from PIL import Image

from helpers import paths

MODELS_DIR: Path = paths.DATA_DIR / "models"
CONFIDENCE_QUANTILE = 0.01  # the confidence floor: what 99% of the held-out digits read correctly reach
CLASSIFIER_DIR: Path = MODELS_DIR / "digit-classifier"
SMOKE_MODEL_DIR: Path = MODELS_DIR / "flux-dev-smoke"
DIGIT_WORDS: tuple[str, ...] = ("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine")
# The prompt per digit that the model card, the tests and the notebooks use; training also sees PHRASINGS.
PHRASINGS: tuple[str, ...] = ("a handwritten digit {word}", "the number {word}, handwritten", "a {word}")
SIDE = 8  # the classifier reads 8x8 images, as scikit-learn's digits are
HOLDOUT_SEED = 0
HOLDOUT_SHARE = 0.2
FEATURES = 32  # width of the classifier's feature layer, on which the Frechet distance is taken

ImageLike = Image.Image | torch.Tensor | np.ndarray
Images = Sequence[ImageLike] | torch.Tensor


def prompt(digit: int, phrasing: int = 0) -> str:
    """The text prompt for a digit, e.g. prompt(7) == 'a handwritten digit seven'."""
    return PHRASINGS[phrasing].format(word=DIGIT_WORDS[digit])


def load_digits() -> tuple[torch.Tensor, torch.Tensor]:
    """scikit-learn's digits as (images (N, 8, 8) in [0, 1], labels (N,)); needs scikit-learn."""
    from sklearn.datasets import load_digits as sk_load_digits  # lazy: only training and tests need it

    data = sk_load_digits()
    images = torch.tensor(data.images, dtype=torch.float32) / 16.0
    return images, torch.tensor(data.target, dtype=torch.long)


def holdout_split(labels: torch.Tensor, share: float = HOLDOUT_SHARE,
                  seed: int = HOLDOUT_SEED) -> tuple[torch.Tensor, torch.Tensor]:
    """(train, held-out) indices, stratified by label: the same share of each digit held out, seeded."""
    gen = torch.Generator().manual_seed(seed)
    train, held = [], []
    for digit in range(10):
        idx = torch.nonzero(labels == digit).flatten()
        idx = idx[torch.randperm(len(idx), generator=gen)]
        n_held = round(len(idx) * share)
        held.append(idx[:n_held])
        train.append(idx[n_held:])
    return torch.cat(train).sort().values, torch.cat(held).sort().values


def upsample(digits: torch.Tensor, size: int = 128) -> torch.Tensor:
    """8x8 digits (N, 8, 8) in [0, 1] as RGB images (N, 3, size, size) in [0, 1], bilinear, white on black."""
    x = torch.nn.functional.interpolate(digits[:, None].float(), size=(size, size), mode="bilinear",
                                        align_corners=False)
    return x.clamp(0, 1).expand(-1, 3, -1, -1).contiguous()


def _as_tensor(image: ImageLike) -> torch.Tensor:
    """One image (PIL, HWC uint8 array, or CHW float tensor in [0, 1]) as a CHW float32 tensor in [0, 1]."""
    if isinstance(image, Image.Image):
        image = np.asarray(image.convert("RGB"))
    if isinstance(image, np.ndarray):
        t = torch.from_numpy(np.array(image))  # a writable copy
        t = t.permute(2, 0, 1) if t.ndim == 3 else t[None]
        return t.float() / 255.0 if image.dtype == np.uint8 else t.float()
    t = image.detach().float().cpu()
    return t[None] if t.ndim == 2 else t


def as_batch(images: Images) -> torch.Tensor:
    """PIL images, arrays or tensors as one float32 batch (N, C, H, W) in [0, 1] on the CPU."""
    if isinstance(images, torch.Tensor):
        batch = images.detach().float().cpu()
        return batch[None] if batch.ndim == 3 else batch
    return torch.stack([_as_tensor(im) for im in images])


def to_8x8(images: Images) -> torch.Tensor:
    """Images reduced as the classifier reads them: grey (mean of channels), area-averaged to 8x8, (N, 64)."""
    batch = as_batch(images).mean(dim=1, keepdim=True)
    return torch.nn.functional.adaptive_avg_pool2d(batch, SIDE).flatten(1)


class DigitClassifier(torch.nn.Module):
    """An MLP on 8x8 digits: 64 -> 256 -> FEATURES (the feature layer) -> 10 classes."""

    def __init__(self) -> None:
        super().__init__()
        self.body = torch.nn.Sequential(torch.nn.Linear(SIDE * SIDE, 256), torch.nn.ReLU(),
                                        torch.nn.Linear(256, FEATURES), torch.nn.ReLU())
        self.head = torch.nn.Linear(FEATURES, 10)

    def features(self, x: torch.Tensor) -> torch.Tensor:
        """Feature layer activations for flattened 8x8 inputs (N, 64) in [0, 1]."""
        return self.body(x)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Class logits for flattened 8x8 inputs (N, 64) in [0, 1]."""
        return self.head(self.body(x))


def train_classifier(x: torch.Tensor, y: torch.Tensor, *, seed: int = 0, epochs: int = 400) -> DigitClassifier:
    """Train the classifier on flattened 8x8 inputs (N, 64) in [0, 1], full-batch Adam, seeded (seconds on a CPU).

    Inputs get Gaussian noise (0.05) and a random brightness gain in [0.7, 1.3] each epoch, so a generated digit
    slightly dimmer or noisier than the data is still read by its shape."""
    gen = torch.Generator().manual_seed(seed)
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        model = DigitClassifier()
    opt = torch.optim.Adam(model.parameters(), lr=3e-3, weight_decay=1e-4)
    model.train()
    for _ in range(epochs):
        gain = torch.empty(len(x), 1).uniform_(0.7, 1.3, generator=gen)
        noisy = (x * gain + 0.05 * torch.randn(x.shape, generator=gen)).clamp(0, 1)
        loss = torch.nn.functional.cross_entropy(model(noisy), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
    return model.eval()


def feature_stats(features: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Mean and covariance (float64) of a feature matrix (N, D)."""
    f = features.double()
    return f.mean(0), torch.cov(f.T)


def save_classifier(model: DigitClassifier, folder: Path, *, real_features: torch.Tensor,
                    info: dict[str, Any]) -> None:
    """Write the classifier's weights and the real digits' feature statistics (safetensors) and info.json."""
    from safetensors.torch import save_file

    folder.mkdir(parents=True, exist_ok=True)
    mu, sigma = feature_stats(real_features)
    tensors = {f"model.{k}": v.contiguous() for k, v in model.state_dict().items()}
    tensors |= {"real_mu": mu, "real_sigma": sigma}
    save_file(tensors, str(folder / "model.safetensors"))
    (folder / "info.json").write_text(json.dumps(info, indent=2) + "\n")


@lru_cache(maxsize=2)
def _load(folder: str) -> tuple[DigitClassifier, torch.Tensor, torch.Tensor]:
    """The shipped classifier and the real digits' feature mean and covariance, loaded once."""
    from safetensors.torch import load_file

    tensors = load_file(str(Path(folder) / "model.safetensors"))
    model = DigitClassifier()
    model.load_state_dict({k.removeprefix("model."): v for k, v in tensors.items() if k.startswith("model.")})
    return model.eval(), tensors["real_mu"], tensors["real_sigma"]


def classifier(folder: Path = CLASSIFIER_DIR) -> DigitClassifier:
    """The shipped digit classifier (data/models/digit-classifier), in eval mode."""
    return _load(str(folder))[0]


def classifier_info(folder: Path = CLASSIFIER_DIR) -> dict[str, Any]:
    """What training reported about the shipped classifier (held-out accuracy, split, recipe)."""
    return json.loads((folder / "info.json").read_text())


@torch.no_grad()
def predict(images: Images, folder: Path = CLASSIFIER_DIR) -> torch.Tensor:
    """The digit the classifier reads in each image, (N,) long."""
    return classifier(folder)(to_8x8(images)).argmax(1)


@dataclass(frozen=True)
class Read:
    """What the judge reads in one image: the likeliest digit, its probability, the distance to the nearest training
    digit of that class (8x8, [0, 1]), and whether both are within the held-out digits' limits (else: not a digit)."""

    digit: int
    confidence: float
    distance: float
    is_digit: bool

    def __str__(self) -> str:
        what = f"a {self.digit}" if self.is_digit else f"under the judge's limits, likeliest {self.digit}"
        return f"{what}, confidence {self.confidence:.2f}, {self.distance:.2f} from the nearest real {self.digit}"


def _nearest_same_class(x8: torch.Tensor, digits: torch.Tensor, ref8: torch.Tensor, ref_labels: torch.Tensor
                        ) -> torch.Tensor:
    """Distance (L2, 8x8) from each row of x8 to the nearest reference digit of the class given in digits."""
    d = torch.cdist(x8.double(), ref8.double())
    d[digits[:, None] != ref_labels[None, :]] = math.inf
    return d.min(1).values.float()


@lru_cache(maxsize=2)
def _judge(folder: str) -> tuple[torch.Tensor, torch.Tensor, dict[str, Any]]:
    """The training digits (8x8 rows and labels) and the limits calibrate() chose, loaded once."""
    from safetensors.torch import load_file

    tensors = load_file(str(Path(folder) / "judge.safetensors"))
    return tensors["train_8x8"], tensors["train_labels"].long(), json.loads((Path(folder) / "judge.json").read_text())


def limits(folder: Path = CLASSIFIER_DIR) -> dict[str, Any]:
    """The judge's limits: confidence_floor, distance_ceiling, and how they were chosen from the held-out digits."""
    return dict(_judge(str(folder))[2])


@torch.no_grad()
def read(images: Images, folder: Path = CLASSIFIER_DIR) -> list[Read]:
    """What the judge reads in each image: a digit only when confident and close to real digits (noise is not)."""
    x8 = to_8x8(images)
    probs = classifier(folder)(x8).softmax(1)
    conf, digit = probs.max(1)
    ref8, ref_labels, lim = _judge(str(folder))
    dist = _nearest_same_class(x8, digit, ref8, ref_labels)
    return [Read(int(d), float(c), float(r), bool(c >= lim["confidence_floor"] and r <= lim["distance_ceiling"]))
            for d, c, r in zip(digit, conf, dist, strict=True)]


def recognized(images: Images, digits: Sequence[int] | torch.Tensor, folder: Path = CLASSIFIER_DIR) -> float:
    """Share of images (PIL or tensors, 128x128 RGB) that the judge reads, surely, as the prompted digit."""
    expected = [int(d) for d in (digits.tolist() if isinstance(digits, torch.Tensor) else digits)]
    found = read(images, folder)
    if len(found) != len(expected):
        raise ValueError(f"{len(found)} images but {len(expected)} digits")
    return sum(r.is_digit and r.digit == e for r, e in zip(found, expected, strict=True)) / len(expected)


def calibrate(model: DigitClassifier, folder: Path, images: torch.Tensor, labels: torch.Tensor,
              train: torch.Tensor, held: torch.Tensor) -> dict[str, Any]:
    """Choose the judge's limits from the held-out digits and write judge.safetensors and judge.json to folder.

    confidence_floor: the CONFIDENCE_QUANTILE quantile of the probability held-out digits read correctly reach;
    distance_ceiling: the largest distance from a held-out digit to the nearest training digit of its class."""
    from safetensors.torch import save_file

    x8 = to_8x8(upsample(images))
    with torch.no_grad():
        probs = model(x8[held]).softmax(1)
    conf, digit = probs.max(1)
    right = digit == labels[held]
    dist = _nearest_same_class(x8[held], labels[held], x8[train], labels[train])
    info = {"confidence_floor": round(float(torch.quantile(conf[right], CONFIDENCE_QUANTILE)), 4),
            "distance_ceiling": round(float(dist.max()), 4),
            "chosen_from": (f"{len(held)} held-out digits: the confidence floor is the {CONFIDENCE_QUANTILE:.0%} "
                            f"quantile of the probability of those read correctly; the distance ceiling the largest "
                            f"distance (8x8, [0, 1]) from one to the nearest training digit of its class"),
            "train_digits": len(train)}
    folder.mkdir(parents=True, exist_ok=True)
    save_file({"train_8x8": x8[train].contiguous(), "train_labels": labels[train].to(torch.int32).contiguous()},
              str(folder / "judge.safetensors"))
    (folder / "judge.json").write_text(json.dumps(info, indent=2) + "\n")
    write_heldout(folder, images, labels, held)
    _judge.cache_clear()
    return info


@torch.no_grad()
def features(images: Images, folder: Path = CLASSIFIER_DIR) -> torch.Tensor:
    """Classifier feature-layer activations of images, (N, FEATURES)."""
    return classifier(folder).features(to_8x8(images))


def _frechet(mu1: torch.Tensor, s1: torch.Tensor, mu2: torch.Tensor, s2: torch.Tensor) -> float:
    """Frechet distance between Gaussians: |mu1-mu2|^2 + tr(s1 + s2 - 2 (s1^1/2 s2 s1^1/2)^1/2)."""
    vals, vecs = torch.linalg.eigh(s1)
    root1 = vecs @ torch.diag(vals.clamp(min=0).sqrt()) @ vecs.T
    cross = torch.linalg.eigvalsh(root1 @ s2 @ root1).clamp(min=0).sqrt().sum()
    return float((mu1 - mu2).square().sum() + torch.trace(s1) + torch.trace(s2) - 2 * cross)


def frechet_distance(images: Images, reference: Images | None = None, folder: Path = CLASSIFIER_DIR) -> float:
    """Frechet distance between classifier features of images and of real digits (or of reference images).

    Without reference, the real side is the statistics of all 1,797 scikit-learn digits shipped with the
    classifier. Like FID, it is biased upward for small samples: compare values taken on the same number of
    images."""
    mu1, s1 = feature_stats(features(images, folder))
    if reference is None:
        _, mu2, s2 = _load(str(folder))
    else:
        mu2, s2 = feature_stats(features(reference, folder))
    return _frechet(mu1, s1, mu2.double(), s2.double())


HELDOUT_FILE = "heldout.safetensors"  # the held-out real digits (8x8), shipped beside the judge


def write_heldout(folder: Path, images: torch.Tensor, labels: torch.Tensor, held: torch.Tensor) -> Path:
    """Write the held-out digits (8x8 in [0, 1], with labels) to folder, for real_frechet on hosts without
    scikit-learn."""
    from safetensors.torch import save_file

    path = folder / HELDOUT_FILE
    save_file({"images": images[held].contiguous(), "labels": labels[held].to(torch.int32).contiguous()}, str(path))
    return path


def real_frechet(per_digit: int = 1, folder: Path = CLASSIFIER_DIR) -> float:
    """frechet_distance of real held-out digits, the first per_digit of each class: what real digits score at that
    sample size (it grows as the sample shrinks), to read a generated sample's distance against."""
    from safetensors.torch import load_file

    held = load_file(str(folder / HELDOUT_FILE))
    labels = held["labels"].long()
    idx = torch.cat([torch.nonzero(labels == d).flatten()[:per_digit] for d in range(10)])
    return frechet_distance(upsample(held["images"][idx]), folder=folder)


def psnr(image: Images, reference: Images) -> float:
    """Peak signal-to-noise ratio in dB of image against reference, data range 1, over the whole batch (torchmetrics'
    definition, in plain torch, so a GPU host without torchmetrics computes it too): inf if equal."""
    a, b = as_batch(image).double(), as_batch(reference).double()
    if a.shape != b.shape:
        raise ValueError(f"psnr: image batch {tuple(a.shape)} and reference batch {tuple(b.shape)} differ in shape")
    mse = float(((a - b) ** 2).mean())
    return math.inf if mse == 0 else 10 * math.log10(1.0 / mse)


def ssim(image: Images, reference: Images) -> float:
    """Structural similarity of image against reference, data range 1, 1 if equal: torchmetrics' definition (Gaussian
    window of sigma 1.5 and 11 pixels, reflected borders, k1 0.01, k2 0.03, mean over pixels and batch) in plain
    torch, so a GPU host without torchmetrics computes it too."""
    a, b = as_batch(image).double(), as_batch(reference).double()
    if a.shape != b.shape:
        raise ValueError(f"ssim: image batch {tuple(a.shape)} and reference batch {tuple(b.shape)} differ in shape")
    sigma, size = 1.5, int(3.5 * 1.5 + 0.5) * 2 + 1
    dist = torch.arange((1 - size) / 2, (1 + size) / 2, 1.0, dtype=torch.float64)
    g = torch.exp(-((dist / sigma) ** 2) / 2)
    g = (g / g.sum())[None]
    channels = a.shape[1]
    kernel = (g.T @ g).expand(channels, 1, size, size)
    pad = (size - 1) // 2
    a, b = (torch.nn.functional.pad(x, (pad, pad, pad, pad), mode="reflect") for x in (a, b))
    out = torch.nn.functional.conv2d(torch.cat((a, b, a * a, b * b, a * b)), kernel, groups=channels).split(len(a))
    mu_a2, mu_b2, mu_ab = out[0] ** 2, out[1] ** 2, out[0] * out[1]
    var_a, var_b = (out[2] - mu_a2).clamp(min=0), (out[3] - mu_b2).clamp(min=0)
    c1, c2 = 0.01**2, 0.03**2
    full = (2 * mu_ab + c1) * (2 * (out[4] - mu_ab) + c2) / ((mu_a2 + mu_b2 + c1) * (var_a + var_b + c2))
    return float(full.reshape(len(full), -1).mean(-1).mean())


def judgeable(weights: str) -> str | None:
    """None if images of these weights can be judged for quality, else the reason they cannot (random weights)."""
    if str(weights) == "random":
        return ("quality cannot be judged: WEIGHTS='random' draws noise, so recognized / Frechet / PSNR / SSIM "
                "would measure nothing; only the numerical distance to the reference is reported")
    return None


def _to_pil(image: ImageLike, size: int) -> Image.Image:
    """One image as an RGB PIL image of size x size (nearest, so pixels stay visible)."""
    t = _as_tensor(image).clamp(0, 1)
    if t.shape[0] == 1:
        t = t.expand(3, -1, -1)
    array = (t.permute(1, 2, 0).numpy() * 255).round().astype(np.uint8)
    return Image.fromarray(array).resize((size, size), Image.Resampling.NEAREST)


def image_grid(rows: Sequence[Images], labels: Sequence[str] | None = None, *, size: int = 128,
               pad: int = 4, columns: Sequence[str] | None = None) -> Image.Image:
    """Rows of images side by side (e.g. reference row, lever row: same seeds and prompts) as one PIL image.

    labels, one per row, are written at the left of each row; columns, one per column, above it."""
    from PIL import ImageDraw, ImageFont

    rows = [list(as_batch(r)) if isinstance(r, torch.Tensor) else list(r) for r in rows]
    font = ImageFont.load_default(size=14)  # Pillow's scalable default: its 10 px bitmap font drops the spaces
    label_w = 0 if not labels else 12 + int(max(font.getlength(s) for s in labels))
    head = 0 if not columns else 20
    cols = max(len(r) for r in rows)
    grid = Image.new("RGB", (label_w + cols * (size + pad) + pad, head + len(rows) * (size + pad) + pad), "white")
    draw = ImageDraw.Draw(grid)
    for j, title in enumerate(columns or []):
        x = label_w + pad + j * (size + pad) + (size - font.getlength(title)) / 2
        draw.text((x, pad), title, fill="black", font=font)
    for i, row in enumerate(rows):
        y = head + pad + i * (size + pad)
        if labels:
            draw.text((4, y + size // 2 - 8), labels[i], fill="black", font=font)
        for j, image in enumerate(row):
            grid.paste(_to_pil(image, size), (label_w + pad + j * (size + pad), y))
    return grid


def scores(images: Images, digits: Sequence[int] | torch.Tensor, reference: Images | None = None) -> dict[str, float]:
    """recognized and frechet of images; with the reference images of the same seeds and prompts, psnr and ssim."""
    out = {"recognized": recognized(images, digits), "frechet": frechet_distance(images)}
    if reference is not None:
        out |= {"psnr": psnr(images, reference), "ssim": ssim(images, reference)}
    return out
