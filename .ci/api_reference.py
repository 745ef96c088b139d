"""Build the API reference: HTML pages from nbtrain's docstrings, made by pdoc.

    .venv/bin/python .ci/api_reference.py [OUTPUT_DIR]     (default build/api)

then open OUTPUT_DIR/index.html. It documents the public API, the names in ``nbtrain.__all__``
(``notebook_launcher``, ``Accelerator``, ``start_ranks``, ...), with their signatures and
docstrings. Strict: a public name without a docstring, or a warning from pdoc (a public name
that does not resolve, a module that does not import), fails the build with exit code 1.
``tests/docs/test_docs.py`` runs this script.
"""

from __future__ import annotations

import sys
import warnings
from pathlib import Path

import pdoc
import pdoc.render

REPO = Path(__file__).resolve().parents[1]


def load_public_names() -> None:
    """nbtrain loads its public names on first use (a module ``__getattr__``), and pdoc reads
    a module's ``__dict__``: load them first, so each name is documented where users find it."""
    import nbtrain

    for name in nbtrain.__all__:
        setattr(nbtrain, name, getattr(nbtrain, name))


def undocumented() -> list[str]:
    """Public names without a docstring of their own: each would be a bare signature."""
    import nbtrain

    return [
        f"nbtrain.{name} has no docstring"
        for name in nbtrain.__all__
        if name != "__version__" and not (getattr(nbtrain, name).__doc__ or "").strip()
    ]


def build(output: Path) -> list[str]:
    """Write the reference into ``output``; return its problems (empty when it is clean)."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        load_public_names()
        missing = undocumented()
        pdoc.render.configure(
            docformat="restructuredtext",  # the docstrings' ``code`` and *emphasis*
            footer_text="nbtrain API reference (from the docstrings)",
            search=True,
            show_source=False,
        )
        pdoc.pdoc("nbtrain", output_directory=output)
    # Only pdoc's own complaints are the documentation's problems (libraries imported along
    # the way may warn about their own deprecations).
    pdoc_warnings = [
        str(w.message) for w in caught if "/pdoc/" in w.filename.replace("\\", "/")
    ]
    return missing + pdoc_warnings


def main(argv: list[str]) -> int:
    output = Path(argv[0]) if argv else REPO / "build" / "api"
    problems = build(output)
    for problem in problems:
        print(f"api_reference: {problem}", file=sys.stderr)
    if problems:
        return 1
    print(f"API reference written to {output / 'index.html'}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
