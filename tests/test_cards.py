"""`profile: auto` takes the profile that fits the card a run lands on. No GPU exists here: the card is
stubbed (enlace.config.cards.card returns a compute capability and a name), and the test says so; what is
chosen from it, and the config that results, are real."""

from __future__ import annotations

import pytest
from support.configs import write_run

from enlace.config import cards
from enlace.config.schema import load_config


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
    assert cfg.profile_why.startswith(f"{card[1]}, compute capability" if card[0] else "no CUDA device here")


def test_a_named_profile_never_asks_the_card(project, monkeypatch):
    def no():
        raise AssertionError("the card was asked for a named profile")

    monkeypatch.setattr(cards, "card", no)
    write_run(project, "named", profile="cpu")
    assert load_config("named", [], root=project).profile_why == ""
