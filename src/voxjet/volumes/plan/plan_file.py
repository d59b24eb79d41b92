"""The plan of a segmentation dataset as one typed object (nnU-Net's PlansManager and
ConfigurationManager in one): what the dataset is (labels or regions, channels and their
normalisation, the case store) and what one configuration trains and predicts with (spacing,
patch, batch, network, pipeline stages). plan.json holds the 3d_fullres configuration at its
top level and the others under `configurations`; `Plan.configured` gives the plan of one of
them. This module is the only one that reads or writes plan.json's layout; model.pt records
`Plan.to_dict()` and reads it back with `Plan.from_dict`."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from voxjet.errors import VoxjetError
from voxjet.io.remote import ReadOptions, read_json_at

# 2: the typed plan (older plan.json files, without the field, are read as version 1)
PLAN_VERSION = 2
CONFIGURATIONS = ("3d_fullres", "2d", "3d_lowres", "3d_cascade_fullres")
# left out of plan.json where they do not apply
OPTIONAL = ("slice_axis", "previous_stage", "num_outputs", "median_shape_resampled",
            "ignore_label")  # fmt: skip


@dataclass(frozen=True)
class LabelSet:
    """What a label map's values mean: the classes (value → name; 0 the background), or the
    regions (name → values) a region-based dataset trains, written back in `region_order`;
    `ignore`, nnU-Net's ignore label: voxels nobody annotated, in no class and no score."""

    labels: dict[int, str]
    num_classes: int
    regions: dict[str, list[int]] | None = None
    region_order: list[int] | None = None
    ignore: int | None = None


def target_values(classes: LabelSet) -> dict[str, list[int]]:
    """{class or region name: the label values its mask covers}, the foreground ones."""
    if classes.regions:
        return {name: list(values) for name, values in classes.regions.items()}
    names = {int(k): v for k, v in classes.labels.items()}
    return {names[c]: [c] for c in range(1, classes.num_classes) if c in names}


def class_values(classes: LabelSet) -> dict[str, list[int]]:
    """The label values a reported class (or region) covers in a label map."""
    if classes.regions:
        order = classes.region_order
        return {
            name: [v for v in order if v in set(vals)] for name, vals in classes.regions.items()
        }
    return {name: [int(v)] for v, name in classes.labels.items() if int(v) > 0}


@dataclass(frozen=True)
class Plan:
    """One configuration's plan of a dataset (3d_fullres unless `configured` chose another)."""

    # the dataset
    labels: dict[int, str]
    num_classes: int
    channels: list[str]
    normalization: list[str]
    # this configuration
    target_spacing: list[float]
    patch_size: list[int]
    batch_size: int
    network: dict[str, Any] = field(default_factory=dict)
    configuration: str = "3d_fullres"
    pipeline_stages: int = 1
    micro_batches: int = 1
    median_shape_resampled: list[float] | None = None
    slice_axis: int | None = None  # a 2d configuration's: the axis it slices along
    previous_stage: str | None = None  # a cascade's: the configuration it is fed
    # the dataset, again
    num_outputs: int | None = None  # None: one a class (softmax)
    regions: dict[str, list[int]] | None = None  # region-based: name → label values
    region_order: list[int] | None = None
    ignore_label: int | None = None  # nnU-Net's ignore label (the highest value; no class)
    modality: str = ""
    planner: str = "voxjet"
    network_depth: int = 3
    storage: dict[str, Any] = field(default_factory=dict)
    config: dict[str, Any] = field(default_factory=dict)  # the volumes: section it was made with
    configurations: dict[str, dict[str, Any]] = field(default_factory=dict)  # the others
    # the planner's own numbers (memory estimate, feature-map elements, nnU-Net's axis order …)
    details: dict[str, Any] = field(default_factory=dict)
    version: int = PLAN_VERSION

    @property
    def outputs(self) -> int:
        """Network outputs: one a class (softmax), or one a region (sigmoid)."""
        return int(self.num_outputs if self.num_outputs is not None else self.num_classes)

    @property
    def label_set(self) -> LabelSet:
        """The dataset's classes or regions."""
        return LabelSet(self.labels, self.num_classes, self.regions, self.region_order,
                        self.ignore_label)  # fmt: skip

    @property
    def seed(self) -> int:
        """The seed the dataset's splits were drawn with."""
        return int(self.config.get("seed", 42))

    def to_dict(self) -> dict[str, Any]:
        """plan.json's layout (as earlier voxjets wrote it, plus the version)."""
        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)
               if f.name != "details"}  # fmt: skip
        for optional in OPTIONAL:
            if out[optional] is None:
                del out[optional]
        out["labels"] = {int(k): v for k, v in self.labels.items()}
        return {**out, **self.details}

    @classmethod
    def from_dict(cls, data: dict[str, Any], where: str = "plan.json") -> Plan:
        """A plan from plan.json's layout (or a model's record of it); keys the type does not
        know are the planner's details."""
        known = {f.name for f in dataclasses.fields(cls)} - {"details"}
        need = ("labels", "num_classes", "target_spacing", "patch_size", "batch_size")
        missing = [k for k in need if k not in data]
        if missing:
            raise VoxjetError(f"{where}: not a voxjet plan (no {missing}); rerun the "
                              "plan_volumes rule (snakemake -R plan_volumes)")  # fmt: skip
        values = {k: v for k, v in data.items() if k in known}
        schemes = values.get("normalization", "zscore")
        if isinstance(schemes, str):  # a plan of one scheme for channel 0 (older plans)
            n = len(values.get("channels") or [None])
            schemes = [schemes] + ["zscore"] * (n - 1)
        values["normalization"] = list(schemes)
        values.setdefault("channels", [values.get("modality", "")] * len(schemes))
        values["labels"] = {int(k): str(v) for k, v in data["labels"].items()}
        values.setdefault("version", 1)
        return cls(**values, details={k: v for k, v in data.items() if k not in known})

    @classmethod
    def of_model(cls, model_config: dict[str, Any], where: str) -> Plan | None:
        """The plan a model trained with, as model.pt records it (None: a model from before
        models recorded it)."""
        recorded = model_config.get("plan")
        return cls.from_dict(recorded, f"{where} (its plan)") if recorded else None

    def configured(self, configuration: str, where: str = "plan.json") -> Plan:
        """The plan a run of `configuration` trains and predicts with: 3d_fullres as planned,
        any other with its spacing, patch, batch and network in place of the fullres ones."""
        if configuration == self.configuration:
            return self
        if configuration == "3d_fullres":
            raise VoxjetError(f"{where}: a {self.configuration} plan holds no 3d_fullres one; "
                              "read the dataset's plan.json")  # fmt: skip
        planned = self.configurations
        low = ("3d_lowres", "3d_cascade_fullres")
        if configuration in low and "2d" in planned and configuration not in planned:
            full = self.patch_size
            raise VoxjetError(
                f"{where}: the plan has no {configuration} configuration: the 3d_fullres patch "
                f"{'×'.join(map(str, full))} covers a quarter of the median case or more "
                f"({'×'.join(f'{x:g}' for x in self.median_shape_resampled or [])}), where "
                "nnU-Net plans none; train configuration: 3d_fullres"
            )
        if configuration not in planned:
            raise VoxjetError(
                f"{where}: the plan has no {configuration!r} configuration (it has "
                f"{['3d_fullres', *sorted(planned)]}); rerun the plan_volumes rule with this "
                "voxjet (snakemake -R plan_volumes), or choose another experiment configuration"
            )
        merged = {**self.to_dict(), **planned[configuration], "configuration": configuration}
        return Plan.from_dict(merged, where)


def read_plan(location: str, opts: ReadOptions | None = None) -> Plan:
    """The plan.json of a folder or URL of case files (or of the planning job's folder)."""
    data = read_json_at(location, "plan.json", opts or ReadOptions())
    return Plan.from_dict(data, f"{location}/plan.json")


def read_configured(location: str, configuration: str,
                    opts: ReadOptions | None = None) -> Plan:  # fmt: skip
    """The plan of one configuration of a folder's plan.json."""
    return read_plan(location, opts).configured(configuration, f"{location}/plan.json")
