"""The jets data config, typed from the YAML to the loader: a dataset's `jets:` section (its
weaver_config applied, its inputs checked) as one JetDataConfig, written into index.json by the
shard index and read back into the same dataclass by training, evaluation and predict; and the
shard format version."""

from __future__ import annotations

import dataclasses
import hashlib
import json
from dataclasses import asdict, dataclass, field
from typing import Any

from voxjet.errors import VoxjetError
from voxjet.jets.leakage import check_inputs, class_names, reweight_labels
from voxjet.jets.reweight import parse as parse_weights
from voxjet.jets.weaver_config import resolve

# 5: inputs standardised robustly (median and 16-84% spread, clipped; voxjet.jets.robust),
# the training split's samples and the outliers in part.json and index.json;
# 4: each jet's source file and entry (`file`, `entry`), stored as `jets.storage` says (a
# reader tells the two apart by the `crc32` dataset); 3: a fletcher32 checksum a chunk;
# 2: particles stored jagged (flat rows + offsets); 1 stored them padded
FORMAT_VERSION = 5
SHARD_KEYS = ("particles", "jets", "labels", "file", "entry")
SPLITS = ("train", "val", "test")
DEFAULT_TREE = "tree"


@dataclass
class JetDataConfig:
    """How ROOT branches (or Parquet columns) become model inputs (in the spirit of weaver's
    data config)."""

    # a ROOT file's tree (None: `tree`); a Parquet file is one table and has none
    tree: str | None = None
    # one-hot branches (a list), {"branch": b, "classes": [...]} (an integer class branch) or
    # {"by_file": {class: glob on the file name}} (one class a source file)
    labels: list[str] | dict = field(
        default_factory=lambda: ["label_QCD", "label_Hbb", "label_Wqq", "label_Tbqq"]
    )
    particle_features: list[str] = field(
        default_factory=lambda: [
            "part_deta",
            "part_dphi",
            "part_pt_log",
            "part_e_log",
            "part_logptrel",
            "part_logerel",
            "part_deltaR",
            "part_charge",
            "part_isChargedHadron",
            "part_isNeutralHadron",
            "part_isPhoton",
            "part_isElectron",
            "part_isMuon",
            "part_d0",
            "part_d0err",
            "part_dz",
            "part_dzerr",
        ]
    )
    jet_features: list[str] = field(
        default_factory=lambda: [
            "jet_pt",
            "jet_eta",
            "jet_sdmass",
            "jet_nparticles",
            "jet_tau21",
            "jet_tau32",
        ]
    )
    new_variables: dict[str, str] = field(default_factory=dict)
    sort_by: str | None = "part_pt"
    selection: str | None = None
    # the test split's own selection (weaver's test_time_selection; None: `selection`)
    test_time_selection: str | None = None
    max_particles: int = 128
    jets_per_shard: int = 10000
    shard_jobs: int = 1
    storage: str = "mapped"  # voxjet.jets.shard_files
    on_bad_file: str = "fail"
    # predefined splits (JetClass ships train_100M/, val_5M/, test_20M/): {split: globs on
    # the file's path in the dataset}; None: the hash split by val/test_fraction
    split_files: dict[str, list[str]] | None = None
    truth_inputs: list[str] = field(default_factory=list)
    bad_labels: str = "fail"
    background: str | None = None
    weaver_config: str | None = None
    weaver_inputs: dict | None = None
    observers: list[str] = field(default_factory=list)
    # regression targets beside the classes: {name: {expr, loss, weight}} (voxjet.jets.targets)
    targets: dict = field(default_factory=dict)
    # constituent collections beside the particles: {name: {features, length, sort_by, count}}
    # (voxjet.jets.collections)
    collections: dict = field(default_factory=dict)
    # weaver's `weights:` section (voxjet.jets.reweight): sampling weights for training
    weights: dict | None = None
    # sentinel values a feature (voxjet.jets.robust): left out of its statistics, given its centre
    missing: dict[str, float] = field(default_factory=dict)
    outliers: str = "warn"  # values far outside a feature's percentiles: warn, or fail
    # undeclared sentinels found at shard time (voxjet.jets.robust): replace, fail, or keep
    sentinels: str = "replace"
    val_fraction: float = 0.1
    test_fraction: float = 0.1
    step_size: int = 50000
    seed: int = 42

    def __post_init__(self) -> None:
        # built directly from a section (not a record): its weaver_config applied here
        if self.weaver_config and self.weaver_inputs is None:
            for k, v in resolve(asdict(self), "jets").items():
                setattr(self, k, v)

    @classmethod
    def checked(cls, section: dict[str, Any], where: str = "jets") -> JetDataConfig:
        """The config of a dataset's `jets:` section (defaults filled): its weaver_config read
        and applied, its inputs checked for truth leakage, its weights parsed — once, where the
        config is checked; what it gives is the record every later step reads."""
        jets = resolve(dict(section), where)
        check_inputs(jets, where)
        colls = (jets.get("collections") or {}).values()
        known = [*jets.get("particle_features", []), *jets.get("jet_features", []),
                 *(f for c in colls for f in (c or {}).get("features", []))]  # fmt: skip
        unknown = sorted(set(jets.get("missing") or {}) - set(known))
        if unknown:
            raise VoxjetError(
                f"config key '{where}.missing': {unknown} are not input features of this "
                "dataset; name particle, jet or collection features"
            )
        parse_weights(jets.get("weights"), reweight_labels(jets["labels"]),
                      f"config key '{where}.weights'")  # fmt: skip
        return cls._built(jets, where)

    @classmethod
    def from_record(cls, record: dict[str, Any], where: str) -> JetDataConfig:
        """The config as index.json, model.pt or the workflow's command line records it; a
        record whose weaver_config was not applied yet is checked first."""
        if record.get("weaver_config") and record.get("weaver_inputs") is None:
            return cls.checked(record, where)
        return cls._built(record, where)

    @classmethod
    def _built(cls, record: dict[str, Any], where: str) -> JetDataConfig:
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(record) - names)
        if unknown:
            raise VoxjetError(f"{where}: unknown jets config keys {unknown}; known: "
                              f"{sorted(names)}")  # fmt: skip
        return cls(**record)

    def record(self) -> dict[str, Any]:
        """What index.json and model.pt hold (JSON)."""
        return asdict(self)

    def hash(self) -> str:
        """A short hash that changes whenever the shard contents would."""
        content = {k: v for k, v in asdict(self).items() if k not in METRICS_ONLY}
        content["tree"] = self.tree_name  # the default spelled out: hashes as before
        return hashlib.sha256(json.dumps(content, sort_keys=True).encode()).hexdigest()[:12]

    @property
    def tree_name(self) -> str:
        """The tree a ROOT file is read from."""
        return self.tree or DEFAULT_TREE

    @property
    def background_class(self) -> str:
        """The class the others are measured against (default the first)."""
        classes = class_names(self.labels)
        name = self.background or classes[0]
        if name not in classes:
            raise VoxjetError(f"jets.background: {name!r} is none of the classes {classes}")
        return name


# settings that change what is reported, not what the shards hold
# (weaver_config: its content arrives as the fields it sets; observers: read by predict only)
METRICS_ONLY = {"background", "weaver_config", "observers"}


def index_config(index: dict, where: str) -> JetDataConfig:
    """The config the shards of an index.json were made with."""
    return JetDataConfig.from_record(index.get("config") or {}, f"{where} (its config)")
