"""The staged copies checked against their sources after the sources were touched, copied or
moved (new times, no change the quick fingerprint saw): each such source's full checksum
against the one its copy was verified with. Equal, the ledger takes the new time (the dry run
stops re-reading the file); different where the fingerprint was the same, the file's
generation counts up (voxjet.stage.fingerprint) and the job stops, so that the next run
restages it and rebuilds what read it. Nothing after the stage waits for this check: a touch
reruns it alone."""

from __future__ import annotations

import sys
from pathlib import Path

from voxjet.errors import VoxjetError
from voxjet.io.atomic import write_json
from voxjet.progress import Progress
from voxjet.stage.checksum import algorithm_for, checksum_file
from voxjet.stage.fingerprint import quick_fingerprint
from voxjet.stage.transfer import LEDGER, Ledger, list_sources


def verify_sources(source: str, dest: str | Path, patterns: list[str], out: str | Path) -> dict:
    """Check every local source whose size or time differs from what the ledger in `dest`
    verified; write the summary to `out` (refusing, after the ledger is saved, when a file
    changed where its fingerprint did not)."""
    ledger = Ledger(Path(dest) / LEDGER)
    files = list_sources(source, patterns)[1]
    moved = [f for f in files if f.relpath in ledger.entries and ledger.source_changed(f)]
    changed, hidden = [], []
    bar = Progress(len(moved), f"verify {Path(dest).parent.name}", "file")
    for f in moved:
        entry = ledger.entries[f.relpath]
        algorithm = algorithm_for(f.relpath)
        path = f.url.removeprefix("file://")
        bar.update(1)
        if checksum_file(path, algorithm) == entry.get("checksum", {}).get(algorithm):
            entry.update(source_size=f.size, source_stamp=f.stamp)  # as staged: new time only
        elif quick_fingerprint(path) == entry.get("quick"):
            # the stage copies it again (its source time is not the one verified) and keeps
            # the generation, which changes the file's key for the dry run
            entry.update(generation=int(entry.get("generation", 0)) + 1, stale=True)
            hidden.append(f.relpath)
        else:
            changed.append(f.relpath)  # a change the dry run saw: the stage copies it
    bar.close()
    ledger.save()
    if hidden:
        raise VoxjetError(
            f"{len(hidden)} source files changed since they were staged though their size and "
            f"sampled bytes did not ({', '.join(sorted(hidden)[:5])}), so no run could tell "
            "before it started. They are recorded as changed: run snakemake again, and it "
            "restages them and rebuilds what reads them"
        )
    summary = {"files": len(files), "checked": len(moved), "changed": sorted(changed)}
    write_json(Path(out), summary)
    print(f"verify: {len(moved)} of {len(files)} sources had new times; "
          f"{len(moved) - len(changed)} of them are as staged", file=sys.stderr)  # fmt: skip
    return summary
