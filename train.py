"""Train a Transformer translation model.

    python train.py                                   # the default experiment (conf/train.yaml)
    python train.py experiment=multi30k_de_en data.dir=../shared/data/multi30k
    python train.py model=tiny trainer.max_steps=200 trainer.device=cpu hydra.run.dir=/tmp/run1
    python train.py -m optim.lr=5e-4,7e-4             # Hydra multirun sweep
    torchrun --nproc_per_node=8 train.py experiment=wmt14_en_de

Everything a run writes goes under its Hydra run dir; re-running in the same dir resumes.
"""

from __future__ import annotations

import json
import logging
import sys
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

from common.errors import UserError
from training.loop import fit

log = logging.getLogger("train")


@hydra.main(version_base="1.3", config_path="conf", config_name="train")
def main(cfg: DictConfig) -> float:
    """Returns the best validation BLEU, so a Hydra sweeper can optimise it."""
    run_dir = HydraConfig.get().runtime.output_dir
    try:
        best = fit(cfg, run_dir)
    except UserError as e:
        log.error("%s", e)  # keeps the reason in train.log too
        print(f"train.py: error: {e}", file=sys.stderr)
        sys.exit(2)
    results = json.loads((Path(run_dir) / "results.json").read_text(encoding="utf-8"))
    print(f"best valid BLEU {best:.2f} (step {results['best_step']} of {results['steps']})")
    for split, score in results["test"].items():
        print(f"test {split}: BLEU {score['bleu']:.2f}  chrF {score['chrf']:.2f}  {score['signature']}")
    print(f"results in {run_dir}/results.json")
    return best


if __name__ == "__main__":
    main()
