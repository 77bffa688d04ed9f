"""Drive JupyterLab in headless Chromium as a learner does: open a notebook, edit a cell, Run All, read it.

The pieces are separate so tests can combine them: `ensure_chromium` (find or install the browser),
`LabServer` (a JupyterLab on loopback with a token, in a throwaway root and settings folder),
`run_in_lab` (open one notebook in a page, append lines to its parameters cell, run every cell from the
Run menu, wait for the kernel, read back what rendered) and `problems` (what a learner would see as broken).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# Chromium without a sandbox (root in a container), without a GPU, and without talking to Google's hosts.
CHROMIUM_ARGS: tuple[str, ...] = (
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
)
CHROMIUM_CANDIDATES: tuple[str, ...] = (
    "/usr/bin/chromium", "/usr/bin/chromium-browser", "/usr/bin/google-chrome",
)
APT_PACKAGES: tuple[str, ...] = ("chromium", "fonts-liberation", "fonts-dejavu-core")

ERROR_MIME = "application/vnd.jupyter.error"
WIDGET_MIME = "application/vnd.jupyter.widget-view+json"
# A textual tqdm bar, e.g. " 50%|█████     | 1/2 [00:01<00:01,  1.2s/it]".
TEXT_BAR = re.compile(r"\d+%\|.*\|\s*\d+/\d+")
ANSI = re.compile(r"\x1b\[[0-9;]*m")


# --------------------------------------------------------------------------------------------- browser

def find_chromium() -> str | None:
    """The first Chromium at the usual paths or on PATH (ensure_chromium also honours $CHROMIUM)."""
    for path in CHROMIUM_CANDIDATES:
        if os.access(path, os.X_OK):
            return path
    for name in ("chromium", "chromium-browser", "google-chrome"):
        if found := shutil.which(name):
            return found
    return None


def ensure_chromium() -> tuple[str | None, str]:
    """(path, "") of a Chromium, installing Debian's package when root with apt-get; else (None, why not).

    $CHROMIUM, when set, is the one to use, and nothing is installed in its place.
    """
    if chosen := os.environ.get("CHROMIUM"):
        if os.path.isfile(chosen) and os.access(chosen, os.X_OK):
            return chosen, ""
        return None, f"CHROMIUM={chosen} is not an executable file"
    if path := find_chromium():
        return path, ""
    if os.geteuid() != 0 or not shutil.which("apt-get"):
        return None, ("no Chromium found (looked at " + ", ".join(CHROMIUM_CANDIDATES) + " and PATH) "
                      "and cannot install one here (needs root and apt-get): run `sudo make browser-deps`")
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    steps = (["apt-get", "update", "-qq"],
             ["apt-get", "install", "-y", "-qq", "--no-install-recommends", "-o", "DPkg::Lock::Timeout=120",
              *APT_PACKAGES])
    for cmd in steps:
        proc = subprocess.run(cmd, check=False, env=env, capture_output=True, text=True, timeout=900)
        if proc.returncode != 0:
            return None, (f"no Chromium, and `{' '.join(cmd)}` failed ({proc.returncode}): "
                          f"{proc.stderr[-800:]}")
    path = find_chromium()
    return path, "" if path else "apt-get installed chromium but no binary was found afterwards"


# ---------------------------------------------------------------------------------------------- server

def free_port() -> int:
    """A TCP port on loopback that nothing listens on right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class LabServer:
    """JupyterLab from this Python environment on 127.0.0.1, with a token, no browser, and throwaway state.

    Config, runtime, settings and workspaces live under `state_dir`, so neither the learner's own Jupyter
    setup nor an earlier run changes what the test sees; kernels come from this environment (the `python3`
    kernel that `make venv` registers in .venv).
    """

    def __init__(self, root_dir: Path, state_dir: Path, *, startup_timeout_s: float = 90,
                 make_target: str = "") -> None:
        """Prepare (not start) a server whose file browser shows root_dir; make_target='lab' starts it with
        `make lab` (the learner's command, which opens notebooks/) instead of calling JupyterLab directly."""
        self.root_dir, self.state_dir = Path(root_dir), Path(state_dir)
        self.make_target = make_target
        self.startup_timeout_s = startup_timeout_s
        self.token = secrets.token_hex(16)
        self.port = 0
        self.proc: subprocess.Popen[bytes] | None = None
        self.log_path = self.state_dir / "jupyterlab.log"

    @property
    def base_url(self) -> str:
        """http://127.0.0.1:<port>/"""
        return f"http://127.0.0.1:{self.port}/"

    def url(self, notebook: str, workspace: str) -> str:
        """The browser address that opens notebook (relative to the root) in a fresh named workspace."""
        return f"{self.base_url}lab/workspaces/{workspace}/tree/{notebook}?reset&token={self.token}"

    def api(self, path: str, method: str = "GET", timeout: float = 10) -> Any:
        """Call the server's REST API with the token and return the decoded JSON (None when empty)."""
        req = urllib.request.Request(self.base_url + path, method=method,
                                     headers={"Authorization": f"token {self.token}"})
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # loopback: never via a proxy
        with opener.open(req, timeout=timeout) as resp:
            body = resp.read()
        return json.loads(body) if body.strip() else None

    def _env(self) -> dict[str, str]:
        env = dict(os.environ)
        # A learner's kernel draws plots inline; pytest's conftest sets Agg for papermill runs, which would
        # silently stop the kernel from showing any figure in the browser.
        env.pop("MPLBACKEND", None)
        env.pop("JUPYTER_TOKEN", None)
        for name, sub in (("JUPYTER_CONFIG_DIR", "config"), ("JUPYTER_RUNTIME_DIR", "runtime"),
                          ("JUPYTERLAB_SETTINGS_DIR", "settings"),
                          ("JUPYTERLAB_WORKSPACES_DIR", "workspaces"), ("IPYTHONDIR", "ipython")):
            (self.state_dir / sub).mkdir(parents=True, exist_ok=True)
            env[name] = str(self.state_dir / sub)
        env["JUPYTER_PREFER_ENV_PATH"] = "1"
        # No "receive Jupyter news?" toast, no update check: nothing beyond loopback, nothing over the page.
        notif = (self.state_dir / "settings" / "@jupyterlab" / "apputils-extension"
                 / "notification.jupyterlab-settings")
        notif.parent.mkdir(parents=True, exist_ok=True)
        notif.write_text(json.dumps({"fetchNews": "false", "checkForUpdates": False}))
        return env

    def start(self) -> LabServer:
        """Start the server and wait until its API answers; raises with the server's log if it does not."""
        self.state_dir.mkdir(parents=True, exist_ok=True)
        env = self._env()
        for _attempt in range(3):
            self.port = free_port()
            common = ["--no-browser", "--ServerApp.ip=127.0.0.1", "--ServerApp.port_retries=0",
                      f"--IdentityProvider.token={self.token}",
                      "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate"]
            if self.make_target:  # `make lab` sets the kernel environment, the folder and --allow-root itself
                cmd = ["make", "--no-print-directory", self.make_target, f"PORT={self.port}",
                       "LAB_ARGS=" + " ".join(common)]
                cwd = Path(__file__).resolve().parent.parent
            else:
                cmd = [sys.executable, "-m", "jupyterlab", f"--ServerApp.port={self.port}",
                       f"--ServerApp.root_dir={self.root_dir}", *common]
                cmd += ["--allow-root"] if os.geteuid() == 0 else []  # CI containers run as root
                cwd = self.root_dir
            with open(self.log_path, "ab") as log:
                self.proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=log,
                                             stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                             start_new_session=True)
            deadline = time.monotonic() + self.startup_timeout_s
            while time.monotonic() < deadline and self.proc.poll() is None:
                try:
                    self.api("api/status", timeout=2)
                    return self
                except (urllib.error.URLError, ConnectionError, TimeoutError, OSError):
                    time.sleep(0.5)
            if self.proc.poll() is None:
                self.stop()
                raise RuntimeError(f"JupyterLab did not answer within {self.startup_timeout_s:.0f} s:\n"
                                   + self.log_tail())
            if "already in use" not in self.log_tail():
                break
        raise RuntimeError(f"JupyterLab exited with {self.proc.returncode}:\n{self.log_tail()}")

    def log_tail(self, n: int = 4000) -> str:
        """The last n characters of the server's log."""
        try:
            return self.log_path.read_text(errors="replace")[-n:]
        except FileNotFoundError:
            return "(no log)"

    def stop(self) -> None:
        """Shut the server and every kernel it started down; kill what does not exit. Safe to call twice."""
        if self.proc is None:
            return
        proc, self.proc = self.proc, None
        import psutil

        try:
            family = psutil.Process(proc.pid).children(recursive=True)  # kernels run in their own sessions
        except psutil.Error:
            family = []
        if proc.poll() is None:
            try:
                self.api("api/shutdown", method="POST", timeout=5)  # shuts kernels down cleanly too
            except OSError:  # URLError is an OSError
                proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=10)
        for child in family:
            try:
                child.wait(timeout=5)
            except psutil.TimeoutExpired:
                with contextlib.suppress(psutil.Error):
                    child.kill()
            except psutil.Error:
                pass  # already gone


# ------------------------------------------------------------------------------------------ the page

@dataclass
class Output:
    """One rendered output of a code cell."""

    mime: str
    text: str
    tables: int
    images: int
    progress: int  # rendered widget progress bars (ipywidgets)


@dataclass
class Cell:
    """One cell as the page shows it; section is the last '## ' heading above it."""

    index: int
    kind: str
    section: str
    prompt: str
    source: str
    outputs: list[Output] = field(default_factory=list)

    def describe(self) -> str:
        """'cell 12 [7]: (## Results) first line of source'."""
        first = self.source.strip().splitlines()[0][:70] if self.source.strip() else ""
        return f"cell {self.index} {self.prompt or ''} ({self.section or 'top'}) {first!r}"


@dataclass
class LabRun:
    """What a notebook looked like in JupyterLab after Run All."""

    notebook: str
    cells: list[Cell]
    kernel_name: str
    kernel_status: str
    seconds: float
    timed_out: bool
    saved: dict[str, Any] | None = None  # the notebook as JupyterLab saved it after the run (nbformat JSON)

    def code_cells(self) -> list[Cell]:
        """The code cells in order."""
        return [c for c in self.cells if c.kind == "code"]

    def section_outputs(self, heading: str) -> list[Output]:
        """Outputs of the code cells under the '## heading' section."""
        return [o for c in self.code_cells() if c.section == heading for o in c.outputs]

    def errors(self) -> list[tuple[Cell | None, dict[str, Any]]]:
        """(cell on the page, output) for every output of type 'error' in the saved notebook.

        The page cannot tell an error from other stderr text: JupyterLab renders a traceback with the
        application/vnd.jupyter.stderr renderer (its bundle also carries application/vnd.jupyter.error), so
        errors are read from the notebook JupyterLab saved, where they keep output_type 'error'.
        """
        if not self.saved:
            return []
        by_index = {c.index: c for c in self.cells}
        return [(by_index.get(i), o) for i, cell in enumerate(self.saved.get("cells", []))
                for o in cell.get("outputs", []) if o.get("output_type") == "error"]

    def progress_bar(self, section: str | None = None) -> tuple[str, str]:
        """('widget' | 'text' | '', where): how a loop's progress bar rendered (in section, if given), widget first."""
        text_hit = ""
        for c in self.code_cells():
            if section is not None and c.section != section:
                continue
            for o in c.outputs:
                if o.progress:
                    return "widget", c.describe()
                if not text_hit and TEXT_BAR.search(o.text):
                    text_hit = c.describe()
        return ("text", text_hit) if text_hit else ("", "")


# Reads the notebook panel's cells in document order. Headings lose JupyterLab's "¶" anchor.
_SNAPSHOT_JS = r"""
() => {
  const panel = [...document.querySelectorAll('.jp-NotebookPanel')]
    .find(p => !p.classList.contains('lm-mod-hidden'));
  if (!panel) return null;
  const status = panel.querySelector('.jp-Notebook-ExecutionIndicator');
  const kernel = panel.querySelector('.jp-KernelName, .jp-Toolbar-kernelName');
  let section = '';
  const cells = [...panel.querySelectorAll('.jp-Notebook .jp-Cell')].map((el, index) => {
    const kind = el.classList.contains('jp-CodeCell') ? 'code'
      : el.classList.contains('jp-MarkdownCell') ? 'markdown' : 'raw';
    if (kind === 'markdown') {
      const hs = el.querySelectorAll('.jp-RenderedMarkdown h2');
      if (hs.length) section = hs[hs.length - 1].textContent.replace(/¶/g, '').trim();
    }
    const editor = el.querySelector('.jp-InputArea-editor .cm-content');
    const source = editor ? [...editor.querySelectorAll('.cm-line')].map(l => l.textContent).join('\n') : '';
    const promptEl = el.querySelector('.jp-InputArea-prompt');
    const outputs = [...el.querySelectorAll('.jp-OutputArea-output')].map(o => {
      const typed = o.matches('[data-mime-type]') ? o : o.querySelector('[data-mime-type]');
      return {
        mime: typed ? typed.getAttribute('data-mime-type') : '',
        text: (o.textContent || '').slice(0, 4000),  // innerText is empty for cells scrolled out of view
        tables: o.querySelectorAll('table').length,
        images: o.querySelectorAll('img').length,
        progress: o.querySelectorAll('.widget-progress, progress, .progress-bar').length,
      };
    });
    return {index, kind, section, prompt: promptEl ? promptEl.textContent.trim() : '', source, outputs};
  });
  return {
    cells,
    status: status ? (status.getAttribute('data-status') || '') : '',
    kernel: kernel ? kernel.textContent.trim() : '',
  };
}
"""


def snapshot(page: Any, notebook: str, seconds: float = 0.0, timed_out: bool = False) -> LabRun:
    """Read the open notebook's cells, prompts and rendered outputs from the page."""
    raw = page.evaluate(_SNAPSHOT_JS)
    if raw is None:
        raise AssertionError(f"{notebook}: no notebook panel on the page")
    cells = [Cell(index=c["index"], kind=c["kind"], section=c["section"], prompt=c["prompt"],
                  source=c["source"], outputs=[Output(**o) for o in c["outputs"]]) for c in raw["cells"]]
    return LabRun(notebook=notebook, cells=cells, kernel_name=raw["kernel"], kernel_status=raw["status"],
                  seconds=seconds, timed_out=timed_out)


def _dialog_text(page: Any) -> str:
    dialog = page.query_selector(".jp-Dialog")
    return dialog.inner_text() if dialog else ""


def kernel_state(server: LabServer, notebook: str) -> tuple[str, str]:
    """(kernel name, execution state) of the server's session for notebook, ('', '') when there is none."""
    for sess in server.api("api/sessions"):
        if sess.get("path") == notebook and sess.get("kernel"):
            return sess["kernel"].get("name", ""), sess["kernel"].get("execution_state", "")
    return "", ""


def _page_status(page: Any) -> str:
    return page.evaluate("() => { const s = document.querySelector("
                         "'.jp-NotebookPanel:not(.lm-mod-hidden) .jp-Notebook-ExecutionIndicator');"
                         " return s ? (s.getAttribute('data-status') || '') : ''; }") or ""


def wait_for_kernel_idle(page: Any, server: LabServer, notebook: str, timeout_s: float) -> str:
    """Wait until the notebook's kernel has started and is idle (server and page agree); return its name.

    The page's indicator says "idle" before any kernel exists, so the server's session must agree too.
    Fails at once on a dialog (a missing kernel makes JupyterLab ask which kernel to use).
    """
    deadline = time.monotonic() + timeout_s
    calm, name, state, status = 0, "", "", ""
    while time.monotonic() < deadline:
        if text := _dialog_text(page):
            raise AssertionError(f"{notebook}: JupyterLab shows a dialog instead of starting the kernel "
                                 f"(is the python3 kernel registered? run `make venv`): {text[:500]!r}")
        name, state = kernel_state(server, notebook)
        status = _page_status(page)
        calm = calm + 1 if (state == "idle" and status == "idle") else 0
        if calm >= 2:
            return name
        time.sleep(0.5)
    raise AssertionError(f"{notebook}: kernel not idle after {timeout_s:.0f} s (server: {name!r} {state!r}, "
                         f"page: {status!r})\n{server.log_tail(1500)}")


def append_to_parameters(page: Any, lines: Sequence[str]) -> str:
    """Type lines at the end of the parameters cell (the first code cell) as a learner would; return it."""
    cell = page.locator(".jp-NotebookPanel:not(.lm-mod-hidden) .jp-Notebook .jp-CodeCell").first
    editor = cell.locator(".jp-InputArea-editor .cm-content")
    editor.click()
    page.keyboard.press("Control+End")
    for line in lines:
        page.keyboard.press("Enter")
        page.keyboard.type(line)
    page.keyboard.press("Escape")  # back to command mode, as after editing
    text = "\n".join(editor.locator(".cm-line").all_text_contents())
    missing = [line for line in lines if line not in text.splitlines()]
    if missing:
        raise AssertionError(f"typing into the parameters cell did not give the lines {missing}; "
                             f"cell now:\n{text}")
    return text


def run_all_from_menu(page: Any) -> None:
    """Run > Run All Cells, clicked in the menu bar."""
    page.locator(".lm-MenuBar-item", has_text=re.compile(r"^Run$")).click()
    page.locator(".lm-Menu-item[data-command='runmenu:run-all']", has_text="Run All Cells").click()


def wait_until_finished(page: Any, server: LabServer, notebook: str, timeout_s: float,
                        started: float) -> LabRun:
    """Wait for Run All to end: something ran, no cell is queued or running ([*]), the kernel is idle.

    The kernel must be idle on the server and on the page, and the state has to hold for two polls in a
    row (a cell can be between queue and start). When a cell raises, JupyterLab stops the run there, so the
    later cells keep an empty prompt: that also ends the wait.
    """
    deadline = time.monotonic() + timeout_s
    calm = 0
    while time.monotonic() < deadline:
        run = snapshot(page, notebook, time.monotonic() - started)
        prompts = [c.prompt for c in run.code_cells()]
        ran = any(re.fullmatch(r"\[\d+\]:", p) for p in prompts)
        busy = any("*" in p for p in prompts)
        _name, state = kernel_state(server, notebook)
        calm = calm + 1 if (ran and not busy and run.kernel_status == "idle" and state == "idle") else 0
        code = run.code_cells()
        all_ran = all(re.fullmatch(r"\[\d+\]:", p) for p in prompts)
        last_silent = bool(code) and not code[-1].outputs and all_ran
        if calm >= (10 if last_silent else 2):  # give a last output that is still rendering a moment
            return run
        time.sleep(1.0)
    return snapshot(page, notebook, time.monotonic() - started, timed_out=True)


def save_and_read(page: Any, server: LabServer, notebook: str, timeout_s: float = 60) -> dict[str, Any]:
    """Save the notebook from the toolbar (as a learner does) and return the file JupyterLab wrote."""
    path = server.root_dir / notebook
    before = path.stat().st_mtime_ns if path.exists() else 0
    page.locator(".jp-NotebookPanel:not(.lm-mod-hidden) .jp-NotebookPanel-toolbar "
                 "[data-command='docmanager:save']").first.click()
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if path.exists() and path.stat().st_mtime_ns != before:
            time.sleep(0.5)  # the server writes through a temporary file; let it land
            try:
                return json.loads(path.read_text())
            except json.JSONDecodeError:
                pass
        if text := _dialog_text(page):
            raise AssertionError(f"{notebook}: saving opened a dialog: {text[:500]!r}")
        time.sleep(0.5)
    raise AssertionError(f"{notebook}: JupyterLab did not save the notebook within {timeout_s:.0f} s")


def run_in_lab(browser: Any, server: LabServer, notebook: str, *, parameter_lines: Sequence[str] = (),
               timeout_s: float = 600, screenshot: Path | None = None,
               viewport: tuple[int, int] = (1280, 900)) -> LabRun:
    """Open notebook (a path under the server's root) in a new page, append parameter_lines to its
    parameters cell, Run > Run All Cells, wait for the kernel, save, and return what the page shows
    (and the saved notebook).

    With screenshot, the finished notebook is captured whole: the page is made as tall as the notebook.
    """
    context = browser.new_context(viewport={"width": viewport[0], "height": viewport[1]})
    page = context.new_page()
    page.set_default_timeout(60_000)
    try:
        workspace = re.sub(r"[^a-z0-9]+", "-", Path(notebook).stem.lower()) or "nb"
        page.goto(server.url(notebook, workspace), wait_until="domcontentloaded")
        page.wait_for_selector(".jp-NotebookPanel .jp-Notebook .jp-CodeCell .cm-content", timeout=120_000)
        wait_for_kernel_idle(page, server, notebook, timeout_s=120)
        if parameter_lines:
            append_to_parameters(page, parameter_lines)
        started = time.monotonic()
        run_all_from_menu(page)
        result = wait_until_finished(page, server, notebook, timeout_s, started)
        if not result.timed_out:
            result.saved = save_and_read(page, server, notebook)
        if screenshot is not None:
            save_screenshot(page, screenshot, width=viewport[0])
        return result
    except Exception:
        if screenshot is not None:  # what the page showed when driving it failed
            with contextlib.suppress(Exception):  # never hide the real failure behind this one
                page.screenshot(path=str(screenshot.with_name(screenshot.stem + "-failed.png")))
        raise
    finally:
        context.close()
        shutdown_sessions(server, notebook)


def shutdown_sessions(server: LabServer, notebook: str) -> None:
    """End the notebook's kernel session on the server (a closed page leaves its kernel running)."""
    with contextlib.suppress(OSError):  # the server is stopped at the end anyway, kernels included
        for sess in server.api("api/sessions"):
            if sess.get("path") == notebook:
                server.api(f"api/sessions/{sess['id']}", method="DELETE", timeout=30)


def save_screenshot(page: Any, path: Path, *, width: int, max_height: int = 16_000) -> Path:
    """Screenshot the whole finished notebook: grow the viewport to the notebook's height, scroll to top."""
    path.parent.mkdir(parents=True, exist_ok=True)
    js = """() => {
      const s = document.querySelector('.jp-NotebookPanel:not(.lm-mod-hidden) .jp-WindowedPanel-outer');
      if (!s) return 0;
      const cells = s.querySelectorAll('.jp-Cell');
      if (!cells.length) return 0;
      const bottom = cells[cells.length - 1].getBoundingClientRect().bottom - s.getBoundingClientRect().top;
      return bottom + s.scrollTop - s.clientHeight;
    }"""
    # Off-screen cells are laid out at an estimated height (content-visibility), so grow until it holds.
    for _ in range(8):
        extra = int(page.evaluate(js))
        height = min(max_height, page.viewport_size["height"] + extra + 24)
        if extra <= 0 or height == page.viewport_size["height"]:
            break
        page.set_viewport_size({"width": width, "height": height})
        time.sleep(0.7)
    page.evaluate("() => { const s = document.querySelector('.jp-NotebookPanel:not(.lm-mod-hidden) "
                  ".jp-WindowedPanel-outer'); if (s) s.scrollTop = 0; }")
    page.mouse.move(0, 0)
    time.sleep(1.5)  # let the relayout and the images settle
    page.screenshot(path=str(path), full_page=True)
    return path


# --------------------------------------------------------------------------------------------- checks

def problems(run: LabRun, *, results_section: str | None = "Results", need_table: bool = True,
             need_plot: bool = True, need_progress: bool = True) -> list[str]:
    """Everything a learner would see as broken after Run All; an empty list means the notebook ran clean."""
    found: list[str] = []
    if run.timed_out:
        busy = [c.describe() for c in run.code_cells() if "*" in c.prompt]
        found.append(f"Run All did not finish within {run.seconds:.0f} s (kernel {run.kernel_status!r}; "
                     f"still running/queued: {busy[:3]})")
    if run.saved is None and not run.timed_out:
        found.append("the notebook was not saved after the run: its outputs could not be checked for errors")
    for cell, o in run.errors():
        where = cell.describe() if cell else "a cell"
        trace = ANSI.sub("", "\n".join(o.get("traceback", [])))
        found.append(f"error output in {where}: {o.get('ename')}: {o.get('evalue')}\n{trace[-1500:]}")
    saved_error_cells = {id(cell) for cell, _ in run.errors()}
    for c in run.code_cells():  # an error rendered on the page but missing from the saved file
        for o in c.outputs:
            traceback = o.mime.endswith("stderr") and "Traceback (most recent call last)" in o.text
            if o.mime == ERROR_MIME or (traceback and id(c) not in saved_error_cells):
                found.append(f"traceback on the page in {c.describe()}:\n{o.text[-1500:]}")
    not_run = [c.describe() for c in run.code_cells() if not re.fullmatch(r"\[\d+\]:", c.prompt)]
    if not_run:
        found.append(f"{len(not_run)} code cell(s) did not run, first: {not_run[0]}")
    code = run.code_cells()
    if code and not code[-1].outputs:
        found.append(f"the last code cell has no output: {code[-1].describe()}")
    if results_section is not None:
        outs = run.section_outputs(results_section)
        if not any(c.section == results_section for c in code):
            found.append(f"no code cell under a '## {results_section}' heading")
        if need_table and not any(o.tables for o in outs):
            found.append(f"no HTML table rendered in the '## {results_section}' outputs "
                         f"(mime types there: {[o.mime for o in outs]})")
        if need_plot and not any(o.images for o in outs):
            found.append(f"no plot (<img>) rendered in the '## {results_section}' outputs "
                         f"(mime types there: {[o.mime for o in outs]})")
    if need_progress:
        kind, _where = run.progress_bar()
        if not kind:
            found.append("no progress bar rendered: neither an ipywidgets progress element nor a textual "
                         "tqdm bar in any output")
    return found


def summary(run: LabRun) -> str:
    """A few lines on the run for test logs and failure messages."""
    kind, where = run.progress_bar()
    outs = [o for c in run.code_cells() for o in c.outputs]
    return (f"{run.notebook}: {len(run.code_cells())} code cells, {len(outs)} outputs, kernel "
            f"{run.kernel_name!r} {run.kernel_status!r}, {run.seconds:.1f} s after Run All; progress bar: "
            f"{kind or 'none'} {where}")
