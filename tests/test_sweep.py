"""Sweeps as one object: the grid and its run names, placement by each host's room, the ranked table (fast);
then a 2x2 sweep over two real sshd hosts told to a real webhook, its status, fetch, plot and board page in
chromium; and `stop --sweep` stopping its runs, queued and running, and nothing else."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest
from support.browser import artifacts_dir, chromium, wait_for
from support.configs import write_toy
from support.remote import PipeReader, connections, popen_remote, remote, server_dir, tiny_corpus, wait_until
from support.repocopy import commit_all
from support.sshd import make_server
from support.webhook import Webhook

from orchestrator.errors import UsageError
from orchestrator.launch.sweep import place
from orchestrator.sweep import grid, record, table


def test_the_grid_names_each_point_by_its_values():
    swept, fixed = grid.parse_sets(("optim.learning_rate=1e-3,3e-3", "model.n_layer=4,6", "training.max_steps=50"))
    assert fixed == ["training.max_steps=50"]
    names = [p.run_name for p in grid.points("lr", swept)]
    assert names == ["lr-lr1e-3-nl4", "lr-lr1e-3-nl6", "lr-lr3e-3-nl4", "lr-lr3e-3-nl6"]
    assert grid.points("lr", swept)[1].sets() == ["optim.learning_rate=1e-3", "model.n_layer=6"]
    clash, _ = grid.parse_sets(("optim.learning_rate=1,2", "distill.loss_rate=3,4"))  # both `lr`: last parts
    assert grid.points("s", clash)[0].run_name == "s-learning_rate1-loss_rate3"
    long, _ = grid.parse_sets((f"a.key={'x' * 70},y",))
    assert [p.run_name for p in grid.points("s", long)] == ["s-000", "s-001"]  # too long: numbered
    own, _ = grid.parse_sets(("args.lr=1e-3,3e-3", "env.SEED=1,2", "args.n-layer=4,6"))  # a command's: one word whole
    assert grid.points("m", own)[0].run_name == "m-lr1e-3-SEED1-nl4"
    cased, fixed = grid.parse_sets(("args.lr=1e-3,1E-3", "env.EMPTY="))  # one empty value is a fixed one
    # a disk that ignores case (macOS) would take c-lr1e-3 and c-lr1E-3 for one directory: numbered
    assert fixed == ["env.EMPTY="] and [p.run_name for p in grid.points("c", cased)] == ["c-000", "c-001"]


@pytest.mark.parametrize(
    "items, said",
    [
        (("optim.learning_rate=1e-3",), "at least one --set KEY=V1,V2"),
        (("optim.learning_rate=1e-3,,2",), "an empty value between commas"),
        (("a.b=1,2", "a.b=3,4"), "given twice"),
        (("args.lr=1,2,1",), "'1' is given twice — each value once"),
        (("nonsense",), "expected KEY=V1,V2"),
        (("run_name=a,b",), "a sweep names each run after its values"),
    ],
)
def test_a_bad_grid_is_one_clear_line(items, said):
    with pytest.raises(UsageError, match=said):
        grid.parse_sets(items)


def test_points_go_where_there_is_room_then_to_the_shorter_queue():
    rooms = {
        "a": {"slots": 2, "free": 1, "waiting": 0, "per_run": 1},
        "b": {"slots": 1, "free": 1, "waiting": 0, "per_run": 1},
    }
    assert place(range(5), ["a", "b"], rooms) == ["a", "b", "a", "b", "a"]  # free first; then by queue per slot
    full = {
        "a": {"slots": 4, "free": 0, "waiting": 0, "per_run": 1},
        "b": {"slots": 1, "free": 0, "waiting": 0, "per_run": 1},
    }
    assert place(range(5), ["a", "b"], full) == ["a", "b", "a", "a", "a"]  # a's queue drains four at a time


def test_the_table_ranks_by_val_bpb_and_says_progress():
    sweep = record.Sweep(
        "s", "tiny", [], ["k"], [{"run_name": f"s-k{i}", "host": "h", "values": {"k": str(i)}} for i in range(4)]
    )
    found = {
        ("h", "s-k0"): {"run_name": "s-k0", "status": "finished", "val_bpb": 2.5, "step": 30, "max_steps": 30},
        ("h", "s-k1"): {"run_name": "s-k1", "status": "finished", "val_bpb": 1.5, "step": 30, "max_steps": 30},
        ("h", "s-k2"): {"run_name": "s-k2", "status": "queued", "val_bpb": None, "step": 0, "max_steps": None},
    }
    rows = table.rows_of(sweep, found)
    assert [r["run_name"] for r in rows] == ["s-k1", "s-k0", "s-k2", "s-k3"] and rows[0]["best"]
    assert table.progress(rows) == "2/4 finished (1 queued, 1 not launched)"
    text = table.format_table(sweep, rows)
    assert text.splitlines()[0] == "sweep s: tiny, 2/4 finished (1 queued, 1 not launched); best s-k1 (val bpb 1.5000)"
    assert text.splitlines()[2].startswith("*  s-k1  h     1  finished      30/30  1.5000")
    # a host that did not answer: its points are not known, not "not launched" (stop --sweep took them for that)
    two = record.Sweep("s", "tiny", [], ["k"], [*sweep.points[:3], {**sweep.points[3], "host": "down"}])
    assert table.progress(table.rows_of(two, found, frozenset({"down"}))) == "2/4 finished (1 queued, 1 no answer)"


def test_a_sweep_of_a_script_that_logs_a_val_loss_is_ranked_by_it():
    sweep = record.Sweep(
        "m",
        "mine",
        [],
        ["args.lr"],
        [{"run_name": f"m-lr{i}", "host": "h", "values": {"args.lr": str(i)}} for i in range(3)],
    )
    found = {
        ("h", "m-lr0"): {"run_name": "m-lr0", "status": "finished", "val_loss": 0.9, "val_bpb": None, "step": 3},
        ("h", "m-lr1"): {"run_name": "m-lr1", "status": "finished", "val_loss": 0.2, "val_bpb": None, "step": 3},
        ("h", "m-lr2"): {"run_name": "m-lr2", "status": "running", "val_loss": 0.1, "val_bpb": None, "step": 1},
    }
    rows = table.rows_of(sweep, found)
    assert [r["run_name"] for r in rows] == ["m-lr1", "m-lr0", "m-lr2"] and rows[0]["best"]  # finished ones first
    assert {r["metric"] for r in rows} == {"val_loss"}
    text = table.format_table(sweep, rows).splitlines()
    assert text[0] == "sweep m: mine, 2/3 finished (1 running); best m-lr1 (val loss 0.2000)"
    assert text[1].split()[-1] == "LOSS" and text[2].split()[-1] == "0.2000"
    started = {k: {**r, "val_loss": None, "command": ["python", "t.py"]} for k, r in found.items()}
    assert table.format_table(sweep, table.rows_of(sweep, started)).splitlines()[1].endswith("VAL LOSS")  # at once
    # a loss too small or too large for 4 decimals keeps its digits (3e-11 read 0.0000, tied in a ranked table)
    found[("h", "m-lr0")]["val_loss"], found[("h", "m-lr1")]["val_loss"] = 3e-11, 1.97e25
    text = table.format_table(sweep, table.rows_of(sweep, found)).splitlines()
    assert text[0].endswith("best m-lr0 (val loss 3.000e-11)") and text[3].split()[-1] == "1.970e+25", text
    from enlace.units import loss_figure

    assert [loss_figure(v) for v in (0.00118, 0.00123, 0.0123, 2.5, None)] == [
        "1.180e-03",
        "1.230e-03",
        "0.0123",
        "2.5000",
        "-",
    ]


def test_a_failed_or_crashed_run_says_why_under_its_row_in_one_cut_line():
    sweep = record.Sweep(
        "f",
        "mine",
        [],
        ["args.lr"],
        [{"run_name": f"f-lr{i}", "host": "h", "values": {"args.lr": str(i)}} for i in range(3)],
    )
    typo = "t.py: error: unrecognized arguments:\n --learning_rate=0.1 — the command exited 2 3 s after this launch started it: a usage error"
    found = {
        ("h", "f-lr0"): {"run_name": "f-lr0", "status": "failed", "step": 0, "error": typo},
        ("h", "f-lr1"): {"run_name": "f-lr1", "status": "crashed", "step": 0, "error": "gave up after 3 restarts: x"},
        ("h", "f-lr2"): {"run_name": "f-lr2", "status": "finished", "step": 3, "error": "an earlier attempt's cause"},
    }
    text = table.format_table(sweep, table.rows_of(sweep, found)).splitlines()
    assert text[3].split()[0] == "f-lr0" and text[4].startswith(
        "    └ error: t.py: error: unrecognized arguments: --learning_rate=0.1 — the command exited 2"
    )
    assert text[4].endswith("… (enlace-remote --host h status f-lr0: all of it)") and len(text[4]) < 160
    from enlace.units import one_line

    assert (
        one_line("the trainer was killed by SIGKILL at step 10 of 40", 44)
        == "the trainer was killed by SIGKILL at step…"
    )
    assert one_line("x" * 60, 10, " more") == "x" * 9 + "… more"  # no space to cut at: at the width
    assert text[5].split()[0] == "f-lr1" and text[6] == "    └ error: gave up after 3 restarts: x"
    assert len(text) == 7  # a finished run shows no error of an earlier attempt


def test_a_bare_sweep_option_without_any_sweep_says_how_to_start_one(tmp_path):
    with pytest.raises(UsageError, match="no sweep was launched from this repo yet"):
        record.load(tmp_path, "")
    with pytest.raises(UsageError, match="sweep name"):
        record.load(tmp_path, "../x")


def _two_hosts(tmp_path: Path) -> dict:
    servers = [make_server(tmp_path, name) for name in ("h1", "h2")]
    cfg = tmp_path / "ssh_config"
    cfg.write_text("".join((s.dir / "ssh_config").read_text() for s in servers))
    hosts = tmp_path / "hosts.yaml"
    entry = "  {n}: {{remote_dir: {d}/remote-{n}, python: {py}}}\n"
    hosts.write_text(
        "hosts:\n" + "".join(entry.format(n=n, d=tmp_path, py=json.dumps(sys.executable)) for n in ("h1", "h2"))
    )
    for s in servers:  # each host's ssh config names its own known_hosts: one file knows both
        s.dir.joinpath("known_hosts").write_text("".join((t.dir / "known_hosts").read_text() for t in servers))
    for n in ("h1", "h2"):
        tiny_corpus(tmp_path / f"remote-{n}")
    return {"env": {"ENLACE_SSH_CONFIG": str(cfg), "ENLACE_HOSTS_FILE": str(hosts)}, "servers": servers}


@pytest.mark.parametrize("recorded", [False, True])
def test_ctrl_c_during_a_sweep_says_what_it_started_and_the_command_that_goes_on(
    user_repo, monkeypatch, capsys, recorded
):
    """Ctrl-C is a KeyboardInterrupt wherever the launch is (here: raised by the launch itself); click said only
    "Aborted!". Without --name the same command would start another sweep (sweep2): the words give the name."""
    from types import SimpleNamespace

    from orchestrator.launch import sweep as sweep_launch

    write_toy(user_repo)

    def interrupted(*args):
        if recorded:  # the record is written once every point is checked, before the first start
            record.save(user_repo, record.Sweep("toy-sweep1", "toy", [], ["args.lr"], []))
        raise KeyboardInterrupt

    monkeypatch.setattr(sweep_launch, "_launch", interrupted)
    with pytest.raises(SystemExit) as ended:
        sweep_launch.launch_sweep(SimpleNamespace(repo=user_repo), "toy", ("args.lr=1,2",), None, None, None)
    said = capsys.readouterr().err.strip()
    assert ended.value.code == 130
    if recorded:
        assert said == (
            "sweep toy-sweep1: interrupted — any runs it started go on; the same command with --name toy-sweep1 "
            "starts the points it did not (`status --sweep toy-sweep1`)"
        )
    else:
        assert said == "sweep toy-sweep1: interrupted — nothing was started"


@pytest.mark.slow
def test_a_two_by_two_sweep_on_two_hosts_finishes_ranked_and_told(tmp_path, user_repo):
    setup, hook = _two_hosts(tmp_path), Webhook()
    env, board, driver = setup["env"], None, None
    try:
        out = remote(
            user_repo,
            env,
            "sweep",
            "tiny",
            "--set",
            "optim.learning_rate=1e-3,1e-2",
            "--set",
            "model.n_layer=1,2",
            "--hosts",
            "h1,h2",
            "--name",
            "grid",
            "--notify",
            hook.url,
            host="h1",
        )
        assert "sweep grid: 4 runs on h1, h2" in out.stdout
        sweep = json.loads((user_repo / ".enlace" / "sweeps" / "grid.json").read_text())
        placed = {p["run_name"]: (p["host"], p["values"]) for p in sweep["points"]}
        assert placed["grid-lr1e-3-nl1"] == ("h1", {"optim.learning_rate": "1e-3", "model.n_layer": "1"})
        assert sorted(h for h, _ in placed.values()) == ["h1", "h1", "h2", "h2"]  # one slot each: two per host

        def rows() -> list[dict]:
            return json.loads(remote(user_repo, env, "status", "--sweep", "--json", host="h1").stdout)

        wait_until(lambda: all(r["status"] == "finished" for r in rows()), 600, "every run of the sweep to finish")
        ranked = rows()
        for name, (host, values) in placed.items():  # each run recorded its values and its sweep on its host
            state = json.loads((tmp_path / f"remote-{host}" / "runs" / name / "run.json").read_text())
            assert state["sweep"] == "grid" and {f"{k}={v}" for k, v in values.items()} <= set(state["overrides"])
        assert [r["val_bpb"] for r in ranked] == sorted(r["val_bpb"] for r in ranked) and ranked[0]["best"]
        text = remote(user_repo, env, "status", "--sweep", host="h1").stdout  # bare: the last sweep
        assert text.startswith(f"sweep grid: tiny, 4/4 finished; best {ranked[0]['run_name']}")

        wait_until(lambda: len(hook.events("run_end")) == 4 and len(hook.events("sweep_end")) == 2, 120, "the POSTs")
        assert sorted(d["run"] for d in hook.events("run_end")) == sorted(placed)  # one per run end
        assert {d["status"] for d in hook.events("run_end")} == {"finished"}
        assert sorted(d["host"] for d in hook.events("sweep_end")) == ["h1", "h2"]  # each host's share, once
        assert all(d["text"].startswith("enlace: sweep grid on h") for d in hook.events("sweep_end"))

        best = ranked[0]["run_name"]
        out = remote(user_repo, env, "fetch", "--sweep", "grid", "--best", host="h1")
        assert f"fetch {best} ({ranked[0]['host']})" in out.stdout
        assert list((user_repo / "runs" / best / "checkpoints").glob("step-*/MANIFEST"))
        png = remote(user_repo, env, "plot", "--sweep", host="h1").stdout.strip()
        assert png.endswith("runs/sweep-grid.png") and Path(png).stat().st_size > 1000

        board = popen_remote(user_repo, env, "board", "--no-browser", "--hosts", "h1,h2", host="h1")
        err = PipeReader(board.stderr)
        wait_until(lambda: "token=" in err.text(), 60, "the board's URL")
        url = next(w for w in err.text().split() if "token=" in w)
        driver = chromium(tmp_path / "chromium-profile")
        driver.get(url)
        wait_for(driver, lambda d: d.find_element("css selector", '#sweeps a[href="#sweep=grid"]')).click()
        head = wait_for(
            driver,
            lambda d: "4/4 finished" in d.find_element("id", "sweep-head").text and d.find_element("id", "sweep-head"),
        )
        assert f"best {best}" in head.text
        order = [
            tr.get_attribute("data-run") for tr in driver.find_elements("css selector", "#sweep-table tr[data-run]")
        ]
        assert order == [r["run_name"] for r in ranked]
        assert driver.find_element("css selector", "#sweep-table tr.best").get_attribute("data-run") == best
        wait_for(
            driver,
            lambda d: len(d.find_elements("css selector", 'svg[data-metric="val_bpb"] polyline')) == 4,
            what="the four runs' curves overlaid",
        )
        driver.save_screenshot(str(artifacts_dir() / "board-sweep.png"))
    finally:
        if driver is not None:
            driver.quit()
        if board is not None:
            board.terminate()
            board.wait(timeout=30)
        hook.close()
        for s in setup["servers"]:
            s.stop()


def _toy_with_cpu_slots(sshd, repo: Path, slots: int) -> None:
    write_toy(repo)
    hosts = Path(sshd.env["ENLACE_HOSTS_FILE"])
    hosts.write_text(
        hosts.read_text().replace("    default_run: tiny\n", f"    default_run: tiny\n    cpu_slots: {slots}\n", 1)
    )


@pytest.mark.slow
def test_a_sweep_of_your_own_script_gives_each_run_its_values_and_ranks_them_by_its_val_loss(sshd, user_repo):
    _toy_with_cpu_slots(sshd, user_repo, 2)
    remote(user_repo, sshd.env, "sweep", "toy", "--set", "args.lr=0.1,0.02", "--set", "env.SEED=0,3", "--name", "m")
    rows = lambda: json.loads(remote(user_repo, sshd.env, "status", "--sweep", "--json").stdout)
    wait_until(lambda: all(r["status"] == "finished" for r in rows()), 300, "every run of the sweep to finish")
    ranked = rows()
    assert [r["run_name"] for r in ranked] == ["m-lr0.02-SEED0", "m-lr0.02-SEED3", "m-lr0.1-SEED0", "m-lr0.1-SEED3"]
    assert [r["val_loss"] for r in ranked] == [0.01, 0.04, 0.09, 0.12] and ranked[0]["best"]
    for r in ranked:  # each run's command was given its point's values: as an option, and in its environment
        log = (server_dir(sshd, "testhost") / "runs" / r["run_name"] / "train.log").read_text()
        assert f"lr={float(r['values']['args.lr'])} seed={r['values']['env.SEED']}" in log, log
    text = remote(user_repo, sshd.env, "status", "--sweep").stdout
    assert text.startswith("sweep m: toy, 4/4 finished; best m-lr0.02-SEED0 (val loss 0.0100)"), text
    assert text.splitlines()[1].split()[-2:] == ["VAL", "LOSS"]
    fetched = remote(user_repo, sshd.env, "fetch", "--sweep", "--best").stdout
    assert "fetch m-lr0.02-SEED0 (testhost): 1 output file(s) verified" in fetched, fetched
    assert (user_repo / "runs" / "m-lr0.02-SEED0" / "out" / "val.txt").read_text() == "0.01\n"
    assert not (user_repo / "runs" / "m-lr0.1-SEED3").exists()  # --best: that run alone
    logs = server_dir(sshd, "testhost") / "runs"
    # one point again, one value new, followed to its end (the record was noted after that, and -f never got there)
    remote(user_repo, sshd.env, "launch", "m-lr0.1-SEED3", "--set", "args.lr=0.5", "--follow")
    wait_until(lambda: "lr=0.5 seed=3" in (logs / "m-lr0.1-SEED3" / "train.log").read_text(), 120, "the new value")
    again = next(r for r in rows() if r["run_name"] == "m-lr0.1-SEED3")
    assert again["values"] == {"args.lr": "0.5", "env.SEED": "3"} and again["command"][2:] == ["--lr=0.5"]
    # a point whose name is close to a run file's goes by the run file and --set items it was launched with
    (user_repo / "configs" / "runs" / "m-lr0.02-SEED.yaml").write_text("command: [python, -c, pass]\n")
    commit_all(user_repo, "a run file whose name is close to a point's")
    remote(user_repo, sshd.env, "launch", "m-lr0.02-SEED3", "--set", "args.lr=0.7")
    wait_until(lambda: "lr=0.7 seed=3" in (logs / "m-lr0.02-SEED3" / "train.log").read_text(), 120, "its new value")
    # the same sweep command again starts what its host has no run of (a launch cut short), and nothing else
    shutil.rmtree(logs / "m-lr0.1-SEED0")
    grid_args = ("sweep", "toy", "--set", "args.lr=0.1,0.02", "--set", "env.SEED=0,3", "--name", "m")
    again = remote(user_repo, sshd.env, *grid_args)
    assert "sweep m: 3 of 4 points were launched before; launching the 1 that were not" in again.stderr, again.stderr
    back = logs / "m-lr0.1-SEED0" / "train.log"
    wait_until(lambda: back.exists() and "lr=0.1 seed=0" in back.read_text(), 120, "the point launched again")
    again = remote(user_repo, sshd.env, *grid_args)  # all launched now: nothing to do, and no mistake
    assert "sweep m: every point of it was launched before" in again.stderr and "4 runs on testhost" in again.stdout
    elsewhere = remote(user_repo, sshd.env, *grid_args, host="local")  # the record places it, not --host: said
    assert "note: sweep m was placed on testhost: it goes on there" in elsewhere.stderr, elsewhere.stderr
    other = remote(user_repo, sshd.env, "sweep", "toy", "--set", "args.lr=1,2", "--name", "m", check=False)
    assert other.returncode == 2 and "launched from here before with another run file or grid" in other.stderr
    # numbered points (1e-3 and 1E-3 would be one directory on macOS) do not tell values apart by name: the
    # values are compared; here a launch cut short after its record was written, before any start
    numbered = [
        {"run_name": f"c-00{i}", "host": "testhost", "values": {"args.lr": v}} for i, v in enumerate(["1e-3", "1E-3"])
    ]
    record.save(user_repo, record.Sweep("c", "toy", [], ["args.lr"], numbered))
    other = remote(user_repo, sshd.env, "sweep", "toy", "--set", "args.lr=5e-3,5E-3", "--name", "c", check=False)
    assert other.returncode == 2 and "launched from here before with other values" in other.stderr, other.stderr
    again = remote(user_repo, sshd.env, "sweep", "toy", "--set", "args.lr=1e-3,1E-3", "--name", "c")
    assert "sweep c: 0 of 2 points were launched before; launching the 2 that were not" in again.stderr


@pytest.mark.slow
def test_stop_sweep_stops_its_queued_and_running_runs_and_nothing_else(sshd, user_repo):
    """A sweep of a script of our own, held until stopped: what stop does does not depend on what the runs run
    (enlace's trainer's sweeps run in the test above and on Slurm)."""
    _toy_with_cpu_slots(sshd, user_repo, 2)
    tiny_corpus(server_dir(sshd, "testhost"))  # for the refusals of enlace's trainer's sweeps at the end
    before = connections(sshd)
    bad = remote(user_repo, sshd.env, "sweep", "toy", "--set", "args.lr=1,{x}", "--name", "b", check=False)
    assert bad.returncode == 2 and "--set args.lr: '{x}' uses {x}, which enlace does not fill" in bad.stderr, bad.stderr
    assert connections(sshd) == before  # a bad point of a command's sweep is said before anything connects
    remote(user_repo, sshd.env, "launch", "toy", "--set", "args.hold=1", "--set", "run_name=bystander")
    remote(
        user_repo, sshd.env, "sweep", "toy", "--set", "args.lr=1e-3,2e-3,3e-3", "--set", "args.hold=1", "--name", "s"
    )
    state = lambda: {
        r["run_name"]: r["status"] for r in json.loads(remote(user_repo, sshd.env, "status", "--json").stdout)
    }
    wait_until(
        lambda: sorted(state().values()) == ["queued", "queued", "running", "running"], 120, "1 running, 2 queued"
    )
    out = remote(user_repo, sshd.env, "stop", "--sweep")
    assert out.stdout.count(": stopped at step 1; latest checkpoint none") == 1, out.stdout  # the one that ran
    assert out.stdout.count(": stopped (stopped while queued: it never started)") == 2, out.stdout
    now = state()
    assert now["bystander"] == "running"
    assert {now[n] for n in ("s-lr1e-3", "s-lr2e-3", "s-lr3e-3")} == {"stopped"}
    remote(user_repo, sshd.env, "stop", "bystander")
    (user_repo / ".enlace" / "sweeps" / "s.json").unlink()  # as another clone would be: no record of `s` here
    again = remote(
        user_repo, sshd.env, "sweep", "long", "--set", "optim.learning_rate=1e-3,5e-3", "--name", "s", check=False
    )
    assert (
        again.returncode == 2
        and "testhost already has run s-lr1e-3 (a sweep of this name from elsewhere?)" in again.stderr
    )
    assert not (user_repo / ".enlace" / "sweeps" / "s.json").exists()  # nothing recorded, nothing started
    bad = remote(
        user_repo, sshd.env, "sweep", "long", "--set", "optim.learning_rate=abc,1e-3,xyz", "--name", "t", check=False
    )
    assert bad.returncode == 2 and "expected a number, got 'abc'" in bad.stderr  # its first point is wrong, and
    # its third: each said at once (the third was found only once the first was fixed; the first, verified with
    # the sync, ended the sweep before any point's check)
    assert "2 of the sweep's 3 points fail their check; nothing was started" in bad.stderr, bad.stderr
    assert "expected a number, got 'xyz'" in bad.stderr and bad.stderr.count("Error:") == 1, bad.stderr
    assert "t-lr1e-3" not in state() and not (user_repo / ".enlace" / "sweeps" / "t.json").exists()  # none started
    with record.launching(user_repo, "u"):  # a `sweep --name u` under way in another terminal: a second is refused
        two = remote(
            user_repo, sshd.env, "sweep", "long", "--set", "optim.learning_rate=1e-3,2e-3", "--name", "u", check=False
        )
    assert two.returncode == 7 and "another `enlace-remote sweep` of that name is under way" in two.stderr, two.stderr
    assert "u-lr1e-3" not in state() and not (user_repo / ".enlace" / "sweeps" / "u.json").exists()
