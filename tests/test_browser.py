"""The explorers in a real browser: each lesson that shows one, run top to bottom in JupyterLab 4 in headless Chromium.

tests/test_widgets.py calls the explorers' callbacks from Python; this test checks what a learner sees: the
front end (ipywidgets 8's JupyterLab extension) renders each explorer, moving a slider with the mouse redraws its
table and its figure, and the controls stay readable at a 1,000- and a 1,400-pixel window (no toggle buttons
wrapped under their label, no label cut short). A JupyterLab server runs on 127.0.0.1 with a token, in a temporary
copy of the lessons; Playwright drives the system's Chromium (Debian's `chromium` package, which `.ci/run`
installs; another with $MINIGRPO_CHROMIUM), never a browser that Playwright downloads. Screenshots go to
$MINIGRPO_SCREENSHOTS (default: a folder under pytest's temporary directory, printed by the test).

Without Chromium, Playwright or JupyterLab the test is skipped with the reason; in CI (CI=true) it fails instead.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import secrets
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).resolve().parent.parent
CHROMIUM_FLAGS = [  # headless, and no connection anywhere but the local server
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
# lesson -> the explorers it shows: (the call that builds one, a slider that changes both its table and its figure;
# with A > 0 the clipping table does not depend on epsilon, the low side, but on epsilon_high)
EXPLORERS = {
    "03_group_relative_advantages": [("group_advantage_explorer(", "r1")],
    "04_grpo_objective": [("clipping_explorer(", "epsilon_high"), ("kl_explorer(", "shift")],
}
WIDTHS = (1400, 1000)  # the window widths the controls must stay readable at
STEP_TIMEOUT_S = 60  # for each wait; running a lesson's cells has none (a cell that hangs fails nbval's run too)

pytestmark = pytest.mark.browser


def chromium() -> str:
    """The system's Chromium, or a skip (a failure in CI) that says how to install it."""
    path = os.environ.get("MINIGRPO_CHROMIUM") or shutil.which("chromium") or shutil.which("chromium-browser")
    missing = []
    if path is None:
        missing.append("Chromium (apt-get install chromium)")
    for module, package in (("playwright", "playwright"), ("jupyterlab", "jupyterlab>=4")):
        try:
            __import__(module)
        except ImportError:
            missing.append(f"{package} (pip install -e '.[browser]')")
    if missing:
        reason = "the browser test needs " + ", ".join(missing)
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(f"{reason}: CI must run it, and .ci/run installs them")
        pytest.skip(reason)
    return path


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@contextlib.contextmanager
def jupyter_lab(folder: Path, home: Path):
    """A JupyterLab server on 127.0.0.1 with a token, serving `folder`; its settings and runtime files in `home`.
    Yields (base URL, token)."""
    settings = {
        # Every cell in the page, not only those scrolled into view, so the test finds each explorer's cell by index.
        "notebook-extension/tracker": {"windowingMode": "none"},
        "apputils-extension/notification": {"fetchNews": "false"},  # no news pop-up over the outputs, no request
    }
    for name, values in settings.items():
        path = home / "settings" / "@jupyterlab" / f"{name}.jupyterlab-settings"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(values))
    token, port = secrets.token_hex(16), free_port()
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(
            [str(ROOT), os.environ.get("PYTHONPATH", "")]
        ),  # the kernel imports this checkout
        "JUPYTER_CONFIG_DIR": str(home / "config"),
        "JUPYTER_RUNTIME_DIR": str(home / "runtime"),
        "JUPYTERLAB_SETTINGS_DIR": str(home / "settings"),
        "JUPYTERLAB_WORKSPACES_DIR": str(home / "workspaces"),
    }
    command = [
        sys.executable,
        "-m",
        "jupyterlab",
        "--no-browser",
        "--ServerApp.ip=127.0.0.1",
        f"--ServerApp.port={port}",
        "--ServerApp.port_retries=0",
        "--ServerApp.allow_root=True",  # CI runs as root
        "--ServerApp.terminals_enabled=False",
        f"--IdentityProvider.token={token}",
        f"--ServerApp.root_dir={folder}",
        "--LabApp.expose_app_in_browser=True",  # window.jupyterapp: run all cells through JupyterLab's own command
        "--LabApp.news_url=None",  # nothing from outside this machine
        "--LabApp.check_for_updates_class=jupyterlab.handlers.announcements.NeverCheckForUpdate",
        "--LabApp.extension_manager=readonly",
    ]
    log_path = home / "server.log"
    with log_path.open("w") as log:
        server = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT)
        base = f"http://127.0.0.1:{port}"
        try:
            deadline = time.monotonic() + 60
            while True:
                try:
                    with urllib.request.urlopen(f"{base}/api/status?token={token}", timeout=2):
                        break
                except OSError:
                    if server.poll() is not None or time.monotonic() > deadline:
                        raise RuntimeError(f"JupyterLab did not start:\n{log_path.read_text()}") from None
                    time.sleep(0.5)
            yield base, token
        finally:
            server.terminate()
            try:
                server.wait(timeout=20)
            except subprocess.TimeoutExpired:
                server.kill()


@contextlib.contextmanager
def chromium_context(executable: str, profile: Path):
    """A headless Chromium (the system's, driven by Playwright) with a fresh profile: yields a browser context."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        context = playwright.chromium.launch_persistent_context(
            str(profile),
            executable_path=executable,
            args=CHROMIUM_FLAGS,
            headless=True,
            viewport={"width": WIDTHS[0], "height": 1000},
        )
        try:
            yield context
        finally:
            context.close()


@pytest.fixture(scope="module")
def jupyter(tmp_path_factory):
    """JupyterLab in a copy of the lessons that show an explorer, and a browser: yields (base URL, token, context)."""
    executable = chromium()
    home = tmp_path_factory.mktemp("jupyter")
    lessons = home / "lessons"
    lessons.mkdir()
    for name in EXPLORERS:
        shutil.copy(ROOT / "notebooks" / f"{name}.ipynb", lessons)
    with jupyter_lab(lessons, home) as (base, token), chromium_context(executable, home / "profile") as context:
        yield base, token, context


@pytest.fixture(scope="module")
def screenshots(tmp_path_factory) -> Path:
    folder = Path(os.environ.get("MINIGRPO_SCREENSHOTS") or tmp_path_factory.mktemp("screenshots"))
    folder.mkdir(parents=True, exist_ok=True)
    print(f"screenshots: {folder}")
    return folder


def cell_index(name: str, call: str) -> int:
    """The index, among all the notebook's cells, of the code cell that builds the explorer."""
    cells = nbformat.read(ROOT / "notebooks" / f"{name}.ipynb", as_version=4).cells
    found = [i for i, cell in enumerate(cells) if cell.cell_type == "code" and call in cell.source]
    assert len(found) == 1, f"{name}: expected one cell calling {call}, found {found}"
    return found[0]


def run_all_cells(page) -> None:
    """JupyterLab's own Run All, awaited: fails with the first error a cell raised."""
    page.wait_for_function("() => window.jupyterapp && window.jupyterapp.shell.currentWidget?.sessionContext")
    ok = page.evaluate(
        """async () => {
            const panel = window.jupyterapp.shell.currentWidget;
            await panel.context.ready;
            await panel.sessionContext.ready;
            return await window.jupyterapp.commands.execute('notebook:run-all-cells');
        }"""
    )
    errors = page.locator(".jp-OutputArea-output[data-mime-type='application/vnd.jupyter.stderr']")
    assert ok, "a cell raised: " + " | ".join(errors.all_inner_texts())[-2000:]


def state(output) -> dict:
    """What a learner reads off an explorer: its table, and its figure (the PNG's data)."""
    return {
        "table": output.locator(".widget-html pre").inner_text(),
        "figure": output.locator("img").get_attribute("src"),
    }


def digest(figure: str) -> str:
    """A short name for a figure's data, for messages."""
    return hashlib.sha256(figure.encode()).hexdigest()[:12]


def drag_slider(page, output, description: str) -> None:
    """Drag the slider labelled `description` with the mouse, a third of its track towards its far end."""
    label = page.locator(".widget-label", has_text=re.compile(f"^{re.escape(description)}$"))
    slider = output.locator(".widget-slider", has=label)
    slider.scroll_into_view_if_needed()  # the mouse reaches only what the window shows
    track = slider.locator(".noUi-target").bounding_box()
    box = slider.locator(".noUi-handle").bounding_box()
    x, y = box["x"] + box["width"] / 2, box["y"] + box["height"] / 2
    direction = -1 if x > track["x"] + track["width"] / 2 else 1  # a handle at its maximum moves left
    page.mouse.move(x, y)
    page.mouse.down()
    page.mouse.move(x + direction * track["width"] / 3, y, steps=8)
    page.mouse.up()


def layout_problems(output) -> list[str]:
    """What a learner could not read: a label or a button's text cut short, toggle buttons wrapped onto two rows or
    under their label, a slider squeezed to a stub, or a figure scaled down to fit (with `scaled`)."""
    return output.evaluate(
        """(root) => {
            const problems = [];
            const box = (element) => element.getBoundingClientRect();
            for (const text of root.querySelectorAll('.widget-label, button')) {
                if (text.scrollWidth > text.clientWidth + 1) problems.push(`text cut: ${text.textContent}`);
            }
            for (const toggles of root.querySelectorAll('.widget-toggle-buttons')) {
                const label = toggles.querySelector('.widget-label').textContent;
                const buttons = [...toggles.querySelectorAll('button')].map(box);
                const top = Math.min(...buttons.map((b) => b.top));
                const bottom = Math.max(...buttons.map((b) => b.bottom));
                if (bottom - top > 1.5 * buttons[0].height) problems.push(`buttons on two rows: ${label}`);
                const above = box(toggles.querySelector('.widget-label')).bottom <= top + 1;
                if (above) problems.push(`label above its buttons: ${label}`);
            }
            for (const slider of root.querySelectorAll('.widget-slider')) {
                const track = slider.querySelector('.noUi-target, .slider');
                if (track && box(track).width < 80) problems.push(`slider squeezed: ${slider.textContent}`);
            }
            return problems;
        }"""
    )


def figure_scale(output) -> float:
    """How much the browser shrank the explorer's figure to fit the output area (1.0: shown at its own size)."""
    return output.locator(".widget-output img").evaluate(
        "(img) => img.getBoundingClientRect().width / img.naturalWidth"
    )


def test_every_explorer_a_lesson_shows_is_tested():
    """EXPLORERS lists every explorer a lesson builds (this part needs no browser)."""
    shown = set()
    for path in sorted((ROOT / "notebooks").glob("*.ipynb")):
        for cell in nbformat.read(path, as_version=4).cells:
            if cell.cell_type == "code":
                shown |= {(path.stem, call) for call in re.findall(r"\b(\w+_explorer\()", cell.source)}
    assert shown == {(name, call) for name, explorers in EXPLORERS.items() for call, _ in explorers}


@pytest.mark.parametrize("name", list(EXPLORERS))
def test_explorers_render_and_follow_their_sliders(name, jupyter, screenshots):
    from playwright.sync_api import TimeoutError as PlaywrightTimeoutError

    base, token, context = jupyter
    page = context.new_page()
    page.set_default_timeout(STEP_TIMEOUT_S * 1000)
    page.goto(f"{base}/lab/tree/{name}.ipynb?reset&token={token}")
    run_all_cells(page)
    cells = page.locator(".jp-Notebook .jp-Cell")
    for call, slider in EXPLORERS[name]:
        which = call.rstrip("(")
        cell = cells.nth(cell_index(name, call))
        output = cell.locator(".jp-OutputArea-output").filter(has=page.locator(".widget-vbox")).first
        output.locator(".widget-output img").wait_for()
        text = cell.locator(".jp-Cell-outputArea").inner_text()
        assert "Loading widget" not in text and "Error displaying widget" not in text, f"{which}: {text[:300]}"
        output.scroll_into_view_if_needed()
        for width in WIDTHS:
            page.set_viewport_size({"width": width, "height": 1000})
            page.wait_for_timeout(300)
            output.screenshot(path=screenshots / f"{which}-{width}px.png")
            page.screenshot(path=screenshots / f"{which}-page-{width}px.png")
            assert layout_problems(output) == [], f"{which} at a {width}-pixel window"
            if width == max(WIDTHS):  # narrower, with the file browser open, a 100-dpi figure has to shrink
                assert figure_scale(output) > 0.99, f"{which}: a figure wider than the notebook column"
        before = state(output)
        drag_slider(page, output, slider)
        try:
            page.wait_for_function(
                "([el, table, figure]) => el.querySelector('.widget-html pre')?.innerText !== table"
                " && el.querySelector('img')?.src !== figure",
                arg=[output.element_handle(), before["table"], before["figure"]],
            )
        except PlaywrightTimeoutError:
            pass  # the assertions below say which of the two did not change
        after = state(output)
        output.screenshot(path=screenshots / f"{which}-moved.png")
        assert after["table"] != before["table"], f"{which}: the table did not change when {slider} was dragged"
        unchanged = digest(after["figure"]) == digest(before["figure"])
        assert not unchanged, (
            f"{which}: the figure (PNG {digest(before['figure'])}) did not change when {slider} was dragged"
        )
    page.close()
