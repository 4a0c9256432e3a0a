"""Where the committed records come from: ``evidence_commits`` gives the commits they ran at, for the first screen.

Every results file records the commit in its ``setup`` (``setups[*]`` for ``drain-rules.json``, ``runs[*].setup``
for ``durations.json``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rendering.results import load_json


def _setups(data: dict[str, Any]) -> list[dict[str, Any]]:
    if "setup" in data:
        return [data["setup"]]
    if "setups" in data:  # one per column (drain-rules.json)
        return list(data["setups"].values())
    return [run["setup"] for run in data.get("runs", {}).values() if "setup" in run]


def evidence_commits(results_dir: Path) -> list[str]:
    """The commits the committed records ran at, each once, in order of first appearance by file name."""
    commits = [setup.get("git_commit", "unknown") for path in sorted(results_dir.glob("*.json"))
               for setup in _setups(load_json(path))]
    return list(dict.fromkeys(commits))
