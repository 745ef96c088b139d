"""One test "node": a separate Python process calling notebook_launcher(num_nodes=...).

Usage: python node.py SPEC_JSON RESULT_PATH. SPEC_JSON names a function in jobs.py, its args and
the launcher keywords; the outcome (value, or the error's type, text and WorkerError fields) is
written to RESULT_PATH as JSON. Launches can be chained (a list of specs) to test relaunching.
"""

from __future__ import annotations

import json
import sys
import traceback

import jobs

from nbtrain import WorkerError, notebook_launcher


def run(spec: dict) -> dict:
    function = getattr(jobs, spec["function"])
    try:
        value = notebook_launcher(function, tuple(spec.get("args", ())), **spec["launch"])
    except WorkerError as err:
        return {
            "error": "WorkerError",
            "text": str(err),
            "rank": err.rank,
            "node": err.node,
            "type_name": err.type_name,
            "traceback": err.remote_traceback,
            "exitcode": err.exitcode,
        }
    except KeyboardInterrupt:
        return {"error": "KeyboardInterrupt", "text": ""}
    except Exception as exc:  # the test asserts on type and text
        return {
            "error": type(exc).__name__,
            "text": str(exc),
            "mro": [cls.__name__ for cls in type(exc).__mro__],
            "traceback": traceback.format_exc(),
        }
    return {"value": value}


def main() -> None:
    specs = json.loads(sys.argv[1])
    results = [run(spec) for spec in (specs if isinstance(specs, list) else [specs])]
    with open(sys.argv[2], "w") as handle:
        json.dump(results, handle)


if __name__ == "__main__":
    main()
