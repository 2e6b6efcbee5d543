"""TensorRT-LLM releases: the two pins the server images are built on (`trtllm-releases.env`, read here, by
the image build and by the docs), how release versions order, and the first release of each method the
maintained path gained, which admission holds a deployment's release against."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from importlib.resources import files
from typing import Final

__all__ = [
    "FINAL",
    "METHOD_FLOORS",
    "RELEASES",
    "SA_COMBINED_FLOOR",
    "VERSION_PATTERN",
    "MethodFloor",
    "Releases",
    "TrtllmVersion",
    "cel_version_key",
    "read_releases",
]

VERSION_PATTERN: Final = r"^[0-9]+\.[0-9]+\.[0-9]+(rc[0-9]+)?(\.post[0-9]+)?$"
"""A TensorRT-LLM release as NGC tags it: `1.2.1`, `1.3.0rc27`, `1.2.0rc6.post3`."""
FINAL: Final = 999
"""The release-candidate number of a final release: after every `rc` of the same version."""
_PARTS = re.compile(r"^([0-9]+)\.([0-9]+)\.([0-9]+)(?:rc([0-9]+))?(?:\.post[0-9]+)?$")


@dataclass(frozen=True, order=True)
class TrtllmVersion:
    """A release, ordered as TensorRT-LLM orders them (a `.postN` build counts as its release)."""

    major: int
    minor: int
    patch: int
    rc: int
    text: str = field(compare=False)

    @classmethod
    def parse(cls, text: str) -> TrtllmVersion:
        match = _PARTS.match(text)
        if match is None:
            raise ValueError(f"{text!r} is not a TensorRT-LLM release such as 1.2.1 or 1.3.0rc27")
        major, minor, patch, rc = match.groups()
        return cls(int(major), int(minor), int(patch), FINAL if rc is None else int(rc), text)

    @property
    def key(self) -> int:
        """One integer in the order of releases: what :func:`cel_version_key` computes in CEL."""
        return self.major * 10**9 + self.minor * 10**6 + self.patch * 10**3 + self.rc

    def __str__(self) -> str:
        return self.text


def cel_version_key(expr: str) -> str:
    """CEL for :attr:`TrtllmVersion.key` of the string `expr` (a value matching VERSION_PATTERN)."""
    third = f"{expr}.split('.')[2]"
    return (
        f"(int({expr}.split('.')[0]) * 1000000000 + int({expr}.split('.')[1]) * 1000000 + "
        f"int({third}.split('rc')[0]) * 1000 + "
        f"({third}.contains('rc') ? int({third}.split('rc')[1]) : {FINAL}))"
    )


@dataclass(frozen=True)
class Releases:
    """The release of each backend's default server image."""

    pytorch: TrtllmVersion
    tensorrt: TrtllmVersion


def read_releases(text: str) -> Releases:
    """The pins of `trtllm-releases.env` (`NAME=version` lines; `#` comments)."""
    pins: dict[str, str] = {}
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        name, sep, value = line.partition("=")
        if not sep:
            raise ValueError(f"trtllm-releases.env line {number}: expected NAME=version, got {line!r}")
        pins[name.strip()] = value.strip()
    missing = {"PYTORCH", "TENSORRT"} - set(pins)
    if missing:
        raise ValueError(f"trtllm-releases.env: no {', '.join(sorted(missing))}")
    return Releases(TrtllmVersion.parse(pins["PYTORCH"]), TrtllmVersion.parse(pins["TENSORRT"]))


RELEASES: Final = read_releases(
    files("specdeploy_operator").joinpath("trtllm-releases.env").read_text(encoding="utf-8")
)


@dataclass(frozen=True)
class MethodFloor:
    """The first TensorRT-LLM release with a method, and what says so."""

    floor: TrtllmVersion
    evidence: str


METHOD_FLOORS: Final[dict[str, MethodFloor]] = {
    "ngram": MethodFloor(
        TrtllmVersion.parse("1.0.0"),
        "on the PyTorch path in every release read (1.0.0rc4 on)",
    ),
    "pard": MethodFloor(
        TrtllmVersion.parse("1.3.0rc7"),
        "v1.3.0rc7 release notes (NVIDIA/TensorRT-LLM#11438)",
    ),
    "suffixAutomaton": MethodFloor(
        TrtllmVersion.parse("1.3.0rc10"),
        "estimated: #11434 was in review in February 2026, after PARD; no release note names it",
    ),
    "dflash": MethodFloor(
        TrtllmVersion.parse("1.3.0rc20"),
        "#15666 ran DFlash (#12794) on 1.3.0rc20; the first release with it is not known",
    ),
}
"""The methods only the maintained path has, each with the first release that has it."""

SA_COMBINED_FLOOR: Final = MethodFloor(
    TrtllmVersion.parse("1.3.0rc27"),
    "in the 1.3.0rc27 API reference; earlier candidates took use_sa_spec/sa_spec_threshold",
)
"""`spec.speculative.suffixAutomaton` with eagle3, mtp or pard (TensorRT-LLM's `sa_config`)."""
