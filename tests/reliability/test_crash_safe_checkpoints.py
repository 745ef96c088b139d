"""Crash-safe checkpoints: SIGKILL a rank at random moments of save_state.

API.md: "writing is atomic (an interrupted save leaves the previous checkpoint loadable)". Each
trial is a real 2-rank launch that first loads what the previous trial left, then saves a new
generation while one rank (chosen at random) is SIGKILLed at a random moment of the save (seeded:
a failure replays): uniform over one save's calibrated duration, and trials go on until enough
kills landed before the victim's save_state returned (at least 20 over the two tests; the ones
that came after it are counted apart). What every load must show:

- overwriting one directory: the last complete generation, or the one being saved if its save
  got far enough to complete; never a mix (every piece, on every rank, tells one generation);
- saving into a fresh directory: the new generation complete, or a clear refusal; never a
  partial checkpoint taken for a complete one;
- a save that returned on rank 0 is never lost.

Two deterministic cases aim at the narrowest window, between the renames of the swap.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
import rankcheckpoints
import torch._dynamo  # noqa: F401 - as in a notebook that built an optimizer: forked ranks inherit it

from nbtrain import WorkerError, notebook_launcher

pytestmark = pytest.mark.timeout(300)

SEED = 8
OVERWRITE_TRIALS = 12  # kills that land mid-save, per test (22 in all)
FRESH_TRIALS = 10
MAX_TRIALS = 40  # a bound on the trials each test may need to get there
QUIET = {"progress": "off", "output": "none"}
STATS: dict[str, int] = {"previous checkpoint loaded": 0, "new checkpoint complete": 0}


def run_trial(report: Path, load: Path | None, save: Path | None, generation: int,
              victim: int, delay: float) -> WorkerError | None:
    try:
        notebook_launcher(
            rankcheckpoints.trial,
            (str(report), str(load) if load else None, str(save) if save else None, generation,
             victim, delay),
            num_processes=2, timeout=120, **QUIET,
        )
    except WorkerError as err:
        return err
    return None


def loaded(report: Path, err: WorkerError | None = None) -> list[dict]:
    """What each rank loaded; a rank without a report failed while loading."""
    paths = [Path(f"{report}.{rank}") for rank in (0, 1)]
    missing = [str(path) for path in paths if not path.exists()]
    assert not missing, f"no report from {missing}: the load failed: {err}\n" + (
        err.remote_traceback if err else ""
    )
    return [json.loads(path.read_text()) for path in paths]


def generation_of(outcomes: list[dict]) -> int:
    """The one generation every piece on every rank holds (fails on any mix)."""
    seen = set()
    for outcome in outcomes:
        assert outcome["rng_matches_tag"], f"rank {outcome['rank']}: RNG of another save"
        pieces = {outcome["params"], outcome["momentum"], outcome["tag"]}
        assert len(pieces) == 1 and None not in pieces, f"a mixed checkpoint: {outcome}"
        seen |= pieces
    assert len(seen) == 1, f"the ranks loaded different generations: {outcomes}"
    return int(seen.pop())


def calibrate(tmp_path: Path) -> float:
    return notebook_launcher(
        rankcheckpoints.calibrate, (str(tmp_path / "calibration"),), num_processes=2, **QUIET
    )


def check_killed(err: WorkerError | None, victim: int) -> None:
    assert err is not None, "the victim was not killed"
    assert (err.rank, err.signal) == (victim, "SIGKILL"), str(err)


def killed_mid_save(report: Path, victim: int) -> bool:
    """The victim's save_state had not returned when the kill came."""
    return not Path(f"{report}.returned.{victim}").exists()


def test_sigkill_while_overwriting_a_checkpoint(tmp_path):
    rng = random.Random(SEED)
    duration = calibrate(tmp_path)
    checkpoint = tmp_path / "checkpoint"
    assert run_trial(tmp_path / "r0", None, checkpoint, 1, victim=-1, delay=0) is None
    complete, attempted, returned = 1, None, False
    mid_save = 0
    for trial in range(1, MAX_TRIALS + 2):
        last = mid_save >= OVERWRITE_TRIALS or trial == MAX_TRIALS + 1  # only loads
        generation, victim = trial + 1, rng.randrange(2)
        delay = rng.uniform(0, duration)
        report = tmp_path / f"r{trial}"
        err = run_trial(report, checkpoint, None if last else checkpoint, generation, victim,
                        delay)
        got = generation_of(loaded(report, err))
        allowed = {complete} if attempted is None else {complete, attempted}
        if returned:
            allowed = {attempted}  # rank 0's save_state returned: it must not be lost
        assert got in allowed, f"trial {trial}: loaded generation {got}, expected {allowed}"
        if attempted is not None:
            kind = "previous checkpoint loaded" if got == complete else "new checkpoint complete"
            STATS[kind] += 1
        if last:
            assert err is None
            break
        check_killed(err, victim)
        mid_save += killed_mid_save(report, victim)
        complete, attempted = got, generation
        returned = Path(f"{report}.saved").exists()
    assert mid_save >= OVERWRITE_TRIALS, f"only {mid_save} kills landed mid-save"
    print(f"crash-safe checkpoints ({trial - 1} kills, {mid_save} mid-save): {STATS}")


def test_sigkill_while_saving_into_a_fresh_directory(tmp_path):
    rng = random.Random(SEED + 1)
    duration = calibrate(tmp_path)
    previous: tuple[Path, int, Path] | None = None  # (directory, generation, report)
    refusals = mid_save = 0
    for trial in range(MAX_TRIALS + 1):
        last = mid_save >= FRESH_TRIALS or trial == MAX_TRIALS
        generation, victim = trial + 1, rng.randrange(2)
        delay = rng.uniform(0, duration)
        report = tmp_path / f"r{trial}"
        target = tmp_path / f"fresh-{trial}"
        err = run_trial(report, previous[0] if previous else None, None if last else target,
                        generation, victim, delay)
        if previous is not None:
            _, expected, previous_report = previous
            outcomes = loaded(report, err)
            if "refused" in outcomes[0]:
                assert all("refused" in o for o in outcomes), outcomes
                assert not Path(f"{previous_report}.saved").exists(), (
                    "a save that returned cannot be loaded"
                )
                assert "no checkpoint at that path" in outcomes[0]["refused"] or (
                    "not a complete nbtrain checkpoint" in outcomes[0]["refused"]
                ), outcomes[0]["refused"]
                refusals += 1
            else:
                assert generation_of(outcomes) == expected
        if last:
            assert err is None
            break
        check_killed(err, victim)
        mid_save += killed_mid_save(report, victim)
        previous = (target, generation, report)
    assert mid_save >= FRESH_TRIALS, f"only {mid_save} kills landed mid-save"
    print(f"fresh directories: {trial} kills ({mid_save} mid-save), {refusals} partial saves "
          "refused, the rest complete")


@pytest.mark.parametrize(("nth", "expected"), [(1, 1), (2, 2)],
                         ids=["after-moving-the-old-one-aside", "after-moving-the-new-one-in"])
def test_sigkill_between_the_renames_of_the_swap(tmp_path, nth, expected):
    checkpoint = tmp_path / "checkpoint"
    assert run_trial(tmp_path / "r0", None, checkpoint, 1, victim=-1, delay=0) is None
    with pytest.raises(WorkerError) as info:
        notebook_launcher(rankcheckpoints.kill_after_rename, (str(checkpoint), 2, nth),
                          num_processes=2, timeout=120, **QUIET)
    assert (info.value.rank, info.value.signal) == (0, "SIGKILL")
    assert run_trial(tmp_path / "r1", checkpoint, checkpoint, 3, victim=-1, delay=0) is None
    assert generation_of(loaded(tmp_path / "r1")) == expected
    # ... and the save after it completed normally and cleaned up.
    assert run_trial(tmp_path / "r2", checkpoint, None, 0, victim=-1, delay=0) is None
    assert generation_of(loaded(tmp_path / "r2")) == 3
    leftovers = sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".checkpoint"))
    assert leftovers == [], leftovers
