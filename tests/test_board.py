"""`enlace-remote board`: its HTTP side (127.0.0.1 only, 403 without the token), its curves as the run
stands after a resume (kept between polls, thinned for a long run), and the whole page in a real headless
chromium against a real sshd: two hosts' runs (one host unreachable), a run's curve whose last point is
metrics.jsonl's, the page following a new step."""

from __future__ import annotations

import json
import re
import threading
import time
import urllib.error
import urllib.request

import pytest
from support.browser import artifacts_dir, chromium, wait_for
from support.configs import write_toy
from support.remote import PipeReader, env_with_a_dead_host, popen_remote, remote, server_dir, tiny_corpus

from enlace.tools.curves import MAX_POINTS, Curves
from orchestrator.view.board import Board
from orchestrator.view.board_http import BoardServer


def _get(url: str, headers: dict | None = None) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers or {}), timeout=30) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def _start_board(repo, env: dict, hosts: str):
    """`enlace-remote board` on `hosts`, left running: (its process, the URL it printed)."""
    proc = popen_remote(repo, env, "board", "--no-browser", "--hosts", hosts)
    err = PipeReader(proc.stderr)
    deadline = time.time() + 60
    while not (m := re.search(r"http://127\.0\.0\.1:\d+/\?token=\S+", err.text())):
        assert proc.poll() is None and time.time() < deadline, err.text()
        time.sleep(0.05)
    return proc, m.group(0)


def test_the_board_answers_only_with_its_token_and_only_on_loopback(tmp_path):
    server = BoardServer(Board(tmp_path, [], session_for=None), port=0)
    threading.Thread(target=server.serve_forever, daemon=True, name="board-http").start()
    try:
        host, port = server.server_address
        assert host == "127.0.0.1"
        base = f"http://127.0.0.1:{port}"
        assert _get(base + "/")[0] == 403
        assert _get(base + "/api/runs")[0] == 403
        assert _get(base + "/api/runs", {"X-Enlace-Token": "wrong"})[0] == 403
        status, page = _get(server.url)
        assert status == 200 and b"enlace board" in page
        status, body = _get(base + "/api/runs", {"X-Enlace-Token": server.token})
        assert status == 200 and json.loads(body) == {"hosts": [], "rows": []}
        # the right token, sent to another name (a rebinding page) or from another origin: refused
        token = {"X-Enlace-Token": server.token}
        assert _get(base + "/api/runs", {**token, "Host": f"evil.example:{port}"})[0] == 403
        assert _get(base + "/api/runs", {**token, "Origin": "http://evil.example"})[0] == 403
        assert _get(base + "/api/runs", {**token, "Host": f"localhost:{port}"})[0] == 200
        assert _get(base + "/api/run?host=nope&run=x", {"X-Enlace-Token": server.token})[0] == 404
        # a second board on its port (one left running, a forwarded port): one line, not a traceback
        from orchestrator.errors import UsageError

        with pytest.raises(UsageError, match=f"cannot serve the board on 127.0.0.1:{port}: .* pick another --port"):
            BoardServer(Board(tmp_path, [], session_for=None), port=port)
    finally:
        server.shutdown()
        server.server_close()


def test_curves_are_the_run_as_it_stands_after_a_resume_from_an_older_checkpoint(tmp_path):
    records = [{"kind": "start", "step": 0}]
    records += [{"kind": "train", "step": s, "loss": 5.0 - s, "lr": 0.1, "tokens_per_s": 9.0} for s in (1, 2, 3, 4)]
    records += [{"kind": "eval", "step": 4, "val_bpb": 7.0}]
    records += [{"kind": "start", "step": 2}, {"kind": "train", "step": 3, "loss": 0.5, "lr": 0.1, "tokens_per_s": 9}]
    (tmp_path / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in records) + '\n{"kind": "tra')
    got = series_of((tmp_path / "metrics.jsonl").read_bytes())
    assert [p[0] for p in got["train"]] == [1, 2, 3] and got["train"][-1][1] == 0.5
    assert got["eval"] == [] and got["starts"] == [2]  # the eval at 4 was of the attempt resumed past


def _records(n: int, start: int = 0) -> list[dict]:
    out = [{"kind": "start", "step": start}]
    for s in range(start + 1, start + n + 1):
        out.append({"kind": "train", "step": s, "loss": 5.0 / (s - start), "lr": 0.1, "tokens_per_s": 9.0})
        if s % 7 == 0:
            out.append({"kind": "eval", "step": s, "val_bpb": 7.0 / (s - start)})
    return out


def test_curves_parse_only_what_the_file_gained_and_equal_a_fresh_parse():
    """The board keeps a run's curves between polls: fed the file as it grows (cut anywhere, mid-line too,
    across a resume from an older step), they equal a parse of the whole file; a rewritten file is parsed
    from its start."""
    data = "".join(json.dumps(r) + "\n" for r in _records(60) + _records(30, start=40)).encode()
    fresh = series_of(data)

    class Counting(Curves):
        parsed = 0

        def _take(self, line: bytes) -> None:
            self.parsed += 1
            super()._take(line)

    curves = Counting()
    for cut in (0, 1, 200, 201, 2000, 3333, 4444, 5555, len(data) - 5, len(data)):
        curves.update(data[:cut])
        assert curves.consumed == data[:cut].rfind(b"\n") + 1  # whole lines only; a half line waits
        assert curves.view() == series_of(data[:cut])
        assert curves.view(max_points=12) == series_of(data[:cut], max_points=12)  # thinned, as it grows
    assert curves.view() == fresh and fresh["starts"] == [40] and curves.parsed == data.count(b"\n")  # each once
    assert [p[0] for p in fresh["train"]] == list(range(1, 71)) and fresh["train"][40][:2] == [41, 5.0]
    assert [p[0] for p in fresh["eval"]] == [7, 14, 21, 28, 35, 42, 49, 56, 63, 70]  # 42..56: the resumed attempt's

    rewritten = "".join(json.dumps(r) + "\n" for r in _records(10)).encode()  # a new run under the name
    curves.update(rewritten)
    assert curves.view() == series_of(rewritten) and curves.view()["train"][-1][0] == 10


def series_of(data: bytes, max_points: int = MAX_POINTS) -> dict:
    curves = Curves()
    curves.update(data)
    return curves.view(max_points)


def test_a_long_runs_curves_are_thinned_keeping_spikes_ends_and_strict_json():
    """A long run logs a point a step; the page gets at most MAX_POINTS a curve, with the first and last step
    and a one-step loss spike still on it, and numbers JSON can carry (NaN, inf: none)."""
    n, spike = 20 * MAX_POINTS, 12_345
    lines = [json.dumps({"kind": "start", "step": 0})]
    for s in range(1, n + 1):
        loss = 9.5 if s == spike else float("nan") if s == 5 else 2.0 + 1.0 / s
        lines.append(json.dumps({"kind": "train", "step": s, "loss": loss, "lr": 0.1, "tokens_per_s": 9.0}))
    lines.append(json.dumps({"kind": "eval", "step": n, "val_bpb": float("inf")}))
    got = series_of(("\n".join(lines) + "\n").encode())
    steps = [p[0] for p in got["train"]]
    assert len(steps) <= MAX_POINTS and steps == sorted(steps) and steps[0] == 1 and steps[-1] == n
    assert [spike, 9.5] in [p[:2] for p in got["train"]]
    assert got["eval"] == [[n, None, None]]
    json.dumps(got, allow_nan=False)  # what the page's JSON.parse can read


@pytest.mark.slow
def test_the_board_in_a_real_browser(sshd, user_repo, tmp_path):
    env = env_with_a_dead_host(sshd, tmp_path)  # `gone`: the unreachable host
    tiny_corpus(server_dir(sshd, "testhost"))
    remote(user_repo, env, "launch", "tiny", "--no-preflight", "--until", "3")
    proc, url = _start_board(user_repo, env, "testhost,gone")
    driver = None
    try:
        driver = chromium(tmp_path / "chromium-profile")
        driver.get(url)
        row = wait_for(driver, lambda d: d.find_element("css selector", 'tr[data-host="testhost"][data-run="tiny"]'))
        assert "stopped" in row.text and "3/30" in row.text, row.text
        down = wait_for(driver, lambda d: d.find_element("css selector", 'tr.host-error[data-host="gone"]'))
        assert "unreachable" in down.text, down.text
        driver.save_screenshot(str(artifacts_dir() / "board-runs.png"))

        driver.get(url + "#run=testhost:tiny")
        server_run = server_dir(sshd, "testhost") / "runs" / "tiny"

        def last_point(d):
            line = d.find_element("css selector", 'svg[data-metric="loss"] polyline[data-run="testhost:tiny"]')
            return int(line.get_attribute("data-last-step")), float(line.get_attribute("data-last-value"))

        train = [json.loads(x) for x in (server_run / "metrics.jsonl").read_text().splitlines()]
        train = [r for r in train if r["kind"] == "train"]
        step, value = wait_for(driver, last_point, what="the loss curve")
        assert step == train[-1]["step"] == 3 and value == pytest.approx(train[-1]["loss"])
        assert "step      3/30" in driver.find_element("id", "log").text
        driver.save_screenshot(str(artifacts_dir() / "board-run.png"))

        # two more steps, on the server (launch returns at the first of them)
        remote(user_repo, env, "launch", "tiny", "--no-preflight", "--until", "5")
        step, value = wait_for(driver, lambda d: last_point(d)[0] == 5 and last_point(d), what="step 5 on the page")
        train = [json.loads(x) for x in (server_run / "metrics.jsonl").read_text().splitlines()]
        assert value == pytest.approx([r for r in train if r["kind"] == "train"][-1]["loss"])
        wait_for(driver, lambda d: "step      5/30" in d.find_element("id", "log").text, what="the log's new step")
        assert driver.find_elements("css selector", 'svg[data-metric="loss"] line[data-resumed-at="3"]')
        driver.save_screenshot(str(artifacts_dir() / "board-run-updated.png"))

        # the page's chart itself draws any number of points (Math.min(...points) threw on a long array)
        drawn = driver.execute_script(
            "const points = Array.from({length: 300000}, (_, i) => [i, Math.sin(i)]);"
            "const svg = chart('loss', 'loss', [{key: 'big', color: '#000', points}]).querySelector('svg');"
            "return svg.querySelector('polyline').getAttribute('data-last-step');"
        )
        assert drawn == "299999"
        assert not driver.find_elements("css selector", 'svg[data-metric="val_loss"]')  # a script's panel only

        # a script of your own that logs a val loss: its run's page draws it in a panel of its own
        write_toy(user_repo, seed="3")
        remote(user_repo, env, "launch", "toy")
        driver.get(url + "#run=testhost:toy")
        line = 'svg[data-metric="val_loss"] polyline[data-run="testhost:toy"]'
        drawn = wait_for(driver, lambda d: d.find_element("css selector", line), what="the script's val loss")
        assert float(drawn.get_attribute("data-last-value")) == pytest.approx(0.12)  # |0.1 - 0.01| + 3/100
        driver.save_screenshot(str(artifacts_dir() / "board-own-script.png"))
    finally:
        if driver is not None:
            driver.quit()
        proc.terminate()
        proc.wait(timeout=30)


def test_a_down_host_shows_its_last_known_runs_marked_stale_within_seconds(sshd, user_repo, tmp_path):
    """Seen: with a host's sshd stopped, /api/runs gave no answer for 60 s and then dropped its runs; /api/run
    hung past 120 s and held a concurrent /api/runs past 100 s."""
    tiny_corpus(server_dir(sshd, "testhost"))
    remote(user_repo, sshd.env, "launch", "tiny", "--no-preflight", "--until", "3")
    proc, url = _start_board(user_repo, sshd.env, "testhost,local")
    driver = None
    try:
        driver = chromium(tmp_path / "chromium-profile")
        driver.get(url)
        wait_for(driver, lambda d: d.find_element("css selector", 'tr[data-host="testhost"][data-run="tiny"]'))
        token, base = url.split("token=")[1], url.split("/?")[0]
        assert json.loads(_get(f"{base}/api/run?host=testhost&run=tiny&log=-1", {"X-Enlace-Token": token})[1])["state"]
        sshd.stop()  # the host goes down, its connection with it

        def stale_on_the_server(_):
            rows = json.loads(_get(f"{base}/api/runs", {"X-Enlace-Token": token})[1])["rows"]
            return any(r.get("stale") for r in rows if r["host"] == "testhost")

        wait_for(driver, stale_on_the_server, what="the board to notice the host is down")
        driver.get(url)  # a page loaded while the host is down
        t0 = time.monotonic()
        row = wait_for(
            driver, lambda d: d.find_element("css selector", 'tr.stale[data-host="testhost"][data-run="tiny"]')
        )
        seconds = time.monotonic() - t0
        assert "stopped (stale:" in row.text and "3/30" in row.text, row.text
        # the server waits READ_DEADLINE_S (3 s) on a host; before, ≥ 60 s. A loaded machine's browser gets slack
        assert seconds < 15, f"the stale row took {seconds:.1f} s"
        driver.save_screenshot(str(artifacts_dir() / "board-stale-host.png"))
        t0 = time.monotonic()
        status, body = _get(f"{base}/api/run?host=testhost&run=tiny&log=-1", {"X-Enlace-Token": token})
        doc = json.loads(body)
        assert status == 200 and "not answering" in doc["error"] and doc["state"]["status"] == "stopped", doc
        assert time.monotonic() - t0 < 15  # the transport retries a dropped host for 90 s: not this request
    finally:
        if driver is not None:
            driver.quit()
        proc.terminate()
        proc.wait(timeout=30)
