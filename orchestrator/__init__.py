"""enlace-remote — the local driver. Never imports torch (the laptop may have no GPU stack)."""
