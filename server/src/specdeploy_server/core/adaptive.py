"""Adaptive draft length (``draftLen: auto``): per step, per sequence, for the whole batch.

Model: each draft token of sequence i is accepted independently with probability alpha_i, so proposing k_i
tokens emits ``E(alpha_i, k_i) = (1 - alpha_i^(k_i+1)) / (1 - alpha_i)`` tokens. A step costs one draft call
(pass j over the sequences proposing at least j tokens) plus one verify call over ``sum(k_i + 1)`` tokens.
The controller picks the k_i that maximise the batch's expected emitted tokens per second,
``sum_i E(alpha_i, k_i) / (draft seconds + verify seconds)``. On a GPU the verify call is memory-bound at
small batches (k extra tokens are nearly free) and compute-bound at large ones (every rejected token is
paid), so the answer moves from "draft long" at batch 1 to "do not draft" under load.

* **Acceptance.** alpha_i is sequence i's own maximum-likelihood estimate for a geometric run truncated at
  k (accepted / (accepted + steps that ended in a rejection)), shrunk towards the batch-wide estimate by
  ``prior_trials`` pseudo-observations, so a new sequence starts at the batch's alpha.
* **Costs** are measured, not assumed: the verify call's seconds as a function of its tokens, kept per batch
  size (the curve of all batch sizes together stands in for a batch size not yet seen), and the draft call's
  seconds as a function of its number of passes and its sequences per pass (:class:`DraftCost`: one curve per
  pass count, so a call's fixed cost is not spread over its passes). A :class:`CostCurve` keeps, per size
  bucket, the typical time of the latest measurements (their median: what the calls usually take, contention
  included, with rare outliers left out), and the least of a bucket's first measurements, so a warm-up outlier
  is gone at the next one; a size measured slower than a larger one counts at the larger one's time. The draft
  call is timed alone (the plan search is not a cost of drafting); the first step's measurements are left out,
  and so are those of a step that also fed a new prompt (up to ``max_prefill_skips`` such steps in a row),
  whose calls ran the prompt's forwards too. A pass count or size measured fewer times than trusted counts at
  no more than the trusted ones make it (next to them), so one unlucky first call cannot rule a draft length
  out. A size between measured buckets is estimated optimistically, as the least time consistent with a GPU
  step (time does not fall with size, time per token does not rise: ``max(t_left, t_right * size /
  size_right)``); above the largest measured size along the last segment's slope (flat with one point), below
  the smallest proportionally (a draft pass: at the smallest's time). So a size not yet measured is tried and
  known from then on: a load change costs a handful of exploratory steps, not a slow drift.
* **Search.** Adding the j-th draft token to sequence i gains alpha_i^j expected tokens, which falls with
  j, so for a given number of draft tokens and draft passes the best plan takes the largest gains: the plans
  compared are "draft every token whose gain is at least a threshold tau, at most ``cap`` per sequence"
  (the cap bounds the draft passes, each of which costs a draft-model forward however few sequences it
  carries). Sequences are grouped by alpha (to ``ALPHA_GRID``, each group at its members' mean); for each
  cap every threshold is evaluated in one walk down the sorted gains.
* **Hysteresis.** The plan is (tau, cap). It changes only when the best plan's predicted rate beats
  the current tau's, under the same (current) estimates, by more than ``hysteresis`` (3 %): measurement
  noise between two near-equal plans cannot make it oscillate, while a load change that moves the optimum
  by more than 3 % is followed at the next step.
* **Cadence.** The search runs when the batch size changes (a load change is seen at once), after a step
  that measured a size never measured before, and otherwise every ``replan_every`` (8) steps; in between
  the current threshold is applied to the current alphas.
* **Exploration.** While the plan drafts nothing, one sequence (in turn) drafts one token after
  ``explore_every`` steps, so alpha keeps being measured and speculation returns when it pays again; each
  exploration that leaves the plan at "no draft" doubles the interval, up to ``explore_max``, and it is
  back at ``explore_every`` once the plan drafts. Where the measured costs rule drafting out at the batch
  size even if every draft token were accepted, nobody explores.

**Padded backends** (``padded``: the reference backend, whose batched passes are as wide as their widest
row) pay batch x the longest draft whatever the shorter rows draft: their steps are measured at that padded
size, and the plans compared are the uniform ones (every row drafts ``cap``), since drafting less for a
row that accepts less saves nothing there and loses its accepted tokens.

``disable_above`` (``disableAboveConcurrency``) is a hard rule on top of this: above that many sequences in
the step nobody drafts, whatever the draft length (as TensorRT-LLM's ``max_concurrency``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from specdeploy_server.core.cost_curves import BUCKETS_PER_DOUBLING, CostCurve, DraftCost

__all__ = [
    "ALPHA_GRID",
    "NO_DRAFT",
    "CostCurve",
    "DraftCost",
    "DraftLenController",
    "Plan",
    "expected_tokens_per_step",
    "group_alphas",
]

#: per-sequence alphas are grouped to this resolution for the search
ALPHA_GRID = 0.05


Plan = tuple[float, int]
"""(threshold tau, cap): each sequence drafts the tokens whose gain alpha_i^j >= tau, at most cap of them."""
NO_DRAFT: Plan = (math.inf, 0)


def group_alphas(alphas: Sequence[float]) -> dict[float, int]:
    """Alphas grouped to ``ALPHA_GRID``: {the mean alpha of a group: its count}."""
    sums: dict[int, list[float]] = {}
    for alpha in alphas:
        entry = sums.setdefault(round(alpha / ALPHA_GRID), [0.0, 0])
        entry[0] += alpha
        entry[1] += 1
    return {total / count: int(count) for total, count in sums.values()}


def _batch_bucket(batch: int) -> int:
    return batch if batch <= 16 else 16 + round(math.log2(batch / 16) * BUCKETS_PER_DOUBLING)


def expected_tokens_per_step(alpha: float, k: int) -> float:
    """Tokens one sequence step emits when each of k draft tokens is accepted with probability alpha."""
    if alpha >= 1.0:
        return float(k + 1)
    return (1.0 - alpha ** (k + 1)) / (1.0 - alpha)


@dataclass
class DraftLenController:
    """Chooses each step's per-sequence draft lengths; ``fixed`` disables adaptation."""

    max_k: int
    fixed: int | None = None
    #: above this many sequences in a step, nobody drafts (None: no such rule)
    disable_above: int | None = None
    #: the drafter's time is worth measuring (a draft model; prompt lookup is free)
    has_draft_cost: bool = True
    #: the backend pads a batch's rows to the widest (core.executors.pads_rows): a step costs batch x the
    #: longest draft, so every row drafts the same length (the plans compared are the uniform ones)
    padded: bool = False
    smoothing: float = 0.02
    initial: int = 4
    hysteresis: float = 0.03
    prior_trials: float = 4.0
    #: while the plan drafts nothing, one sequence drafts one token after this many steps; the interval
    #: doubles after each such exploration (the plan staying "no draft" confirms it), up to ``explore_max``,
    #: and is back at ``explore_every`` once the plan drafts again
    explore_every: int = 32
    explore_max: int = 1024
    #: the cost measurements of the first steps are left out (a first call's warm-up is not its cost)
    warmup_steps: int = 1
    #: the search runs when the batch size changed, else every this many steps (between, the plan's threshold
    #: is applied to the sequences' current alphas)
    replan_every: int = 8
    #: a step that fed a prompt is measured only after this many such steps in a row were left out
    max_prefill_skips: int = 8
    # state
    accepted: float = 0.0
    rejections: float = 0.0
    #: verify seconds by verify tokens, all batch sizes together: the estimate for a batch size not yet seen
    verify_curve: CostCurve = field(default_factory=CostCurve)
    #: the same per batch size (exact up to 16, then buckets a factor sqrt(2) wide): what the search uses
    verify_by_batch: dict[int, CostCurve] = field(default_factory=dict)
    draft_cost: DraftCost = field(default_factory=DraftCost)
    current: Plan | None = None  # the plan in use
    _per_sequence: dict[str, list[float]] = field(default_factory=dict)  # id -> [accepted, trials]
    _steps_without_draft: int = 0
    _explore_interval: int = 0  # 0: explore_every
    _explored: int = 0
    _observed_steps: int = 0
    _planned_batch: int = 0
    _learned: bool = False  # the last step measured a size never measured before: search again
    _since_replan: int = 0
    _prefill_skips: int = 0

    @property
    def alpha(self) -> float:
        """The batch-wide acceptance estimate (an EMA over recent sequence steps)."""
        total = self.accepted + self.rejections
        return self.accepted / total if total > 0 else 0.5

    def alpha_of(self, request_id: str) -> float:
        own = self._per_sequence.get(request_id)
        accepted, trials = own if own is not None else (0.0, 0.0)
        return (accepted + self.prior_trials * self.alpha) / (trials + self.prior_trials)

    # ----------------------------------------------------------------- decisions
    def plan(self, request_ids: Sequence[str]) -> list[int]:
        """Draft lengths for one step's sequences, in order."""
        batch = len(request_ids)
        if self.disable_above is not None and batch > self.disable_above:
            return [0] * batch
        if self.fixed is not None:
            return [min(self.fixed, self.max_k)] * batch
        if self.max_k <= 0 or batch == 0:
            return [0] * batch
        if not self.verify_curve.confirmed or (self.has_draft_cost and not self.draft_cost.known):
            return [min(self.initial, self.max_k)] * batch
        self._since_replan += 1
        alphas: list[float] | None = None
        if (
            self.current is None
            or self._learned
            or batch != self._planned_batch
            or self._since_replan >= self.replan_every
        ):
            alphas = [self.alpha_of(rid) for rid in request_ids]
            self.current = self.choose_plan(group_alphas(alphas), self.current)
            self._planned_batch, self._since_replan, self._learned = batch, 0, False
        if self.current[1] == 0:
            ks = [0] * batch
        else:
            alphas = alphas or [self.alpha_of(rid) for rid in request_ids]
            ks = [self.draft_len_at(alpha, self.current) for alpha in alphas]
        if any(ks):
            self._steps_without_draft, self._explore_interval = 0, self.explore_every
            return ks
        self._steps_without_draft += 1
        interval = self._explore_interval or self.explore_every
        if self._steps_without_draft >= interval:
            self._steps_without_draft = 0
            if not self.drafting_ruled_out(batch):
                self._explore_interval = min(2 * interval, max(self.explore_max, self.explore_every))
                self._explored += 1
                ks[self._explored % batch] = 1
        return ks

    def drafting_ruled_out(self, batch: int) -> bool:
        """Whether the measured costs rule drafting out at this batch size whatever the acceptance: not one
        plan beats drafting nothing even if every draft token were accepted (then exploring, to measure the
        acceptance, cannot pay)."""
        rates = self._plan_rates({1.0: batch})
        return max(rate for _, rate in rates[1:]) <= rates[0][1]

    def choose_plan(self, groups: Mapping[float, int], current: Plan | None) -> Plan:
        """The best plan for sequences grouped by alpha (``{alpha: count}``), or ``current`` when the best
        does not beat it by more than the hysteresis."""
        rates = self._plan_rates(groups)
        best, best_rate = NO_DRAFT, -1.0
        current_rate = rates[0][1]  # a threshold above every gain drafts nothing
        for plan, rate in rates:
            if rate > best_rate * (1 + 1e-12):
                best, best_rate = plan, rate
            if current is not None and plan[1] == current[1] and plan[0] >= current[0]:
                current_rate = rate  # the last plan of that cap still at or above the current threshold
        if current is not None and best_rate <= current_rate * (1 + self.hysteresis):
            return current
        return best

    def predicted_rate(self, groups: Mapping[float, int], plan: Plan) -> float:
        """Expected emitted tokens/s of ``plan`` for sequences grouped by alpha."""
        rates = self._plan_rates(groups)
        rate = rates[0][1]
        for (tau, cap), r in rates:
            if cap == plan[1] and tau >= plan[0]:
                rate = r
        return rate

    def _plan_rates(self, groups: Mapping[float, int]) -> list[tuple[Plan, float]]:
        """(plan, predicted tokens/s): "no draft" first, then for each cap every distinct threshold."""
        batch = sum(groups.values())
        at_batch = self.verify_by_batch.get(_batch_bucket(batch))
        verify_curve = at_batch if at_batch is not None else self.verify_curve
        verify_points = verify_curve.points()
        verify_sizes = [p[0] for p in verify_points]
        draft = self.draft_cost.estimator()
        verify = verify_curve.estimate
        no_draft_seconds = verify(batch, verify_points, verify_sizes)
        rates: list[tuple[Plan, float]] = [
            (NO_DRAFT, batch / no_draft_seconds if no_draft_seconds else batch)
        ]
        if self.padded:
            for cap in range(1, self.max_k + 1):  # uniform: every row drafts cap tokens (tau 0 takes all)
                tokens = sum(count * expected_tokens_per_step(alpha, cap) for alpha, count in groups.items())
                seconds = verify(batch * (cap + 1), verify_points, verify_sizes)
                if self.has_draft_cost:
                    seconds += draft(cap, batch)
                rates.append(((0.0, cap), tokens / seconds if seconds > 0 else tokens))
            return rates
        for cap in range(1, self.max_k + 1):
            gains = sorted(
                ((alpha**j, alpha, j) for alpha in groups for j in range(1, cap + 1)), reverse=True
            )
            tokens, drafted, passes = float(batch), 0, 0
            draft_seconds, last = 0.0, math.inf
            for gain, alpha, j in gains:
                count = groups[alpha]
                tokens += count * gain
                drafted += count
                passes = max(passes, j)  # the draft passes so far: the deepest draft token taken
                if self.has_draft_cost:
                    draft_seconds = draft(passes, drafted / passes)
                seconds = draft_seconds + verify(batch + drafted, verify_points, verify_sizes)
                rate = tokens / seconds if seconds > 0 else tokens
                if gain == last:
                    rates[-1] = ((gain, cap), rate)
                else:
                    rates.append(((gain, cap), rate))
                last = gain
        return rates

    def draft_len_at(self, alpha: float, plan: Plan) -> int:
        """A sequence's draft length under ``plan``: the tokens whose gain alpha^j reaches the threshold, at
        most the cap."""
        tau, cap = plan
        k = 0
        while k < cap and alpha ** (k + 1) >= tau:
            k += 1
        return k

    # ----------------------------------------------------------------- measurements
    def observe_acceptance(self, request_id: str, drafted: int, accepted: int) -> None:
        if drafted <= 0:
            return
        rejected = 1.0 if accepted < drafted else 0.0
        decay = 1.0 - self.smoothing
        self.accepted = self.accepted * decay + accepted
        self.rejections = self.rejections * decay + rejected
        own = self._per_sequence.get(request_id)
        if own is None:
            self._per_sequence[request_id] = [float(accepted), accepted + rejected]
        else:
            own[0] += accepted
            own[1] += accepted + rejected

    def observe_costs(
        self,
        draft_lens: Sequence[int],
        draft_seconds: float,
        verify_tokens: int,
        verify_seconds: float,
        *,
        prefills: bool = False,
    ) -> None:
        """One step's measured calls: the draft lengths it asked for, the draft call's seconds (the call
        alone: not the planning), the tokens the verify call covered (drafts + one per sequence) and its
        seconds. The first ``warmup_steps`` steps' are left out, and so is a step in which some sequence's
        prompt was fed (``prefills``: its first step): the draft and verify calls then also ran the prompt's
        forwards, a cost no draft length saves, which made such a call take twice the time of its size on
        the reference backend. In a closed loop of short requests every other step carried one, too many for
        the medians to leave out. Only when ``max_prefill_skips`` steps in a row carried one (requests so
        short, or arriving so fast, that nearly every step does) is the step measured all the same: a
        measurement with a prompt in it beats none."""
        self._observed_steps += 1
        if self._observed_steps <= self.warmup_steps:
            return
        if prefills and self._prefill_skips < self.max_prefill_skips:
            self._prefill_skips += 1
            return
        self._prefill_skips = 0
        passes = max(draft_lens, default=0)
        if self.padded:  # every row was as wide as the widest, in the verify pass and in every draft pass
            verify_tokens = len(draft_lens) * (passes + 1)
        if self.has_draft_cost and passes > 0:
            per_pass = len(draft_lens) if self.padded else sum(draft_lens) / passes
            self._learned |= self.draft_cost.observe(passes, per_pass, draft_seconds)
        self.verify_curve.observe(verify_tokens, verify_seconds)
        curve = self.verify_by_batch.setdefault(_batch_bucket(len(draft_lens)), CostCurve())
        self._learned |= curve.observe(verify_tokens, verify_seconds)

    def forget(self, request_id: str) -> None:
        """A sequence ended: drop its acceptance estimate."""
        self._per_sequence.pop(request_id, None)
