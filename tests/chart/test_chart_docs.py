"""docs/install.md's tables of what the chart installs and of the operator's ClusterRole are what `make docs`
(hack/docgen.py) renders from `helm template` now."""

from __future__ import annotations

from hack import docgen


def test_committed_install_doc_is_current(helm_bin: str) -> None:
    text = docgen.INSTALL_DOC.read_text()
    assert docgen.install_doc(text, helm_bin) == text, "docs/install.md is stale: run `make docs`"


def test_the_rbac_table_lists_every_rule_of_the_cluster_role(helm_bin: str) -> None:
    table = docgen.rbac_table(helm_bin)
    (role,) = (o for o in docgen.helm_template(helm_bin) if o["kind"] == "ClusterRole")
    for rule in role["rules"]:
        for resource in rule["resources"]:
            assert f"`{resource}`" in table
    assert "`keda.sh`" in table
