"""Train a Transformer translation model.

    python train.py                                   # the default experiment (conf/train.yaml)
    python train.py experiment=multi30k_de_en data.dir=../shared/data/multi30k
    python train.py model=tiny trainer.max_steps=200 trainer.device=cpu hydra.run.dir=/tmp/run1
    python train.py -m optim.lr=5e-4,7e-4             # Hydra multirun sweep
    torchrun --nproc_per_node=8 train.py experiment=wmt14_en_de

Everything a run writes goes under its Hydra run dir; re-running in the same dir resumes.
Under torchrun only rank 0 writes (run dir, `train.log`, TensorBoard, `results.json`); the
other ranks print warnings and errors only, prefixed with their rank.
"""

from __future__ import annotations

import logging
import os
import sys
import time
from pathlib import Path
from typing import NoReturn

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

from attnmt.cli.args import program_name
from attnmt.common.errors import UserError
from attnmt.training.loop import fit
from attnmt.training.resume_config import ResumePlan, is_resume, plan_resume
from attnmt.training.run_dir import check_run_dir_free, torchrun_overrides

PROG = program_name("train.py")
RANK = int(os.environ.get("RANK", "0"))
WORLD_SIZE = int(os.environ.get("WORLD_SIZE", "1"))
log = logging.getLogger("train")
CONF_DIR = Path(__file__).resolve().parent.parent / "conf"
_RESUME: ResumePlan | None = None  # set by `cli` when the run dir holds a run to resume


@hydra.main(version_base="1.3", config_path="../conf", config_name="train")
def main(cfg: DictConfig) -> float:
    """Returns the best validation BLEU, so a Hydra sweeper can optimise it."""
    if RANK > 0:  # Hydra set up no logging here (see _torchrun_overrides)
        logging.basicConfig(
            level=logging.WARNING,
            stream=sys.stderr,
            format=f"[rank {RANK}] %(levelname)s %(name)s: %(message)s",
        )
    run_dir = HydraConfig.get().runtime.output_dir
    if _RESUME is not None:  # the run's own config with this command line's overrides
        cfg = _RESUME.config
    try:
        outcome = fit(cfg, run_dir, keep_memory=True, resume_plan=_RESUME)  # reuse freed blocks
    except UserError as e:
        _fail(str(e))
    if RANK == 0:
        if outcome.preempted:
            print(
                f"stopped by {outcome.preempted} at step {outcome.results['steps']}; "
                f"checkpoints/last.pt holds it: rerun with hydra.run.dir={run_dir} to resume"
            )
        else:
            _print_summary(outcome.results, run_dir)
    return outcome.results.get("valid", {}).get("bleu", 0.0)


def _print_summary(results: dict, run_dir: str) -> None:
    print(
        f"best valid BLEU {results['valid']['bleu']:.2f} "
        f"(step {results['best_step']} of {results['steps']})"
    )
    for split, score in results["test"].items():
        print(
            f"test {split}: BLEU {score['bleu']:.2f}  chrF {score['chrf']:.2f}  "
            f"{score['signature']}"
        )
    print(f"results in {run_dir}/results.json")


def _fail(message: str) -> None:
    """One line on stderr and exit 2. Under torchrun, a rank other than 0 waits a moment
    first: if rank 0 hit the same error it reports it and torchrun ends this rank, so the user
    reads one line, not one per rank."""
    if RANK > 0:
        time.sleep(5)
        message = f"[rank {RANK}] {message}"
    if RANK == 0:  # train.log keeps it; the console shows only the line below
        record = log.makeRecord(log.name, logging.ERROR, __file__, 0, message, None, None)
        for handler in logging.getLogger().handlers:
            if isinstance(handler, logging.FileHandler):
                handler.handle(record)
    print(f"{PROG}: error: {message}", file=sys.stderr)
    _exit(2)


def _exit(code: int) -> NoReturn:
    """Exit; a torchrun worker skips interpreter teardown (after flushing what it printed).

    DDP keeps the process group alive after `destroy_process_group` (torch 2.13: its gloo
    threads still run at exit, see `tests/test_distributed.py::test_ddp_leaks_its_process_group`),
    and in one CI run 2 of about 20 torchrun runs had a worker abort with SIGABRT ("terminate
    called without an active exception"), most likely while finalizing with those threads
    running (not reproduced in about 60 runs here). Everything the run writes is closed by then
    (checkpoints, results, TensorBoard); only log handlers and stdio need flushing.
    """
    if WORLD_SIZE > 1:
        logging.shutdown()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    sys.exit(code)


def resume_plan(argv: list[str]) -> ResumePlan | None:
    """The resume of the run in this command's `hydra.run.dir`, if it holds one."""
    given = [arg.split("=", 1)[1] for arg in argv if arg.startswith("hydra.run.dir=")]
    if not given or {"-m", "--multirun"} & set(argv) or not is_resume(Path(given[-1])):
        return None
    return plan_resume(Path(given[-1]), argv, CONF_DIR)


def cli() -> None:
    """The command (`attnmt-train`, `python train.py`): Hydra's overrides from `sys.argv`."""
    global _RESUME
    try:
        sys.argv += torchrun_overrides(sys.argv[1:])
        check_run_dir_free(sys.argv[1:])  # before Hydra writes .hydra/ and train.log there
        _RESUME = resume_plan(sys.argv[1:])
    except UserError as e:
        _fail(str(e))
    if _RESUME is not None and "hydra.output_subdir=null" not in sys.argv:
        sys.argv.append("hydra.output_subdir=null")  # the run's .hydra/ stays as it was
    main()
    _exit(0)


if __name__ == "__main__":
    cli()
