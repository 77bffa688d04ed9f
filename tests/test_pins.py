"""requirements.txt is the one place versions are pinned; environment.yml must agree with it."""

import re

from helpers import paths


def _pins(text: str) -> dict[str, str]:
    return {m.group(1).lower().replace("_", "-"): m.group(2)
            for m in re.finditer(r"^[\s-]*([A-Za-z0-9_.-]+)==([^\s#]+)", text, re.MULTILINE)}


def test_environment_yml_matches_requirements():
    req = _pins((paths.ROOT / "requirements.txt").read_text())
    env = _pins((paths.ROOT / "environment.yml").read_text())
    assert req == env, f"differ: {set(req.items()) ^ set(env.items())}"
    assert req["torch"] == "2.13.0" and req["diffusers"] == "0.42.1"


def test_every_requirement_is_pinned_exactly():
    for line in (paths.ROOT / "requirements.txt").read_text().splitlines():
        line = line.split("#")[0].strip()
        if line:
            assert re.fullmatch(r"[A-Za-z0-9_.-]+==[\w.]+", line), f"not an exact pin: {line}"


def test_environment_yml_has_no_unpinned_package():
    lines = [ln.strip()[2:].strip() for ln in (paths.ROOT / "environment.yml").read_text().splitlines()
             if ln.strip().startswith("- ") and ln.startswith("      ")]  # the pip: entries
    loose = [ln for ln in lines if "==" not in ln and ln != "-e ."]
    assert lines and not loose, f"environment.yml installs unpinned packages: {loose}"
