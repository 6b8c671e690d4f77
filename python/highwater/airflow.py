"""Airflow integration (issue 22): a task that runs a highwater stage and
skips when its plan is empty (Airflow then records no asset event)."""

from __future__ import annotations

from typing import Any

from highwater.pipeline import Pipeline


def run_or_skip(pipeline: Pipeline, stage: str | None = None) -> dict[str, Any]:
    """The task's body: skip on an empty plan, fail on a failed item."""
    try:
        from airflow.exceptions import AirflowException, AirflowSkipException
    except ImportError:  # Airflow 3's task SDK
        from airflow.sdk.exceptions import AirflowException, AirflowSkipException  # type: ignore
    plan = pipeline.plan(stage)
    if plan.is_empty():
        raise AirflowSkipException("highwater: nothing changed since the last run")
    result = pipeline.run(stage=stage, raise_on_failure=False)
    failed = {n: [f.input for f in s.failed] for n, s in result.stages.items() if s.failed}
    blocked = {n: s.blocked for n, s in result.stages.items() if s.blocked}
    if failed or blocked:
        raise AirflowException(f"highwater: failed items {failed}, blocked stages {blocked}")
    return {n: s.processed for n, s in result.stages.items()}


def task(pipeline: Pipeline, stage: str | None = None, task_id: str | None = None, **kw: Any):
    """A PythonOperator running `run_or_skip`."""
    try:
        from airflow.providers.standard.operators.python import PythonOperator
    except ImportError:
        from airflow.operators.python import PythonOperator  # type: ignore
    return PythonOperator(
        task_id=task_id or f"highwater_{stage or 'all'}",
        python_callable=run_or_skip,
        op_args=[pipeline, stage],
        **kw,
    )
