"""Memory a training step of a segmentation network takes on CPU, measured in a fresh process:
what the planner's estimate (voxjet.volumes.plan.memory.estimate_bytes) is tested against."""

from __future__ import annotations

import json
import os
import subprocess
import sys

# Anonymous resident memory, sampled every 0.2 ms by a thread: unlike the peak resident set
# size it leaves out library code paged in on first use, which depends on the page cache
# (a busy machine made ru_maxrss read up to twice the allocations). glibc's malloc is told to
# map every block over 64 KiB on its own and give freed memory back at once: with its adaptive
# thresholds, freed tensors stayed in the heap at random and one machine read a third more.
CODE = """
import json, sys, threading, time, torch
from voxjet.volumes.networks.models import build_seg_model
def anon():
    for l in open('/proc/self/status'):
        if l.startswith('RssAnon:'):
            return int(l.split()[1]) * 1024
cfg, patch, batch = json.loads(sys.argv[1])
torch.set_num_threads(1)
m = build_seg_model(cfg)
opt = torch.optim.AdamW(m.parameters())
small = [8 * max(1, p // p) for p in patch]
x = torch.randn(batch, cfg['in_channels'], *patch)
m(torch.randn(1, cfg['in_channels'], *[16] * 3)).float().sum().backward()
opt.step(); opt.zero_grad(set_to_none=True)
base = anon(); peak = [base]; done = threading.Event()
def watch():
    while not done.is_set():
        peak[0] = max(peak[0], anon()); time.sleep(0.0002)
t = threading.Thread(target=watch); t.start()
out = m(x)
out.float().pow(2).mean().backward()
done.set(); t.join()
print(max(peak[0], anon()) - base)
"""


def measure_peak_bytes(cfg: dict, patch: list[int], batch: int) -> int:
    """Resident memory a forward and backward pass of the network `cfg` describes adds on CPU
    (after a first step, so optimiser state and gradients exist), in a fresh process."""
    out = subprocess.run(
        [sys.executable, "-c", CODE, json.dumps([cfg, patch, batch])],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "MALLOC_MMAP_THRESHOLD_": "65536", "MALLOC_TRIM_THRESHOLD_": "0"},
    )
    return int(out.stdout.strip().splitlines()[-1])
