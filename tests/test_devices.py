"""Local multi-GPU runs: concurrent jobs claim disjoint devices; a killed job frees its own."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from voxjet.distributed.devices import claim_devices

HOLD = """
import sys, time
from voxjet.distributed.devices import claim_devices
devices, _ = claim_devices(int(sys.argv[1]), 4, sys.argv[2], timeout_s=30, poll_s=0.05)
print(",".join(map(str, devices)), flush=True)
time.sleep(60)
"""


def _holder(n: int, lock_dir) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-c", HOLD, str(n), str(lock_dir)], stdout=subprocess.PIPE, text=True
    )


def test_concurrent_jobs_get_disjoint_devices_and_kill_frees_them(tmp_path):
    a = _holder(2, tmp_path)
    got_a = a.stdout.readline().strip()
    b = _holder(2, tmp_path)
    got_b = b.stdout.readline().strip()
    try:
        assert {got_a, got_b} == {"0,1", "2,3"}
        with pytest.raises(TimeoutError, match="no 1 free GPUs of 4"):
            claim_devices(1, 4, tmp_path, timeout_s=0.2, poll_s=0.05)
        a.send_signal(signal.SIGKILL)  # a job that dies releases its devices
        a.wait()
        devices, fds = claim_devices(2, 4, tmp_path, timeout_s=10, poll_s=0.05)
        assert ",".join(map(str, devices)) == got_a
        assert all(os.get_inheritable(fd) for fd in fds)  # kept across exec into torchrun
    finally:
        for p in (a, b):
            p.kill()
            p.wait()


def test_waiting_job_starts_when_devices_free_up(tmp_path):
    a = _holder(4, tmp_path)
    a.stdout.readline()
    c = _holder(1, tmp_path)
    time.sleep(0.3)
    assert c.poll() is None  # waiting
    a.kill()
    a.wait()
    try:
        assert c.stdout.readline().strip() in {"0", "1", "2", "3"}
    finally:
        c.kill()
        c.wait()


def test_asking_for_more_than_exist_is_an_error(tmp_path):
    with pytest.raises(ValueError, match="5 GPUs asked for, 4"):
        claim_devices(5, 4, tmp_path)
