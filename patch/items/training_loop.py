"""The training loop's side of the look-ahead fetcher (``look_ahead``): it counts, transfers and ends the epoch by
what a step taking ``dataloader_iter`` took, and the helpers and messages it shares with the other loops."""

import ast

from patch.edits import LightningSource
from patch.statements import assigns, calls


def training_loop(source: LightningSource) -> None:
    utilities = source.module("loops.utilities")
    utilities.insert(
        """
        def _transfer_batch(trainer: "pl.Trainer", batch: Any, dataloader_idx: int) -> Any:
            batch = trainer.precision_plugin.convert_input(batch)
            batch = trainer.lightning_module._on_before_batch_transfer(batch, dataloader_idx=dataloader_idx)
            return call._call_strategy_hook(trainer, "batch_to_device", batch, dataloader_idx=dataloader_idx)
        """,
        before="_no_grad_context",
    )
    utilities.add_import("from pytorch_lightning.trainer import call")
    utilities.add_import("from pytorch_lightning.utilities.exceptions import MisconfigurationException")
    utilities.insert_in_body(
        "_select_data_fetcher",
        """
        required = [
            p.name
            for p in inspect.signature(step_fx).parameters.values()
            if p.name != "dataloader_iter" and p.default is p.empty and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)
        ]
        if required:
            raise MisconfigurationException(
                f"`{step_fx_name}` takes `dataloader_iter` and also {', '.join(f'`{name}`' for name in required)}."
                " Keep only `dataloader_iter` to take the batches in the step, or remove it to receive each batch."
            )
        """,
        before=calls("rank_zero_warn"),
    )

    warnings_module = source.module("utilities.warnings")
    warnings_module.insert(
        '''
        class CutShortCallWarning(PossibleUserWarning):
            """Warning for a step taking ``dataloader_iter`` that ran out of batches within a call."""
        '''
    )

    manual = source.module("loops.optimization.manual")
    # a `StopIteration` from the step now reaches the training loop, which tells the end of the data from a misuse
    manual.replace_statement(
        "_ManualOptimization.run", lambda node: isinstance(node, ast.With), "self.advance(kwargs)"
    )
    manual.remove_imported_name("suppress")

    validator = source.module("trainer.configuration_validator")
    # its warning says that hooks get stale batch indices and that accumulation does not work: no longer true
    validator.remove("__warn_dataloader_iter_limitations")
    validator.remove_statement("_verify_loop_configurations", calls("__warn_dataloader_iter_limitations"))

    module = source.module("core.module")
    module.extend_docstring(
        "LightningModule.training_step",
        "To take the batches yourself, declare ``dataloader_iter`` in place of ``batch`` and ``batch_idx``:\n"
        "see :ref:`dataloader_iter`.",
    )
    # the loop now infers the batch size from the batches the step takes
    module.remove_statement(
        "LightningModule.log",
        lambda node: isinstance(node, ast.If) and "dataloader_iter" in ast.unparse(node.test),
    )
    module.remove_imported_name("is_param_in_hook_signature")

    fit_loop = source.module("loops.fit_loop")
    fit_loop.replace_statement(
        "_FitLoop.on_save_checkpoint",
        lambda node: isinstance(node, ast.If) and "_state_dicts" in ast.unparse(node.test),
        """
        if isinstance(self._data_fetcher, _DataLoaderIterDataFetcher):
            # the loaders' states as of the batches the step took, not as of those fetched ahead
            loader_states = self._data_fetcher._loader_states()
        else:
            loader_states = self._combined_loader._state_dicts() if self._combined_loader is not None else []
        if loader_states:
            state_dict["combined_loader"] = loader_states
        """,
    )
    fit_loop.add_import("from pytorch_lightning.loops.fetchers import _DataLoaderIterDataFetcher")

    loop = source.module("loops.training_epoch_loop")
    for line in (
        "import functools",
        "from pytorch_lightning.loops.utilities import _transfer_batch",
        "from pytorch_lightning.utilities.warnings import CutShortCallWarning",
    ):
        loop.add_import(line)
    loop.insert_in_body(
        "_TrainingEpochLoop.__init__",
        "self._batches_in_call = self._most_batches_in_a_call = 1\nself._last_call = False",
        at_end=True,
    )
    loop.insert_in_body(
        "_TrainingEpochLoop.on_run_start",
        """
        if isinstance(data_fetcher, _DataLoaderIterDataFetcher):
            data_fetcher._transfer = functools.partial(_transfer_batch, self.trainer)
            self._batches_in_call = 1
            self._look_for_end_of_data(data_fetcher)
        """,
        at_end=True,
    )
    loop.insert(
        '''
        def _look_for_end_of_data(self, data_fetcher: _DataLoaderIterDataFetcher) -> None:
            """Finds whether the data has ended and whether the next step call may take its last batch."""
            # the data may end within a call that takes as many batches as the most a call took so far
            last_call = not data_fetcher._fetch_ahead(self._most_batches_in_a_call + 1)
            ended = data_fetcher.done
            self.batch_progress.is_last_batch = bool(ended)
            self._last_call = bool(last_call)
        ''',
        after="_TrainingEpochLoop.on_run_start",
    )
    advance = "_TrainingEpochLoop.advance"
    loop.remove_comment(advance, "correctness cannot be guaranteed")
    loop.insert_in_body(
        advance,
        """
        # the optimization counts its accumulation windows in step calls
        step_idx = len(data_fetcher._batches_per_call) - 1
        """,
        after=assigns("batch_idx"),
        nth=0,
    )
    loop.replace_statement(advance, assigns("batch_idx"), "batch_idx = step_idx = self.batch_idx + 1", nth=1)
    loop.replace_statement(
        advance,
        assigns("self.batch_progress.is_last_batch"),
        """
        # a step taking `dataloader_iter` steps and syncs the gradients in a call that may take the last batch
        self.batch_progress.is_last_batch = self._last_call if using_dataloader_iter else data_fetcher.done
        """,
        comments_above=True,
        nth=0,
    )
    loop.replace_statement(
        advance,
        lambda node: isinstance(node, ast.If) and ast.unparse(node.test) == "not using_dataloader_iter",
        """
        if not using_dataloader_iter:
            batch = _transfer_batch(trainer, batch, dataloader_idx=0)
        """,
    )
    loop.replace_statement(
        advance,
        lambda node: isinstance(node, ast.With) and "run_training_batch" in ast.unparse(node.items[0]),
        """
        try:
            with trainer.profiler.profile("run_training_batch"):
                if trainer.lightning_module.automatic_optimization:
                    # in automatic optimization, there can only be one optimizer
                    batch_output = self.automatic_optimization.run(trainer.optimizers[0], step_idx, kwargs)
                else:
                    batch_output = self.manual_optimization.run(kwargs)
        except StopIteration:
            if not using_dataloader_iter:
                raise
            if not data_fetcher.done:
                raise RuntimeError(
                    "`training_step` raised `StopIteration` while `dataloader_iter` had batches left. Only"
                    " `dataloader_iter` running out ends the epoch: catch it in the step."
                )
            self._warning_cache.warn(
                f"A call of `training_step` ran out of data after {len(data_fetcher._taken)} of its batches,"
                " which are not trained. Ask `dataloader_iter.has_batches(n)` before taking `n` batches.",
                category=CutShortCallWarning,
            )
            if not trainer.lightning_module.automatic_optimization:
                # the step may have run backward on the batches it took: discard what it left
                for optimizer in trainer.optimizers:
                    optimizer.zero_grad()
        """,
    )
    loop.insert_in_body(
        advance,
        """
        if isinstance(data_fetcher, _DataLoaderIterDataFetcher) and not should_skip_rest_of_epoch:
            # progress counts the batches the step took, not its calls
            self._batches_in_call = data_fetcher._end_step_call()
            self._most_batches_in_a_call = max(self._most_batches_in_a_call, self._batches_in_call)
            self.batch_progress.increment_by(self._batches_in_call - 1)
            self._look_for_end_of_data(data_fetcher)
        """,
        after=calls("self.batch_progress.increment_processed"),
    )
    loop.remove_statement(advance, assigns("self.batch_progress.is_last_batch"), comments_above=True, nth=1)
    loop.insert_in_body(
        "_TrainingEpochLoop._accumulated_batches_reached",
        """
        data_fetcher = self.trainer.fit_loop._data_fetcher
        # a step taking `dataloader_iter` accumulates over its calls, whatever the batches each takes
        if isinstance(data_fetcher, _DataLoaderIterDataFetcher):
            return len(data_fetcher._batches_per_call) % self.trainer.accumulate_grad_batches == 0
        """,
        at_start=True,
    )
    check_val = "_TrainingEpochLoop._should_check_val_fx"
    loop.replace_condition(check_val, "is_last_batch", "is_last_batch and is_infinite_dataset")
    loop.replace_statement(
        check_val,
        lambda node: isinstance(node, ast.Assign) and "% self.trainer.val_check_batch" in ast.unparse(node),
        """
        # validate once the batches pass a multiple of the interval: a step may take several in a call
        batches, interval = current_iteration + 1, self.trainer.val_check_batch
        is_val_check_batch = batches // interval > (batches - self._batches_in_call) // interval
        """,
    )
