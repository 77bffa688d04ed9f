"""Where the project's folders are, independent of the working directory."""

from pathlib import Path

ROOT: Path = Path(__file__).resolve().parent.parent
NOTEBOOKS_DIR: Path = ROOT / "notebooks"
DATA_DIR: Path = ROOT / "data"
RESULTS_DIR: Path = DATA_DIR / "results"
REFERENCE_DIR: Path = DATA_DIR / "reference"
FIGURES_DIR: Path = ROOT / "figures"
MODELS_DIR: Path = DATA_DIR / "models"


def relative(path: Path) -> str:
    """path relative to the project root when it lies inside it (for rows and messages), else as given."""
    path = Path(path).resolve()
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)
