"""The training page's own script in headless Chromium over hand-made run folders
(``browser.serve``: no Airflow): a pipelined run's lanes, microbatch bars, bubbles,
legend, stage columns and pipeline line; a data-parallel run's page without them;
an elastic run's world changes and the rank that left; and none wider than a narrow
window."""

from __future__ import annotations

import json

import pytest

from dagtrain.plugins import report

from . import browser
from .pipeline_fixture import DAG, make_pipeline_run
from .test_page_report import make_run
from .test_world_changes import GROW, SHRINK, make_elastic_run
from .test_world_changes import RUN as ELASTIC_RUN

pytestmark = pytest.mark.slow
MINUS, TIMES = "\u2212", "\u00d7"  # what the page writes: (S\u22121)/(M+S\u22121), S \u00d7 D


@pytest.fixture(scope="module")
def chromium():
    path = browser.chromium()
    if path is None:
        pytest.skip("no chromium on this machine (make browser installs it where apt can)")
    sync_api = pytest.importorskip("playwright.sync_api", reason="playwright not installed")
    with sync_api.sync_playwright() as p:
        b = p.chromium.launch(executable_path=path, args=["--no-sandbox"])
        try:
            yield b
        finally:
            b.close()


def open_run(chromium, root, data, run_id, width=1280):
    page = chromium.new_page(viewport={"width": width, "height": 900})
    errors: list[str] = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    browser.serve(page, root, data, run_id)
    page.goto(browser.page_url(run_id))
    page.wait_for_selector("#ranks", timeout=15_000)
    page.wait_for_selector("svg.timeline", timeout=15_000)
    return page, errors


def texts(page, selector):
    return [t.strip() for t in page.locator(selector).all_text_contents()]


@pytest.mark.parametrize("order", ["zero-bubble", "1f1b"])
def test_a_pipelined_runs_page_has_a_lane_per_stage_rank_and_its_bubble(chromium, tmp_path, order):
    root, data = make_pipeline_run(tmp_path, order=order, steps=(None, 20))
    page, errors = open_run(chromium, root, data, "manual__pp")
    try:
        svg = page.locator("svg.timeline.pipelined")
        assert svg.count() == 1
        # a lane per stage rank, named by its stage, and its bubble at the lane's end
        assert texts(page, "svg.timeline text.lane.rank") == [
            "rank 0 · stage 0",
            "rank 1 · stage 1",
        ]
        want = report.run_report(root, DAG, "manual__pp", [], None, data)["pipeline"]
        bubbles = [f"bubble {round(100 * x['bubble'])}%" for x in want["ranks"]]
        assert texts(page, "svg.timeline text.lane.bubble") == bubbles
        # bars labelled by microbatch, each kind its own colour
        for kind in ["F", "B", *(["W"] if order == "zero-bubble" else []), "send", "recv"]:
            assert page.locator(f"svg.timeline g.op.{kind}[data-microbatch='3']").count() >= 1
        assert "F2" in texts(page, "svg.timeline g.op.F text.mb")
        fills = {
            k: page.locator(f"svg.timeline g.op.{k} rect").first.get_attribute("fill")
            for k in ("F", "B", "send", "update")
        }
        assert len(set(fills.values())) == 4, fills
        legend = page.locator("p.legend").inner_text()
        assert "F forward" in legend and "B backward" in legend and "W weight gradient" in legend
        # the mean, next to (S-1)/(M+S-1) = 1/5 for 2 stages and 4 microbatches
        summary = page.locator("p.bubble-summary").inner_text()
        assert f"mean {round(100 * want['mean_bubble'])}%" in summary, summary
        formula = "(S-1)/(M+S-1) = (2-1)/(4+2-1) = 20%".replace("-", MINUS)
        assert formula in summary, summary
        # the ranks table: stage and replica columns
        head = texts(page, "table.ranks th")
        assert head[:3] == ["rank", "stage", "replica"], head
        cells = page.locator("table.ranks tr").evaluate_all(
            "rows => rows.slice(1).map((r) => [...r.cells].slice(0, 3).map((c) => c.innerText))"
        )
        assert cells == [["0", "0", "0"], ["1 slowest", "1", "0"]], cells
        line = page.locator("p.pipeline").inner_text()
        assert f"2 stages {TIMES} 1 replica, 4 microbatches, order {order}, split [3]" in line, line
        # one replica a stage: no gradient sync, said so, not a table of zeros
        sync = page.locator("h2:has-text('Gradient sync') + *").inner_text()
        assert sync.startswith("no gradient sync: each of the 2 pipeline stages"), sync
        # the effective config's long lines wrap inside its box
        wrap = page.locator("pre.config").evaluate("e => getComputedStyle(e).whiteSpace")
        assert wrap == "pre-wrap", wrap
        # another traced step: still a lane per stage rank, with its bubbles
        page.select_option("#step", index=0)
        page.wait_for_function("new URLSearchParams(location.search).get('step') === '20'")
        page.wait_for_selector("svg.timeline.pipelined text.lane.bubble")
        assert texts(page, "svg.timeline text.lane.rank") == [
            "rank 0 · stage 0",
            "rank 1 · stage 1",
        ]
        page.screenshot(path=str(tmp_path / f"pipelined-{order}.png"), full_page=True)
        assert errors == []
    finally:
        page.close()


def test_a_data_parallel_runs_page_has_no_stage_columns_or_bubbles(chromium, tmp_path):
    root, data = make_run(tmp_path)
    page, errors = open_run(chromium, root, data, "manual__1")
    try:
        assert page.locator("svg.timeline").count() == 1
        assert page.locator("svg.timeline.pipelined, p.bubble-summary, p.pipeline").count() == 0
        assert texts(page, "table.ranks th")[:2] == ["rank", "host"]
        assert "forward/backward" in page.locator("div.scroll:has(svg.timeline) + p").inner_text()
        assert texts(page, "svg.timeline text.lane")[0] == "rank 0 · thread 0"
        assert errors == []
    finally:
        page.close()


@pytest.mark.parametrize("pipelined", [True, False])
def test_in_a_narrow_window_the_page_scrolls_its_wide_parts_not_itself(
    chromium, tmp_path, pipelined
):
    if pipelined:
        root, data = make_pipeline_run(tmp_path, stages=2, replicas=2, order="zero-bubble")
        run_id = "manual__pp"
    else:
        (root, data), run_id = make_run(tmp_path), "manual__1"
    page, errors = open_run(chromium, root, data, run_id, width=420)
    try:
        page.screenshot(path=str(tmp_path / "narrow.png"), full_page=True)
        width = page.evaluate("document.documentElement.scrollWidth")
        assert width <= 420, width  # the timeline and the tables scroll in their boxes
        assert errors == []
    finally:
        page.close()


@pytest.mark.parametrize("width", [1400, 700])
def test_an_elastic_runs_page_lists_its_world_changes_and_the_rank_that_left(
    chromium, tmp_path, width
):
    root, data = make_elastic_run(tmp_path)
    page, errors = open_run(chromium, root, data, ELASTIC_RUN, width=width)
    try:
        assert page.locator("h2#world-changes").inner_text() == "World changes"
        head = texts(page, "table.world th")
        assert head == [
            "try",
            "at step",
            "world",
            "ranks lost",
            "hosts",
            "recovered in",
            "steps lost",
            "why",
        ], head
        rows = page.locator("table.world tr").evaluate_all(
            "rows => rows.slice(1).map((r) => [...r.cells].map((c) => c.innerText.trim()))"
        )
        assert rows == [
            ["1", "108", "3 → 2 ranks shrink", "1", "h1 lost", "6.0 s", "1", SHRINK["why"]],
            ["1", "135", "2 → 3 ranks grow", "none", "h1 back", "9.5 s", "0", GROW["why"]],
        ], rows
        # the ranks table: the world of now, then the rank that left, and how
        left = page.locator("table.ranks tr").last.inner_text()
        assert "left at step 108" in left and "its host back at step 135" in left, left
        assert "was killed by SIGKILL" in left and left.startswith("1 of 3"), left
        assert page.locator("table.ranks tr").count() == 1 + 4
        assert texts(page, "table:has(th:text-is('world changes')) a") == ["2"]
        width_now = page.evaluate("document.documentElement.scrollWidth")
        assert width_now <= width, width_now  # its tables scroll in their own boxes
        assert errors == []
    finally:
        page.close()


def test_a_run_without_world_changes_has_no_world_changes_table(chromium, tmp_path):
    root, data = make_run(tmp_path)
    page, errors = open_run(chromium, root, data, "manual__1")
    try:
        assert page.locator("#world-changes, table.world").count() == 0
        assert "world changes" not in texts(page, "th")
        assert errors == []
    finally:
        page.close()


XSS = '<img src=x onerror="window.__xss=1">'


def test_values_written_as_html_show_as_text_and_never_run(chromium, tmp_path):
    """What a task, a rank or an XCom wrote reaches the page as text: a registry, a
    failure record, a trace and data version holding an HTML payload in every field
    (as a user who may write XComs through the REST API could make them)."""
    root, data = make_run(tmp_path)
    payload = {"a": XSS}
    (root / "registry").mkdir()
    (root / "registry" / "registry.json").write_text(
        json.dumps(
            {
                "champion": XSS,
                "versions": [
                    {
                        "version": XSS,
                        "metrics": {"test_accuracy": XSS, "test_loss": XSS},
                        "promoted": True,
                        "reason": XSS,
                        "lineage": {
                            "run_id": XSS,
                            "data_version": XSS,
                            "data_manifest": XSS,
                            "config": XSS,
                            "config_values": {"model": payload},
                        },
                    }
                ],
            }
        )
    )
    train = report.run_dir_of(root, DAG, "manual__1") / "train"
    (train / "failure-try1.json").write_text(json.dumps({"rank": 1, "how": XSS, "error": XSS}))
    ev = [{"ph": "X", "name": XSS, "pid": XSS, "tid": XSS, "ts": 0, "dur": 100}]
    (train / "traces" / "step-rank0.json").write_text(json.dumps({"traceEvents": ev}))
    page, errors = open_run(chromium, root, data | {"version": XSS}, "manual__1")
    try:
        page.wait_for_selector("#registry", timeout=15_000)
        assert page.evaluate("window.__xss") is None
        assert page.locator("main img").count() == 0
        registry = page.locator("table.registry").inner_text()
        assert registry.count(XSS) >= 5, registry  # version, metrics, why, lineage
        assert XSS in page.locator("svg.timeline").inner_html().replace("&lt;", "<").replace(
            "&gt;", ">"
        ).replace("&quot;", '"')
        assert errors == []
    finally:
        page.close()


def test_a_regression_runs_page_draws_a_chart_per_metric_and_shows_test_mse(chromium, tmp_path):
    from .test_page_report import REGRESSION_ROWS, objective_run, registered

    root, data = objective_run(tmp_path, REGRESSION_ROWS)
    tested = {"test_loss": 940.0, "test_mse": 940.0, "test_mae": 24.0, "test_r2": 0.2}
    registered(root, "regression", tested | {"test_samples": 89})
    train = report.run_dir_of(root, DAG, "manual__obj") / "train"
    (train / "result.json").write_text(json.dumps({"world": 2, "samples_per_second": 900.0}))
    (train.parent / "eval.json").write_text(
        json.dumps({"checkpoint": "c.pt", "metrics": tested, "better": True, "reason": "first"})
    )
    page = chromium.new_page(viewport={"width": 1280, "height": 900})
    errors: list[str] = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    browser.serve(page, root, data, "manual__obj")
    page.goto(browser.page_url("manual__obj"))
    try:
        page.wait_for_selector("#registry", timeout=15_000)
        charts = page.locator("#charts .chart")
        assert [charts.nth(i).get_attribute("data-metric") for i in range(4)] == [
            "loss",
            "mse",
            "mae",
            "r2",
        ]
        assert texts(page, "#charts .u-title") == ["loss", "mse", "mae", "r2"]
        assert texts(page, "#charts .chart:nth-child(2) .u-legend th")[1:] == [
            "train",
            "validation",
        ]
        heads = texts(page, "h2:has-text('Result') + div table th")
        assert heads[:2] == ["validation mse", "test mse"], heads
        result = texts(page, "h2:has-text('Result') + div table td")
        assert result[:2] == ["948.0000", "940.0000"], result  # the last epoch's val_mse
        assert texts(page, "table.registry th")[1:3] == ["test mse", "test loss"]
        assert texts(page, "table.registry td")[1:3] == ["940.0000", "940.0000"]
        page.screenshot(path=str(tmp_path / "regression.png"), full_page=True)
        assert errors == []
    finally:
        page.close()


@pytest.mark.parametrize(
    ("early_stop", "init", "said"),
    [
        (
            None,  # the record as the recipe wrote it: stopped after epoch 6, best 4
            None,  # a champion's warm start
            [
                "started from champion v3 (/r/models/v0003/model.pt)",
                "stopped early after epoch 6: val loss did not improve by more than 0.001 "
                "for 2 epoch(s) after epoch 4; best epoch 4 (val loss 0.2000) is the model kept",
            ],
        ),
        (
            {"best_epoch": 5, "best": 0.26, "stopped_after_epoch": None, "why": "trained to..."},
            {"kind": "scratch", "version": None, "path": None, "note": "no champion yet"},
            [
                "no champion yet: trained from scratch",
                "early stopping on val loss (patience 2, min_delta 0.001) did not stop training: "
                "it ran to the last step; best epoch 6 (val loss 0.2600), the last, is the "
                "model kept",
            ],
        ),
    ],
)
def test_a_runs_page_draws_its_lr_and_gradient_norm_and_says_its_early_stop_and_warm_start(
    chromium, tmp_path, early_stop, init, said
):
    from .test_page_report import CHAMPION, STOPPED, recipe_run

    root, data = recipe_run(tmp_path, STOPPED | (early_stop or {}), init or CHAMPION)
    page = chromium.new_page(viewport={"width": 1280, "height": 900})
    errors: list[str] = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    browser.serve(page, root, data, "manual__recipe")
    page.goto(browser.page_url("manual__recipe"))
    try:
        page.wait_for_selector("#registry", timeout=15_000)
        charts = page.locator("#charts .chart")
        # the LR beside the loss, then the gradient norm (its clipped share on the right)
        assert [charts.nth(i).get_attribute("data-metric") for i in range(4)] == [
            "loss",
            "lr",
            "grad_norm",
            "accuracy",
        ]
        assert texts(page, "#charts .u-title")[1:3] == ["learning rate", "gradient norm"]
        legend = texts(page, "#charts .chart[data-metric=grad_norm] .u-legend th")
        assert legend[1:] == [
            "mean norm before clipping",
            "max_grad_norm 1",
            "steps clipped (right axis)",
        ]
        # the cursor on epoch 1: the legend says its LR as the epoch lines do, its share clipped
        hover = """([m, x]) => {
          const u = window.dagtrainCharts.find((c) => c.root.parentNode.dataset.metric === m);
          u.setCursor({ left: u.valToPos(x, "x"), top: 10 });
          return [...u.root.querySelectorAll(".u-legend td")].map((td) => td.textContent);
        }"""
        assert page.evaluate(hover, ["lr", 1])[1] == "5.0e-2"
        assert page.evaluate(hover, ["grad_norm", 1])[1:] == ["1.5", "1", "60%"]
        assert [p.replace("\n", " ") for p in texts(page, "p.init, p.early-stop")] == said
        heads = texts(page, "h2:has-text('Result') + div table th")
        kept = early_stop is None  # the best epoch is not the last: its row is the result's
        assert heads[0] == (
            "validation accuracy (epoch 4, kept)" if kept else "validation accuracy"
        )
        assert texts(page, "h2:has-text('Result') + div table td")[0] == (
            "0.7500" if kept else "0.8500"
        )
        marked = texts(page, "#charts .chart[data-metric=loss] .u-legend th")
        assert ("best epoch 4 (kept)" in marked) == kept, marked
        page.screenshot(path=str(tmp_path / "recipe.png"), full_page=True)
        assert errors == []
    finally:
        page.close()
