"""Engines beyond DDP: the shipped accelerate configs, the gather/scatter helpers of
``flowgrpo.distributed`` (plain tensors, a 1-process FSDP2 group, two FSDP2 processes on CPU) and
the one-line engine description."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from flowgrpo import distributed as engines
from helpers import ROOT

CONFIGS = ROOT / "configs" / "accelerate"
# file: (distributed_type, processes in all, machines)
EXPECTED = {
    "ddp": ("MULTI_GPU", 8, 1),
    "multi_node": ("MULTI_GPU", 16, 2),
    "fsdp": ("FSDP", 8, 1),
    "deepspeed_zero2": ("DEEPSPEED", 8, 1),
}


def launch_args(name: str):
    """The ``accelerate launch`` arguments the config file ``name`` resolves to."""
    from accelerate.commands.launch import _validate_launch_command, launch_command_parser

    args = launch_command_parser().parse_args(
        ["--config_file", str(CONFIGS / f"{name}.yaml"), "train.py"])
    return _validate_launch_command(args)[:2]


def fsdp_env(monkeypatch) -> dict[str, str]:
    """The environment ``accelerate launch`` gives each process for ``fsdp.yaml``."""
    from accelerate.utils.launch import prepare_multi_gpu_env

    args, _ = launch_args("fsdp")
    env = {k: v for k, v in prepare_multi_gpu_env(args).items()
           if k.startswith(("ACCELERATE_", "FSDP_"))}
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    return env


# ----------------------------------------------------------------- the config files
def test_every_shipped_config_is_tested():
    assert sorted(p.stem for p in CONFIGS.glob("*.yaml")) == sorted(EXPECTED)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_config_loads_with_accelerates_loader(name):
    from accelerate.commands.config.config_args import ClusterConfig, load_config_from_file
    from accelerate.commands.launch import launch_command_parser

    cfg = load_config_from_file(str(CONFIGS / f"{name}.yaml"))  # unknown top-level keys raise
    kind, processes, machines = EXPECTED[name]
    assert isinstance(cfg, ClusterConfig)
    assert cfg.distributed_type.value == kind
    assert (cfg.num_processes, cfg.num_machines) == (processes, machines)
    assert cfg.mixed_precision == "no"  # precision is flowgrpo's (model.mixed_precision)
    assert cfg.use_cpu is False
    # nested keys become `accelerate launch` arguments, and an unknown one is silently ignored:
    # every key must be one of them
    known = vars(launch_command_parser().parse_args(["train.py"]))
    nested = [*cfg.fsdp_config, *cfg.deepspeed_config]
    assert [k for k in nested if k not in known] == []
    args, _ = launch_args(name)  # what the launcher makes of the file
    assert (args.num_processes, args.num_machines) == (processes, machines)
    assert (args.multi_gpu, args.use_fsdp, args.use_deepspeed) == (
        kind == "MULTI_GPU", kind == "FSDP", kind == "DEEPSPEED")


def test_multi_node_config_names_machine_zero():
    from accelerate.commands.config.config_args import load_config_from_file

    cfg = load_config_from_file(str(CONFIGS / "multi_node.yaml"))
    assert cfg.machine_rank == 0
    assert isinstance(cfg.main_process_ip, str) and isinstance(cfg.main_process_port, int)
    assert cfg.num_processes % cfg.num_machines == 0  # processes per machine
    assert "machine_rank" in (CONFIGS / "multi_node.yaml").read_text().split("compute_")[0]


def test_fsdp_config_builds_a_full_state_dict_fsdp2_plugin(monkeypatch):
    from accelerate.utils import FullyShardedDataParallelPlugin
    from torch.distributed.fsdp import StateDictType

    env = fsdp_env(monkeypatch)
    assert env["ACCELERATE_USE_FSDP"] == "true" and env["FSDP_VERSION"] == "2"
    plugin = FullyShardedDataParallelPlugin()
    assert plugin.fsdp_version == 2
    assert plugin.reshard_after_forward is True  # full shard
    assert plugin.state_dict_type == StateDictType.FULL_STATE_DICT
    assert type(plugin.cpu_offload).__name__ == "OffloadPolicy"  # no CPU offload
    assert engines.requested_engine(env) == "FSDP2"


@pytest.mark.parametrize("family,blocks,named", [
    ("sd3", {"JointTransformerBlock"}, False),
    ("flux", {"FluxTransformerBlock", "FluxSingleTransformerBlock"}, False),
    ("wan", {"WanTransformerBlock"}, False),
    ("ace_step", {"AceStepTransformerBlock"}, True),  # no _no_split_modules: name the class
])
def test_fsdp_config_wraps_each_familys_transformer_blocks(monkeypatch, family, blocks, named):
    """TRANSFORMER_BASED_WRAP without a class list wraps the model's ``_no_split_modules``;
    ACE-Step declares none, so its block class is named (``fsdp_transformer_layer_cls_to_wrap``,
    which reaches the processes as ``FSDP_TRANSFORMER_CLS_TO_WRAP``)."""
    from accelerate.utils import FullyShardedDataParallelPlugin
    from accelerate.utils.fsdp_utils import fsdp2_prepare_auto_wrap_policy

    from helpers.tiny import tiny_sd3_pipeline
    from helpers.tiny_families import tiny_ace_step_pipeline, tiny_flux_pipeline, tiny_wan_pipeline

    build = {"sd3": tiny_sd3_pipeline, "flux": tiny_flux_pipeline, "wan": tiny_wan_pipeline,
             "ace_step": tiny_ace_step_pipeline}
    transformer = build[family]().transformer
    fsdp_env(monkeypatch)

    def wrapped() -> list[torch.nn.Module]:
        policy = fsdp2_prepare_auto_wrap_policy(FullyShardedDataParallelPlugin(), transformer)
        return [m for m in transformer.modules() if policy(m)]

    if named:
        assert wrapped() == []  # one unit for the whole model: no memory saved
        monkeypatch.setenv("FSDP_TRANSFORMER_CLS_TO_WRAP", ",".join(sorted(blocks)))
    found = wrapped()
    assert {type(m).__name__ for m in found} == blocks
    assert len(found) == sum(type(m).__name__ in blocks for m in transformer.modules())


def test_deepspeed_config_builds_a_zero2_plugin(monkeypatch):
    from accelerate.utils import DeepSpeedPlugin
    from accelerate.utils.launch import prepare_deepspeed_cmd_env

    from flowgrpo.config.schema import TrainConfig

    args, defaults = launch_args("deepspeed_zero2")
    args.deepspeed_fields_from_accelerate_config = ",".join(defaults.deepspeed_config)
    _, env = prepare_deepspeed_cmd_env(args)
    for key, value in env.items():
        if key.startswith("ACCELERATE_"):
            monkeypatch.setenv(key, value)
    plugin = DeepSpeedPlugin()  # deepspeed itself is not needed to build the plugin
    assert plugin.zero_stage == 2
    assert plugin.deepspeed_config["gradient_clipping"] == TrainConfig().max_grad_norm
    assert engines.requested_engine(env) == "DeepSpeed ZeRO-2"
    # prepare() without a dataloader needs the micro-batch size, which the file leaves auto
    acc = fake_accelerator("DEEPSPEED", 8, deepspeed_plugin=plugin)
    assert plugin.is_auto("train_micro_batch_size_per_gpu")
    assert engines.set_deepspeed_micro_batch(acc, 6)
    assert plugin.get_value("train_micro_batch_size_per_gpu") == 6
    assert not engines.set_deepspeed_micro_batch(acc, 6)  # set already
    assert not engines.set_deepspeed_micro_batch(fake_accelerator("MULTI_GPU", 8), 6)


# ----------------------------------------------------------------- helpers on plain tensors
def lora_model(seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(5, 3), torch.nn.BatchNorm1d(3))
    model.requires_grad_(False)
    model[0].weight.requires_grad_(True)
    return model


def test_full_state_dict_of_plain_parameters_and_buffers():
    model = lora_model()
    out = engines.full_state_dict(model, ["0.weight", "1.running_mean"])
    assert list(out) == ["0.weight", "1.running_mean"]
    assert torch.equal(out["0.weight"], model[0].weight)
    assert out["0.weight"].device.type == "cpu" and not out["0.weight"].requires_grad
    assert set(engines.full_state_dict(model)) == {
        n for n, _ in [*model.named_parameters(), *model.named_buffers()]}
    with pytest.raises(KeyError, match="nope"):
        engines.full_state_dict(model, ["nope"])
    assert engines.trainable_parameters(model) == [model[0].weight]
    assert not engines.any_sharded(model)


def test_copy_full_and_optimizer_state_round_trip_on_plain_tensors():
    model = lora_model()
    opt = torch.optim.AdamW(engines.trainable_parameters(model), lr=0.1)
    model(torch.randn(4, 5)).sum().backward()
    opt.step()
    full = engines.full_optimizer_state(opt.state_dict())
    assert engines.shard_optimizer_state(full, opt)["state"][0]["exp_avg"] is full["state"][0][
        "exp_avg"]  # nothing to shard
    other = lora_model(seed=1)
    engines.copy_full_(other[0].weight, model[0].weight.detach())
    assert torch.equal(other[0].weight, model[0].weight)


# ----------------------------------------------------------------- describe
def fake_accelerator(kind: str, n: int, device: str = "cuda", **state):
    from accelerate.utils import DistributedType

    return SimpleNamespace(distributed_type=DistributedType(kind), num_processes=n,
                           device=torch.device(device), state=SimpleNamespace(**state))


@pytest.mark.parametrize("acc,env,line", [
    (fake_accelerator("NO", 1, "cpu"), {}, "1 process, no distributed engine, cpu"),
    (fake_accelerator("MULTI_GPU", 8), {"WORLD_SIZE": "8"}, "8 processes, DDP, cuda"),
    (fake_accelerator("FSDP", 8, fsdp_plugin=SimpleNamespace(fsdp_version=2)),
     {"ACCELERATE_USE_FSDP": "true", "FSDP_VERSION": "2"}, "8 processes, FSDP2, cuda"),
    (fake_accelerator("DEEPSPEED", 16, deepspeed_plugin=SimpleNamespace(zero_stage=2)),
     {"ACCELERATE_USE_DEEPSPEED": "true", "ACCELERATE_DEEPSPEED_ZERO_STAGE": "2"},
     "16 processes, DeepSpeed ZeRO-2, cuda"),
    (fake_accelerator("MULTI_CPU", 2, "cpu"), {"ACCELERATE_USE_FSDP": "true", "FSDP_VERSION": "2"},
     "2 processes, DDP, cpu (the launcher asked for FSDP2; accelerate runs DDP on cpu)"),
])
def test_describe(acc, env, line):
    assert engines.describe(acc, env) == line


def test_describe_flags_a_process_that_runs_alone():
    line = engines.describe(fake_accelerator("NO", 1, "cpu"), {"WORLD_SIZE": "2"})
    assert line.startswith("1 process, no distributed engine, cpu (the launcher started 2")


def test_describe_a_real_accelerator(monkeypatch):
    from accelerate import Accelerator

    for key in ("ACCELERATE_USE_FSDP", "ACCELERATE_USE_DEEPSPEED", "WORLD_SIZE"):
        monkeypatch.delenv(key, raising=False)
    assert engines.describe(Accelerator(cpu=True)) == "1 process, no distributed engine, cpu"


# ----------------------------------------------------------------- FSDP2 on CPU
def test_gather_and_scatter_on_a_one_process_fsdp2_group(tmp_path):
    """``fully_shard`` on a 1-process gloo group: DTensor parameters, gathered and put back."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    if dist.is_initialized():
        pytest.skip("a process group is already up in this process")
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0,
                            world_size=1)
    try:
        model = lora_model()
        plain = {n: p.detach().clone() for n, p in model.named_parameters()}
        fully_shard(model, mesh=init_device_mesh("cpu", (1,)))
        params = engines.trainable_parameters(model)
        assert params and all(engines.is_sharded(p) for p in params)
        assert engines.any_sharded(model)
        full = engines.full_state_dict(model, ["0.weight", "0.bias"])
        assert not engines.is_sharded(full["0.weight"])
        assert all(torch.equal(full[n], plain[n]) for n in full)
        opt = torch.optim.AdamW(params, lr=0.1)
        model(torch.randn(4, 5)).sum().backward()
        opt.step()
        state = engines.full_optimizer_state(opt.state_dict())
        assert not engines.is_sharded(state["state"][0]["exp_avg"])
        opt.load_state_dict(engines.shard_optimizer_state(state, opt))
        assert engines.is_sharded(opt.state_dict()["state"][0]["exp_avg"])
        engines.copy_full_(params[0], plain["0.weight"])
        assert torch.equal(engines.full_tensor(params[0]), plain["0.weight"])
    finally:
        dist.destroy_process_group()


@pytest.mark.slow
def test_fsdp2_lora_on_two_cpu_processes(tmp_path):
    """Two processes launched with configs/accelerate/fsdp.yaml shard a LoRA model with
    ``fully_shard`` over gloo, train 2 steps and gather full weights, LoRA and optimizer state
    equal to the same training in one process."""
    from safetensors.torch import load_file

    from helpers import fsdp_job

    cmd = [sys.executable, "-m", "accelerate.commands.launch", "--config_file",
           str(CONFIGS / "fsdp.yaml"), "--num_processes", "2", "--main_process_port", "29527",
           str(Path(fsdp_job.__file__)), str(tmp_path)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    assert [r["world"] for r in ranks] == [2, 2]
    assert [r["accelerate_world"] for r in ranks] == [2, 2]
    assert sorted(r["rank"] for r in ranks) == [0, 1]
    assert {r["backend"] for r in ranks} == {"gloo"}
    # accelerate itself does not enable FSDP on CPU, and says so through describe
    assert "asked for FSDP2; accelerate runs DDP on cpu" in ranks[0]["describe"]
    for r in ranks:
        assert r["sharded"] and r["replaced"]  # DTensor parameters, new objects
        assert r["reload_equal"] and r["optimizer_reload_equal"]
        assert r["mixed_dtypes"] == "ok"  # frozen bf16 base + fp32 LoRA under FSDP2
    for name, full in ranks[0]["full_shapes"].items():  # dim 0 split (unevenly) in two
        local = [r["local_shapes"][name] for r in ranks]
        assert sum(shape[0] for shape in local) == full[0] and all(s[0] < full[0] for s in local)

    gathered = [load_file(str(tmp_path / f"rank{r}.safetensors")) for r in (0, 1)]
    assert gathered[0].keys() == gathered[1].keys()
    for key in gathered[0]:  # every process holds the same full tensors
        assert torch.equal(gathered[0][key], gathered[1][key]), key
    weights, lora, optimizer = fsdp_job.reference()
    for prefix, expected in (("weights.", weights), ("lora.", lora), ("optimizer.", optimizer)):
        got = {k[len(prefix):]: v for k, v in gathered[0].items() if k.startswith(prefix)}
        assert got.keys() == expected.keys(), prefix
        for key, value in expected.items():
            assert got[key].shape == value.shape, key
            torch.testing.assert_close(got[key], value, rtol=1e-5, atol=1e-6)
