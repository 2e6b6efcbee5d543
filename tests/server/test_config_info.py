"""The server says which configuration it loaded: the operator/server contract, read from the live process."""

from __future__ import annotations

from specdeploy_server.config import ServerConfig, config_digest
from specdeploy_server.metrics import ServerMetrics


def test_config_info_metric_names_the_digest_of_the_effective_configuration() -> None:
    config = ServerConfig.model_validate(
        {"model": {"target": "/models/t", "draft": "/models/d"}, "speculative": {"draftLen": 3}}
    )
    metrics = ServerMetrics("t")
    metrics.set_config(config.dump())
    text = metrics.render().decode()
    line = next(x for x in text.splitlines() if x.startswith("specdeploy_server_config_info{"))
    assert f'config_sha256="{config_digest(config.dump())}"' in line
    assert 'draft_len="3"' in line
    assert 'method="None"' in line  # unset: the server derives draftTarget from model.draft
    assert line.endswith(" 1.0")


def test_the_digest_ignores_key_order_but_not_values() -> None:
    a = {"model": {"target": "/m", "draft": "/d"}, "backend": "auto"}
    b = {"backend": "auto", "model": {"draft": "/d", "target": "/m"}}
    assert config_digest(a) == config_digest(b)
    assert config_digest(a) != config_digest({**a, "backend": "pytorch-reference"})


def test_the_access_log_leaves_out_the_kubelets_probes() -> None:
    import logging

    from specdeploy_server.cli import _without_probes

    def record(path: str) -> logging.LogRecord:
        args = ("198.18.0.1:5000", "GET", path, "1.1", 200)
        return logging.LogRecord("uvicorn.access", logging.INFO, "", 0, '%s - "%s %s HTTP/%s" %d', args, None)

    assert not _without_probes(record("/health/ready"))
    assert not _without_probes(record("/health/live"))
    assert _without_probes(record("/v1/completions"))
    assert _without_probes(record("/metrics"))
