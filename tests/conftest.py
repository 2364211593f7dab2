"""Test-wide settings."""

import pytest
import torch


@pytest.fixture(autouse=True, scope="session")
def _one_thread_per_test_process():
    # 2-core machines: in-process tests run single-threaded so that they do not fight the
    # subprocesses (train.py / translate.py / DDP ranks) that other tests start.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
