"""Regenerate the tables of the docs that state facts of the code (`make docs`), as crdgen does for
docs/api.md.

Each table sits between two markers in its Markdown file and is rewritten from its source:

- docs/operator.md `settings`: every field of `OperatorSettings` (variable, chart value, default, meaning),
  the chart value read from the chart's Deployment template;
- docs/operator.md `rendered-objects`: what `specdeploy render` (`render_children`) produces for every
  example and for the variations in `RENDER_VARIATIONS`;
- docs/operator.md `conditions`: the condition types of each kind and the reasons each may take, from the
  status vocabulary (`specdeploy_operator.api.conditions`);
- docs/install.md `chart-objects`: what `helm template` renders with the default values and with each option
  of `CHART_OPTIONS`;
- docs/install.md `rbac`: the rules of the chart's ClusterRole (`helm template`), with the ones only some
  values add.

`python hack/docgen.py [--helm PATH] [--check]`; tests/unit/test_docgen.py and tests/chart/test_chart_docs.py
fail when a committed table differs from what this renders.
"""

from __future__ import annotations

import argparse
import copy
import itertools
import os
import re
import subprocess
import sys
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from specdeploy_operator.api import CONDITION_REASONS, ConditionType, SpeculativeDeployment, parse_object
from specdeploy_operator.api.trtllm import METHOD_FLOORS, RELEASES, SA_COMBINED_FLOOR
from specdeploy_operator.builders import OperatorSettings, render_children
from specdeploy_operator.builders.settings import ENV_PREFIX

REPO = Path(__file__).resolve().parents[1]
CHART = REPO / "charts" / "specdeploy"
OPERATOR_DOC = REPO / "docs" / "operator.md"
INSTALL_DOC = REPO / "docs" / "install.md"
TRTLLM_DOC = REPO / "docs" / "trtllm.md"
KUBE_VERSION = "1.35.4"
RELEASE, NAMESPACE = "specdeploy", "specdeploy-system"

# -------------------------------------------------------------------------------------------- markers


def begin_marker(name: str) -> str:
    return f"<!-- BEGIN GENERATED {name}: `make docs` (hack/docgen.py) rewrites this table; do not edit -->"


def end_marker(name: str) -> str:
    return f"<!-- END GENERATED {name} -->"


def replace_block(text: str, name: str, body: str) -> str:
    """`text` with the lines between the markers of `name` replaced by `body`."""
    begin, end = begin_marker(name), end_marker(name)
    if text.count(begin) != 1 or text.count(end) != 1:
        raise ValueError(f"expected one pair of markers for {name!r}")
    head, rest = text.split(begin, 1)
    _, tail = rest.split(end, 1)
    return f"{head}{begin}\n{body.rstrip()}\n{end}{tail}"


def cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def table(header: Sequence[str], rows: Iterable[Sequence[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(cell(c) for c in row) + " |" for row in rows]
    return "\n".join(lines) + "\n"


# ------------------------------------------------------------------------------------------- settings


def chart_values_by_env(template: str) -> dict[str, str]:
    """`SPECDEPLOY_*` variable -> the chart value that sets it, from the Deployment template's env list."""
    found: dict[str, str] = {}
    for match in re.finditer(r"- name: (SPECDEPLOY_[A-Z_]+)\n\s+value: (.*)", template):
        values = re.findall(r"\.Values\.([A-Za-z0-9_.]+)", match.group(2))
        if values:
            found[match.group(1)] = values[0]
    return found


def _default(value: Any) -> str:
    if value is None:
        return "unset"
    if isinstance(value, tuple):
        return "empty" if not value else "`" + ",".join(str(v) for v in value) + "`"
    return f"`{value}`"


def settings_table() -> str:
    chart = chart_values_by_env((CHART / "templates" / "deployment.yaml").read_text())
    defaults = OperatorSettings()
    rows = []
    for name, field in OperatorSettings.model_fields.items():
        env = ENV_PREFIX + name.upper()
        value = f"`{chart[env]}`" if env in chart else "none"
        # The variable has its own column: leave out the docstring's mentions of it.
        meaning = re.sub(rf"\s*\(`{env}`\)|`{env}`, ", "", field.description or "")
        rows.append((f"`{env}`", value, _default(getattr(defaults, name)), meaning))
    return table(("variable", "chart value", "default", "meaning"), rows)


# ----------------------------------------------------------------------------------------- conditions


def conditions_table() -> str:
    """Each condition type, the kind that carries it, and its reasons, in the vocabulary's order."""
    rows = []
    for type_, reasons in CONDITION_REASONS.items():
        kind = {
            ConditionType.SUCCEEDED: "EngineBuild",
            ConditionType.GENERATED: "DraftTraining",
            ConditionType.TRAINED: "DraftTraining",
            ConditionType.PROMOTED: "DraftTraining",
        }.get(type_, "SpeculativeDeployment")
        rows.append((f"`{type_}`", kind, ", ".join(f"`{reason}`" for reason in reasons)))
    return table(("condition", "on", "reasons"), rows)


# ----------------------------------------------------------------------------------- rendered objects


def _merge(base: dict[str, Any], patch: dict[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(base)
    for key, value in patch.items():
        out[key] = _merge(out.get(key, {}), value) if isinstance(value, dict) else value
    return out


#: (label, example, spec patch): objects no example renders
RENDER_VARIATIONS: tuple[tuple[str, str, dict[str, Any]], ...] = (
    (
        "08 with `autoscaling.engine: keda`",
        "08-autoscaling-llama8b-1b-h100",
        {"autoscaling": {"engine": "keda"}},
    ),
)
RENDER_LABELS = frozenset(label for label, _, _ in RENDER_VARIATIONS)


@dataclass(frozen=True)
class Rendered:
    label: str
    sdep: SpeculativeDeployment
    objects: list[dict[str, Any]]


def rendered_inputs() -> list[Rendered]:
    out = []
    # Keyed by the path under examples/ without .yaml, labelled by its number ("tensorrt/01": engine builds).
    root = REPO / "examples"
    paths = sorted(root.glob("*.yaml")) + sorted(root.glob("tensorrt/*.yaml"))
    examples = {p.relative_to(root).with_suffix("").as_posix(): p for p in paths}
    for key, path in examples.items():
        for doc in yaml.safe_load_all(path.read_text()):
            if doc and doc.get("kind") == "SpeculativeDeployment":
                sdep = parse_object(doc)
                assert isinstance(sdep, SpeculativeDeployment)
                out.append(Rendered(key.split("-")[0], sdep, render_children(sdep, OperatorSettings())))
    for label, stem, patch in RENDER_VARIATIONS:
        doc = yaml.safe_load(examples[stem].read_text())
        doc["spec"] = _merge(doc["spec"], patch)
        sdep = parse_object(doc)
        assert isinstance(sdep, SpeculativeDeployment)
        out.append(Rendered(label, sdep, render_children(sdep, OperatorSettings())))
    return out


def name_pattern(obj: dict[str, Any], sdep: SpeculativeDeployment) -> str:
    name = str(obj["metadata"]["name"])
    labels = obj["metadata"].get("labels", {})
    engine_hash, role = labels.get("specdeploy.dev/engine-hash"), labels.get("specdeploy.dev/engine-role")
    if engine_hash and role and f"-{role}-{engine_hash}" in name:
        return "<model>-<role>-<hash>" + name.split(f"-{role}-{engine_hash}", 1)[1]
    return name.replace(str(sdep.metadata.name), "<sdep>", 1)


def owner(obj: dict[str, Any]) -> str:
    refs = obj["metadata"].get("ownerReferences") or []
    if not refs:
        return "none"
    kind = str(refs[0]["kind"])
    return "the SpeculativeDeployment" if kind == "SpeculativeDeployment" else f"its {kind}"


def _distinct(values: Iterable[str]) -> list[str]:
    return list(dict.fromkeys(values))


def _job_steps(obj: dict[str, Any]) -> str:
    pod = obj["spec"]["template"]["spec"]
    return " → ".join(c["name"] for c in [*pod.get("initContainers", []), *pod["containers"]])


def _pdb(obj: dict[str, Any], sdep: SpeculativeDeployment) -> str:
    replicas = sdep.spec.replicas
    budget = obj["spec"]
    limit = (
        f"minAvailable {budget['minAvailable']}"
        if "minAvailable" in budget
        else (f"maxUnavailable {budget['maxUnavailable']} pod")
    )
    return f"{limit} with {replicas} replica{'s' if replicas != 1 else ''}"


def _hpa(obj: dict[str, Any], _: SpeculativeDeployment) -> str:
    return ", ".join(m["pods"]["metric"]["name"] for m in obj["spec"]["metrics"])


#: what the "details" column says of each kind; every kind rendered must have an entry
DETAILS: dict[str, Callable[[dict[str, Any], SpeculativeDeployment], str]] = {
    "PersistentVolumeClaim": lambda o, _: ", ".join(o["spec"]["accessModes"]),
    "EngineBuild": lambda o, _: (
        "`stageOnly`: the checkpoint staged, nothing built"
        if o["spec"].get("stageOnly")
        else "an engine build"
    ),
    "Job": lambda o, _: _job_steps(o),
    "ConfigMap": lambda o, _: ", ".join(f"`{k}`" for k in o["data"]),
    "Deployment": lambda o, _: "rolling update, maxSurge {maxSurge} / maxUnavailable {maxUnavailable}".format(
        **o["spec"]["strategy"]["rollingUpdate"]
    ),
    "LeaderWorkerSet": lambda o, _: (
        "groups of {size} pods (leader + workers), {restartPolicy}; rolling update, maxSurge {maxSurge} / "
        "maxUnavailable {maxUnavailable}"
    ).format(
        **o["spec"]["leaderWorkerTemplate"], **o["spec"]["rolloutStrategy"]["rollingUpdateConfiguration"]
    ),
    "Service": lambda o, _: (
        o["spec"]["type"] + ", port " + ", ".join(str(p["port"]) for p in o["spec"]["ports"])
    ),
    "PodDisruptionBudget": _pdb,
    "HorizontalPodAutoscaler": _hpa,
    "ScaledObject": lambda o, _: ", ".join(t["type"] + " trigger" for t in o["spec"]["triggers"]),
}


def apply_order(sequences: Iterable[Sequence[str]]) -> list[str]:
    """The kinds in an order every input's (apply) order agrees with; ties in order of first appearance."""
    seen: list[str] = []
    after: dict[str, set[str]] = {}
    for seq in sequences:
        kinds = _distinct(seq)
        for kind in kinds:
            if kind not in seen:
                seen.append(kind)
            after.setdefault(kind, set())
        for earlier, later in itertools.pairwise(kinds):
            after[later].add(earlier)
    out: list[str] = []
    while len(out) < len(seen):
        ready = [k for k in seen if k not in out and after[k] <= set(out)]
        if not ready:
            raise ValueError(f"the examples disagree on the order of {sorted(set(seen) - set(out))}")
        out.append(ready[0])
    return out


def rendered_objects_table() -> str:
    inputs = rendered_inputs()
    order = apply_order([str(o["kind"]) for o in item.objects] for item in inputs)
    rows: dict[str, dict[str, list[str]]] = {}
    for item in inputs:
        for obj in item.objects:
            kind = str(obj["kind"])
            if kind not in DETAILS:
                raise KeyError(f"hack/docgen.py DETAILS has no entry for {kind}")
            if kind not in rows:
                rows[kind] = {"name": [], "owner": [], "for": [], "details": []}
            row = rows[kind]
            row["name"].append(name_pattern(obj, item.sdep))
            row["owner"].append(owner(obj))
            row["for"].append(item.label)
            row["details"].append(DETAILS[kind](obj, item.sdep))
    every = [i.label for i in inputs if i.label not in RENDER_LABELS]

    def labels(found: list[str]) -> str:
        distinct = _distinct(found)
        if all(label in distinct for label in every):
            extra = [x for x in distinct if x not in every]
            return "every example" + (", " + ", ".join(extra) if extra else "")
        engine_path = [label for label in every if label.startswith("tensorrt/")]
        if engine_path and all(label in distinct for label in engine_path):
            distinct = [x for x in distinct if x not in engine_path]
            distinct.insert(
                next((i for i, x in enumerate(distinct) if x in RENDER_LABELS), len(distinct)), "tensorrt/*"
            )
        return ", ".join(distinct)

    out = []
    for kind in order:
        row = rows[kind]
        out.append(
            (
                kind,
                " or ".join(f"`{n}`" for n in _distinct(row["name"])),
                " or ".join(_distinct(row["owner"])),
                labels(row["for"]),
                "; ".join(_distinct(row["details"])),
            )
        )
    return table(("object", "name", "owner", "rendered for", "details"), out)


# --------------------------------------------------------------------------------------------- chart

#: (value set, how the doc names it): the options whose objects the chart-objects table lists
CHART_OPTIONS: tuple[tuple[Sequence[str], str], ...] = (
    (("replicaCount=2",), "`replicaCount` > 1"),
    (("metrics.serviceMonitor.enabled=true",), "`metrics.serviceMonitor.enabled`"),
    (("serverMetrics.podMonitor.enabled=true",), "`serverMetrics.podMonitor.enabled`"),
    (
        ("serverMetrics.prometheusAdapterRules.enabled=true",),
        "`serverMetrics.prometheusAdapterRules.enabled`",
    ),
    (("monitoring.dashboard.enabled=true",), "`monitoring.dashboard.enabled`"),
    (("monitoring.alerts.enabled=true",), "`monitoring.alerts.enabled`"),
    (("watchNamespaces={team-a,team-b}",), "`watchNamespaces: [team-a, team-b]`"),
)


def helm_template(helm: str, sets: Sequence[str] = ()) -> list[dict[str, Any]]:
    args = [helm, "template", RELEASE, str(CHART), "--namespace", NAMESPACE, "--include-crds"]
    args += ["--kube-version", KUBE_VERSION]
    for item in sets:
        args += ["--set", item]
    out = subprocess.run(args, capture_output=True, text=True, check=True, timeout=300).stdout
    return [doc for doc in yaml.safe_load_all(out) if doc]


def _key(obj: dict[str, Any]) -> tuple[str, str, str]:
    meta = obj["metadata"]
    return str(obj["kind"]), str(meta["name"]), str(meta.get("namespace", ""))


def chart_objects_table(helm: str) -> str:
    default = helm_template(helm)
    found: dict[tuple[str, str, str], list[str]] = {_key(o): ["default values"] for o in default}
    for sets, label in CHART_OPTIONS:
        for obj in helm_template(helm, sets):
            key = _key(obj)
            if "default values" not in found.get(key, []):
                found.setdefault(key, []).append(f"with {label}")
    rows = []
    for (kind, name, namespace), when in found.items():
        where = f" (namespace `{namespace}`)" if namespace and namespace != NAMESPACE else ""
        rows.append((kind, f"`{name}`{where}", "always" if when == ["default values"] else ", ".join(when)))
    return table(("object", "name (release `specdeploy` in `specdeploy-system`)", "installed"), rows)


def _rule_rows(objs: list[dict[str, Any]], kind: str) -> list[tuple[str, str, str, str]]:
    rows = []
    for obj in objs:
        if obj["kind"] != kind:
            continue
        for rule in obj["rules"]:
            groups = ", ".join("core" if g == "" else f"`{g}`" for g in rule.get("apiGroups", []))
            names = ", ".join(f"`{n}`" for n in rule.get("resourceNames", [])) or "all"
            resources = ", ".join(f"`{r}`" for r in rule["resources"])
            rows.append((groups, resources, ", ".join(rule["verbs"]), names))
    return rows


def rbac_table(helm: str) -> str:
    default = helm_template(helm)
    (role,) = (o for o in default if o["kind"] == "ClusterRole")
    base = _rule_rows(default, "ClusterRole")
    rows = [(*r, "always") for r in base]
    for sets, label in CHART_OPTIONS:
        if sets[0].startswith("watchNamespaces"):
            continue  # namespaced mode: Roles instead (described in prose)
        for extra in _rule_rows(helm_template(helm, sets), "ClusterRole"):
            if extra not in base:
                rows.append((*extra, f"with {label}"))
    head = f"ClusterRole `{role['metadata']['name']}` (release `{RELEASE}` in `{NAMESPACE}`):\n\n"
    return head + table(("API group", "resources", "verbs", "resource names", "granted"), rows)


# ---------------------------------------------------------------------------------------------- main


def default_helm() -> str:
    if os.environ.get("HELM"):
        return os.environ["HELM"]
    if os.environ.get("SPECDEPLOY_BIN_DIR"):
        return str(Path(os.environ["SPECDEPLOY_BIN_DIR"]) / "helm")
    import tempfile  # noqa: PLC0415

    from specdeploy_localcluster.cluster import LocalCluster  # noqa: PLC0415

    return str(LocalCluster(Path(tempfile.gettempdir()) / "specdeploy-unused").bin_dir / "helm")


def operator_doc(text: str) -> str:
    text = replace_block(text, "settings", settings_table())
    text = replace_block(text, "conditions", conditions_table())
    return replace_block(text, "rendered-objects", rendered_objects_table())


# ------------------------------------------------------------------------------------ TensorRT-LLM releases


def releases_table() -> str:
    """The two pins of trtllm-releases.env and the default image of each."""
    settings = OperatorSettings()
    rows = [
        (
            "`pytorch`, `transformers`",
            f"`{RELEASES.pytorch}`",
            f"`{settings.server_image}` (`settings.serverImage`)",
        ),
        (
            "`tensorrt`",
            f"`{RELEASES.tensorrt}`",
            f"`{settings.engine_server_image}` (`settings.engineServerImage`)",
        ),
    ]
    return table(("backend", "TensorRT-LLM release (`PYTORCH`, `TENSORRT`)", "default image"), rows)


_CONFIG_CLASS = {
    "ngram": "`NGramDecodingConfig`",
    "suffixAutomaton": "`SADecodingConfig`",
    "pard": "`PARDDecodingConfig`",
    "dflash": "`DFlashDecodingConfig`",
}


def method_floors_table() -> str:
    """Each maintained-path method, its config class, the first release admission accepts, and why."""
    rows = [
        (f"`{method}`", _CONFIG_CLASS[method], f"`{floor.floor}`", floor.evidence)
        for method, floor in METHOD_FLOORS.items()
    ]
    rows.append(
        (
            "`suffixAutomaton` with `eagle3`, `mtp`, `pard`",
            "`sa_config=SAEnhancerConfig(…)`",
            f"`{SA_COMBINED_FLOOR.floor}`",
            SA_COMBINED_FLOOR.evidence,
        )
    )
    return table(("method", "config", "first release", "evidence"), rows)


def trtllm_doc(text: str) -> str:
    text = replace_block(text, "trtllm-releases", releases_table())
    return replace_block(text, "method-floors", method_floors_table())


def install_doc(text: str, helm: str) -> str:
    text = replace_block(text, "chart-objects", chart_objects_table(helm))
    return replace_block(text, "rbac", rbac_table(helm))


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--helm", help="helm binary (default: $HELM, $SPECDEPLOY_BIN_DIR/helm, the harness's)"
    )
    parser.add_argument("--check", action="store_true", help="only report stale files (exit 1)")
    args = parser.parse_args(argv)
    helm = args.helm or default_helm()
    stale = []
    renders: tuple[tuple[Path, Callable[[str], str]], ...] = (
        (OPERATOR_DOC, operator_doc),
        (INSTALL_DOC, lambda t: install_doc(t, helm)),
        (TRTLLM_DOC, trtllm_doc),
    )
    for path, render in renders:
        old = path.read_text()
        new = render(old)
        if new != old:
            stale.append(path)
            if not args.check:
                path.write_text(new)
        print(f"{'stale' if args.check and new != old else 'wrote' if new != old else 'current'}: {path}")
    return 1 if args.check and stale else 0


if __name__ == "__main__":
    sys.exit(main())
