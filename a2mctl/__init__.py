"""The `a2m` command: serve, up, doctor, import/export, bench. The composition root: it alone knows every package."""
