"""One configuration in its own process: ``python -m bench._child '<spec JSON>'``.

Prints one JSON object on stdout: the spec's measurements (wall and CPU seconds of the measured
section, model calls, extras such as SQLite commits and bytes) and the process's peak RSS.
Warm-up runs happen before the measured section, inside the same process.
"""

from __future__ import annotations

import asyncio
import dataclasses
import importlib
import json
import logging
import os
import resource
import sys
import tempfile
import traceback
import warnings

from . import SYSTEMS
from ._measure import Spec


def main(argv: list[str]) -> int:
    warnings.simplefilter("ignore")
    logging.disable(logging.WARNING)
    spec = Spec(**json.loads(argv[0]))
    out: dict[str, object] = {"spec": dataclasses.asdict(spec)}
    try:
        module = importlib.import_module(SYSTEMS[spec.system][0])
        with tempfile.TemporaryDirectory(prefix="polyloop-bench-") as tmp:
            spec.workdir = tmp
            measured = asyncio.run(module.measure(spec))
        out.update(
            ok=True,
            wall_s=measured.wall_s,
            cpu_s=measured.cpu_s,
            model_calls=spec.model_calls,
            **measured.extra,
        )
    except Exception as exc:  # reported, not raised: the parent notes it and goes on
        out.update(ok=False, error=f"{type(exc).__name__}: {exc}", trace=traceback.format_exc())
    out["peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    sys.stdout.flush()
    os.write(1, ("\n" + json.dumps(out) + "\n").encode())
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
