"""Request fields that steer speculation: OpenAI's ``prediction`` (Predicted Outputs) and the server's own
``speculation`` extension (sent through the SDKs' ``extra_body``). See docs/server.md "Predicted Outputs"."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field


class _Closed(BaseModel):
    """Strict types, and no field it does not know (a misspelt option is refused, naming it)."""

    model_config = ConfigDict(strict=True, extra="forbid")


class PredictionTextPart(_Closed):
    type: Literal["text"]
    text: str


class Prediction(_Closed):
    """``{"type": "content", "content": "..." | [{"type": "text", "text": "..."}]}``, as OpenAI's API."""

    type: Literal["content"]
    content: str | list[PredictionTextPart]

    def text(self) -> str:
        if isinstance(self.content, str):
            return self.content
        return "".join(part.text for part in self.content)


class SpeculationOptions(_Closed):
    """``speculation``: ``enabled: false`` decodes this request without draft tokens (no prediction either);
    ``max_draft_tokens`` caps its draft length (its prediction's drafts too)."""

    enabled: bool = True
    max_draft_tokens: int | None = Field(default=None, ge=0)

    def cap(self) -> int | None:
        """The request's draft-length cap (0: no speculation), None for the deployment's."""
        if not self.enabled:
            return 0
        return self.max_draft_tokens
