"""Lightning's own checks on the files the stack of pull requests touches: ``ruff check``, ``ruff format --check`` and
mypy, each with the configuration of the release's ``pyproject.toml``.

    python -m patch.lint [--sdist-cache DIR]

Generates the stack on the release (``patch.series.patched_tree``). Ruff runs on the Python files each commit touches,
at that commit: any finding fails. Mypy runs on the package files the stack touches, at the release and at the stack's
last commit: an error fails unless the release has it too (compared by file, error code and message, not by line: the
stack moves lines). The configuration is Lightning's ``[tool.mypy]`` but for ``install_types`` and
``non_interactive``, which download stub packages. Exits 1 naming each finding; CI (``.ci/run``) runs it.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import tomllib

from patch.series import BASE_TAG, DEFAULT_CACHE, PACKAGE_IN_SDIST, commits, git, patched_tree

# `path:line: error: message  [code]`, as mypy prints an error
MYPY_ERROR = re.compile(r"^(?P<path>[^:]+):\d+: error: (?P<message>.*?)\s+\[(?P<code>[\w-]+)\]$")


def touched_files(tree: Path, commit: str) -> list[str]:
    """The Python files ``commit`` adds or changes (not those it deletes)."""
    listed = git(tree, "diff-tree", "--no-commit-id", "--name-only", "--diff-filter=AM", "-r", commit).split()
    return sorted(name for name in listed if name.endswith(".py"))


def ruff_findings(tree: Path) -> list[str]:
    """Lightning's ruff check and format check on the files each commit of the stack touches, at that commit."""
    findings = []
    for commit in commits(tree):
        files = touched_files(tree, commit)
        if not files:
            continue
        git(tree, "checkout", "--quiet", commit)
        for check in (["check", "--output-format", "concise"], ["format", "--check"]):
            run = subprocess.run([sys.executable, "-m", "ruff", *check, "--no-cache", *files], cwd=tree,
                                 capture_output=True, text=True)
            if run.returncode:
                findings.append(f"{commit[:12]} ruff {check[0]}:\n{run.stdout}{run.stderr}")
    return findings


def mypy_config(tree: Path, dest: Path) -> Path:
    """Lightning's ``[tool.mypy]`` as a configuration file of its own, without the options that download stubs."""
    options = tomllib.loads((tree / "pyproject.toml").read_text())["tool"]["mypy"]
    lines = ["[mypy]"] + [f"{key} = {value}" for key, value in options.items()
                          if key not in ("files", "install_types", "non_interactive")]
    dest.write_text("\n".join(lines) + "\n")
    return dest


def mypy_errors(tree: Path, ref: str, files: list[str], config: Path) -> set[tuple[str, str, str]]:
    """Mypy's errors in ``files`` (those of them present at ``ref``), as (file, code, message)."""
    git(tree, "checkout", "--quiet", ref)
    present = [name for name in files if (tree / name).is_file()]
    run = subprocess.run([sys.executable, "-m", "mypy", "--config-file", str(config), "--no-incremental",
                          *(str(Path(name).relative_to("src")) for name in present)],
                         cwd=tree / "src", capture_output=True, text=True)
    errors = set()
    for line in run.stdout.splitlines():
        if (found := MYPY_ERROR.match(line)) and f"src/{found['path']}" in present:
            errors.add((found["path"], found["code"], found["message"]))
    return errors


def new_mypy_errors(tree: Path, head: str) -> list[str]:
    """The errors mypy finds in the package files the stack touches that the release does not have."""
    files = sorted({name for commit in commits(tree) for name in touched_files(tree, commit)
                    if Path(name).is_relative_to(PACKAGE_IN_SDIST)})
    with tempfile.TemporaryDirectory() as scratch:
        config = mypy_config(tree, Path(scratch) / "mypy.ini")
        before = mypy_errors(tree, BASE_TAG, files, config)
        after = mypy_errors(tree, head, files, config)
    git(tree, "checkout", "--quiet", head)
    return [f"{path}: {message}  [{code}]" for path, code, message in sorted(after - before)]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sdist-cache", type=Path, default=DEFAULT_CACHE)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as scratch:
        tree = patched_tree(Path(scratch), args.sdist_cache)
        head = git(tree, "rev-parse", "HEAD").strip()
        findings = ruff_findings(tree)
        git(tree, "checkout", "--quiet", head)
        errors = new_mypy_errors(tree, head)
    for finding in findings:
        print(finding)
    for error in errors:
        print(f"mypy, not on the release: {error}")
    checked = "ruff check, ruff format --check and mypy on the files the stack touches"
    print(f"{checked}: {len(findings)} ruff finding(s), {len(errors)} new mypy error(s)")
    return 1 if findings or errors else 0


if __name__ == "__main__":
    raise SystemExit(main())
