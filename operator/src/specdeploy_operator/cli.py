"""The `specdeploy` command line.

`specdeploy validate -f FILE [-f FILE ...]` validates manifests offline with the same pydantic models the CRDs
are generated from. Every YAML document is checked (`---`-separated, `kind: List` items too); errors name the
field (`spec.draft: spec.draft is required when ...`). Exit status: 0 when everything is valid, 1 when
anything is not (or a file cannot be read or parsed), 2 on usage errors.

`specdeploy render -f FILE [--settings-env]` prints every object the operator would create for the
SpeculativeDeployments of FILE as multi-document YAML (like `helm template`), from the operator's own
builders. Operator settings are the defaults, or with `--settings-env` the `SPECDEPLOY_*` environment
variables."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

import yaml

from .api import API_VERSION, SpeculativeDeployment, validate_object
from .builders import OperatorSettings, dump_yaml, render_children

__all__ = ["main"]


@dataclass(frozen=True)
class _Document:
    label: str
    body: Any


def _documents(text: str) -> Iterator[_Document]:
    for index, body in enumerate(yaml.safe_load_all(text), start=1):
        if body is None:
            continue
        if isinstance(body, dict) and body.get("apiVersion") == "v1" and body.get("kind") == "List":
            for item_index, item in enumerate(body.get("items") or [], start=1):
                yield _Document(f"document {index}, item {item_index}", item)
        else:
            yield _Document(f"document {index}", body)


def _describe(body: Any) -> str:
    if not isinstance(body, dict):
        return ""
    metadata = body.get("metadata")
    name = metadata.get("name") if isinstance(metadata, dict) else None
    return f" ({body.get('kind', '?')}/{name or '?'})"


def _read(source: str) -> str:
    if source == "-":
        return sys.stdin.read()
    return Path(source).read_text()


def _validate_file(source: str, *, skip_other_kinds: bool, out: TextIO, err: TextIO) -> bool:
    name = "<stdin>" if source == "-" else source
    try:
        text = _read(source)
    except (OSError, UnicodeDecodeError) as error:
        print(f"{name}: cannot read: {error}", file=err)
        return False
    ok = True
    seen = 0
    try:
        for document in _documents(text):
            seen += 1
            ok = (
                _validate_document(name, document, skip_other_kinds=skip_other_kinds, out=out, err=err) and ok
            )
    except yaml.YAMLError as error:
        print(f"{name}: not valid YAML: {error}", file=err)
        return False
    if not seen:
        print(f"{name}: no documents", file=err)
        return False
    return ok


def _validate_document(
    name: str, document: _Document, *, skip_other_kinds: bool, out: TextIO, err: TextIO
) -> bool:
    where = f"{name}: {document.label}{_describe(document.body)}"
    body = document.body
    if skip_other_kinds and isinstance(body, dict) and body.get("apiVersion") != API_VERSION:
        print(f"{where}: skipped (apiVersion {body.get('apiVersion')!r})", file=out)
        return True
    _, errors = validate_object(body)
    if not errors:
        print(f"{where}: valid", file=out)
        return True
    print(f"{where}: invalid", file=err)
    for error in errors:
        print(f"  {error}", file=err)
    return False


def _validate(args: argparse.Namespace) -> int:
    results = [
        _validate_file(source, skip_other_kinds=args.skip_other_kinds, out=sys.stdout, err=sys.stderr)
        for source in args.filename
    ]
    return 0 if all(results) else 1


def _render(args: argparse.Namespace) -> int:
    settings = OperatorSettings.from_env(os.environ) if args.settings_env else OperatorSettings()
    name = "<stdin>" if args.filename == "-" else args.filename
    try:
        documents = list(_documents(_read(args.filename)))
    except (OSError, UnicodeDecodeError) as error:
        print(f"{name}: cannot read: {error}", file=sys.stderr)
        return 1
    except yaml.YAMLError as error:
        print(f"{name}: not valid YAML: {error}", file=sys.stderr)
        return 1
    objects: list[dict[str, Any]] = []
    ok = True
    for document in documents:
        body = document.body
        if not (isinstance(body, dict) and body.get("kind") == "SpeculativeDeployment"):
            continue
        parsed, errors = validate_object(body)
        if errors or not isinstance(parsed, SpeculativeDeployment):
            print(f"{name}: {document.label}{_describe(body)}: invalid", file=sys.stderr)
            for problem in errors:
                print(f"  {problem}", file=sys.stderr)
            ok = False
            continue
        if args.namespace and not parsed.metadata.namespace:
            parsed = parsed.model_copy(
                update={"metadata": parsed.metadata.model_copy(update={"namespace": args.namespace})}
            )
        objects += render_children(parsed, settings)
    if not ok:
        return 1
    if not objects:
        print(f"{name}: no SpeculativeDeployment", file=sys.stderr)
        return 1
    sys.stdout.write(dump_yaml(objects))
    return 0


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="specdeploy", description="specdeploy command line tools")
    commands = parser.add_subparsers(dest="command", required=True)
    validate = commands.add_parser(
        "validate",
        help="validate SpeculativeDeployment / EngineBuild manifests offline",
        description="Validate manifests with the models the CRDs are generated from; errors name the field.",
    )
    validate.add_argument(
        "-f",
        "--filename",
        action="append",
        required=True,
        metavar="FILE",
        help="manifest file ('-' for stdin); repeat for several",
    )
    validate.add_argument(
        "--skip-other-kinds",
        action="store_true",
        help=f"skip documents whose apiVersion is not {API_VERSION} instead of failing on them",
    )
    validate.set_defaults(run=_validate)
    render = commands.add_parser(
        "render",
        help="print the objects the operator would create for a manifest",
        description="Print every child object (EngineBuilds, Jobs, ConfigMap, Deployment, Service, "
        "PodDisruptionBudget) of the SpeculativeDeployments in FILE as multi-document YAML.",
    )
    render.add_argument(
        "-f", "--filename", required=True, metavar="FILE", help="manifest file ('-' for stdin)"
    )
    render.add_argument("-n", "--namespace", help="namespace for objects whose manifest sets none")
    render.add_argument(
        "--settings-env",
        action="store_true",
        help="take operator settings from SPECDEPLOY_* environment variables instead of the defaults",
    )
    render.set_defaults(run=_render)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the `specdeploy` console script."""
    args = _parser().parse_args(argv)
    code: int = args.run(args)
    return code


if __name__ == "__main__":
    sys.exit(main())
