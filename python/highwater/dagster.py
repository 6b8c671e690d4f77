"""Dagster integration (issues 22 and 48): a highwater stage as a Dagster
asset, and the stage's inputs as an observable source asset upstream of it.

- The asset's `code_version` is the stage's recipe id (the code recipe, so
  an edit to a helper the stage calls changes it): Dagster reports it stale
  with the cause CODE.
- The inputs asset's data version is the content of what the stage reads,
  as the engine sees it (issue 48): each input's digest (the manifest's for
  an unchanged input, the plan's digest now for a changed or new one), and
  the content of each file the stage's function read when it last ran (the
  manifest's dependencies). Observing it after an input edit, or after an
  edit to a file the function reads, changes it, and Dagster reports the
  asset stale with the cause DATA; a run that changes nothing else leaves
  it as it was, so a materialisation that follows an observation is fresh.
  One exception: a run that reads a file no run read before (a stage's
  first run, say) adds that file to the version, so the next observation
  shows the asset stale once; materialising it again runs nothing.
- The asset's own data version is a digest of the stage's manifest entries.

    from highwater.dagster import assets
    defs = dg.Definitions(assets=assets(p, "tidy"))

Observe the inputs (`dagster asset observe`, a schedule, or the source
asset's `auto_observe_interval_minutes`) for Dagster to see an edit; a
materialisation records the inputs' version last observed.
"""

from __future__ import annotations

import hashlib
import json
import os
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


def inputs_version(pipeline: Pipeline, stage: str) -> str:
    """The content version of what `stage` reads: per input its digest as
    a run would record it, and the content of the files its function read
    (the dependencies the last run recorded). The same before a run and
    after it when nothing was edited in between."""
    _, raw = pipeline._plan_raw(stage)
    plan = next(s for s in raw["stages"] if s["name"] == stage)
    changed = {c["input"]: c for c in plan["changed"]}
    recorded = {e["input"]: e for e in pipeline.entries(stage) if e["kind"] == "item"}
    items = []
    for item in sorted(set(recorded) | set(changed)):
        c = changed.get(item)
        if c is not None and c["reason"] == "deleted":
            continue  # gone: no longer an input
        prev = recorded.get(item)
        digest = prev["digest"] if prev is not None else None
        now = (c or {}).get("digests") or []
        if now:
            algo = digest.split(":", 1)[0] if digest else None
            digest = next((d for d in now if d.split(":", 1)[0] == algo), now[-1])
        if digest is None:
            # A signal that reads no bytes (`mtime`, `exists`): the stat.
            digest = _file_version(os.path.join(pipeline.root, item))
        items.append((item, digest))
    files = sorted(
        {(d["path"], d["kind"]) for i in pipeline.deps(stage) for d in i["deps"]}
    )
    read = [(path, kind, _dep_version(pipeline.root, path, kind)) for path, kind in files]
    return hashlib.blake2b(
        json.dumps([items, read]).encode(), digest_size=16
    ).hexdigest()


def _file_version(path: str) -> str:
    try:
        st = os.stat(path)
    except OSError:
        return "absent"
    return f"stat:{st.st_size}:{st.st_mtime_ns}"


def _dep_version(root: str, path: str, kind: str) -> str:
    """What a file the function read holds now: its content's digest (a
    read), its listing (a folder listed), its target (a link), whether it
    exists (a file looked for and not found)."""
    full = path if os.path.isabs(path) else os.path.join(root, path)
    try:
        if kind == "listed":
            return hashlib.blake2b("\0".join(sorted(os.listdir(full))).encode()).hexdigest()
        if kind == "link":
            return os.readlink(full)
        if kind == "absent":
            return "exists" if os.path.lexists(full) else "absent"
        h = hashlib.blake2b()
        with open(full, "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                h.update(block)
        return h.hexdigest()
    except OSError:
        return "absent"


def inputs_key(stage: str) -> dg.AssetKey:
    """The key of the inputs asset of `stage`: `<stage>_inputs`."""
    return dg.AssetKey(f"{stage}_inputs")


def inputs_asset(pipeline: Pipeline, stage: str, **source_kwargs: Any) -> Any:
    """What `stage` reads, as an observable source asset whose data version
    is `inputs_version` (`source_kwargs` go to
    `dagster.observable_source_asset`: auto_observe_interval_minutes, ...)."""
    source_kwargs.setdefault("key", inputs_key(stage))

    @dg.observable_source_asset(**source_kwargs)
    def _observe() -> dg.DataVersion:
        return dg.DataVersion(inputs_version(pipeline, stage))

    return _observe


def asset(pipeline: Pipeline, stage: str, **asset_kwargs: Any) -> dg.AssetsDefinition:
    """The stage `stage` of `pipeline` as an asset, downstream of its inputs
    asset (`inputs_key(stage)`); `asset_kwargs` go to `dagster.asset` (name,
    group_name, deps, ...)."""
    code_version = pipeline.recipe_ids()[stage]
    asset_kwargs.setdefault("name", stage)
    asset_kwargs["deps"] = [*asset_kwargs.get("deps", ()), inputs_key(stage)]

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


def assets(pipeline: Pipeline, stage: str) -> list[Any]:
    """The inputs asset and the asset of `stage`, for `dagster.Definitions`."""
    return [inputs_asset(pipeline, stage), asset(pipeline, stage)]
