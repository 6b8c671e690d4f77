"""Dagster integration (issue 22): a highwater stage as a Dagster asset.

The asset's `code_version` is the stage's recipe id (the code recipe, so an
edit to a helper the stage calls changes it) and its data version is a
digest of the stage's manifest entries, so Dagster's own staleness works:
after a helper edit Dagster reports the asset stale, with the code version
as the cause.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

import dagster as dg

from highwater.pipeline import Pipeline


def data_version(pipeline: Pipeline, stage: str) -> str:
    """A digest of what the manifest holds for the stage: every item's
    input digest, recipe, output and status."""
    rows = sorted(
        (e["input"], json.dumps(e["digest"]), e["recipe"], e["output"], e["status"])
        for e in pipeline.entries(stage)
    )
    return hashlib.blake2b(json.dumps(rows).encode(), digest_size=16).hexdigest()


def asset(pipeline: Pipeline, stage: str, **asset_kwargs: Any) -> dg.AssetsDefinition:
    """The stage `stage` of `pipeline` as an asset; `asset_kwargs` go to
    `dagster.asset` (name, group_name, deps, ...)."""
    code_version = pipeline.recipe_ids()[stage]
    asset_kwargs.setdefault("name", stage)

    @dg.asset(code_version=code_version, **asset_kwargs)
    def _materialize(context) -> dg.Output:  # noqa: ANN001 - Dagster reads the hint itself
        result = pipeline.run(stage=stage, raise_on_failure=False)
        st = result.stages[stage]
        if st.failed or st.blocked:
            raise dg.Failure(
                description=f"highwater stage {stage}: {len(st.failed)} item(s) failed"
                + (f"; the first, {st.failed[0].input}: {st.failed[0].error}" if st.failed else "")
                + (f"; {st.blocked}" if st.blocked else ""),
                metadata={"failed": dg.MetadataValue.json([f.input for f in st.failed])},
            )
        return dg.Output(
            None,
            data_version=dg.DataVersion(data_version(pipeline, stage)),
            metadata={
                "processed": st.processed,
                "unchanged": st.unchanged,
                "deleted": st.deleted,
                "recipe": st.recipe,
            },
        )

    return _materialize
