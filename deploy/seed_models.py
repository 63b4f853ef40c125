"""Seed a model repository with the default models: copy each missing model in atomically.

Usage: python seed_models.py [SOURCE [TARGET]]. SOURCE defaults to the `default-models` folder
beside this script (where the image keeps ./models), TARGET to $HYBRIDSERVE_MODEL_REPOSITORY or
/models. A model already present in TARGET is left alone, so running this twice, or from several
pods at once, is safe. Each model is copied into a hidden temporary folder inside TARGET (names
starting with '.' are never model names, so replicas polling TARGET ignore it) and then renamed
into place, so a replica never sees a half-copied model.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from pathlib import Path

DEFAULT_SOURCE = Path(__file__).resolve().parent / "default-models"
DEFAULT_TARGET = "/models"


def model_dirs(source: Path) -> list[Path]:
    """The model folders of a repository: visible subdirectories, sorted by name."""
    if not source.is_dir():
        raise FileNotFoundError(f"seed source {str(source)!r} is not a directory; expected a "
                                "model repository such as the image's default-models folder")
    return sorted(p for p in source.iterdir() if p.is_dir() and not p.name.startswith("."))


def seed_model(model: Path, target: Path) -> bool:
    """Copy one model folder into `target` unless present; True if this call placed it."""
    destination = target / model.name
    if destination.exists():
        return False
    staging = Path(tempfile.mkdtemp(prefix=f".seed-{model.name}-", dir=target))
    try:
        shutil.copytree(model, staging / model.name)
        try:
            os.rename(staging / model.name, destination)
        except OSError:
            if destination.exists():
                return False  # another seeder won the race; its copy is complete
            raise
        return True
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def seed(source: Path, target: Path) -> list[str]:
    """Copy every model of `source` missing from `target`; return the names copied."""
    if not target.is_dir():
        raise FileNotFoundError(f"seed target {str(target)!r} is not a directory; expected the "
                                "mounted model repository (HYBRIDSERVE_MODEL_REPOSITORY)")
    return [model.name for model in model_dirs(source) if seed_model(model, target)]


def main(argv: list[str] | None = None) -> int:
    """Seed TARGET from SOURCE and print what was copied and what was already there."""
    args = sys.argv[1:] if argv is None else argv
    source = Path(args[0]) if args else DEFAULT_SOURCE
    target_default = os.environ.get("HYBRIDSERVE_MODEL_REPOSITORY", DEFAULT_TARGET)
    target = Path(args[1]) if len(args) > 1 else Path(target_default)
    try:
        copied = seed(source, target)
    except OSError as error:
        print(f"seed failed: {error}", file=sys.stderr)
        return 1
    skipped = sorted({m.name for m in model_dirs(source)} - set(copied))
    print(f"seeded {target}: copied {copied or 'nothing'}; already present {skipped or 'none'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
