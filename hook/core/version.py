"""The hook's version, as a constant the live path can read without ``importlib.metadata``.

Rule: equal to pyproject's ``[project] version`` (a test holds them together); ``hook --version``
prefers the installed distribution's metadata and falls back to this.
"""

VERSION = "0.1.0"
