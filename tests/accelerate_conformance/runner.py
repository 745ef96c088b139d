"""Run the cases on 2 CPU ranks started by ``notebook_launcher``, each case in a launch of its
own (a failed case cannot leave the next one's ranks out of step), with Accelerate's own names
("accelerate") or with the names a user changes bound to nbtrain's ("nbtrain")."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

from nbtrain import notebook_launcher

from .bindings import bind
from .cases import CASES, load_script, start

CASE_TIMEOUT = 45.0  # seconds (a case takes < 5): one that hangs in a collective fails
BY_ID = {case.id: case for case in CASES}


def run_case(case_id: str, implementation: str, directory: str) -> str | None:
    """(In a rank.) None when the case passed here, else the error."""
    os.chdir(directory)  # (process_execution_check writes a file into the working directory)
    case = BY_ID[case_id]
    module = load_script(case.script)
    if implementation == "nbtrain":
        bind(module)
    try:
        start(module)
        case.run(module)
    except BaseException as error:  # (a case's failure is the result)
        return f"{type(error).__name__}: {error}".strip()[:400]
    return None


def run_all(implementation: str, directory: Path) -> dict[str, dict[str, Any]]:
    results: dict[str, dict[str, Any]] = {}
    for case in CASES:
        workdir = directory / implementation / case.id.replace("/", "_")
        workdir.mkdir(parents=True, exist_ok=True)
        started = time.monotonic()
        try:
            errors = notebook_launcher(
                run_case,
                (case.id, implementation, str(workdir)),
                num_processes=2,
                start_method="fork",
                return_all=True,
                timeout=CASE_TIMEOUT,
                progress="off",
                output="none",
            )
            error = next((e for e in errors if e is not None), None)
        except Exception as failure:  # (a rank that died, a timeout)
            error = f"{type(failure).__name__}: {failure}".strip()[:400]
        results[case.id] = {
            "passed": error is None,
            "error": error,
            "seconds": round(time.monotonic() - started, 2),
        }
    return results


BASELINE = Path(__file__).with_name("accelerate_baseline.json")


def accelerate_version() -> str:
    from importlib.metadata import version

    return version("accelerate")


def record_baseline(directory: Path, path: Path = BASELINE) -> dict[str, dict[str, Any]]:
    results = run_all("accelerate", directory)
    payload = {"accelerate": accelerate_version(), "results": results}
    path.write_text(json.dumps(payload, indent=1, sort_keys=True) + "\n")
    return results


def baseline(directory: Path) -> dict[str, dict[str, Any]]:
    """Accelerate's recorded results; measured again (into ``directory``, the checked-in record
    left alone) when the installed version or the cases differ from the record's."""
    if BASELINE.is_file():
        payload = json.loads(BASELINE.read_text())
        if payload.get("accelerate") == accelerate_version() and set(payload["results"]) == set(
            BY_ID
        ):
            return dict(payload["results"])
    return record_baseline(directory, directory / BASELINE.name)
