"""Memory a U-Net training step takes on CPU, measured in a fresh process: what the planner's
estimate (voxjet.volumes.memory) is tested against."""

from __future__ import annotations


def measure_peak_bytes(
    patch: list[int], channels: list[int], batch: int, num_res_units: int = 1, out_channels: int = 2
) -> int:
    """Resident memory a forward and backward pass adds on CPU, measured in a fresh process
    (the peak resident size only grows, so each measurement needs its own)."""
    import json
    import subprocess
    import sys

    # Anonymous resident memory, sampled every 0.2 ms by a thread: unlike the peak resident set
    # size it leaves out library code paged in on first use, which depends on the page cache
    # (a busy machine made ru_maxrss read up to twice the allocations).
    code = (
        "import json,sys,threading,time,torch\n"
        "from voxjet.volumes.models import build_unet\n"
        "def anon():\n"
        "  for l in open('/proc/self/status'):\n"
        "    if l.startswith('RssAnon:'): return int(l.split()[1])*1024\n"
        "p,ch,b,r,o=json.loads(sys.argv[1]);torch.set_num_threads(1)\n"
        "m=build_unet(1,o,ch,r)\n"
        "m(torch.randn(1,1,*[2**len(ch)]*3)).sum().backward();m.zero_grad()\n"
        "x=torch.randn(b,1,*p)\n"
        "base=anon();peak=[base];done=threading.Event()\n"
        "def watch():\n"
        "  while not done.is_set(): peak[0]=max(peak[0],anon());time.sleep(0.0002)\n"
        "t=threading.Thread(target=watch);t.start()\n"
        "m(x).float().pow(2).mean().backward()\n"
        "done.set();t.join();print(max(peak[0],anon())-base)\n"
    )
    out = subprocess.run(
        [
            sys.executable,
            "-c",
            code,
            json.dumps([patch, channels, batch, num_res_units, out_channels]),
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    return int(out.stdout.strip().splitlines()[-1])
