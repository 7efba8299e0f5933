"""`infertool report RUN_DIR` (Markdown + a self-contained HTML page) and `infertool compare RUN_A RUN_B`.

Everything comes from the run directory: manifest.json and the files each stage wrote (quantize.json,
results.json, profile.json, bench.json, plots), read once as their producers' records (``rundir``: ``RunData``).
Plots are embedded in the HTML as <img> data: URIs, SVG too, never inline: a browser shows an SVG image without
running its scripts, event handlers or links and without loading anything, so a plot in a run directory (written by
someone else) cannot script the page. That is sturdier than sanitising the SVG's markup, where every missed element
or attribute is a hole. Every other string from the run directory is escaped (html.escape / md_escape) by the
renderers.

    rundir      a run directory read once, safely (read_inside, read_json_inside, load_run, read_run)
    page        the page model (sections of paragraphs, tables, bullets, figures) and the cells' formatters
    sections    the summary that decides and each stage's section; bench: the bench section
    render      Markdown and HTML, and write_report
    comparison  compare: two runs' headline figures side by side
"""

from infertool.report.comparison import Comparison, CompareRow, RecipeChange, compare, compare_runs
from infertool.report.render import ReportWritten, html_document, html_table, img_tag, md_escape, md_table, write_report
from infertool.report.rundir import MAX_JSON_BYTES, Unreadable, load_run, read_inside, read_json_inside, read_run

__all__ = ["MAX_JSON_BYTES", "CompareRow", "Comparison", "RecipeChange", "ReportWritten", "Unreadable", "compare",
           "compare_runs", "html_document", "html_table", "img_tag", "load_run", "md_escape", "md_table", "read_inside",
           "read_json_inside", "read_run", "write_report"]
