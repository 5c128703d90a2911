"""Real-browser end-to-end tests (a package, so that its conftest is not the module `conftest`
that tests/*.py import helpers from)."""
