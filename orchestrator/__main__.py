"""`python -m orchestrator`: enlace-remote where its console script is not on PATH (a venv not activated)."""

from orchestrator.cli import run_main

if __name__ == "__main__":
    run_main()
