"""`profile: auto` takes the profile that fits the card a run lands on. No GPU exists here: the card is
stubbed — enlace.config.cards.card replaced, or a stand-in nvidia-smi on PATH — and each test says so; what is
chosen from it, and the config that results, are real."""

from __future__ import annotations

import pytest
from support.configs import write_run

from enlace.config import cards
from enlace.config.schema import load_config
from enlace.errors import ConfigError


@pytest.mark.parametrize(
    "card, profile, precision, compiled",
    [
        (((7, 5), "Tesla T4"), "rtx2060", "fp16", False),
        (((8, 0), "NVIDIA A100-SXM4-80GB"), "ampere", "bf16", True),
        (((8, 6), "NVIDIA A10"), "ampere", "bf16", True),
        (((9, 0), "NVIDIA H100 80GB HBM3"), "hopper", "bf16", True),
        ((None, ""), "cpu", "fp32", False),
    ],
)
def test_auto_takes_the_profile_of_the_card_it_lands_on(project, monkeypatch, card, profile, precision, compiled):
    monkeypatch.setattr(cards, "card", lambda: card)  # a stand-in card: no GPU on this machine
    write_run(project, "anywhere", profile="auto")
    cfg = load_config("anywhere", [], root=project)
    assert cfg.files["profile"] == f"configs/profiles/{profile}.yaml"
    assert cfg.runtime.precision == precision and cfg.runtime.compile is compiled
    assert cfg.profile_why.startswith(f"{card[1]}, compute capability" if card[0] else "no NVIDIA card here")


def test_a_named_profile_never_asks_the_card(project, monkeypatch):
    def no():
        raise AssertionError("the card was asked for a named profile")

    monkeypatch.setattr(cards, "card", no)
    write_run(project, "named", profile="cpu")
    assert load_config("named", [], root=project).profile_why == ""


def _fake_smi(tmp_path, monkeypatch, script: str) -> None:
    """A stand-in nvidia-smi on PATH (no GPU here): `script` is its shell body."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    (bin_dir / "nvidia-smi").write_text("#!/bin/sh\n" + script)
    (bin_dir / "nvidia-smi").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:/usr/bin:/bin")


def test_the_card_is_read_with_nvidia_smi_and_is_the_runs_first_visible_one(tmp_path, monkeypatch):
    _fake_smi(
        tmp_path,
        monkeypatch,
        "echo '0, GPU-aaa, 7.5, Tesla T4'\necho '1, GPU-bbb, 9.0, NVIDIA H100 80GB HBM3'\n",
    )
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    assert cards.card() == ((7, 5), "Tesla T4")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")  # the queue gave this run GPU 1
    assert cards.card() == ((9, 0), "NVIDIA H100 80GB HBM3")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "GPU-aaa")
    assert cards.card() == ((7, 5), "Tesla T4")
    for none in ("", "-1"):  # every card hidden: torch sees none, so auto must not pick a GPU profile
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", none)
        assert cards.card() == (None, "")


def test_a_driver_that_cannot_tell_the_capability_is_one_clear_line(tmp_path, monkeypatch):
    _fake_smi(tmp_path, monkeypatch, "echo 'Field \"compute_cap\" is not a valid field to query.' >&2\nexit 2\n")
    with pytest.raises(ConfigError, match=r"cannot tell the card's compute capability .* name a profile instead"):
        cards.card()
