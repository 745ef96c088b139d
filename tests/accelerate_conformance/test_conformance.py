"""Accelerate's own distributed test scripts (accelerate/test_utils/scripts: test_ops,
test_sync, test_script, test_distributed_data_loop, test_metrics), each case on 2 CPU ranks
started by notebook_launcher, with the names a user changes bound to nbtrain's (bindings.py).

Every case that Accelerate itself passes on these ranks (its recorded baseline) must pass on
nbtrain, except the few listed below, each with its reason; the README's count is checked
against this run. Per-case results go to $NBTRAIN_CONFORMANCE_OUT (JSON) when set."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

import pytest

from .cases import CASES
from .runner import baseline, run_all

pytestmark = pytest.mark.timeout(900)

README = Path(__file__).parents[2] / "README.md"

# Cases Accelerate passes that nbtrain does not, on purpose: each tests Accelerate's internals.
OUT_OF_SCOPE = {
    "test_script::rng_sync_check": (
        "synchronize_rng_states() is Accelerate's utility over its own state singleton; nbtrain "
        "has no rng_types (prepared loaders agree on their order themselves)"
    ),
    "test_script::check_seedable_sampler_in_batch_sampler_shard": (
        "checks Accelerate's internal classes (a SeedableRandomSampler inside a "
        "BatchSamplerShard); nbtrain's use_seedable_sampler gives the same orders "
        "(check_seedable_sampler and check_seedable_sampler_with_data_seed pass)"
    ),
    "test_script::test_reinstantiated_state": (
        "tests the error of AcceleratorState's singleton after _reset_state(); nbtrain keeps no "
        "process-wide state"
    ),
    "test_metrics::gather_for_metrics_with_iterable_dataset": (
        "asserts the prepared loader is Accelerate's DataLoaderDispatcher: Accelerate dispatches "
        "IterableDatasets by default, nbtrain lets every rank read its own share unless "
        "dispatch_batches=True (the same batches either way)"
    ),
}


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    directory = tmp_path_factory.mktemp("conformance")
    measured = {
        "nbtrain": run_all("nbtrain", directory),
        "accelerate": baseline(directory),
    }
    out = os.environ.get("NBTRAIN_CONFORMANCE_OUT")
    if out:
        Path(out).write_text(json.dumps(measured, indent=1, sort_keys=True))
    return measured


def counts(results: dict[str, Any]) -> tuple[int, int]:
    """(cases nbtrain passes among those Accelerate passes, cases Accelerate passes)."""
    accelerate = [c.id for c in CASES if results["accelerate"][c.id]["passed"]]
    return sum(results["nbtrain"][i]["passed"] for i in accelerate), len(accelerate)


def test_every_public_api_case_accelerate_passes_passes_on_nbtrain(results):
    assert set(OUT_OF_SCOPE) <= {case.id for case in CASES}
    failed = {
        case.id: results["nbtrain"][case.id]["error"]
        for case in CASES
        if results["accelerate"][case.id]["passed"]
        and not results["nbtrain"][case.id]["passed"]
        and case.id not in OUT_OF_SCOPE
    }
    assert not failed, json.dumps(failed, indent=1)
    for case_id in OUT_OF_SCOPE:  # an out-of-scope case that passes now is no longer one
        assert not results["nbtrain"][case_id]["passed"], f"{case_id} passes: unlist it"


def test_the_readme_states_the_measured_count(results):
    passed, total = counts(results)
    found = re.search(r"Accelerate's own tests: (\d+) of (\d+)", README.read_text())
    assert found, 'README.md lacks the line "Accelerate\'s own tests: X of Y"'
    assert (int(found[1]), int(found[2])) == (passed, total), (
        f"README says {found[1]} of {found[2]}; measured {passed} of {total}"
    )
