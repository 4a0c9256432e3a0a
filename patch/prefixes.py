"""Every prefix of the patch series, smoke-run: does each commit, applied in order from the first, leave a Lightning
that imports and trains?

    python -m patch.prefixes [--sdist-cache DIR] [--repository GITDIR [--commit REV]] [--json FILE | --commits N ...]

A maintainer bisecting a regression lands on any commit of a merged stack, so each must work on its own. For each
commit of the stack (``patch.series.patched_tree``) this checks the commit out and runs ``SMOKE`` in a fresh
interpreter whose ``pytorch_lightning`` and ``lightning_fabric`` are that commit's sources (first on ``PYTHONPATH``:
the package is pure Python, so its sources are what ``pip install`` would copy): a regular module and one whose
steps take ``dataloader_iter``, each fitted with validation twice per epoch, then validated and asked to predict.
Prints one line per commit; ``--json`` writes them (``commit``, its ``items`` and ``subject``, ``passed``, the
error's last line) with the checkout's revision. The command fails when any commit fails, so CI holds every commit
of the stack to it. With ``--repository`` the stack is made on that Lightning repository's commit (its master, say:
``patch.repository``), its repository-layout patches are applied there with a plain ``git am`` (recorded under
``repository``; the command fails if they do not apply), and each commit is smoke-run on master's code.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from harness_common import code_revision
from patch.repository import Repository, git_am
from patch.series import (
    BASE_TAG,
    DEFAULT_CACHE,
    PACKAGE_IN_SDIST,
    RELEASE,
    STACK,
    commits,
    git,
    patched_tree,
    write_series,
)
from patch.stack import commits as stack_commits

# The smoke run, in a child interpreter: a run that raises, or hangs past the timeout, fails the commit.
SMOKE = '''
import warnings

import pytorch_lightning as pl
import torch
from torch.utils.data import DataLoader

warnings.filterwarnings("ignore")


class Regular(pl.LightningModule):
    def __init__(self):
        super().__init__()
        self.layer = torch.nn.Linear(4, 1)

    def loss(self, batch):
        return self.layer(batch).pow(2).mean()

    def training_step(self, batch, batch_idx):
        loss = self.loss(batch)
        self.log("loss", loss)
        return loss

    def validation_step(self, batch, batch_idx):
        self.log("val", self.loss(batch))

    def predict_step(self, batch, batch_idx):
        return self.layer(batch)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)


class Flavour(Regular):
    # batch_size= given: the released flavour asks for it
    def training_step(self, dataloader_iter):
        batch, _, _ = next(dataloader_iter)
        loss = self.loss(batch)
        self.log("loss", loss, batch_size=len(batch))
        return loss

    def validation_step(self, dataloader_iter):
        batch, _, _ = next(dataloader_iter)
        self.log("val", self.loss(batch), batch_size=len(batch))

    def predict_step(self, dataloader_iter):
        batch, _, _ = next(dataloader_iter)
        return self.layer(batch)


def data():
    return DataLoader(torch.randn(8, 4), batch_size=2)


for module_type in (Regular, Flavour):
    trainer = pl.Trainer(max_epochs=2, val_check_interval=0.5, logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False, accelerator="cpu", devices=1)
    module = module_type()
    trainer.fit(module, train_dataloaders=data(), val_dataloaders=data())
    assert trainer.global_step == 8, (module_type.__name__, trainer.global_step)
    trainer.validate(module, dataloaders=data(), verbose=False)
    predictions = trainer.predict(module, dataloaders=data())
    assert len(predictions) == 4, (module_type.__name__, len(predictions))
print("smoke run passed")
'''
SMOKE_TIMEOUT_S = 300


def smoke_run(root: Path) -> tuple[bool, str]:
    """Run ``SMOKE`` against the sources checked out in ``root``: whether it passed, and its last line of output."""
    env = {**os.environ, "PYTHONPATH": str(root / PACKAGE_IN_SDIST.parent)}
    with tempfile.TemporaryDirectory() as scratch:
        try:
            result = subprocess.run([sys.executable, "-c", SMOKE], cwd=scratch, env=env, capture_output=True, text=True,
                                    timeout=SMOKE_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            return False, f"no result within {SMOKE_TIMEOUT_S} s"
    lines = (result.stdout + result.stderr).strip().splitlines() or [""]
    return result.returncode == 0, lines[-1]


def every_prefix(cache: Path = DEFAULT_CACHE, only: set[int] | None = None,
                 repository: Repository | None = None) -> tuple[list[dict], dict | None]:
    """The stack generated now (on the release, or on ``repository``'s commit), each of its commits smoke-run in
    order (``only``: those of these numbers, from 1): one row per commit run; on a repository, also what a plain
    ``git am`` of the repository-layout patches onto its commit gives (``patch.repository.git_am``)."""
    with tempfile.TemporaryDirectory() as scratch:
        tree = patched_tree(Path(scratch) / "tree", cache, repository)
        stack = commits(tree)
        applied = None
        if repository is not None:
            patches = write_series(tree, Path(scratch) / "series", "repository")
            applied = git_am(repository, patches, Path(scratch) / "git-am")
            print(f"git am onto {applied['commit'][:12]}: {'applied' if applied['applied'] else 'FAILED'}"
                  f" ({len(patches)} patches)" + (f"\n        {applied['error'][-300:]}" if applied["error"] else ""))
        git(tree, "checkout", "--quiet", "--detach", BASE_TAG)
        passed, last_line = smoke_run(tree)
        if not passed:  # the smoke run must hold for the base, or it tells nothing about the commits
            raise RuntimeError(f"the smoke run fails on the stack's base, {git(tree, 'log', '-1', '--format=%s')}:"
                               f" {last_line}")
        rows = []
        for number, (commit, sha) in enumerate(zip(stack_commits(STACK), stack, strict=True), start=1):
            if only and number not in only:
                continue
            git(tree, "checkout", "--quiet", "--detach", sha)
            passed, last_line = smoke_run(tree)
            subject = git(tree, "log", "-1", "--format=%s", sha).strip()
            rows.append(dict(commit=number, items=list(commit.items), subject=subject, passed=passed,
                             last_line="" if passed else last_line))
            print(f"{'passed' if passed else 'FAILED'}  {number:2d} {subject[:70]}"
                  + ("" if passed else f"\n        {last_line[:200]}"), flush=True)
        return rows, applied


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sdist-cache", type=Path, default=DEFAULT_CACHE)
    parser.add_argument("--json", type=Path, help="write the rows here")
    parser.add_argument("--commits", type=int, nargs="+", help="run only these commits, from 1 (no --json)")
    parser.add_argument("--repository", type=Path, help="make the stack on this Lightning git directory's --commit")
    parser.add_argument("--commit", default="HEAD", help="the repository's commit (default: HEAD)")
    args = parser.parse_args(argv)
    if args.commits and args.json:
        parser.error("--json records every commit: leave out --commits")
    repository = Repository(args.repository, args.commit) if args.repository else None
    rows, applied = every_prefix(args.sdist_cache, set(args.commits or ()), repository)
    if args.json:
        document = dict(schema=1, release=RELEASE, setup=code_revision(Path(__file__).parent), commits=rows)
        if applied is not None:
            described = repository.git("log", "-1", "--format=%cI%n%s", applied["commit"]).splitlines()
            document.update(repository=dict(commit=applied["commit"], date=described[0], subject=described[1],
                                            git_am=applied))
        args.json.write_text(json.dumps(document, indent=1) + "\n")
    passed = sum(row["passed"] for row in rows)
    print(f"{passed} of {len(rows)} commits pass the smoke run")
    return 0 if passed == len(rows) and (applied is None or applied["applied"]) else 1


if __name__ == "__main__":
    sys.exit(main())
