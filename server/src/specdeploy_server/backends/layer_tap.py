"""The outputs of chosen decoder layers, recorded during a forward pass and kept position by position (what an
EAGLE-3 head drafts from: backends/eagle3_drafter.py)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

__all__ = ["Features", "LayerTap"]

#: rows are merged into one tensor when more chunks than this have come in
MAX_CHUNKS = 64


class Features:
    """Per-position rows (the tapped layers' outputs, concatenated), kept as the chunks they came in."""

    def __init__(self) -> None:
        self._chunks: list[torch.Tensor] = []
        self._len = 0

    def __len__(self) -> int:
        return self._len

    def extend(self, rows: torch.Tensor) -> None:
        if rows.shape[0]:
            self._chunks.append(rows)
            self._len += int(rows.shape[0])
        if len(self._chunks) > MAX_CHUNKS:  # decoding adds one row a step: keep lookups short
            self._chunks = [torch.cat(self._chunks)]

    def truncate(self, length: int) -> None:
        while self._len > length:
            last = self._chunks[-1]
            keep = int(last.shape[0]) - (self._len - length)
            if keep > 0:
                self._chunks[-1] = last[:keep]
                self._len = length
            else:
                self._chunks.pop()
                self._len -= int(last.shape[0])

    def rows(self, start: int, end: int) -> torch.Tensor:
        """Rows ``start .. end - 1`` as one tensor."""
        out, offset = [], 0
        for chunk in self._chunks:
            size = int(chunk.shape[0])
            if offset + size > start and offset < end:
                out.append(chunk[max(start - offset, 0) : end - offset])
            offset += size
        return torch.cat(out) if len(out) > 1 else out[0]


class LayerTap:
    """Records the outputs of the hooked decoder layers while armed."""

    def __init__(self, layers: Sequence[torch.nn.Module]) -> None:
        self.armed = False
        self.outputs: list[torch.Tensor] = []
        for layer in layers:
            layer.register_forward_hook(self._record)

    def _record(self, module: torch.nn.Module, args: Any, output: Any) -> None:
        if self.armed:
            self.outputs.append(output if isinstance(output, torch.Tensor) else output[0])

    def run(self, forward: Any, **inputs: Any) -> tuple[Any, torch.Tensor]:
        self.outputs.clear()
        self.armed = True
        try:
            out = forward(**inputs)
        finally:
            self.armed = False
        features = torch.cat(self.outputs, dim=-1)
        self.outputs.clear()
        return out, features
