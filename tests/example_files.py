"""The example manifests the tests read: `examples/*.yaml` (the maintained backends) and
`examples/tensorrt/*.yaml` (the seeds' engine builds, backend tensorrt)."""

from __future__ import annotations

from pathlib import Path

EXAMPLES_DIR = Path(__file__).resolve().parents[1] / "examples"
ENGINE_EXAMPLES_DIR = EXAMPLES_DIR / "tensorrt"


def example_files() -> list[Path]:
    """Every example, the maintained ones first."""
    return sorted(EXAMPLES_DIR.glob("*.yaml")) + sorted(ENGINE_EXAMPLES_DIR.glob("*.yaml"))


def example_id(path: Path) -> str:
    """A name unique among the examples: the stem, prefixed `tensorrt-` for the engine examples."""
    return path.relative_to(EXAMPLES_DIR).with_suffix("").as_posix().replace("/", "-")
