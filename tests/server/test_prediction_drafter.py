"""The prediction drafter: it follows the output through the prediction and finds its place again after an
edit, and backs off from a prediction that keeps being rejected."""

from __future__ import annotations

import random

from specdeploy_server.core.prediction import PredictionDrafter
from specdeploy_server.core.types import Proposal, RequestSpeculation, SequenceState


def _run(truth: list[int], prediction: list[int], limit: int = 64) -> tuple[int, int, int]:
    """Decode ``truth`` (an oracle target, token-match acceptance) with the prediction drafting; returns
    (steps, drafted, accepted)."""
    drafter = PredictionDrafter()
    seq = SequenceState("r", [0], max_tokens=len(truth), speculation=RequestSpeculation(tuple(prediction)))
    steps = drafted = accepted = 0
    while seq.num_generated < len(truth):
        pos = seq.num_generated
        room = len(truth) - pos - 1
        proposal = drafter.propose(seq, min(limit, room))
        tokens = proposal.tokens if proposal is not None else []
        ok = 0
        while ok < len(tokens) and tokens[ok] == truth[pos + ok]:
            ok += 1
        if proposal is not None:
            drafter.observe(seq, proposal, ok)
            drafted += len(tokens)
            accepted += ok
        emitted = truth[pos : pos + ok + 1]
        seq.token_ids.extend(emitted)
        seq.num_generated += len(emitted)
        steps += 1
    drafter.release("r")
    return steps, drafted, accepted


def _text(n: int, seed: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(1000) for _ in range(n)]


def test_an_exact_prediction_is_proposed_whole_in_growing_drafts() -> None:
    truth = _text(300, 0)
    steps, drafted, accepted = _run(truth, truth)
    assert accepted == drafted == len(truth) - steps  # every draft token accepted, one own token per step
    assert steps <= 8  # 8, 16, 32, 64, 64, 64 ...


def test_one_replaced_token_costs_one_rejected_draft() -> None:
    truth = _text(200, 1)
    prediction = list(truth)
    prediction[100] = 5000  # the output has truth[100] where the prediction has another token
    steps, drafted, accepted = _run(truth, prediction)
    assert drafted - accepted <= 64  # the draft that ran into the replaced token, nothing more
    assert accepted >= len(truth) - steps - 1
    assert steps <= 12


def test_an_insertion_in_the_output_is_followed_by_the_rest_of_the_prediction() -> None:
    prediction = _text(200, 2)
    truth = prediction[:80] + _text(7, 3) + prediction[80:]
    steps, _drafted, accepted = _run(truth, prediction)
    assert accepted >= len(truth) - steps - 1  # every token but the steps' own (the inserted ones among them)
    assert steps <= 20


def test_a_deletion_in_the_output_is_found_again_further_on() -> None:
    prediction = _text(200, 4)
    truth = prediction[:60] + prediction[75:]
    steps, _drafted, accepted = _run(truth, prediction)
    assert accepted >= len(truth) - 20
    assert steps <= 20


def test_only_a_prefix_or_a_suffix_of_the_prediction_helps_where_it_matches() -> None:
    truth = _text(150, 5)
    _, _, accepted_prefix = _run(truth, truth[:50])
    assert accepted_prefix >= 45
    _, _, accepted_suffix = _run(truth, truth[100:])
    assert accepted_suffix >= 40


def test_an_unrelated_prediction_backs_off_to_few_short_drafts() -> None:
    truth = _text(300, 6)
    _steps, drafted, accepted = _run(truth, _text(300, 7))
    assert accepted <= 3
    assert drafted <= 8 + 16  # the opening draft and a shrinking guess, then nothing matches


def test_a_request_without_a_prediction_gets_no_proposal() -> None:
    drafter = PredictionDrafter()
    seq = SequenceState("r", [1, 2], max_tokens=5)
    assert drafter.propose(seq, 8) is None
    seq = SequenceState("s", [1, 2], max_tokens=5, speculation=RequestSpeculation((3, 4, 5)))
    assert drafter.propose(seq, 0) is None
    proposal = drafter.propose(seq, 2)
    assert isinstance(proposal, Proposal)
    assert proposal.tokens == [3, 4]
    assert proposal.from_prediction


def test_an_unrelated_prediction_over_a_small_vocabulary_stops_proposing() -> None:
    """Short n-grams of a small vocabulary match anywhere; the misses in a row ask for longer ones."""
    rng = random.Random(8)
    truth = [rng.randrange(30) for _ in range(400)]
    prediction = [rng.randrange(30) for _ in range(400)]
    steps, drafted, accepted = _run(truth, prediction)
    assert drafted <= 60  # a few short probes, not a draft every step
    assert steps >= len(truth) - accepted - 1
