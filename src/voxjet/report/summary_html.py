"""summary.md as one HTML page that needs nothing beside it (its figures inside, as data URIs):
what Snakemake's report shows on the page a user lands on (workflow/report/workflow.rst
includes it), and a page that opens alone in a browser."""

from __future__ import annotations

import base64
import html
import re
from pathlib import Path

# scoped to the summary's own element: the report page around it keeps its look
STYLE = """<style>
.voxjet-summary { font-family: system-ui, sans-serif; line-height: 1.4; }
.voxjet-summary table { border-collapse: collapse; margin: 0.5em 0 1.2em; font-size: 0.9em; }
.voxjet-summary th, .voxjet-summary td { border: 1px solid #ccc; padding: 0.25em 0.6em;
  text-align: right; white-space: nowrap; }
.voxjet-summary th { background: #f3f3f3; }
.voxjet-summary td:nth-child(2), .voxjet-summary td:nth-child(3),
.voxjet-summary td:nth-child(4) { text-align: left; }
.voxjet-summary img { max-width: 100%; margin: 0.3em 0; }
.voxjet-summary h1 { font-size: 1.6em; } .voxjet-summary h2 { font-size: 1.3em; }
</style>"""
_IMG = re.compile(r'<img src="([^"]+)"')


def _inline(match: re.Match, root: Path) -> str:
    path = root / html.unescape(match.group(1))
    if path.suffix.lower() != ".png" or not path.is_file():
        return match.group(0)  # left as it was: a browser beside the files still finds it
    data = base64.b64encode(path.read_bytes()).decode("ascii")
    return f'<img src="data:image/png;base64,{data}"'


def summary_html(markdown: str, root: str | Path) -> str:
    """The summary's markdown (tables, lists, figures relative to `root`) as an HTML fragment
    with its figures inside."""
    from markdown_it import MarkdownIt

    body = MarkdownIt("commonmark", {"html": False}).enable("table").render(markdown)
    body = _IMG.sub(lambda m: _inline(m, Path(root)), body)
    return f'{STYLE}\n<div class="voxjet-summary">\n{body}</div>\n'
