"""`python -m specdeploy_operator.crdgen [--out-dir DIR] [--docs FILE] [--check]`.

Writes `specdeploy.dev_speculativedeployments.yaml` and `specdeploy.dev_enginebuilds.yaml` into DIR (default
`crds`; the Helm chart's `crds/` is another DIR) and, with `--docs`, the API reference. With `--check` nothing
is written: the exit status is 1 when a file is missing or differs from what would be generated."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from .crd import render_crds
from .docs import render_api_docs


def _outputs(out_dirs: Sequence[Path], docs: Path | None) -> dict[Path, str]:
    outputs = {directory / name: text for directory in out_dirs for name, text in render_crds().items()}
    if docs is not None:
        outputs[docs] = render_api_docs()
    return outputs


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m specdeploy_operator.crdgen",
        description="Generate the specdeploy CRDs (and API docs) from the pydantic models.",
    )
    parser.add_argument(
        "--out-dir",
        type=Path,
        action="append",
        help="directory to write the CRDs into; repeat for several (default: crds)",
    )
    parser.add_argument("--docs", type=Path, help="also write the Markdown API reference to this file")
    parser.add_argument("--check", action="store_true", help="write nothing; exit 1 if any output is stale")
    args = parser.parse_args(argv)

    outputs = _outputs(args.out_dir or [Path("crds")], args.docs)
    if args.check:
        stale = [path for path, text in outputs.items() if not path.is_file() or path.read_text() != text]
        for path in stale:
            print(f"stale: {path} (run `make crds`)", file=sys.stderr)
        return 1 if stale else 0
    for path, text in outputs.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        if not path.is_file() or path.read_text() != text:
            path.write_text(text)
            print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
