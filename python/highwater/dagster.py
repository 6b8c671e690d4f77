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

Partitions (issue 48): a stage whose output template has a time
placeholder (`{day}`, `{month}`, `{window_start}`) is partitioned, one
Dagster partition per item, with a `DynamicPartitionsDefinition` named
`highwater_<stage>` whose key is that placeholder's value
(`marts/{day}.json` gives `2026-03-01`). `partitioned=True` partitions any
stage that renders an output per item (`out/{stem}.txt`), keyed by the
item's input path as the plan names it (`data/a.txt`). Observing the inputs adds the keys of new items, removes
those of deleted ones, and gives each partition its own data version, so
an edit to one input makes that partition stale and no other;
materialising a partition runs only its items (`Pipeline.run(items=)`).
An aggregate stage (no placeholder: one output of all inputs) is one
unpartitioned asset; `partitioned=False` keeps any stage one asset.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from typing import Any

import dagster as dg

from highwater.pipeline import Pipeline


def data_version(pipeline: Pipeline, stage: str, items: set[str] | None = None) -> str:
    """A digest of what the manifest holds for the stage (or for `items`
    of it, one partition): every item's input digest, recipe, output and
    status."""
    rows = sorted(
        (e["input"], json.dumps(e["digest"]), e["recipe"], e["output"], e["status"])
        for e in pipeline.entries(stage)
        if items is None or e["input"] in items
    )
    return hashlib.blake2b(json.dumps(rows).encode(), digest_size=16).hexdigest()


def inputs_version(pipeline: Pipeline, stage: str) -> str:
    """The content version of what `stage` reads: per input its digest as
    a run would record it, and the content of the files its function read
    (the dependencies the last run recorded). The same before a run and
    after it when nothing was edited in between."""
    items = [(i, d) for i, (d, _) in sorted(_input_digests(pipeline, stage).items())]
    files = sorted(
        {(d["path"], d["kind"]) for i in pipeline.deps(stage) for d in i["deps"]}
    )
    read = [(path, kind, _dep_version(pipeline.root, path, kind)) for path, kind in files]
    return hashlib.blake2b(
        json.dumps([items, read]).encode(), digest_size=16
    ).hexdigest()


def _input_digests(pipeline: Pipeline, stage: str) -> dict[str, tuple[str, str | None]]:
    """Each present input of `stage`: (its digest as a run would record
    it, its output as the plan or the manifest renders it)."""
    _, raw = pipeline._plan_raw(stage)
    plan = next(s for s in raw["stages"] if s["name"] == stage)
    changed = {c["input"]: c for c in plan["changed"]}
    recorded = {e["input"]: e for e in pipeline.entries(stage) if e["kind"] == "item"}
    items: dict[str, tuple[str, str | None]] = {}
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
        output = (c or {}).get("output") or (prev or {}).get("output")
        items[item] = (digest, output)
    return items


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


# -- partitions (issue 48) ----------------------------------------------------

# The output template's placeholders that name a period: the partition key
# is their value. Any other per-item placeholder keys a partition by item.
_TIME_PLACEHOLDERS = ("day", "month", "window_start")


def partitions_def(
    pipeline: Pipeline, stage: str, partitioned: bool | None = None
) -> dg.DynamicPartitionsDefinition | None:
    """The partitions of `stage` (`highwater_<stage>`), or None for one
    unpartitioned asset. `partitioned=None` (the default): partitioned
    where the output template has a time placeholder (`{day}`, `{month}`,
    `{window_start}`); True: by item wherever the stage renders one output
    per item (`out/{stem}.txt`); False: never."""
    template = pipeline._stages[stage].output
    names = re.findall(r"\{(\w+)\}", template)
    if partitioned is False:
        return None
    if not names:
        if partitioned:
            raise ValueError(
                f"stage {stage!r} is an aggregate (output {template!r} has no placeholder: "
                "one output of all its inputs); it has no items to partition by: "
                "pass partitioned=None or False"
            )
        return None
    if partitioned is None and not any(n in _TIME_PLACEHOLDERS for n in names):
        return None
    return dg.DynamicPartitionsDefinition(name=f"highwater_{stage}")


def _key_rule(pipeline: Pipeline, stage: str) -> Any:
    """`key(item, output)`: the partition key of one item."""
    template = pipeline._stages[stage].output
    parts = re.split(r"\{(\w+)\}", template)
    names = parts[1::2]
    time = next((n for n in names if n in _TIME_PLACEHOLDERS), None)
    if time is None:
        return lambda item, output: item
    regex, seen = "", set()
    for i, part in enumerate(parts):
        if i % 2 == 0:
            regex += re.escape(part)
        elif part in seen:
            regex += f"(?P={part})"
        else:
            seen.add(part)
            regex += f"(?P<{part}>[^/]+)" if part in _TIME_PLACEHOLDERS else f"(?P<{part}>.+)"
    compiled = re.compile(regex)

    def key(item: str, output: str | None) -> str:
        for candidate in (output or "", os.path.relpath(output or ".", pipeline.root)):
            m = compiled.fullmatch(candidate)
            if m:
                return m.group(time)
        return item  # an output the template does not render: keyed by item

    return key


def partition_items(pipeline: Pipeline, stage: str) -> dict[str, list[str]]:
    """Each partition key of `stage` and the items (inputs, as the plan
    names them) it holds, for the inputs present now."""
    key = _key_rule(pipeline, stage)
    out: dict[str, list[str]] = {}
    for item, (_, output) in sorted(_input_digests(pipeline, stage).items()):
        out.setdefault(key(item, output), []).append(item)
    return out


def partition_versions(pipeline: Pipeline, stage: str) -> dict[str, str]:
    """Each partition's inputs version: its items' digests and the content
    of the files its items' functions read when they last ran."""
    key = _key_rule(pipeline, stage)
    digests = _input_digests(pipeline, stage)
    deps: dict[str, set[tuple[str, str]]] = {}
    for row in pipeline.deps(stage):
        deps.setdefault(row["item"], set()).update((d["path"], d["kind"]) for d in row["deps"])
    by_key: dict[str, list[Any]] = {}
    for item, (digest, output) in sorted(digests.items()):
        read = [
            (path, kind, _dep_version(pipeline.root, path, kind))
            for path, kind in sorted(deps.get(item, ()))
        ]
        by_key.setdefault(key(item, output), []).append([item, digest, read])
    return {
        k: hashlib.blake2b(json.dumps(v).encode(), digest_size=16).hexdigest()
        for k, v in by_key.items()
    }


def _sync_partitions(instance: Any, name: str, keys: set[str]) -> None:
    """Makes the dynamic partitions `name` hold exactly `keys`."""
    have = set(instance.get_dynamic_partitions(name))
    new = sorted(keys - have)
    if new:
        instance.add_dynamic_partitions(name, new)
    for gone in sorted(have - keys):
        instance.delete_dynamic_partition(name, gone)


def inputs_asset(
    pipeline: Pipeline, stage: str, partitioned: bool | None = None, **source_kwargs: Any
) -> Any:
    """What `stage` reads, as an observable source asset whose data version
    is `inputs_version` (`source_kwargs` go to
    `dagster.observable_source_asset`: auto_observe_interval_minutes, ...).
    Partitioned like the stage's asset: an observation then registers the
    items' partitions and versions each one."""
    source_kwargs.setdefault("key", inputs_key(stage))
    parts = partitions_def(pipeline, stage, partitioned)
    if parts is None:

        @dg.observable_source_asset(**source_kwargs)
        def _observe() -> dg.DataVersion:
            return dg.DataVersion(inputs_version(pipeline, stage))

        return _observe

    @dg.observable_source_asset(partitions_def=parts, **source_kwargs)
    def _observe_partitions(context) -> dg.DataVersionsByPartition:  # noqa: ANN001
        versions = partition_versions(pipeline, stage)
        _sync_partitions(context.instance, parts.name, set(versions))
        return dg.DataVersionsByPartition(
            {k: dg.DataVersion(v) for k, v in versions.items()}
        )

    return _observe_partitions


def asset(
    pipeline: Pipeline, stage: str, partitioned: bool | None = None, **asset_kwargs: Any
) -> dg.AssetsDefinition:
    """The stage `stage` of `pipeline` as an asset, downstream of its inputs
    asset (`inputs_key(stage)`); `asset_kwargs` go to `dagster.asset` (name,
    group_name, deps, ...). Partitioned as `partitions_def` says."""
    code_version = pipeline.recipe_ids()[stage]
    asset_kwargs.setdefault("name", stage)
    asset_kwargs["deps"] = [*asset_kwargs.get("deps", ()), inputs_key(stage)]
    parts = partitions_def(pipeline, stage, partitioned)
    if parts is not None:
        asset_kwargs.setdefault("partitions_def", parts)

    @dg.asset(code_version=code_version, **asset_kwargs)
    def _materialize(context) -> dg.Output:  # noqa: ANN001 - Dagster reads the hint itself
        items = None
        if parts is not None:
            items = partition_items(pipeline, stage).get(context.partition_key)
            if items is None:
                raise dg.Failure(
                    description=f"highwater stage {stage}: partition {context.partition_key!r} "
                    "holds no input now (deleted since the last observation?); observe "
                    f"{inputs_key(stage).to_user_string()} to bring the partitions up to date"
                )
        result = pipeline.run(stage=stage, raise_on_failure=False, items=items)
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
            data_version=dg.DataVersion(
                data_version(pipeline, stage, None if items is None else set(items))
            ),
            metadata={
                "processed": st.processed,
                "unchanged": st.unchanged,
                "deleted": st.deleted,
                "recipe": st.recipe,
                **({"items": dg.MetadataValue.json(items)} if items is not None else {}),
            },
        )

    return _materialize


def assets(pipeline: Pipeline, stage: str, partitioned: bool | None = None) -> list[Any]:
    """The inputs asset and the asset of `stage`, for `dagster.Definitions`."""
    return [
        inputs_asset(pipeline, stage, partitioned=partitioned),
        asset(pipeline, stage, partitioned=partitioned),
    ]
