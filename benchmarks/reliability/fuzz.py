"""Schema-driven fuzzing of a live server: schemathesis generates requests for every operation of the server's
own OpenAPI document (valid and invalid, positive and negative), sends them, and runs all its checks on each
response (status documented, content type documented, headers, body schema - per event for streams - no 5xx,
invalid data refused, valid data accepted, unsupported methods 405 with ``Allow``, ...).

A share of the generated bodies get the served model's name, so that generation itself is fuzzed rather than
every request stopping at 404 ``model_not_found``.
"""

from __future__ import annotations

import itertools
import random
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, cast

import httpx
import schemathesis
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import seed as hypothesis_seed
from schemathesis.config import SchemathesisConfig
from schemathesis.core.result import Err
from schemathesis.generation import GenerationMode

#: The statuses a schema-valid request may get. 400 belongs here: some rules cannot be written in a static
#: schema (a prompt plus max_tokens longer than the context, token ids outside the vocabulary, an option the
#: backend does not apply, a JSON schema that does not compile); 503 is the bounded queue under load.
VALID_REQUEST_STATUSES = ["2xx", "400", "401", "404", "503"]

#: what a model name becomes in a generated body: the served name this often
SERVED_NAME_SHARE = 0.7


@dataclass
class FuzzTally:
    examples_per_operation: int
    requests: int = 0
    statuses: Counter[str] = field(default_factory=Counter)  # "METHOD /path STATUS" -> count
    failures: Counter[str] = field(default_factory=Counter)  # first line of each failed check -> count
    examples: list[str] = field(default_factory=list)  # a reproduction of the first few failures
    server_error_bodies: list[str] = field(default_factory=list)  # the first few requests answered >= 500
    modes: Counter[str] = field(default_factory=Counter)  # positive / negative -> count
    server_errors: int = 0  # responses >= 500
    executor_errors: int = 0  # of those, documented executor failures (code executor_error)

    def figures(self) -> dict[str, Any]:
        return {
            "requests": self.requests,
            "operations": len({key.rsplit(" ", 1)[0] for key in self.statuses}),
            "statuses": dict(sorted(self.statuses.items())),
            "modes": dict(self.modes),
            "failures": dict(self.failures),
            "server_errors": self.server_errors,
            "executor_errors": self.executor_errors,
            "examples": self.examples[:5],
            "server_error_bodies": self.server_error_bodies,
        }


def _config(seed: int) -> SchemathesisConfig:
    return SchemathesisConfig.from_dict(
        {"seed": seed, "checks": {"positive_data_acceptance": {"expected-statuses": VALID_REQUEST_STATUSES}}}
    )


def _with_served_name(body: Any, model: str, rng: random.Random) -> Any:
    if isinstance(body, dict) and "model" in body and rng.random() < SERVED_NAME_SHARE:
        return {**body, "model": model}
    return body


@dataclass(frozen=True)
class Target:
    base_url: str
    model: str
    timeout: float
    rng: random.Random  # hypothesis reseeds the global `random` for every example


def _test(operation: Any, mode: GenerationMode, tally: FuzzTally, target: Target) -> Callable[[], None]:
    """A hypothesis test that sends the generated cases of one operation and tallies what came back."""

    @given(case=operation.as_strategy(generation_mode=mode))
    @settings(
        max_examples=tally.examples_per_operation,
        deadline=None,
        database=None,
        phases=[Phase.explicit, Phase.generate],
        suppress_health_check=list(HealthCheck),
    )
    def one(case: Any) -> None:
        case.body = _with_served_name(case.body, target.model, target.rng)
        response = case.call(base_url=target.base_url, timeout=target.timeout)
        tally.requests += 1
        tally.statuses[f"{operation.label} {response.status_code}"] += 1
        tally.modes[mode.value] += 1
        if response.status_code >= 500:
            tally.server_errors += 1
            if len(tally.server_error_bodies) < 10:
                tally.server_error_bodies.append(f"{operation.label} {case.body!r}"[:600])
            if '"executor_error"' in response.text:
                tally.executor_errors += 1
        try:
            case.validate_response(response)
        except BaseException as exc:  # schemathesis raises a group of failed checks
            if isinstance(exc, KeyboardInterrupt):
                raise
            lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
            tally.failures[" / ".join(lines[1:3])[:200]] += 1
            if len(tally.examples) < 5:
                tally.examples.append("\n".join(lines[:12]))

    return cast(Callable[[], None], one)


def fuzz(
    base_url: str, model: str, examples_per_operation: int, seed: int = 0, timeout: float = 30
) -> FuzzTally:
    """Fuzz every operation of ``base_url``'s OpenAPI document; a failed check is counted, not raised, so one
    run reports them all."""
    schema = schemathesis.openapi.from_url(f"{base_url}/openapi.json", config=_config(seed))
    tally = FuzzTally(examples_per_operation)
    rng = random.Random(seed)
    operations = []
    for result in schema.get_all_operations():
        if isinstance(result, Err):
            raise result.err()
        operations.append(result.ok())
    for operation, mode in itertools.product(operations, GenerationMode):
        if mode is GenerationMode.NEGATIVE and not operation.body:
            continue  # nothing to make invalid: no body, no parameters
        test = _test(operation, mode, tally, Target(base_url, model, timeout, rng))
        hypothesis_seed(seed)(test)()
    return tally


def unsupported_methods(base_url: str) -> tuple[int, list[str]]:
    """Every documented path asked with every method it does not document: 405 with ``Allow`` naming the
    documented ones, in the OpenAI error shape; an unknown path: 404 the same way. Returns (requests,
    problems)."""
    problems: list[str] = []
    requests = 0
    with httpx.Client(base_url=base_url, timeout=10) as client:
        paths: dict[str, Any] = client.get("/openapi.json").json()["paths"]
        for path, operations in paths.items():
            documented = {method.upper() for method in operations}
            for method in sorted({"GET", "POST", "PUT", "PATCH", "DELETE"} - documented):
                response = client.request(method, path)
                requests += 1
                allowed = {m.strip() for m in response.headers.get("allow", "").split(",") if m.strip()}
                if response.status_code != 405 or not documented <= allowed or not _is_error(response):
                    problems.append(f"{method} {path}: {response.status_code} Allow={allowed}")
        response = client.get("/v1/no-such-route")
        requests += 1
        if response.status_code != 404 or not _is_error(response):
            problems.append(f"GET /v1/no-such-route: {response.status_code}")
    return requests, problems


def _is_error(response: httpx.Response) -> bool:
    try:
        error = response.json()["error"]
    except (ValueError, KeyError, TypeError):
        return False
    return isinstance(error, dict) and set(error) == {"message", "type", "param", "code"}
