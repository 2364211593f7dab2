"""The one harness every benchmark plugs into: one parser, one timing loop, one table printer.

A plug-in is a module with `__doc__` (its help), `add_flags(add)` (its own flags beside the
common `--device --repeats --threads --seed --json`) and `run(args)`: the JSON-able report, or
(report, exit status); it ends with `sys.exit(harness.main(sys.modules[__name__]))`.
`main(plugin, argv)` parses, runs, writes `--json`, and turns a `UserError` into one line.
"""

from __future__ import annotations

import argparse
import importlib
import json
import platform
import statistics
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

from attnmt.common.errors import UserError, exit_status

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT.parent / "shared" / "data" / "multi30k"  # Multi30k beside the repository


def csv(kind: type) -> Callable[[str], list]:
    return lambda text: [kind(x) for x in text.split(",") if x]


def parser(plugin: ModuleType) -> argparse.ArgumentParser:
    """The common flags (default None: each plug-in says its own) and the plug-in's."""
    name = Path(plugin.__file__).stem  # not "__main__" under python -m
    p = argparse.ArgumentParser(
        prog=f"{name}.py",
        description=plugin.__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add = p.add_argument
    add("--device", default=None, help="cpu or cuda (default: cuda when available)")
    add("--repeats", type=int, default=None, help="timed repeats, interleaved")
    add("--threads", type=int, default=None, help="CPU threads (default: torch's)")
    add("--seed", type=int, default=None, help="seed of weights and batches")
    add("--json", type=Path, default=None, metavar="PATH", help="write the report here")
    plugin.add_flags(add)
    return p


def main(plugin: ModuleType, argv: list[str] | None = None) -> int:
    """Parse, run the plug-in, write --json; the exit status the plug-in's (default 0)."""
    name = Path(plugin.__file__).stem  # not "__main__" under python -m

    def go() -> int:
        args = parser(plugin).parse_args(argv)
        for flag in ("repeats", "threads"):
            if getattr(args, flag) is not None and getattr(args, flag) < 1:
                raise UserError(f"--{flag} must be >= 1, got {getattr(args, flag)}")
        if args.device is None:
            import torch

            args.device = "cuda" if torch.cuda.is_available() else "cpu"
        report, status = out if isinstance(out := plugin.run(args), tuple) else (out, 0)
        if args.json:
            args.json.parent.mkdir(parents=True, exist_ok=True)
            args.json.write_text(json.dumps(report, indent=1, default=str))
            print(f"wrote {args.json}")
        return status

    return exit_status(f"{name}.py", go)


def train_configs(overrides: list[str]) -> Any:
    """train.py's `Configs` for these command-line overrides (its conf/, composed by Hydra)."""
    from hydra import compose, initialize_config_dir

    from attnmt.training.config import Configs

    with initialize_config_dir(str(ROOT / "conf"), version_base=None):
        return Configs.from_hydra(compose("train", overrides=overrides))


def version(name: str) -> str | None:
    """The installed version of package `name`, None when it does not import."""
    try:
        return importlib.import_module(name).__version__
    except ImportError:
        return None


def cpu_model() -> str:
    """The CPU as `lscpu` names it (/proc/cpuinfo on Linux), else what `platform` knows."""
    try:
        block = Path("/proc/cpuinfo").read_text().split("\n\n")[0]  # the first processor
        fields = {k.strip(): v.strip() for k, _, v in (x.partition(":") for x in block.split("\n"))}
        return f"{fields['model name']} (family {fields['cpu family']}, model {fields['model']})"
    except (OSError, KeyError):
        return platform.processor() or platform.machine()


def code_under_test() -> str:
    """The tree `attnmt` is imported from, at its commit (`git describe --dirty`): an A/B of
    two checkouts must print two trees."""
    import attnmt.engine

    root = Path(attnmt.engine.__file__).resolve().parent.parent
    git = ["git", "-C", str(root), "describe", "--always", "--dirty"]
    try:
        described = subprocess.run(git, capture_output=True, text=True, check=True).stdout
        return f"{root} at {described.strip()}"
    except (OSError, subprocess.CalledProcessError):
        return f"{root} (not a git checkout)"


def interleaved(
    runs: dict[Any, Callable[[], Any]], repeats: int, sync: Callable[[], Any] | None = None
) -> dict[Any, list[float]]:
    """Seconds per call of each run, repeat r in the order rotated by r (A B C, B C A, ...:
    drifts in machine speed hit every system). `sync` (e.g. a CUDA synchronize) is called
    before and after each timed call; a run that returns a float reports its own seconds."""
    times: dict[Any, list[float]] = {name: [] for name in runs}
    names, sync = list(runs), sync or (lambda: None)
    for r in range(repeats):
        for name in names[r % len(names) :] + names[: r % len(names)]:
            sync()
            start = time.perf_counter()
            result = runs[name]()
            sync()
            own = isinstance(result, float)
            times[name].append(result if own else time.perf_counter() - start)
    return times


@dataclass(frozen=True)
class Spread:
    """A median and the min-max range of repeated figures."""

    median: float
    low: float
    high: float

    @classmethod
    def of(cls, values: Sequence[float]) -> Spread:
        return cls(statistics.median(values), min(values), max(values))

    def format(self, spec: str = ",.1f", suffix: str = "") -> str:
        return f"{self.median:{spec}}{suffix} ({self.low:{spec}}-{self.high:{spec}}{suffix})"

    def as_dict(self) -> dict[str, float]:
        return {"median": self.median, "min": self.low, "max": self.high}


def ratio_spread(ours_s: Sequence[float], peer_s: Sequence[float]) -> Spread:
    """ours' speed / the peer's, per repeat (the same work: peer seconds / ours seconds)."""
    return Spread.of([p / o for o, p in zip(ours_s, peer_s, strict=True)])


def table(head: Sequence[str], rows: Sequence[Sequence[Any]]) -> list[str]:
    """A Markdown table, figures right-aligned (a float with 2 decimals unless formatted)."""
    numeric = [bool(rows) and all(str(r[i])[:1].isdigit() for r in rows) for i in range(len(head))]
    cell = lambda x: f"{x:,.2f}" if isinstance(x, float) else str(x)  # noqa: E731
    lines = ["| " + " | ".join(head) + " |", "|" + "|".join("---:" if n else "---" for n in numeric) + "|"]  # fmt: skip
    return lines + ["| " + " | ".join(cell(x) for x in row) + " |" for row in rows]


def percent(x: float | None) -> str:
    return "n/a" if x is None else f"{100 * x:.1f}%"
