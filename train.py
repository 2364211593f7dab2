"""Train a Transformer translation model: `attnmt-train`, runnable from a clone.

    python train.py                                   # the default experiment (conf/train.yaml)
    python train.py model=tiny trainer.max_steps=200 trainer.device=cpu hydra.run.dir=/tmp/run1
    torchrun --nproc_per_node=8 train.py experiment=wmt14_en_de

The command lives in `cli/train.py` (`attnmt.cli.train`).
"""

from attnmt.cli.train import cli

if __name__ == "__main__":
    cli()
