"""The ``flowgrpo`` command.

    flowgrpo train [CONFIG] [--set key=value ...] [--resume auto|PATH] [--overwrite]
    flowgrpo ablate [CONFIG] --grid KEY=V1,V2 [--grid ...] [--seeds N] [--parallel P] ...
    flowgrpo config [CONFIG] [--set ...] [--help-fields] [--recipes]
    flowgrpo sample [CONFIG] [--run RUN_DIR] [--prompt TEXT ...] [--sampler NAME] ...
    flowgrpo eval [CONFIG] [--run RUN_DIR] [--set ...]
    flowgrpo report RUN [RUN ...] [--out PATH]
    flowgrpo serve-reward --reward NAME [--params JSON] [--host 127.0.0.1] [--port 8000]
    flowgrpo list [CONFIG]
    flowgrpo doctor
    flowgrpo new-family NAME --pipeline CLASS [--out DIR] [--force]

Every command takes ``--debug`` (or ``FLOWGRPO_DEBUG=1``) to show tracebacks; without it a fault
is one line on stderr.

Without CONFIG, ``configs/digits.yaml`` (the CPU default) is used. The shipped configs work from
any folder and from an installed wheel: ``flowgrpo train configs/sd35_pickscore.yaml`` (or just
``sd35_pickscore``); ``flowgrpo config --recipes`` lists them.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable

from flowgrpo import console
from flowgrpo.cli import new_family
from flowgrpo.errors import ConfigError, FlowgrpoError, one_line


def _config_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("config", nargs="?", default=None,
                   help="YAML config (default: configs/digits.yaml, the CPU digits job)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override a config value, e.g. --set train.lr=1e-4 (repeatable)")


def _load(args: argparse.Namespace):
    from flowgrpo.config.io import load_config

    return load_config(args.config, args.overrides)


# --set keys a command cannot honour, with what to use instead ('*': every key but those listed)
UNUSED = {
    "sample": {"run.output_dir": "--out", "run.seed": "--seed", "sampler.name": "--sampler",
               "sampler.num_steps": "--num-steps (or --set sampler.eval_num_steps=N)"},
    "eval": {"run.output_dir": "nothing: eval writes no files, it prints the metrics"},
}


def _refuse_unused(command: str, overrides: list[str], allowed: tuple[str, ...] = ()) -> None:
    """A ``--set`` key ``command`` would not use is an error naming what to use instead."""
    from flowgrpo.config.io import parse_override

    for item in overrides:
        key = ".".join(parse_override(item)[0][:2])
        if allowed and key not in allowed:
            raise ConfigError(f"--set {key}: flowgrpo {command} reads only "
                              f"{', '.join(allowed)} from --set")
        if key in UNUSED.get(command, {}):
            raise ConfigError(f"--set {key}: flowgrpo {command} does not use it; use "
                              f"{UNUSED[command][key]}")


def _inference_config(args: argparse.Namespace, command: str):
    """The config of ``sample`` / ``eval``: CONFIG, else the run's own config (with ``--set``
    applied to it), else the CPU default."""
    _refuse_unused(command, args.overrides)
    if args.run and not args.config:
        from flowgrpo.cli.inference import run_config

        return run_config(args.run, args.overrides)
    return _load(args)


def cmd_train(args: argparse.Namespace) -> int:
    from flowgrpo.cli.ablate import die_with_parent

    die_with_parent()  # a cell of flowgrpo ablate stops with it
    from flowgrpo.run.resume import train_config
    from flowgrpo.training.trainer import Trainer

    config, resume = train_config(args.config, args.overrides, args.resume)
    Trainer.from_config(config, resume=resume, overwrite=args.overwrite).train()
    return 0


def cmd_ablate(args: argparse.Namespace) -> int:
    from flowgrpo.cli.ablate import ablate, describe_presets

    if args.list_presets:
        given = [flag for flag, value in (("CONFIG", args.config), ("--grid", args.grid),
                                          ("--set", args.overrides), ("--out", args.out))
                 if value]
        if given:
            raise ConfigError(f"--list-presets prints the presets and exits; it takes no "
                              f"{given[0]}")
        console.result(describe_presets(args.presets))
        return 0
    folder = ablate(args.config, args.grid, args.overrides, seeds=args.seeds,
                    parallel=args.parallel, target=args.target, out=args.out,
                    presets=args.presets)
    console.result((folder / "ablation.md").read_text().rstrip("\n"))
    console.result(f"results: {folder}/ablation.csv, ablation.md, eval_vs_step.png, "
                   f"eval_vs_calls.png, eval_vs_time.png")
    return 0


def cmd_config(args: argparse.Namespace) -> int:
    from flowgrpo.config.io import describe_fields, to_yaml

    listing = "--help-fields" if args.help_fields else "--recipes" if args.recipes else ""
    if listing and (args.config or args.overrides):
        raise ConfigError(f"{listing} lists what every config may hold; it takes no "
                          f"{'CONFIG' if args.config else '--set'}")
    if args.help_fields:
        console.result(describe_fields())
        return 0
    if args.recipes:
        from flowgrpo.config.io import recipes
        from flowgrpo.data.files import SHIPPED

        shown = recipes()
        width = max(len(name) for name, _ in shown)
        console.result(f"shipped configs ({SHIPPED}); use as `flowgrpo train configs/<name>`:")
        for name, about in shown:
            console.result(f"  {name:<{width}}  {about}")
        return 0
    console.result(to_yaml(_load(args)).rstrip("\n"))
    return 0


def cmd_list(args: argparse.Namespace) -> int:
    from flowgrpo.cli.catalogue import builtins, plugged_in

    if args.config or args.overrides:  # resolves the config's references, listed below
        _load(args)
    console.result("built-in:")
    for title, names in builtins():
        console.result(f"  {title}: {', '.join(names)}")
    plugins = plugged_in()
    console.result("plug-ins:" if plugins else "plug-ins: none (entry points, module:attribute "
                   "or file.py:attribute references; see the README)")
    for title, name, origin in plugins:
        console.result(f"  {title}: {name} <- {origin}")
    return 0


def cmd_doctor(args: argparse.Namespace) -> int:
    from flowgrpo.cli.doctor import report

    model = None
    if args.config or args.overrides:  # read, not validated: a config that fails still reports
        from flowgrpo.config.io import apply_overrides, read_config

        _refuse_unused("doctor", args.overrides, allowed=("model.path",))
        data = apply_overrides(read_config(args.config), args.overrides)
        model = str((data.get("model") or {}).get("path", "digits"))
    console.result(report(probe=not args.no_network, model=model))
    return 0


def cmd_sample(args: argparse.Namespace) -> int:
    from flowgrpo.cli.inference import sample

    for flag, value in (("--num", args.num), ("--num-steps", args.num_steps)):
        if value is not None and value < 1:
            raise ConfigError(f"{flag} must be >= 1, got {value}")
    config = _inference_config(args, "sample")
    given = [item for item in args.overrides if item.split("=", 1)[0].strip().startswith(
        "sampler.params")]
    if given and args.sampler and args.sampler != config.sampler.name:
        raise ConfigError(f"--set {given[0].split('=', 1)[0].strip()} sets the params of the "
                          f"config's sampler {config.sampler.name!r}, but --sampler is "
                          f"{args.sampler!r}: sample with one sampler")
    sample(config, run=args.run, prompts=args.prompt, sampler=args.sampler,
           num_steps=args.num_steps, seed=args.seed, num=args.num, out=args.out,
           params_given=bool(given))
    return 0


def cmd_eval(args: argparse.Namespace) -> int:
    from flowgrpo.cli.inference import evaluate

    metrics = evaluate(_inference_config(args, "eval"), run=args.run)
    for key, value in metrics.items():
        console.result(f"{key}: {value:.4f}")
    return 0


def cmd_report(args: argparse.Namespace) -> int:
    from flowgrpo.cli.report import report_runs

    console.result(report_runs(args.runs, args.out))
    return 0


def cmd_serve_reward(argv: list[str]) -> int:
    from reward_models.server import main

    return main(argv) or 0


def _kinds() -> str:
    """Every kind's title, ``a, b and c`` (from the declarations: nothing is imported)."""
    from flowgrpo.registry import KINDS

    titles = [kind.title for kind in KINDS]
    return f"{', '.join(titles[:-1])} and {titles[-1]}"


def _train_args(p: argparse.ArgumentParser) -> None:
    _config_args(p)
    p.add_argument("--resume", default=None, metavar="auto|PATH",
                   help="continue a run: auto (run.output_dir, else the run saved last) or a "
                   "run/checkpoint folder; without CONFIG the checkpoint's config is used")
    p.add_argument("--overwrite", action="store_true",
                   help="start afresh in a run folder that holds a run, deleting it")


def _ablate_args(p: argparse.ArgumentParser) -> None:
    _config_args(p)
    p.add_argument("--grid", action="append", default=[], metavar="KEY=V1,V2,...",
                   help="an axis of the grid (repeatable); KEY is a config key or 'method' "
                   "(named presets)")
    p.add_argument("--seeds", type=int, default=1, help="seeds 0..N-1 per cell (default 1)")
    p.add_argument("--parallel", type=int, default=1, help="runs side by side (default 1)")
    p.add_argument("--target", type=float, default=None,
                   help="eval reward whose first reach is reported in calls and seconds")
    p.add_argument("--out", default=None, help="ablation folder (default: runs/ablations/"
                   "<config>-<hash of the command>, so re-running the command resumes it)")
    p.add_argument("--presets", default=None,
                   help="presets YAML for the 'method' axis (default configs/presets/methods.yaml)")
    p.add_argument("--list-presets", action="store_true", help="print the presets and exit")


def _config_command_args(p: argparse.ArgumentParser) -> None:
    _config_args(p)
    p.add_argument("--help-fields", action="store_true", help="list every key with its help")
    p.add_argument("--recipes", action="store_true",
                   help="list the shipped configs (the CPU default and the recipes)")


def _sample_args(p: argparse.ArgumentParser) -> None:
    _config_args(p)
    p.add_argument("--run", default=None, help="run or checkpoint folder (default: base model)")
    p.add_argument("--prompt", action="append", default=None, help="prompt (repeatable; "
                   "default: the config's eval prompts)")
    p.add_argument("--sampler", default=None,
                   help="sampler name (default: ode; a discrete model: the config's sampler)")
    p.add_argument("--num-steps", type=int, default=None, help="denoising steps")
    p.add_argument("--num", type=int, default=4, help="images per prompt")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default="samples.png", help="output PNG grid (or folder for audio)")


def _eval_args(p: argparse.ArgumentParser) -> None:
    _config_args(p)
    p.add_argument("--run", default=None, help="run or checkpoint folder (default: base model)")


def _report_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("runs", nargs="+", metavar="RUN",
                   help="run folder(s), or an ablation folder (its subfolders holding "
                   "metrics.jsonl, up to 2 levels down)")
    p.add_argument("--out", default=None, metavar="PATH",
                   help="the plot to write (default: RUN/report.png for one run, "
                   "ABLATION/report.png for an ablation folder, else ./report.png)")


def _list_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("config", nargs="?", default=None,
                   help="also list the plug-ins this config references")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override a config value (repeatable)")


def _doctor_args(p: argparse.ArgumentParser) -> None:
    _config_args(p)
    p.add_argument("--no-network", action="store_true",
                   help="do not probe the hub (otherwise one short TCP connection)")


def _commands() -> list[tuple[str, str, Callable | None, Callable | None]]:
    """The subcommands in the order ``--help`` lists them: name, help, arguments, handler
    (``serve-reward`` has neither: :func:`main` hands its arguments to the reward server)."""
    return [
        ("train", "run GRPO training", _train_args, cmd_train),
        ("ablate", "run a grid of configs and seeds; a table and plots", _ablate_args,
         cmd_ablate),
        ("config", "print the resolved config", _config_command_args, cmd_config),
        ("sample", "generate media from a base model or a trained run", _sample_args,
         cmd_sample),
        ("eval", "reward of a model on the eval prompts (fixed seeds)", _eval_args, cmd_eval),
        ("report", "plot and summarize a run (and its eval media), or compare several runs or "
         "the runs of an ablation folder", _report_args, cmd_report),
        ("serve-reward", "serve a reward over HTTP (see serve-reward --help)", None, None),
        ("list", f"registered {_kinds()}, and the plug-ins with where each comes from",
         _list_args, cmd_list),
        ("doctor", "versions, device, extras, hub access and plug-ins, for a bug report",
         _doctor_args, cmd_doctor),
        ("new-family", "scaffold a model family: an adapter of a diffusers pipeline and its tests",
         new_family.add_arguments, new_family.cmd_new_family),
    ]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="flowgrpo", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    loud = argparse.ArgumentParser(add_help=False)  # --quiet / --verbose, after any command
    group = loud.add_mutually_exclusive_group()
    group.add_argument("-q", "--quiet", action="store_true",
                       help="only warnings, errors and results: no progress bars or notes")
    group.add_argument("-v", "--verbose", action="store_true",
                       help="everything the libraries say: loading bars, info logs and the "
                       "warnings flowgrpo filters as known to be harmless")
    sub = parser.add_subparsers(dest="command", required=True)
    for name, help_text, add_args, func in _commands():
        if add_args is None:
            sub.add_parser(name, help=help_text, add_help=False)
            continue
        p = sub.add_parser(name, parents=[loud], help=help_text)
        add_args(p)
        p.set_defaults(func=func)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run a command; every fault is one line on stderr and a non-zero exit (2: config, 1: other
    faults, 130/143: SIGINT/SIGTERM), with the traceback only under ``--debug`` or
    ``FLOWGRPO_DEBUG=1``."""
    argv = list(sys.argv[1:] if argv is None else argv)
    debug = os.environ.get("FLOWGRPO_DEBUG", "") not in ("", "0")
    if "--debug" in argv:
        argv.remove("--debug")
        debug = True
    if argv and argv[0] == "serve-reward":
        def command() -> int:
            return cmd_serve_reward(argv[1:])
    else:
        args = build_parser().parse_args(argv)
        console.configure(console.QUIET if args.quiet else console.VERBOSE if args.verbose
                          else console.NORMAL)

        def command() -> int:
            return args.func(args)
    try:
        return command()
    except BrokenPipeError:  # e.g. `flowgrpo list | head`: the reader has what it wanted
        sys.stderr.close()
        return 0
    except Exception as err:
        if debug:
            raise
        if isinstance(err, ConfigError):
            message = f"config error: {one_line(err)}"
        elif isinstance(err, FlowgrpoError):
            message = one_line(err)
        else:  # an unexpected fault: still one line, with the way to see more
            message = (f"{one_line(err, with_type=True)} (rerun with --debug for the "
                       "traceback)")
        print(f"flowgrpo: {message}", file=sys.stderr)
        return getattr(err, "exit_code", 1)
    except KeyboardInterrupt:
        if debug:
            raise
        print("flowgrpo: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    raise SystemExit(main())
