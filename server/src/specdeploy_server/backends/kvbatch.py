"""Per-request KV caches, run as one padded batch per forward pass (the reference backend's model side).

Each request keeps its own ``DynamicCache`` and the list of tokens that cache holds. Before a forward pass the
cache is cut back to the longest common prefix with the request's sequence, which is how rejected draft
tokens leave it ("trim on rejection") without the core having to say so.

A forward over several requests (:class:`PaddedBatch`) stacks their caches into one batched cache, left-padded
to the longest (``P`` positions), and feeds their new tokens right-padded to the longest (``N``); an
attention mask hides the padding and explicit position ids keep every row at its own positions, so each row
computes what it would alone. Tokens fed one at a time afterwards (drafting) are appended to every row. When
the pass is over, each row's cache becomes its slice of the batched one: a view when it is contiguous
(left padding, the row's cache, its new tokens), a copy that skips the right padding otherwise. A single
request runs on its own cache with no padding, no mask and no copy, exactly as one request alone.

Rows of a failed forward keep their caches as they were before it (cut to the common prefix, which stays
valid), so the caller may retry them one by one to find the request that failed.

With :meth:`CachedModel.tap` the outputs of some decoder layers are kept too, position by position beside
the tokens (what an EAGLE-3 head drafts from): every forward records them, and they are cut and committed
with the tokens they belong to.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from transformers import AutoModelForCausalLM, DynamicCache
from transformers.cache_utils import DynamicLayer

from specdeploy_server.backends.layer_tap import Features, LayerTap

log = logging.getLogger(__name__)

#: the token id fed at padding positions (never attended to, never kept)
PAD_ID = 0
#: a row with more tokens than this to feed beyond the positions whose logits are wanted is caught up in a
#: pass of its own when other rows of the batch have fewer (:meth:`PaddedBatch._catch_up_long_rows`)
LONG_CATCH_UP = 16


@dataclass
class _KV:
    cache: Any  # DynamicCache
    tokens: list[int] = field(default_factory=list)  # what the cache holds, position by position
    confirmed: int = 0  # tokens[:confirmed] is known to be a prefix of the request's sequence
    features: Features = field(default_factory=Features)  # with a tap: one row per token of ``tokens``


def _common_prefix(a: Sequence[int], b: Sequence[int], start: int) -> int:
    n = min(len(a), len(b))
    i = min(start, n)
    while i < n and a[i] == b[i]:
        i += 1
    return i


class CachedModel:
    """A causal LM with per-request KV caches, trimmed to the longest common prefix before each forward."""

    def __init__(self, path: Path, device: torch.device, dtype: torch.dtype | str) -> None:
        self.path = path
        self.device = device
        model: Any = AutoModelForCausalLM.from_pretrained(str(path), local_files_only=True, dtype=dtype)
        # Serving never trains: with gradients off, no forward records autograd history, whoever calls it and
        # in whatever grad mode (a recorded graph chains each cache to the batched caches it was cut from, and
        # through them to every earlier request's: memory that grows with every step until the process dies).
        self.model: Any = model.to(device).eval().requires_grad_(False)
        self.vocab_size = int(self.model.config.vocab_size)
        #: the keyword the model's forward takes its cache by: ``cache`` from transformers 5.24 (where
        #: ``past_key_values`` still works, through a deprecation shim that warns on every call), else
        #: ``past_key_values``
        self.cache_kwarg = (
            "cache" if "cache" in inspect.signature(self.model.forward).parameters else "past_key_values"
        )
        self._kv: dict[str, _KV] = {}
        probe = DynamicCache(config=self.model.config)
        #: several requests share a forward only when every cache layer is a plain growing one (a sliding
        #: window or recurrent layer cannot be stacked and sliced this way): otherwise one after another
        self.batches = all(type(layer) is DynamicLayer for layer in getattr(probe, "layers", [None]))
        self._tap: LayerTap | None = None

    def tap(self, layer_ids: Sequence[int]) -> None:
        """Keep the outputs of decoder layers ``layer_ids`` (0-based, in this order, concatenated) for every
        position each request's cache holds (:meth:`features`)."""
        layers = self.model.model.layers
        self._tap = LayerTap([layers[i] for i in layer_ids])

    def features(self, request_id: str, tokens: Sequence[int], start: int, end: int) -> torch.Tensor | None:
        """The tapped rows of positions ``start .. end - 1`` of ``tokens``, or None unless the request's cache
        holds them for exactly those tokens."""
        kv = self._kv.get(request_id)
        if kv is None or len(kv.features) < end or end <= start:
            return None
        if _common_prefix(kv.tokens, tokens, min(kv.confirmed, end)) < end:
            return None
        return kv.features.rows(start, end)

    def forward(self, **inputs: Any) -> tuple[Any, torch.Tensor | None]:
        """One forward pass of the model (with the tapped layers' outputs, ``[batch, positions, ...]``)."""
        if self._tap is None:
            return self.model(**inputs), None
        return self._tap.run(self.model, **inputs)

    def release(self, request_id: str) -> None:
        self._kv.pop(request_id, None)

    def cached_tokens(self, request_id: str) -> int:
        kv = self._kv.get(request_id)
        return 0 if kv is None else int(kv.cache.get_seq_length())

    def prepare(self, request_id: str, full: Sequence[int], keep_last: int) -> tuple[_KV, list[int]]:
        """The request's cache cut back to what it shares with ``full`` (keeping at least ``keep_last``
        positions to compute), and the tokens of ``full`` still to feed."""
        kv = self._kv.get(request_id)
        if kv is None:
            kv = self._kv[request_id] = _KV(DynamicCache(config=self.model.config))
        common = min(_common_prefix(kv.tokens, full, kv.confirmed), len(full) - keep_last)
        kv.confirmed = common
        # the cache's own length: a single request's pass extends its cache in place, so one that failed
        # after its forward (before ``commit``) left positions that ``tokens`` does not list
        cached = int(kv.cache.get_seq_length())
        if cached > common:
            kv.cache.crop(common - cached)  # negative: remove that many positions (works on 4.x and 5.x)
        del kv.tokens[common:]
        kv.features.truncate(common)
        return kv, list(full[common:])

    @torch.inference_mode()
    def logits_for(self, request_id: str, prefix: Sequence[int], extra: Sequence[int]) -> torch.Tensor:
        """Logits (float32, on CPU) for the last ``len(extra) + 1`` positions of ``prefix + extra``.

        Row i predicts the token after ``prefix + extra[:i]``.
        """
        return self.logits_rows([(request_id, prefix, extra)])[0]

    @torch.inference_mode()
    def logits_rows(self, rows: Sequence[tuple[str, Sequence[int], Sequence[int]]]) -> list[torch.Tensor]:
        """:meth:`logits_for` of several requests, in one forward pass."""
        batch = PaddedBatch(self, [(rid, [*prefix, *extra], len(extra) + 1) for rid, prefix, extra in rows])
        logits = batch.run()
        batch.commit()
        return logits

    @torch.inference_mode()
    def prompt_logits(self, token_ids: Sequence[int]) -> torch.Tensor:
        """Logits (float32, CPU) at every position of ``token_ids``, without a cache."""
        out = self.model(input_ids=torch.tensor([list(token_ids)], dtype=torch.long, device=self.device))
        logits: torch.Tensor = out.logits[0].float().cpu()
        return logits

    @torch.inference_mode()
    def append(self, request_id: str, token: int) -> torch.Tensor:
        """Feed one more token after what the cache holds; logits (float32, CPU) of that position."""
        kv = self._kv[request_id]
        out, features = self.forward(
            input_ids=torch.tensor([[token]], dtype=torch.long, device=self.device),
            **{self.cache_kwarg: kv.cache},
            use_cache=True,
        )
        kv.tokens.append(token)
        if features is not None:
            kv.features.extend(features[0])
        logits: torch.Tensor = out.logits[0, -1].float().cpu()
        return logits


def _fill(layer: Any, keys: torch.Tensor, values: torch.Tensor) -> None:
    """Make a cache layer hold ``keys``/``values`` as they are (no copy)."""
    if not layer.is_initialized:
        layer.update(keys[:, :, :0], values[:, :, :0])  # initialises dtype and device, concatenates nothing
    layer.keys, layer.values = keys, values


class PaddedBatch:
    """One forward pass over several requests' caches, then optionally more tokens one at a time per row.

    ``rows``: (request id, the sequence whose logits are wanted, how many of its last positions' logits).
    """

    def __init__(self, model: CachedModel, rows: Sequence[tuple[str, Sequence[int], int]]) -> None:
        self.model = model
        self.kvs: list[_KV] = []
        self.request_ids = [request_id for request_id, _, _ in rows]
        self.new: list[list[int]] = []
        self.keep = [keep for _, _, keep in rows]
        for request_id, full, keep in rows:
            kv, new = model.prepare(request_id, full, keep)
            self.kvs.append(kv)
            self.new.append(new)
        if len(rows) > 1 and self._catch_up_long_rows(rows):
            self.new = [model.prepare(request_id, full, keep)[1] for request_id, full, keep in rows]
        self.lens = [int(kv.cache.get_seq_length()) for kv in self.kvs]
        self.fed: list[list[int]] = [[] for _ in rows]  # tokens fed one at a time after the first pass
        #: with a tap: each row's feature rows of its new tokens, then of each token fed after them
        self.features: list[list[torch.Tensor]] = [[] for _ in rows]
        self.cache: Any = None
        self.mask: torch.Tensor | None = None
        self.positions: torch.Tensor | None = None

    @property
    def single(self) -> bool:
        return len(self.kvs) == 1

    def _catch_up_long_rows(self, rows: Sequence[tuple[str, Sequence[int], int]]) -> bool:
        """Rows with a long way to catch up (a new request's prompt) beside rows with a few tokens to feed
        (running requests) are first fed, among themselves, all but the positions whose logits are wanted:
        one padded pass would otherwise be as wide as the longest for every row (a prompt of 50 tokens
        joining 7 running requests: 400 positions computed instead of about 60), and so would every draft
        pass after it, since the padding stays in the batched cache. Whether anything was fed."""
        excess = [len(new) - keep for new, keep in zip(self.new, self.keep, strict=True)]
        long = [i for i, extra in enumerate(excess) if extra > LONG_CATCH_UP]
        if not long or len(long) == len(rows):
            return False
        prefixes = PaddedBatch(
            self.model, [(rows[i][0], rows[i][1][: len(rows[i][1]) - rows[i][2]], 1) for i in long]
        )
        prefixes.run()
        prefixes.commit()
        return True

    @torch.inference_mode()
    def run(self) -> list[torch.Tensor]:
        """The first pass; per row, logits (float32, CPU) of the last ``keep`` of its positions."""
        device = self.model.device
        width = max(len(n) for n in self.new)
        depth = max(self.lens)
        if self.single:
            self.cache = self.kvs[0].cache
            inputs = torch.tensor(self.new, dtype=torch.long, device=device)
            out = self._in_place(input_ids=inputs, logits_to_keep=self.keep[0])
            return [out.logits[0].float().cpu()]
        padded = any(n != depth for n in self.lens) or any(len(n) != width for n in self.new)
        self.cache = self._stacked(depth)
        inputs = torch.full((len(self.kvs), width), PAD_ID, dtype=torch.long)
        mask = torch.zeros((len(self.kvs), depth + width), dtype=torch.long)
        positions = torch.empty((len(self.kvs), width), dtype=torch.long)
        for i, (new, length) in enumerate(zip(self.new, self.lens, strict=True)):
            inputs[i, : len(new)] = torch.tensor(new, dtype=torch.long)
            mask[i, depth - length : depth + len(new)] = 1
            positions[i] = torch.arange(length, length + width)
        self.mask = mask.to(device) if padded else None
        self.positions = torch.tensor(
            [[length + len(new)] for new, length in zip(self.new, self.lens, strict=True)], device=device
        )  # where each row's next fed token goes
        # logits of the positions any row needs: from the earliest first-needed position to the end
        first = min(len(new) - keep for new, keep in zip(self.new, self.keep, strict=True))
        out, features = self.model.forward(
            input_ids=inputs.to(device),
            **{self.model.cache_kwarg: self.cache},
            attention_mask=self.mask,
            position_ids=positions.to(device) if padded else None,
            use_cache=True,
            logits_to_keep=width - first,
        )
        if features is not None:
            for i, new in enumerate(self.new):  # copies: a view would keep the whole padded batch alive
                self.features[i].append(features[i, : len(new)].clone())
        logits = out.logits.float().cpu()
        return [
            logits[i, len(new) - first - keep : len(new) - first]
            for i, (new, keep) in enumerate(zip(self.new, self.keep, strict=True))
        ]

    @torch.inference_mode()
    def feed(self, tokens: Sequence[int | None]) -> torch.Tensor:
        """One more token per row (None: the row is done, a padding token is fed and not kept); the logits
        (float32, CPU) of that position, one row per request."""
        device = self.model.device
        ids = [PAD_ID if t is None else t for t in tokens]
        for fed, token in zip(self.fed, tokens, strict=True):
            if token is not None:
                fed.append(token)
        inputs = torch.tensor([ids], dtype=torch.long, device=device).T
        if self.single:
            logits: torch.Tensor = self._in_place(input_ids=inputs).logits[:, -1].float().cpu()
            return logits
        assert self.positions is not None
        positions, self.positions = self.positions, self.positions + 1
        if self.mask is not None:
            self.mask = torch.cat([self.mask, self.mask.new_ones((len(ids), 1))], dim=1)
        out, features = self.model.forward(
            input_ids=inputs,
            **{self.model.cache_kwarg: self.cache},
            attention_mask=self.mask,
            position_ids=positions if self.mask is not None else None,
            use_cache=True,
        )
        if features is not None:
            for i, token in enumerate(tokens):
                if token is not None:
                    self.features[i].append(features[i].clone())
        last: torch.Tensor = out.logits[:, -1].float().cpu()
        return last

    def _in_place(self, **inputs: Any) -> Any:
        """A forward pass of the single request on its own cache; a failed one may have extended some of the
        cache's layers and not others, so the cache is dropped (the next call rebuilds it)."""
        try:
            cache = {self.model.cache_kwarg: self.cache}
            out, features = self.model.forward(**cache, use_cache=True, **inputs)
        except Exception:
            self.model.release(self.request_ids[0])
            raise
        if features is not None:
            self.features[0].append(features[0])
        return out

    def _stacked(self, depth: int) -> Any:
        """The rows' caches, left-padded to ``depth`` positions, as one batched cache."""
        cache = DynamicCache(config=self.model.model.config)
        if depth == 0:
            return cache
        sample = next(kv.cache for kv, n in zip(self.kvs, self.lens, strict=True) if n)
        for index, layer in enumerate(cache.layers):
            like = sample.layers[index].keys
            shape = (len(self.kvs), like.shape[1], depth, like.shape[3])
            keys = like.new_zeros(shape)
            values = sample.layers[index].values.new_zeros(shape)
            for i, (kv, length) in enumerate(zip(self.kvs, self.lens, strict=True)):
                if length:
                    row = kv.cache.layers[index]
                    keys[i, :, depth - length :] = row.keys[0]
                    values[i, :, depth - length :] = row.values[0]
            _fill(layer, keys, values)
        return cache

    @torch.inference_mode()
    def commit(self) -> None:
        """Each row's cache and token list now hold its sequence plus what was fed to it."""
        for kv, new, fed, features in zip(self.kvs, self.new, self.fed, self.features, strict=True):
            kv.tokens += new
            kv.tokens += fed
            for rows in features:
                kv.features.extend(rows)
        if self.single:
            return
        depth, width = max(self.lens), max(len(n) for n in self.new)
        for index, layer in enumerate(self.cache.layers):
            for i, (kv, length, new, fed) in enumerate(
                zip(self.kvs, self.lens, self.new, self.fed, strict=True)
            ):
                keys, values = layer.keys[i : i + 1], layer.values[i : i + 1]
                start, end = depth - length, depth + len(new)
                if fed and len(new) < width:  # skip the right padding of the first pass
                    tail = slice(depth + width, depth + width + len(fed))
                    keys = torch.cat([keys[:, :, start:end], keys[:, :, tail]], dim=2)
                    values = torch.cat([values[:, :, start:end], values[:, :, tail]], dim=2)
                else:
                    keys = keys[:, :, start : end + len(fed)]
                    values = values[:, :, start : end + len(fed)]
                _fill(kv.cache.layers[index], keys, values)
