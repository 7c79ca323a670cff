"""The pipeline: the one place that knows the stages, their order, each stage's command and when a
stage is done, and that runs what is left of a run.

    stages.py     the stage table: name, script and arguments, what a done stage leaves behind
    launcher.py   how training stages start: one process per visible GPU, or one in all
    run_state.py  which stages of a run are done (and fit this config), judged from its files
    runner.py     the plan that continues a run, and the loop that runs its stages in order
    __main__.py   ``python -m extensions.pipeline run|state``: what run_pipeline.sh calls
"""
