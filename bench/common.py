"""Shared benchmark helpers: the C load generator, timing statistics, result files."""

from __future__ import annotations

import json
import shutil
import statistics
import subprocess
import tempfile
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"


def loadgen_binary() -> Path | None:
    """Compile bench/loadgen.c once per checkout; None when no C compiler is around."""
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        return None
    out = RESULTS / "loadgen"
    src = HERE / "loadgen.c"
    if not out.exists() or out.stat().st_mtime < src.stat().st_mtime:
        RESULTS.mkdir(exist_ok=True)
        subprocess.run([cc, "-O2", "-o", str(out), str(src)], check=True)
    return out


def run_loadgen(binary: Path, sock: str, conns: int, line: str, *, warm_ms: int = 300,
                measure_ms: int = 1500) -> dict[str, Any]:
    out = subprocess.run(
        [str(binary), sock, str(conns), str(warm_ms), str(measure_ms), line],
        check=True, capture_output=True, text=True,
    )
    return json.loads(out.stdout)


def median_of(runs: list[dict[str, Any]], key: str) -> float:
    return statistics.median(r[key] for r in runs)


def percentile(samples: list[float], q: float) -> float:
    s = sorted(samples)
    return s[min(len(s) - 1, int(len(s) * q))]


def save(name: str, data: dict[str, Any]) -> Path:
    RESULTS.mkdir(exist_ok=True)
    path = RESULTS / f"{name}.json"
    path.write_text(json.dumps(data, indent=2) + "\n")
    return path


def short_tmp() -> Path:
    return Path(tempfile.mkdtemp(prefix="qcb-", dir="/tmp"))
