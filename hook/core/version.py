"""The hook's version, as a constant the live path can read without ``importlib.metadata``.

Rule: this line is the one place the version is written. pyproject.toml reads it (a dynamic
version), ``packaging/version`` prints it for the shell (build-deb, the manifests' render step,
the release: docs/release.md), and the image is tagged from the .deb it builds; a test holds
them together. Keep it one plain ``VERSION = "X.Y.Z"`` line: the shell reads it with ``sed``.
"""

VERSION = "0.1.0"
