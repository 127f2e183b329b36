"""``resolve`` counts every replay it makes, on both of its paths (issue 42: the replay counts it returned).

When the search's own choice (``first``) fits, ``resolve`` goes on from it and counted its replay; when it did
not fit, the count left it out, so a search's ``replays`` was short by one for every such point. The cap is
unchanged: a ``first`` that fits is charged to it, one that does not is not.
"""

from __future__ import annotations

from fake_predictions import prediction as fake_prediction

from search.choose.candidates import Candidate
from search.choose.confirm import MAX_REPLAYS_PER_POINT, resolve
from search.prediction import Prediction
from store.records import RLHFStrategy, Strategy


def _replays(replayed: dict[int, Prediction], asked: list[int]):  # type: ignore[no-untyped-def]
    def replay(s: Strategy | RLHFStrategy) -> Prediction:
        assert isinstance(s, Strategy)
        asked.append(s.micro_batch)
        return replayed[s.micro_batch]

    return replay


def test_a_first_that_does_not_fit_is_counted_as_one_that_fits_is() -> None:
    """Both paths: mb 1 (the search's choice) fits, or does not and mb 2 does; the count is what was asked."""
    variants = [Strategy(micro_batch=m) for m in (1, 2)]
    screened = {1: fake_prediction(1.0, 9.0), 2: fake_prediction(1.2, 8.0)}
    for first_fits in (True, False):
        replayed = {1: fake_prediction(1.0, 9.5 if first_fits else 10.5), 2: fake_prediction(1.2, 8.5)}
        asked: list[int] = []
        first = Candidate(variants[0], screened[1])
        best, _, made = resolve(variants, lambda s: screened[s.micro_batch], _replays(replayed, asked), first)
        assert best is not None and best.strategy.micro_batch == (1 if first_fits else 2)
        assert asked == [1] if first_fits else asked == [1, 2]
        assert made == len(asked)


def test_the_cap_charges_a_first_that_fits_and_not_one_that_does_not() -> None:
    """Each variant is faster than the last by the screen, and every one but (perhaps) the first overflows when
    replayed: the replays stop at the cap, MAX_REPLAYS_PER_POINT after a first that does not fit (which the
    count now includes), MAX_REPLAYS_PER_POINT in all when the first fits."""
    count = MAX_REPLAYS_PER_POINT + 3
    variants = [Strategy(micro_batch=m) for m in range(1, count + 1)]
    screened = {m: fake_prediction(2.0 - m / 100, 9.0) for m in range(1, count + 1)}  # each faster than the last
    for first_fits in (False, True):
        replayed = {m: fake_prediction(2.0 - m / 100, 10.5) for m in range(1, count + 1)}
        replayed[1] = fake_prediction(1.99, 9.5 if first_fits else 10.5)
        asked: list[int] = []
        first = Candidate(variants[0], screened[1])
        _, _, made = resolve(variants, lambda s: screened[s.micro_batch], _replays(replayed, asked), first)
        assert made == len(asked) == MAX_REPLAYS_PER_POINT + (0 if first_fits else 1)
