"""Random JSON schemas for structured output (tests and benchmarks).

Small enough that a random-weight model completes any instance within about 150 tokens: bounded strings,
integers and arrays, no free-form numbers, every object closed (additionalProperties false).
"""

from __future__ import annotations

import random
from typing import Any

_NAMES = ["id", "name", "city", "count", "tags", "ok", "kind", "size", "items", "meta", "score", "note"]


def _scalar(rng: random.Random) -> dict[str, Any]:
    kind = rng.choice(["string", "integer", "boolean", "enum", "null", "pattern"])
    if kind == "string":
        return {"type": "string", "minLength": rng.randint(0, 2), "maxLength": rng.randint(2, 6)}
    if kind == "integer":
        low = rng.randint(-50, 50)
        return {"type": "integer", "minimum": low, "maximum": low + rng.randint(0, 500)}
    if kind == "enum":
        return {"enum": rng.sample(["red", "green", "blue", "alpha", "beta", 1, 2, True], rng.randint(1, 4))}
    if kind == "pattern":
        return {
            "type": "string",
            "pattern": rng.choice(["^[a-z]{2,4}$", "^[0-9]{3}-[0-9]{2}$", "^(yes|no)$"]),
        }
    return {"type": kind}


def _value(rng: random.Random, depth: int) -> dict[str, Any]:
    roll = rng.random()
    if depth < 2 and roll < 0.2:
        return random_object(rng, depth + 1, max_properties=2)
    if roll < 0.35:
        return {"type": "array", "items": _scalar(rng), "minItems": 0, "maxItems": rng.randint(1, 3)}
    if roll < 0.42:
        return {"anyOf": [_scalar(rng), _scalar(rng)]}
    return _scalar(rng)


def random_object(rng: random.Random, depth: int = 0, max_properties: int = 4) -> dict[str, Any]:
    names = rng.sample(_NAMES, rng.randint(1, max_properties))
    properties = {name: _value(rng, depth) for name in names}
    required = [n for n in names if rng.random() < 0.7]
    return {"type": "object", "properties": properties, "required": required, "additionalProperties": False}


def json_schemas(count: int, seed: int = 0) -> list[dict[str, Any]]:
    rng = random.Random(seed)
    return [random_object(rng) for _ in range(count)]
