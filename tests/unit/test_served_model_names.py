"""The names a deployment is served under: `spec.serving.modelName` and its aliases, their defaults from the
target's URI, and what the operator renders from them (the server's config, `status.modelName`)."""

from __future__ import annotations

from typing import Any

import pytest
from specdeploy_operator.api import validate_object
from specdeploy_operator.builders import build_engine_builds, build_server_config

from tests.unit.builder_examples import COLOCATED, SETTINGS, deployment_of, example_body, parsed_example


def rendered_config(body: dict[str, Any]) -> dict[str, Any]:
    sdep = parsed_example(body)
    return build_server_config(sdep, build_engine_builds(sdep, SETTINGS), SETTINGS)


def rendered_model(body: dict[str, Any]) -> dict[str, Any]:
    model: dict[str, Any] = rendered_config(body)["model"]
    return model


@pytest.mark.parametrize(
    ("uri", "names"),
    [
        (
            "hf://meta-llama/Llama-3.1-8B-Instruct",
            ("meta-llama/Llama-3.1-8B-Instruct", "Llama-3.1-8B-Instruct"),
        ),
        ("pvc://model-store/llama-3.3-70b", ("llama-3.3-70b",)),
        ("s3://models/llama/8b/", ("8b",)),
    ],
)
def test_an_unnamed_target_is_served_under_its_hub_id_or_its_uris_last_segment(
    uri: str, names: tuple[str, ...]
) -> None:
    body = example_body(COLOCATED)
    body["spec"]["target"]["model"]["uri"] = uri
    assert parsed_example(body).spec.served_model_names == names


def test_the_users_name_comes_first_and_its_aliases_after_it_in_the_servers_config() -> None:
    body = example_body(COLOCATED)
    body["spec"].setdefault("serving", {}).update(
        {"modelName": "llama-8b", "modelAliases": ["gpt-4o", "fast"]}
    )
    assert parsed_example(body).spec.served_model_names == ("llama-8b", "gpt-4o", "fast")
    model = rendered_model(body)
    assert model["servedModelName"] == "llama-8b"
    assert model["servedModelAliases"] == ["gpt-4o", "fast"]


def test_a_named_deployment_drops_the_uri_name_and_a_lone_name_renders_no_aliases() -> None:
    body = example_body(COLOCATED)
    body["spec"].setdefault("serving", {})["modelName"] = "llama-8b"
    assert "servedModelAliases" not in rendered_model(body)


def test_a_renamed_model_rolls_the_pods() -> None:
    body = example_body(COLOCATED)
    before = deployment_of(parsed_example(body))["spec"]["template"]
    body["spec"].setdefault("serving", {})["modelName"] = "llama-8b"
    assert deployment_of(parsed_example(body))["spec"]["template"] != before


@pytest.mark.parametrize(
    ("serving", "field"),
    [
        ({"modelName": ""}, "spec.serving.modelName"),
        ({"modelAliases": ["a b"]}, "spec.serving.modelAliases[0]"),
        ({"modelAliases": [f"alias-{i}" for i in range(17)]}, "spec.serving.modelAliases"),
    ],
)
def test_bad_names_are_refused_naming_the_field(serving: dict[str, Any], field: str) -> None:
    body = example_body(COLOCATED)
    body["spec"].setdefault("serving", {}).update(serving)
    parsed, problems = validate_object(body)
    assert parsed is None
    assert field in [p.path for p in problems], problems
