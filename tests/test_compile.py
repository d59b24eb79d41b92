"""train.compile: a compiled step gives the eager step's loss and gradients to float rounding
for every model kind, a training run compiles and says how long it took, and where torch
cannot compile a model the run says why and trains eagerly."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from voxjet.distributed.runtime import init_runtime
from voxjet.jets.models import build_model
from voxjet.jets.train import JetTask
from voxjet.training.compiled import compile_wanted
from voxjet.training.loop import train
from voxjet.training.task import TrainSettings
from voxjet.volumes.networks.models import build_seg_model

pytestmark = pytest.mark.slow  # inductor compiles each model with the C++ compiler

FEATURES = ["part_px", "part_py", "part_pz", "part_energy", "part_deta", "part_dphi",
            "part_pt_log", "part_e_log"]  # fmt: skip


def _jet_model(name: str, **kw) -> torch.nn.Module:
    nf = len(FEATURES)
    return build_model(name, n_features=nf, n_classes=3, particle_mean=[0.1] * nf,
                       particle_std=[1.5] * nf, feature_names=FEATURES, **kw)  # fmt: skip


def _jet_step(model, batch):
    x, mask, y = batch
    return F.cross_entropy(model(x, mask).float(), y)


def _seg_step(model, batch):
    x, y = batch
    return F.cross_entropy(model(x), y)


def _jets() -> tuple:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(6, 12, len(FEATURES), generator=g)
    mask = torch.arange(12)[None] < torch.tensor([12, 9, 5, 12, 3, 7])[:, None]
    return x * mask[..., None], mask, torch.randint(0, 3, (6,), generator=g)


CASES = {
    "pfn": (lambda: _jet_model("pfn", phi_sizes=(16, 16), f_sizes=(16,)), _jets, _jet_step),
    "particlenet": (lambda: _jet_model("particlenet", dropout=0.0), _jets, _jet_step),
    "part": (
        lambda: _jet_model(
            "part", dim=16, heads=2, blocks=2, class_blocks=1, pair_dim=8, dropout=0.0
        ),
        _jets,
        _jet_step,
    ),  # fmt: skip
    "unet": (
        lambda: build_seg_model(
            {"name": "unet", "in_channels": 1, "out_channels": 3, "channels": [4, 8, 16]}
        ),  # fmt: skip
        lambda: (
            torch.randn(2, 1, 16, 16, 8, generator=torch.Generator().manual_seed(1)),
            torch.randint(0, 3, (2, 16, 16, 8), generator=torch.Generator().manual_seed(2)),
        ),
        _seg_step,
    ),
}


@pytest.mark.long
@pytest.mark.parametrize("name", sorted(CASES))
def test_compiled_step_equals_eager(name):
    build, data, step = CASES[name]
    torch.manual_seed(0)
    eager = build().train()
    compiled_copy = build().train()
    compiled_copy.load_state_dict(eager.state_dict())
    compiled = torch.compile(compiled_copy)
    batch = data()
    losses, grads = [], []
    for m, params in ((eager, eager), (compiled, compiled_copy)):
        loss = step(m, batch)
        loss.backward()
        losses.append(float(loss.detach()))
        grads.append(torch.cat([p.grad.flatten() for p in params.parameters()
                                if p.grad is not None]))  # fmt: skip
    assert losses[1] == pytest.approx(losses[0], rel=1e-5, abs=1e-6)
    assert grads[0].shape == grads[1].shape
    # summation order differs between the kernels: compare the gradient as a whole
    assert float((grads[1] - grads[0]).norm() / grads[0].norm()) < 1e-3


def test_compile_default_is_cuda_only():
    assert compile_wanted(None, torch.device("cuda", 0))
    assert not compile_wanted(None, torch.device("cpu"))
    assert compile_wanted(True, torch.device("cpu")) and not compile_wanted(
        False, torch.device("cuda")
    )


def _settings(**kw) -> TrainSettings:
    return TrainSettings(steps=12, batch_size=32, lr=3e-3, warmup_steps=2, log_every=4,
                         eval_every=12, checkpoint_every=12, seed=3, **kw)  # fmt: skip


MODEL = {"name": "pfn", "phi_sizes": [16, 16], "f_sizes": [16]}


def test_training_run_compiles_and_matches_eager(shards, tmp_path, capfd):
    rt = init_runtime("cpu")
    train(JetTask(shards, MODEL, _settings(compile=False)), _settings(compile=False),
          tmp_path / "eager", rt)  # fmt: skip
    capfd.readouterr()
    train(JetTask(shards, MODEL, _settings(compile=True)), _settings(compile=True),
          tmp_path / "compiled", rt)  # fmt: skip
    err = capfd.readouterr().err
    assert "train.compile: compiled the training step in" in err, err
    from voxjet.training.logger import read_metrics

    a = [r["loss"] for r in read_metrics(tmp_path / "eager" / "metrics.jsonl") if "loss" in r]
    b = [r["loss"] for r in read_metrics(tmp_path / "compiled" / "metrics.jsonl") if "loss" in r]
    assert len(a) == len(b) == 3
    assert b == pytest.approx(a, rel=1e-3)


def test_compile_failure_falls_back_to_eager_saying_why(shards, tmp_path, capfd, monkeypatch):
    import voxjet.training.compiled as compiled

    real = torch.compile

    def no_backend(gm, inputs):
        raise RuntimeError("this backend cannot compile anything")

    monkeypatch.setattr(compiled.torch, "compile", lambda m, **kw: real(m, backend=no_backend))
    rt = init_runtime("cpu")
    s = _settings(compile=True)
    out = train(JetTask(shards, MODEL, s), s, tmp_path / "run", rt)
    assert out["step"] == 12
    err = capfd.readouterr().err
    assert "train.compile: fell back to eager (BackendCompilerFailed" in err, err
    assert "this backend cannot compile anything" in err
    assert (tmp_path / "run" / "model.pt").exists()
