"""The chart's alerting rules (templates/prometheusrule.yaml): valid for the pinned Prometheus
(`promtool check rules`), each alert firing when it should and silent when it should not (`promtool test
rules` with the series of dashboard_alert_rules_test.yaml), the low-acceptance alert on the operator's own
threshold and minimum, and every runbook link landing on an anchor of docs/troubleshooting.md."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml
from specdeploy_operator.builders import OperatorSettings
from specdeploy_operator.controller.speculation import MIN_DRAFTED_FOR_ALARM

from tests.unit.dashboard_chart import (
    CHART,
    REPO,
    RULE_TESTS,
    alerts,
    bin_dir,
    render,
    write_rule_file,
)

TROUBLESHOOTING = REPO / "docs" / "troubleshooting.md"


def promtool(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(bin_dir() / "promtool"), *args],
        check=False,
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=120,
    )


def run_unit_tests(tmp_path: Path, sets: list[str] | None = None) -> subprocess.CompletedProcess[str]:
    write_rule_file(tmp_path / "rules.yaml", sets or [])
    shutil.copy(RULE_TESTS, tmp_path / "tests.yaml")
    return promtool("test", "rules", "tests.yaml", cwd=tmp_path)


def test_alerts_are_off_by_default_and_on_with_one_value() -> None:
    argv = [str(bin_dir() / "helm"), "template", "specdeploy", str(CHART)]
    out = subprocess.run(argv, check=True, capture_output=True, text=True).stdout
    assert "kind: PrometheusRule" not in out
    assert render("prometheusrule.yaml", ["monitoring.alerts.enabled=true"])["kind"] == "PrometheusRule"


def test_the_rendered_rules_pass_promtool_check(tmp_path: Path) -> None:
    write_rule_file(tmp_path / "rules.yaml")
    result = promtool("check", "rules", "rules.yaml", cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"SUCCESS: {len(alerts())} rules found" in result.stdout


def test_promtool_check_refuses_a_broken_expression(tmp_path: Path) -> None:
    """The check is a real one: the same rules with one expression broken are refused, naming it."""
    groups = [dict(g) for g in yaml.safe_load(write_rule_file(tmp_path / "rules.yaml").read_text())["groups"]]
    rule = groups[0]["rules"][0]
    rule["expr"] = rule["expr"].replace("sum by", "sum bye", 1)
    (tmp_path / "broken.yaml").write_text(yaml.safe_dump({"groups": groups}))
    result = promtool("check", "rules", "broken.yaml", cwd=tmp_path)
    assert result.returncode != 0
    assert rule["alert"] in result.stdout + result.stderr


def test_every_alert_fires_when_it_should_and_stays_silent_when_it_should_not(tmp_path: Path) -> None:
    result = run_unit_tests(tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout


def test_the_unit_tests_cover_every_alert_both_ways() -> None:
    """Each alert has a case where it fires and one where it must not (an empty `exp_alerts` while series
    that look like trouble are present)."""
    cases = yaml.safe_load(RULE_TESTS.read_text())["tests"]
    fires: set[str] = set()
    silent: set[str] = set()
    for case in cases:
        for check in case["alert_rule_test"]:
            (fires if check["exp_alerts"] else silent).add(check["alertname"])
    names = {a["alert"] for a in alerts()}
    assert fires == names
    assert silent == names


@pytest.mark.parametrize(
    ("sets", "alert"),
    [
        # 50 % acceptance is then low: the deployment the tests call healthy fires.
        (["settings.lowAcceptanceRate=0.6"], "SpecDeployLowAcceptance"),
        # 50 drafted tokens in the window are then enough: the deployment that drafts little fires.
        (["monitoring.alerts.lowAcceptance.minDraftedTokens=10"], "SpecDeployLowAcceptance"),
        # 1 % errors are then too many.
        (["monitoring.alerts.errorRatio.threshold=0.005"], "SpecDeployHighErrorRatio"),
        # Firing after 30 m only: the case that expects it at 20 m fails.
        (["monitoring.alerts.queueAtMaxReplicas.for=30m"], "SpecDeployQueueAboveTargetAtMaxReplicas"),
    ],
)
def test_the_unit_tests_fail_when_a_threshold_moves(tmp_path: Path, sets: list[str], alert: str) -> None:
    result = run_unit_tests(tmp_path, sets)
    assert result.returncode != 0
    assert f"alertname: {alert}" in result.stdout + result.stderr


def test_low_acceptance_uses_the_operators_threshold_and_minimum_drafted_tokens() -> None:
    """The operator owns both facts: its `low_acceptance_rate` setting, whose chart value
    (settings.lowAcceptanceRate) the rule reads, and MIN_DRAFTED_FOR_ALARM, which the chart's default
    minDraftedTokens must equal."""
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    assert values["settings"]["lowAcceptanceRate"] == OperatorSettings().low_acceptance_rate
    assert values["monitoring"]["alerts"]["lowAcceptance"]["minDraftedTokens"] == MIN_DRAFTED_FOR_ALARM
    [rule] = [a for a in alerts() if a["alert"] == "SpecDeployLowAcceptance"]
    assert f") < {OperatorSettings().low_acceptance_rate}\n" in rule["expr"]
    assert f">= {MIN_DRAFTED_FOR_ALARM}\n" in rule["expr"]
    [moved] = [a for a in alerts(["settings.lowAcceptanceRate=0.35"]) if a["alert"] == rule["alert"]]
    assert ") < 0.35\n" in moved["expr"]


def github_anchors(markdown: str) -> set[str]:
    """The anchors GitHub gives the headings of `markdown` (lower-cased, punctuation dropped, spaces to -)."""
    anchors = set()
    for line in markdown.splitlines():
        match = re.match(r"^#+\s+(.*)$", line)
        if match:
            text = re.sub(r"[^\w\- ]", "", match.group(1).strip().lower())
            anchors.add(text.replace(" ", "-"))
    return anchors


def test_every_alert_says_what_where_and_links_a_runbook_anchor_that_exists() -> None:
    anchors = github_anchors(TROUBLESHOOTING.read_text())
    base = yaml.safe_load((CHART / "values.yaml").read_text())["monitoring"]["alerts"]["runbookUrl"]
    assert base.endswith("/docs/troubleshooting.md")
    for alert in alerts():
        notes = alert["annotations"]
        assert notes["summary"], alert["alert"]
        assert notes["description"], alert["alert"]
        url, _, anchor = notes["runbook_url"].partition("#")
        assert url == base
        assert anchor in anchors, f"{alert['alert']}: no heading #{anchor} in docs/troubleshooting.md"
        if "deployment" in alert["expr"]:
            assert "$labels.deployment" in notes["description"], alert["alert"]


def test_extra_alert_labels_and_severities_are_values() -> None:
    rendered = alerts(
        ["monitoring.alerts.additionalAlertLabels.team=ml", "monitoring.alerts.operatorDown.severity=page"]
    )
    assert all(a["labels"]["team"] == "ml" for a in rendered)
    [down] = [a for a in rendered if a["alert"] == "SpecDeployOperatorDown"]
    assert down["labels"]["severity"] == "page"
